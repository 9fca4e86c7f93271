"""Checkpoints for the conformance suite, produced by the built `mx2nv`
(generate + convert), once per session."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[2]
MX2NV = Path(os.environ.get("MX2NV", REPO / "build" / "mx2nv")).absolute()

# A K3 down projection whose span (16) only the e4m3 window accepts.
WIDE_MODULE = "language_model.model.layers.1.block_sparse_moe.experts.2.w2"
# A down projection far quieter than the rest: largest exponent -20, span 7, so
# only m = -21 (the fp16 boundary, lowest block scale at 2^-6) serves it.
QUIET_MODULE = "language_model.model.layers.0.block_sparse_moe.experts.1.w2"


def mx2nv(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(MX2NV), *map(str, args)], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"mx2nv {' '.join(map(str, args))} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def built():
    if not MX2NV.exists():
        pytest.fail(f"{MX2NV} not built; run scripts/setup.sh")
    return MX2NV


@pytest.fixture(scope="session")
def outputs(built, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (MXFP4 source, NVFP4 output) for every case the suite checks."""
    root = tmp_path_factory.mktemp("conformance")
    out: dict[str, tuple[Path, Path]] = {}
    mx2nv("demo", root / "demo")
    out["demo"] = (root / "demo" / "mxfp4", root / "demo" / "nvfp4")
    common = ["--layers", "2", "--experts", "4", "--hidden", "256", "--intermediate", "128"]
    mx2nv("generate", root / "k3", "--layout", "k3", "--shards", "3", *common)
    mx2nv("convert", root / "k3", root / "k3-nv")
    out["k3"] = (root / "k3", root / "k3-nv")
    mx2nv("generate", root / "flat", "--layout", "flat", "--shards", "2", "--seed", "7", *common)
    mx2nv("convert", root / "flat", root / "flat-nv")
    out["flat"] = (root / "flat", root / "flat-nv")
    mx2nv("generate", root / "wide", "--layout", "k3", "--shards", "2", "--set-span", f"{WIDE_MODULE}=16", *common)
    mx2nv("convert", root / "wide", root / "wide-nv", "--window", "e4m3")
    out["wide_e4m3"] = (root / "wide", root / "wide-nv")
    # Quiet experts: every largest exponent below -13 (m = k_max - 8 would give
    # vLLM's fp16 path a subnormal global), one far below with a wide span.
    mx2nv("generate", root / "quiet", "--layout", "k3", "--shards", "2", "--k-max", "-15", "--span", "6",
          "--set-k-max", f"{QUIET_MODULE}=-20", "--set-span", f"{QUIET_MODULE}=7", "--seed", "11", *common)
    mx2nv("convert", root / "quiet", root / "quiet-nv")
    out["quiet"] = (root / "quiet", root / "quiet-nv")
    mx2nv("convert", root / "quiet", root / "quiet-e4m3", "--window", "e4m3")
    out["quiet_e4m3"] = (root / "quiet", root / "quiet-e4m3")
    return out


MARLIN_WINDOW_CASES = ["demo", "k3", "flat", "quiet"]
ALL_CASES = MARLIN_WINDOW_CASES + ["wide_e4m3", "quiet_e4m3"]


@pytest.fixture
def broken_copy(outputs, tmp_path):
    """A fresh copy of an output, to damage deliberately."""

    def make(case: str) -> tuple[Path, Path]:
        src, dst = outputs[case]
        copy = tmp_path / f"{case}-broken"
        shutil.copytree(dst, copy)
        return src, copy

    return make


def report_of(*args: str) -> dict:
    """Runs mx2nv with --report and returns the report (any exit code)."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"mx2nv-report-{os.getpid()}.json"
    mx2nv(*args, "--report", path, check=False)
    data = json.loads(path.read_text())
    path.unlink()
    return data
