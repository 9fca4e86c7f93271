"""`mx2nv gate`'s scheme rule against the runtimes' own selectors. The C++
binary cannot import vLLM or SGLang, so this suite asks them instead: vLLM
0.34.0's `CompressedTensorsConfig._is_nvfp4_format` (+ `input_quant is None`,
compressed_tensors_moe.py:145-160) and SGLang 0.5.23's
`CompressedTensorsConfig._is_fp4a16_nvfp4`, taken from the wheels (wheels.py)
and run on compressed-tensors' own QuantizationArgs, must agree with gate's
verdict on every variant of the output config."""

import copy
import json

import pytest
from compressed_tensors.quantization import QuantizationArgs, QuantizationStrategy, QuantizationType

import sglang_marlin
import vllm_marlin
from checkpoints import open_checkpoint
from checkpoints import variant as make_variant
from conftest import mx2nv


def _selectors():
    v = vllm_marlin.code()
    v.namespace.update(QuantizationStrategy=QuantizationStrategy, QuantizationType=QuantizationType)
    vcls = v.methods(vllm_marlin.SELECT, "CompressedTensorsConfig", "_is_nvfp4_format")
    s = sglang_marlin.code()
    s.namespace.update(QuantizationStrategy=QuantizationStrategy, QuantizationType=QuantizationType)
    scls = s.methods(sglang_marlin.SELECT, "CompressedTensorsConfig", "_is_fp4a16_nvfp4")
    return {
        "vllm": lambda w, i: vcls._is_nvfp4_format(w) and i is None,
        "sglang": lambda w, i: scls()._is_fp4a16_nvfp4(w, i),
    }


VARIANTS = {
    "as converted": lambda w, g: None,
    "group_size 32": lambda w, g: w.update(group_size=32),
    "strategy group": lambda w, g: w.update(strategy="group"),
    "asymmetric": lambda w, g: w.update(symmetric=False),
    "8 bits": lambda w, g: w.update(num_bits=8),
    "activations quantized": lambda w, g: g.update(input_activations=dict(w, dynamic=True)),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_gate_and_the_runtimes_select_alike(outputs, tmp_path, variant):
    changed = []

    def change(qc, group):
        VARIANTS[variant](group["weights"], group)
        changed.append(group)

    dst = make_variant(outputs, tmp_path, change)
    (group,) = changed

    weights = QuantizationArgs.model_validate(copy.deepcopy(group["weights"]))
    inputs = group.get("input_activations")
    inputs = QuantizationArgs.model_validate(inputs) if inputs else None
    selectors = _selectors()
    verdicts = json.loads(mx2nv("gate", dst, "--json", "--dtype", "bf16", check=False).stdout)["verdicts"]
    for runtime, selects in selectors.items():
        (verdict,) = [v for v in verdicts if v["runtime"] == runtime and v["backend"] == "marlin"]
        gate_selects = not any(r.startswith("scheme:") for r in verdict["reasons"])
        assert gate_selects == bool(selects(weights, inputs)), (runtime, variant, verdict)
    assert open_checkpoint(dst).quant_config is not None
