"""mx2nv.compare from Python: the CLI's JSON document as a dict, a
difference as a result (exit_code 1) rather than an exception, invalid
input as InvalidInputError, --report / --html written where asked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import mx2nv
from conftest import _wheel_command, generate


def test_compare_exact_on_convert_output_and_as_the_cli(tmp_path: Path, demo_src: Path, demo_dst: Path,
                                                        mx2nv_command: str) -> None:
    doc = mx2nv.compare(demo_src, demo_dst, threads=2, report=tmp_path / "c.json", html=tmp_path / "c.html")
    assert doc["exit_code"] == 0 and doc["format"] == "compressed-tensors"
    assert doc["totals"]["exact_values"] == doc["totals"]["values"] > 0
    assert doc["missing_in_other"] == [] and doc["extra_in_other"] == []
    cli = subprocess.run([mx2nv_command, "compare", str(demo_src), str(demo_dst), "--json"], capture_output=True,
                         text=True, check=True)
    mine, written = json.loads(cli.stdout), json.loads((tmp_path / "c.json").read_text())
    for d in (doc, mine, written):
        d.pop("seconds")
    assert doc == mine == written
    assert "<svg class=\"heatmap\"" in (tmp_path / "c.html").read_text()


def test_compare_difference_is_a_result(tmp_path: Path, demo_src: Path) -> None:
    rq = tmp_path / "rq"
    subprocess.run([_wheel_command(), "requantize", str(demo_src), str(rq)], check=True, capture_output=True)
    doc = mx2nv.compare(demo_src, rq, modules=r"layers\.0\.")
    assert doc["exit_code"] == 1 and all(m["layer"] == 0 for m in doc["modules"])
    assert 0 < doc["totals"]["rel_rmse"] < 0.2


def test_compare_invalid_input_raises(tmp_path: Path) -> None:
    src = generate(tmp_path / "src", "--layers", "1", "--experts", "2", "--hidden", "64", "--intermediate", "64")
    with pytest.raises(mx2nv.InvalidInputError) as e:
        mx2nv.compare(src, src)  # an MXFP4 checkpoint is no NVFP4 OTHER
    assert e.value.exit_code == 3 and "nvfp4-pack-quantized" in str(e.value)
