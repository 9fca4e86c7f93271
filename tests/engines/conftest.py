from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def mx2nv() -> str:
    return str(Path(os.environ.get("MX2NV", REPO / "build" / "mx2nv")))
