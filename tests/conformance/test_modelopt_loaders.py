"""`mx2nv convert --format modelopt` (ModelOpt W4A16_NVFP4) through the pinned
runtimes' own loading, as test_model_loaders.py does for compressed-tensors:

* the config each runtime derives from DST's config.json with its own
  `from_config` (SGLang 0.5.23 ModelOptFp4Config, modelopt_quant.py:1595-1702;
  vLLM 0.34.0 ModelOptNvFp4Config, modelopt.py:327-413, :807-866) selects the
  ModelOpt NVFP4 MoE method in its W4A16 form for every routed-experts layer
  (SGLang ModelOptNvFp4FusedMoEMethod with is_w4a16, :1704-1729, :348-354;
  vLLM ModelOptNvFp4FusedMoE with use_a16, modelopt.py:235-268, :880-890),
  while every non-expert linear the checkpoint holds is left unquantized by
  the config's own get_quant_method (SGLang is_layer_skipped +
  is_layer_excluded, :341-345; vLLM is_layer_excluded, :198-226);
* the K3 and DeepSeek V3 (flat) model classes' load_weights hand every tensor
  to a loader and write every element of the routed parameters
  (model_loaders.py's sentinel technique);
* the method's own post-load processing (FP4 Marlin) and the kernel decode
  give SRC's MXFP4 values exactly, fp16 and bf16;
* the output is the compressed-tensors output of the same SRC in another
  dress: the same packed and block-scale bytes, weight_scale_2 = 1 /
  weight_global_scale exactly, and both wheels parse config.json's and
  hf_quant_config.json's quantization config to the same thing.

(nvidia-modelopt 0.47.0's own NVFP4QTensor is not used: its import pulls in
requests, omegaconf and more, none of which the suite depends on.)
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import model_loaders as ml
import modelopt_loaders as mo
from checkpoints import SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, open_checkpoint
from conftest import mx2nv
from test_model_loaders import DTYPES, assert_decodes_exactly

# K3 layout, DeepSeek V3 layout, and the K3 output whose quietest expert sits
# on the fp16 edge of the Marlin window (conftest.py's `quiet`).
CASES = ["k3", "flat", "quiet"]
RUNTIMES = ["sglang", "vllm"]
EXPERT = re.compile(r"\.experts\.\d+\.")
ARCH = {"k3": "KimiK3ForConditionalGeneration", "quiet": "KimiK3ForConditionalGeneration",
        "flat": "DeepseekV3ForCausalLM"}


@pytest.fixture(scope="module")
def modelopt(outputs, tmp_path_factory):
    """case -> (SRC, compressed-tensors DST, ModelOpt DST) of the same SRC."""
    root = tmp_path_factory.mktemp("modelopt")
    out = {}
    for case in CASES:
        src, ct = outputs[case]
        dst = root / case
        mx2nv("convert", src, dst, "--format", "modelopt")
        out[case] = (src, ct, dst)
    return out


@pytest.fixture(scope="module")
def reports(modelopt):
    cache = {}

    def get(runtime: str, case: str, dtype: str) -> ml.Report:
        key = (runtime, case, dtype)
        if key not in cache:
            dst = modelopt[case][2]
            cache[key] = ml.report(ml.CHAINS[(runtime, ml.model_class(dst))], dst, DTYPES[dtype])
        return cache[key]

    return get


# ---------------------------------------------------------------- the runtimes' own selection


@pytest.mark.parametrize("case", ["k3", "flat"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_own_config_selects_modelopt_w4a16_for_routed_experts(reports, runtime, case):
    r = reports(runtime, case, "bf16")
    run = r.runs[0]
    config = run.quant_config
    assert run.quant_format == "modelopt" and config is not None
    assert config.get_name() == "modelopt_fp4"
    assert config.is_checkpoint_nvfp4_serialized and config.group_size == 16
    if runtime == "sglang":
        assert config.is_w4a16 and config.use_per_token_activation is False
    else:
        assert config.quant_method == "W4A16_NVFP4"
    want = {"sglang": "ModelOptNvFp4FusedMoEMethod", "vllm": "ModelOptNvFp4FusedMoE"}[runtime]
    assert run.experts
    for prefix, (layer, method) in run.experts.items():
        assert type(method).__name__ == want, prefix
        if runtime == "vllm":
            assert method.use_a16 and method.nvfp4_backend.name == "MARLIN"
            name = layer.layer_name
        else:
            name = prefix
        assert not config.is_layer_excluded(name), name


@pytest.mark.parametrize("case", ["k3", "flat"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_non_expert_linear_is_left_unquantized(reports, runtime, case):
    """Every non-expert module with a 2-D weight, at the prefix the runtime's
    own chain places it (and each fused module of the wheel's
    packed_modules_mapping whose every shard the checkpoint holds), gets
    UnquantizedLinearMethod from the config's own get_quant_method."""
    run = reports(runtime, case, "bf16").runs[0]
    config = run.quant_config
    quantized = mo.sglang_is_quantized_linear if runtime == "sglang" else mo.vllm_is_quantized_linear
    shapes = {n: t.shape for n, t in run.fed.stream}
    prefixes = sorted({placed.rsplit(".", 1)[0] for n, placed in run.placed.items()
                       if n.endswith(".weight") and len(shapes[n]) == 2})
    assert any(".self_attn." in p for p in prefixes) and any("lm_head" in p for p in prefixes)
    fused = []
    for name, shards in (config.packed_modules_mapping or {}).items():
        for p in prefixes:
            parent, _, leaf = p.rpartition(".")
            if leaf == shards[0] and all(f"{parent}.{s}" in prefixes for s in shards):
                fused.append(f"{parent}.{name}")
    still = [p for p in prefixes + fused if quantized(config, p)]
    assert still == [], still


def test_vllm_override_maps_config_to_modelopt_fp4(modelopt):
    """vLLM picks the method by ModelOptNvFp4Config.override_quantization_method
    (modelopt.py:799-806, :292-309): quant_method must start with "modelopt"."""
    cls = mo.vllm_code()["ModelOptNvFp4Config"]
    for case in ("k3", "flat"):
        assert cls.override_quantization_method(mo.resolved_quant_config(modelopt[case][2]), None) == "modelopt_fp4"


# ---------------------------------------------------------------- loading and decode


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_modelopt_chain_loads_everything_and_decodes_exactly(modelopt, reports, runtime, case, dtype):
    r = reports(runtime, case, dtype)
    assert r.architecture == ARCH[case] == r.model_class
    assert r.tensors == len(open_checkpoint(modelopt[case][2]).weight_map)
    assert r.unconsumed == []
    assert r.routed_elements > 0 and not any(r.unwritten.values()), {k: v for k, v in r.unwritten.items() if v}
    assert any(k.endswith("w13_weight_scale_2") for k in r.unwritten)  # the globals are judged too
    assert_decodes_exactly(runtime, r, modelopt[case][0], dtype)
    # Both runtimes only warn, then use w1's global for w3 (SGLang
    # modelopt_quant.py:2739-2763, vLLM modelopt.py:1086-1094): never here.
    logs = mo.sglang_code()["logger"].messages if runtime == "sglang" else mo.vllm_code()["logger"].messages
    assert not [m for m in logs if "must match" in m]


# ---------------------------------------------------------------- the same bytes as compressed-tensors


def _names(ck) -> dict[str, str]:
    """compressed-tensors name -> ModelOpt name."""
    out = {}
    for n in ck.weight_map:
        if n.endswith(SUFFIX_PACKED):
            out[n] = n[: -len(SUFFIX_PACKED)] + ".weight"
        elif n.endswith(SUFFIX_GLOBAL):
            out[n] = n[: -len(SUFFIX_GLOBAL)] + ".weight_scale_2"
        else:
            out[n] = n
    return out


@pytest.mark.parametrize("case", CASES)
def test_modelopt_output_is_the_compressed_tensors_output_redressed(modelopt, case):
    _, ct_dir, mo_dir = modelopt[case]
    ct, mo_ck = open_checkpoint(ct_dir), open_checkpoint(mo_dir)
    names = _names(ct)
    assert sorted(names.values()) == sorted(mo_ck.weight_map)  # no input_scale, nothing else
    from safetensors import safe_open

    def dtype(ck, name):
        with safe_open(ck.root / ck.weight_map[name], framework="pt") as f:
            return f.get_slice(name).get_dtype()

    modules = ct.modules()
    assert modules and all(EXPERT.search(m) for m in modules)
    for n, m in names.items():
        a, b = ct.tensor(n), mo_ck.tensor(m)
        if n.endswith(SUFFIX_GLOBAL):
            assert dtype(ct, n) == dtype(mo_ck, m) == "F32" and b.shape == torch.Size([]), m
            # A multiplier, the divisor's reciprocal in fp32, exactly (a power of two).
            assert b.item() * a.reshape(()).item() == 1.0, m
            assert torch.equal(b, (torch.ones((), dtype=torch.float32) / a.reshape(())).float()), m
        else:
            assert dtype(ct, n) == dtype(mo_ck, m), m
            assert a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), m
        if n.endswith(SUFFIX_SCALE) and EXPERT.search(n):
            assert dtype(mo_ck, m) == "F8_E4M3", m
    # Gate and up share one global, bit for bit (both runtimes use w1's).
    for m in modules:
        if m.endswith((".w1", ".gate_proj")):
            up = m[: -len(".w1")] + ".w3" if m.endswith(".w1") else m[: -len(".gate_proj")] + ".up_proj"
            g1, g3 = mo_ck.tensor(m + ".weight_scale_2"), mo_ck.tensor(up + ".weight_scale_2")
            assert g1.view(torch.int32).item() == g3.view(torch.int32).item(), m


@pytest.mark.parametrize("case", ["k3", "flat"])
def test_modelopt_config_parses_alike_in_both_wheels(modelopt, case):
    """config.json's quantization_config (top level; for K3 text_config's too)
    and hf_quant_config.json parse, with both wheels' from_config, to
    W4A16_NVFP4, group 16, and the same exclusion list: every unquantized
    module of the checkpoint by its full name, no routed expert."""
    _, _, dst = modelopt[case]
    cfg = json.loads((dst / "config.json").read_text())
    top = cfg["quantization_config"]  # top level: vLLM's get_config reads only it (see the research notes)
    if "text_config" in cfg:
        assert cfg["text_config"]["quantization_config"] == top
    assert top["quant_method"] == "modelopt" and top["quant_algo"] == "W4A16_NVFP4"
    assert "quantization" not in top  # vLLM _normalize_quantization_config raises for nested W4A16
    hf = json.loads((dst / "hf_quant_config.json").read_text())
    ck = open_checkpoint(dst)
    unquantized = {n.rsplit(".", 1)[0] for n in ck.weight_map if n.endswith(".weight") and not EXPERT.search(n)}
    parsed = []
    for d in (top, hf):
        s = mo.sglang_code()["ModelOptFp4Config"].from_config(dict(d, packed_modules_mapping={}))
        v = mo.vllm_code()["ModelOptNvFp4Config"].from_config(dict(d))
        assert s.is_w4a16 and s.group_size == 16 and s.is_checkpoint_nvfp4_serialized
        assert s.kv_cache_quant_algo == "auto"  # no KV-cache method (modelopt_quant.py:338)
        assert v.quant_method == "W4A16_NVFP4" and v.group_size == 16 and v.kv_cache_quant_algo is None
        assert s.exclude_modules == v.exclude_modules
        parsed.append(sorted(s.exclude_modules))
    assert parsed[0] == parsed[1]
    assert unquantized <= set(parsed[0]), sorted(unquantized - set(parsed[0]))
    assert not [e for e in parsed[0] if EXPERT.search(e + ".")]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_bad_exclusion_list_is_seen(modelopt, tmp_path, runtime):
    """The checks themselves: a bare `experts` entry (both wheels match it
    against a single path part / as a substring, SGLang modelopt_quant.py:
    405-412, vLLM modelopt.py:210-219) leaves the routed experts unquantized
    and the chain refuses; a missing entry leaves that linear quantized."""
    import shutil

    dst = tmp_path / "mutated"
    shutil.copytree(modelopt["flat"][2], dst)
    chain = ml.CHAINS[(runtime, "DeepseekV3ForCausalLM")]
    quantized = mo.sglang_is_quantized_linear if runtime == "sglang" else mo.vllm_is_quantized_linear
    path = dst / "config.json"
    cfg = json.loads(path.read_text())
    qc = cfg["quantization_config"]
    qc["ignore"] = qc["ignore"] + ["experts"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(AssertionError, match="excludes the routed experts"):
        chain(dst, torch.bfloat16, ml.SENTINELS[0])
    qc["ignore"] = [e for e in qc["ignore"] if e not in ("experts", "model.layers.0.self_attn.q_proj")]
    path.write_text(json.dumps(cfg))
    config = chain(dst, torch.bfloat16, ml.SENTINELS[0]).quant_config
    assert quantized(config, "model.layers.0.self_attn.q_proj")
    assert not quantized(config, "model.layers.1.self_attn.q_proj")
