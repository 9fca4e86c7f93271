"""`convert --overspan requantize|bf16` against the ecosystem's own code.

On a generated K3-layout checkpoint with one over-span down projection (and a
second layer's gate/up pair pushed over the window, so a pair is rewritten
together):

- requantize: compressed-tensors 0.20.1 (CPU torch) quantizes the decoded
  values of every rewritten module to the same packed bytes, scale bytes and
  global; every other module keeps SRC's packed bytes; the reported errors
  match a numpy recomputation.
- bf16: every `weight` equals compressed-tensors' own decoding of the MXFP4
  source exactly; compressed-tensors validates the mixed config; vLLM
  0.34.0's own loader rules (CompressedTensorsConfig.get_scheme_dict and
  CompressedTensorsMoEMethod.get_moe_method, taken from the wheel) take the
  unquantized MoE path for the BF16 layer and the NVFP4 scheme for the rest.
"""

from __future__ import annotations

import json
from fnmatch import fnmatch
from types import MappingProxyType

import numpy as np
import pytest
import regex
import torch
from compressed_tensors.quantization import QuantizationConfig

import wheels
from checkpoints import SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, open_checkpoint
from conftest import WIDE_MODULE, mx2nv
from oracles import mxfp4_values, nvfp4_values, u8
from test_requantize import ct_quantize, decoded

PAIR_GATE = "language_model.model.layers.0.block_sparse_moe.experts.1.w1"
PAIR_UP = "language_model.model.layers.0.block_sparse_moe.experts.1.w3"
LAYERS = {0: "language_model.model.layers.0.block_sparse_moe.experts",
          1: "language_model.model.layers.1.block_sparse_moe.experts"}


@pytest.fixture(scope="module")
def overspan(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("overspan")
    src = root / "src"
    mx2nv("generate", src, "--layout", "k3", "--shards", "2", "--layers", "3", "--experts", "3", "--hidden", "128",
          "--intermediate", "64", "--set-span", f"{WIDE_MODULE}=30", "--set-span", f"{PAIR_GATE}=22")
    assert mx2nv("convert", src, root / "refused", check=False).returncode == 1
    out = {"src": src}
    for choice in ("requantize", "bf16"):
        dst, report = root / choice, root / f"{choice}.json"
        mx2nv("convert", src, dst, "--overspan", choice, "--threads", "2", "--report", report)
        mx2nv("verify", src, dst)
        out[choice] = (dst, json.loads(report.read_text()))
    return out


def test_requantized_modules_equal_compressed_tensors_quantization(overspan):
    dst_dir, report = overspan["requantize"]
    src, dst = open_checkpoint(overspan["src"]), open_checkpoint(dst_dir)
    lossy = {row["module"] for row in report["requantized"]}
    assert lossy == {WIDE_MODULE, PAIR_GATE, PAIR_UP}
    assert report["overspan"]["choice"] == "requantize" and report["overspan"]["lossy"] is True
    # The config names them; compressed-tensors' QuantizationConfig loads it (it ignores keys it does not know).
    assert set(dst.quant_config["mx2nv_requantized_modules"]) == lossy
    assert QuantizationConfig.model_validate(dst.quant_config).config_groups
    for m in src.modules():
        if m in lossy:
            ct = ct_quantize(src, m)
            assert np.array_equal(u8(ct["weight_packed"]), u8(dst.tensor(m + SUFFIX_PACKED))), m
            assert np.array_equal(u8(ct["weight_scale"]), u8(dst.tensor(m + SUFFIX_SCALE))), m
            assert torch.equal(ct["weight_global_scale"].reshape(1), dst.tensor(m + SUFFIX_GLOBAL)), m
        else:  # byte-preserved
            assert torch.equal(src.tensor(m + SUFFIX_PACKED), dst.tensor(m + SUFFIX_PACKED)), m


def test_reported_errors_match_an_independent_recomputation(overspan):
    dst_dir, report = overspan["requantize"]
    src, dst = open_checkpoint(overspan["src"]), open_checkpoint(dst_dir)
    for row in report["requantized"]:
        m = row["module"]
        x = mxfp4_values(u8(src.tensor(m + SUFFIX_PACKED)), u8(src.tensor(m + SUFFIX_SCALE)))
        g = float(dst.tensor(m + SUFFIX_GLOBAL)[0])
        q = nvfp4_values(u8(dst.tensor(m + SUFFIX_PACKED)), u8(dst.tensor(m + SUFFIX_SCALE)), g)
        assert row["values"] == x.size
        assert row["relative_rmse"] == pytest.approx(np.sqrt(np.sum((q - x) ** 2) / np.sum(x**2)), rel=1e-9)
        assert row["cosine"] == pytest.approx(np.sum(q * x) / np.sqrt(np.sum(x**2) * np.sum(q**2)), rel=1e-12)
        assert row["max_abs_error"] == pytest.approx(np.max(np.abs(q - x)), rel=1e-12)
        assert row["relative_rmse"] > 0


def test_bf16_weights_are_compressed_tensors_decoding_exactly(overspan):
    dst_dir, report = overspan["bf16"]
    src, dst = open_checkpoint(overspan["src"]), open_checkpoint(dst_dir)
    layers = {row["layer"] for row in report["overspan"]["bf16_layers"]}
    assert layers == {LAYERS[0], LAYERS[1]}
    bf16 = [m for m in src.modules() if m.rsplit(".", 2)[0] in layers]
    assert len(bf16) == 2 * 3 * 3
    for m in bf16:
        w = dst.tensor(m + ".weight")
        assert w.dtype == torch.bfloat16
        assert torch.equal(w.to(torch.float32), decoded(src, m)), m
    for m in set(src.modules()) - set(bf16):
        assert torch.equal(src.tensor(m + SUFFIX_PACKED), dst.tensor(m + SUFFIX_PACKED)), m
    qc = QuantizationConfig.model_validate(dst.quant_config)
    assert set(bf16) <= set(qc.ignore)


def _vllm_rules(quant_config: dict):
    """vLLM 0.34.0's get_scheme_dict / get_moe_method from the wheel, on `quant_config`."""
    root = wheels.wheel_dir(*wheels.VLLM)
    c = wheels.WheelCode(root)
    c.namespace.update(re=regex, fnmatch=fnmatch, MappingProxyType=MappingProxyType)
    q = "vllm/model_executor/layers/quantization/"
    c.functions(q + "utils/config_utils.py", "find_matching_patterns", "is_equal_or_regex_match")
    c.functions(q + "compressed_tensors/utils.py", "should_ignore_layer", "find_matched_target", "_find_first_match",
                "_match_fused_layer")
    config_cls = c.methods(q + "compressed_tensors/compressed_tensors.py", "CompressedTensorsConfig", "get_scheme_dict",
                           "_add_fused_moe_to_target_scheme_map")

    class Unquantized:  # the class get_moe_method returns for an ignored layer; only its identity matters here
        def __init__(self, moe_config):
            self.moe_config = moe_config

    c.namespace["UnquantizedFusedMoEMethod"] = Unquantized
    moe_cls = c.methods(q + "compressed_tensors/compressed_tensors_moe/compressed_tensors_moe.py",
                        "CompressedTensorsMoEMethod", "get_moe_method")
    config = config_cls()
    config.ignore = quant_config["ignore"]
    (group,) = quant_config["config_groups"].values()
    config.target_scheme_map = {t: {"weights": group["weights"], "input_activations": None, "format": None}
                                for t in group["targets"]}
    config.quant_format = quant_config["format"]
    config.packed_modules_mapping = {}
    return config, moe_cls, Unquantized


def test_vllm_loader_rules_accept_the_mixed_config(overspan):
    dst_dir, report = overspan["bf16"]
    dst = open_checkpoint(dst_dir)
    config, moe, unquantized = _vllm_rules(dst.quant_config)
    bf16_layers = {row["layer"] for row in report["overspan"]["bf16_layers"]}
    for i in range(3):
        prefix = f"language_model.model.layers.{i}.block_sparse_moe.experts"
        # vLLM matches the "Linear" target to an MoE layer by its class name, RoutedExperts
        # (_add_fused_moe_to_target_scheme_map); the attributes are the ones get_moe_method reads.
        layer = type("RoutedExperts", (), {})()
        layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name, layer.ckpt_down_proj_name = "w1", "w3", "w2"
        layer.moe_config = None
        config._add_fused_moe_to_target_scheme_map()
        schemes = [config.get_scheme_dict(layer, f"{prefix}.0.{p}") for p in ("w1", "w3", "w2")]
        if prefix in bf16_layers:
            assert schemes == [None, None, None]
            assert isinstance(moe.get_moe_method(config, layer, prefix), unquantized)
        else:  # the NVFP4 scheme for all three projections, as get_moe_method requires
            assert all(s is not None and s == schemes[0] for s in schemes), prefix
            assert schemes[0]["weights"]["strategy"] == "tensor_group"
    assert bf16_layers == {LAYERS[0], LAYERS[1]}  # layer 2 fits and stays NVFP4
