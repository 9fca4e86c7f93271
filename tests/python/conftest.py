"""Fixtures for the Python package tests. They run in a venv where the built
wheel is installed (scripts/python-package-test.sh): `import mx2nv` and the
`mx2nv` command both come from the wheel, never from the source tree."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mx2nv

# A module every generated K3-layout checkpoint has.
K3_MODULE = "language_model.model.layers.0.block_sparse_moe.experts.0.w1"


def _wheel_command() -> str:
    exe = Path(sys.executable).parent / "mx2nv"
    assert exe.exists(), f"the wheel's console command is not installed next to {sys.executable}"
    return str(exe)


@pytest.fixture(scope="session")
def mx2nv_command() -> str:
    """The `mx2nv` console entry point installed by the wheel."""
    return _wheel_command()


def generate(path: Path, *args: str) -> Path:
    subprocess.run([_wheel_command(), "generate", str(path), *args], check=True, capture_output=True)
    return path


@pytest.fixture(scope="session")
def demo_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's checkpoint: K3 layout, 2 layers x 8 experts, 4 shards."""
    return generate(tmp_path_factory.mktemp("demo") / "mxfp4", "--layers", "2", "--experts", "8", "--hidden", "512",
                    "--intermediate", "256", "--shards", "4")


@pytest.fixture(scope="session")
def demo_dst(tmp_path_factory: pytest.TempPathFactory, demo_src: Path) -> Path:
    dst = tmp_path_factory.mktemp("demo-out") / "nvfp4"
    mx2nv.convert(demo_src, dst, threads=2)
    return dst


def fake_hf_cache(cache: Path, repo_id: str, checkpoint: Path, commit: str, ref: str = "main") -> Path:
    """Lays `checkpoint` out as the Hugging Face hub cache does:
    models--org--name/{blobs/<sha256>, refs/<ref> -> commit,
    snapshots/<commit>/<file> -> ../../blobs/<sha256>}."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / ref).write_text(commit)
    snapshot = repo / "snapshots" / commit
    for file in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        rel = file.relative_to(checkpoint)
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(file, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def no_temporaries(directory: Path) -> bool:
    return not any(".mx2nv-tmp" in p.name for p in directory.rglob("*"))
