"""mx2nv.gate: the command's verdicts as objects, the runtimes' own
selectors asked in an interpreter (this one by default), and the probe as
`python -m mx2nv.runtime_probe`. Asking the real vLLM code is
tests/conformance/test_runtime_probe.py; here the wheel's venv has no
runtime, and a stand-in interpreter gives the answers gate must report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import mx2nv


def test_gate_the_demo_output(demo_dst: Path, mx2nv_command: str) -> None:
    g = mx2nv.gate(demo_dst, dtype="bf16")
    assert isinstance(g, mx2nv.GateResult)
    # The demo is Kimi K3: vLLM 0.34.0's class loads it, SGLang 0.5.23's never loads the packed experts.
    assert g.architecture == "KimiK3ForConditionalGeneration"
    assert g.result == "BLOCKED" and not g.runs and g.exit_code == 1
    assert {(v.runtime, v.backend) for v in g.verdicts} == {("vllm", "marlin"), ("vllm", "humming"), ("sglang", "marlin")}
    assert all(v.verdict == ("RUN" if v.runtime == "vllm" else "BLOCKED") and v.dtype == "bf16" for v in g.verdicts)
    assert all(v.model_class == "KimiK3ForConditionalGeneration" for v in g.verdicts)
    assert mx2nv.gate(demo_dst, runtime="vllm", ask_runtimes=False).runs
    # Asked in this interpreter, which has neither runtime.
    assert g.asked and g.python == sys.executable
    assert [(s.runtime, s.outcome, s.agreement) for s in g.selections] == [
        ("vllm", "not-installed", "NO OPINION"), ("sglang", "not-installed", "NO OPINION")]
    # The same as the command's JSON.
    ran = subprocess.run([mx2nv_command, "gate", str(demo_dst), "--json", "--dtype", "bf16", "--python", sys.executable],
                         capture_output=True, text=True)
    assert ran.returncode == 1, ran.stderr  # BLOCKED (SGLang's K3 class) exits 1, as the result says
    cli = json.loads(ran.stdout)
    assert mx2nv.GateResult.from_json(cli) == g


def test_a_runtime_that_refuses_what_gate_runs_is_a_disagreement(demo_dst: Path, tmp_path: Path) -> None:
    fake = tmp_path / "python"
    answer = {"probe": 1, "python": "3.99", "runtimes": [
        {"runtime": "vllm", "version": "0.34.9", "outcome": "refused", "reason": "ValueError: no"}]}
    fake.write_text(f"#!/bin/sh\ncat >/dev/null\necho '{json.dumps(answer)}'\n")
    fake.chmod(0o700)
    g = mx2nv.gate(demo_dst, runtime="vllm", python=str(fake))
    assert g.result == "RUN"  # gate's own verdict
    assert g.disagreement and g.exit_code == 1 and not g.runs
    (s,) = g.selections
    assert (s.outcome, s.agreement, s.version_differs, s.pinned) == ("refused", "DISAGREES", True, "0.34.0")


def test_not_asking_and_errors(demo_src: Path, demo_dst: Path) -> None:
    g = mx2nv.gate(demo_dst, ask_runtimes=False, tp=2)
    assert not g.asked and g.selections == () and all(v.tp == 2 for v in g.verdicts)
    missing = mx2nv.gate(demo_dst, runtime="vllm", python="/nonexistent/python3")
    assert all(s.outcome == "could-not-ask" and "could not be started" in s.reason for s in missing.selections)
    assert missing.runs
    with pytest.raises(mx2nv.InvalidInputError):
        mx2nv.gate(demo_src)  # MXFP4, not NVFP4
    with pytest.raises(mx2nv.UsageError):
        mx2nv.gate(demo_dst, runtime="trtllm")
    with pytest.raises(mx2nv.UsageError):
        mx2nv.gate(demo_dst, tp=0)
    with pytest.raises(mx2nv.UsageError):
        mx2nv.gate(demo_dst, ep=0)
    # What one GPU holds, per verdict.
    split = mx2nv.gate(demo_dst, ask_runtimes=False, tp=2, ep=2, runtime="vllm")
    assert all(v.ep == 2 and v.per_rank["experts"] == 4 for v in split.verdicts)
    # Options for asking, with asking off, could only be ignored: refused.
    for extra in ({"python": "/nonexistent/python3"}, {"ask_timeout": 5}):
        with pytest.raises(mx2nv.UsageError, match="does not apply with ask_runtimes=False"):
            mx2nv.gate(demo_dst, ask_runtimes=False, **extra)


def test_the_probe_as_a_module(demo_dst: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "mx2nv.runtime_probe", str(demo_dst)], capture_output=True, text=True,
                         check=True).stdout
    answer = json.loads(out)
    assert answer["layer"] == "language_model.model.layers.0.block_sparse_moe.experts"
    assert answer["projections"] == ["w1", "w3", "w2"]
    assert [(r["runtime"], r["outcome"]) for r in answer["runtimes"]] == [("vllm", "not-installed"),
                                                                         ("sglang", "not-installed")]


def test_quick_reads_no_block_scales_and_matches_the_command(demo_dst: Path, mx2nv_command: str) -> None:
    g = mx2nv.gate(demo_dst, dtype="bf16", ask_runtimes=False, quick=True)
    assert g.quick and g.scales["negative_block_scales"] is None
    assert not mx2nv.gate(demo_dst, dtype="bf16", ask_runtimes=False).quick
    cli = json.loads(subprocess.run([mx2nv_command, "gate", str(demo_dst), "--json", "--dtype", "bf16", "--quick",
                                     "--ask-runtimes", "never"], capture_output=True, text=True).stdout)
    assert mx2nv.GateResult.from_json(cli) == g
    with pytest.raises(mx2nv.UsageError):
        mx2nv.gate(demo_dst, ask_runtimes=False, quick="yes")
