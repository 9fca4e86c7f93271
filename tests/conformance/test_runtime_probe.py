"""`mx2nv gate` asking the real vLLM 0.34.0 code (issue 9: "where the
runtime's Python package is installed, gate also asks its own config
parser/selector and says when the two disagree").

The probe (python/mx2nv/runtime_probe.py, compiled into the binary) runs in
an interpreter that imports the real `vllm` package: the released wheel's
Python tree (wheels.py's cache, no compiled extension) on PYTHONPATH, in a
venv (build/probe-venv) that sees this suite's packages (torch,
compressed-tensors, ...) and adds the pure-Python or small packages vLLM's
import chain needs (probe-requirements.txt, --no-deps, none of them CUDA:
the GPU stack is never imported on this path). No stub: vLLM's own
`CompressedTensorsConfig.from_config` and `get_quant_method` run; the probe
replaces only the MoE methods' constructors by recorders (they pick GPU
kernels; which one is built, with which arguments, is the answer).

SGLang's import chain needs triton (~1 GB) and the full wheel; its case runs
when MX2NV_SGLANG_PYTHON names an interpreter that imports sglang (with
PYTHONPATH set by the caller), else it is skipped with that reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from checkpoints import variant
from conftest import MX2NV, REPO
from wheels import VLLM, wheel_dir

PROBE_VENV = REPO / "build" / "probe-venv"
REQUIREMENTS = Path(__file__).with_name("probe-requirements.txt")


@pytest.fixture(scope="session")
def vllm_python() -> tuple[str, dict]:
    """(interpreter, environment) in which `import vllm` is the pinned (wheels.VLLM) wheel's code."""
    want = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    stamp = PROBE_VENV / ".requirements.sha256"
    python = PROBE_VENV / "bin" / "python"
    if not python.exists() or not stamp.exists() or stamp.read_text() != want:
        shutil.rmtree(PROBE_VENV, ignore_errors=True)
        venv.create(PROBE_VENV, with_pip=True)
        # This suite's own packages (torch, compressed-tensors, pydantic...)
        # stay visible behind the venv's own.
        (site_dir,) = PROBE_VENV.glob("lib/python*/site-packages")
        (site_dir / "conformance-venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-r", str(REQUIREMENTS)], check=True)
        stamp.write_text(want)
    env = dict(os.environ, PYTHONPATH=str(wheel_dir(*VLLM)))
    return str(python), env


def gate(checkpoint: Path, python: str, env: dict, *args: str) -> tuple[int, dict]:
    r = subprocess.run([str(MX2NV), "gate", str(checkpoint), "--json", "--dtype", "bf16", "--python", python, *args],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def opinion(answer: dict, runtime: str) -> dict:
    (o,) = [r for r in answer["runtime_selectors"]["runtimes"] if r["runtime"] == runtime]
    return o


def test_vllm_selects_nvfp4a16_for_the_output_and_agrees(outputs, vllm_python):
    code, answer = gate(outputs["k3"][1], *vllm_python, "--runtime", "vllm")
    o = opinion(answer, "vllm")
    assert o["outcome"] == "selected", o
    assert o["version"] == VLLM[1] and not o["version_differs"]
    assert o["selected"] == "CompressedTensorsW4A4Nvfp4MoEMethod(use_a16=True)"
    assert o["agreement"] == "AGREES"
    assert answer["runtime_selectors"]["layer"] == "language_model.model.layers.0.block_sparse_moe.experts"
    assert (code, answer["result"]) == (0, "RUN")


@pytest.mark.parametrize("name, change, vllm_says", [
    # Both refuse: vLLM's selector raises on a group of 32 (its NVFP4 test needs 16).
    ("group_size 32", lambda qc, g: g["weights"].update(group_size=32), "refused"),
    # Both refuse NVFP4A16: vLLM selects its W4A4 method (use_a16=False).
    ("activations quantized", lambda qc, g: g.update(input_activations=dict(g["weights"], dynamic="local")),
     "selected"),
])
def test_vllm_and_gate_refuse_alike(outputs, vllm_python, tmp_path, name, change, vllm_says):
    code, answer = gate(variant(outputs, tmp_path, change), *vllm_python, "--runtime", "vllm")
    o = opinion(answer, "vllm")
    assert o["outcome"] == vllm_says, o
    assert not o["selects_nvfp4a16"] and not o["gate_selects_nvfp4a16"]
    assert o["agreement"] == "AGREES"
    assert (code, answer["result"]) == (1, "BLOCKED")


def test_vllm_disagrees_where_gate_reads_the_config_coarser(outputs, vllm_python, tmp_path):
    """Two places where the runtime's own answer differs from gate's scheme
    rule, which reads every config group and not the targets/ignore lists:
    the probe makes them visible (exit code 1), gate's verdict stays its own."""
    fp8_attention = {"targets": ["re:.*self_attn.*"], "format": "float-quantized",
                     "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                                 "dynamic": False},
                     "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                           "dynamic": True}}
    mixed = variant(outputs, tmp_path / "mixed", lambda qc, g: qc["config_groups"].update(attention=fp8_attention))
    code, answer = gate(mixed, *vllm_python, "--runtime", "vllm")
    o = opinion(answer, "vllm")
    assert o["selected"] == "CompressedTensorsW4A4Nvfp4MoEMethod(use_a16=True)", o
    assert not o["gate_selects_nvfp4a16"] and o["agreement"] == "DISAGREES"
    assert (code, answer["result"]) == (1, "BLOCKED")

    ignored = variant(outputs, tmp_path / "ignored", lambda qc, g: qc["ignore"].append("re:.*block_sparse_moe.*"))
    code, answer = gate(ignored, *vllm_python, "--runtime", "vllm")
    o = opinion(answer, "vllm")
    assert o["selected"] == "UnquantizedFusedMoEMethod()", o
    assert o["gate_selects_nvfp4a16"] and o["agreement"] == "DISAGREES"
    assert answer["result"] == "RUN" and answer["runtime_selectors"]["disagreement"]
    assert code == 1


def test_the_probe_runs_standalone_and_in_process(outputs, vllm_python):
    """`python -m mx2nv.runtime_probe CHECKPOINT` reads the checkpoint itself
    (config.json, the index for the layer names) and says the same."""
    python, env = vllm_python
    probe = REPO / "python" / "mx2nv" / "runtime_probe.py"
    r = subprocess.run([python, str(probe), str(outputs["k3"][1]), "--runtime", "vllm"], capture_output=True,
                       text=True, env=env, timeout=600, check=True)
    (answer,) = json.loads(r.stdout)["runtimes"]  # stdout is the answer alone, vLLM's logging went to stderr
    assert answer["selected"] == {"class": "CompressedTensorsW4A4Nvfp4MoEMethod", "args": {"use_a16": True}}


@pytest.mark.skipif(not os.environ.get("MX2NV_SGLANG_PYTHON"),
                    reason="SGLang's import needs triton and the full wheel: set MX2NV_SGLANG_PYTHON (and PYTHONPATH)")
def test_sglang_selects_nvfp4a16_and_agrees(outputs, tmp_path):
    python, env = os.environ["MX2NV_SGLANG_PYTHON"], dict(os.environ)
    code, answer = gate(outputs["k3"][1], python, env, "--runtime", "sglang")
    o = opinion(answer, "sglang")
    assert o["selected"] == "CompressedTensorsW4A16Nvfp4MoE()" and o["agreement"] == "AGREES", o
    assert code == 0
    code, answer = gate(variant(outputs, tmp_path, lambda qc, g: g["weights"].update(group_size=32)), python, env,
                        "--runtime", "sglang")
    o = opinion(answer, "sglang")
    assert o["outcome"] == "refused" and o["agreement"] == "AGREES", o
    assert code == 1
