"""`mx2nv requantize` against compressed-tensors' own NVFP4 quantization.

For every module of the output, compressed-tensors (pinned 0.20.1, CPU torch)
decodes the MXFP4 source with its own MXFP4PackedCompressor, computes the
global with `generate_gparam` from the module's (or gate/up pair's) min and
max, the block scales with `calculate_qparams` under the NVFP4A16 preset, and
packs with NVFP4PackedCompressor.compress. Packed bytes, scale bytes and
globals must equal mx2nv's. compressed-tensors then decompresses mx2nv's
output, and the report's per-module errors must match a numpy recomputation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from compressed_tensors.compressors import MXFP4PackedCompressor, NVFP4PackedCompressor
from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

from checkpoints import SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, open_checkpoint
from conftest import WIDE_MODULE, mx2nv
from oracles import mxfp4_values, nvfp4_values, u8
from test_compressed_tensors import group_for, is_fp4a16_nvfp4

NVFP4A16 = preset_name_to_scheme("NVFP4A16", ["Linear"])
PARTNERS = {".w1": ".w3", ".w3": ".w1", ".gate_proj": ".up_proj", ".up_proj": ".gate_proj"}


@pytest.fixture(scope="session")
def requantized(outputs, tmp_path_factory) -> dict[str, tuple]:
    """case -> (MXFP4 source, requantized output, report)."""
    root = tmp_path_factory.mktemp("requantize")
    cases = {"demo": outputs["demo"][0]}
    common = ["--layers", "2", "--experts", "3", "--hidden", "128", "--intermediate", "64"]
    # Over every window: convert refuses it, requantize must not.
    mx2nv("generate", root / "wide", "--layout", "k3", "--shards", "2", "--set-span", f"{WIDE_MODULE}=30", *common)
    cases["wide"] = root / "wide"
    mx2nv("generate", root / "flat", "--layout", "flat", "--shards", "1", "--seed", "11", "--span", "24", *common)
    cases["flat_single_file"] = root / "flat"
    out = {}
    for name, src in cases.items():
        dst, report = root / f"{name}-rq", root / f"{name}-report.json"
        mx2nv("requantize", src, dst, "--threads", "2", "--report", report)
        out[name] = (src, dst, json.loads(report.read_text()))
    return out


CASES = ["demo", "wide", "flat_single_file"]


def partner(module: str) -> str | None:
    for suffix, other in PARTNERS.items():
        if module.endswith(suffix):
            return module[: -len(suffix)] + other
    return None


def decoded(src, module: str) -> torch.Tensor:
    """compressed-tensors' own decoding of the MXFP4 module, as float32 (exact)."""
    (scheme,) = QuantizationConfig.model_validate(src.quant_config).config_groups.values()
    w = MXFP4PackedCompressor.decompress(
        {"weight_packed": src.tensor(module + SUFFIX_PACKED), "weight_scale": src.tensor(module + SUFFIX_SCALE)}, scheme
    )["weight"]
    return w.to(torch.float32)


def ct_quantize(src, module: str) -> dict[str, torch.Tensor]:
    w = decoded(src, module)
    pair = [w] + ([decoded(src, partner(module))] if partner(module) in set(src.modules()) else [])
    global_scale = generate_gparam(torch.stack([p.min() for p in pair]).min(), torch.stack([p.max() for p in pair]).max())
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 16, 16)
    scale, _ = calculate_qparams(blocks.amin(dim=-1), blocks.amax(dim=-1), NVFP4A16.weights, global_scale=global_scale)
    return NVFP4PackedCompressor.compress(
        {"weight": w, "weight_scale": scale, "weight_global_scale": global_scale}, NVFP4A16
    )


def test_decoded_values_are_the_mxfp4_values(requantized):
    src = open_checkpoint(requantized["wide"][0])
    m = WIDE_MODULE
    expect = mxfp4_values(u8(src.tensor(m + SUFFIX_PACKED)), u8(src.tensor(m + SUFFIX_SCALE)))
    assert np.array_equal(decoded(src, m).numpy().astype(np.float64), expect)


@pytest.mark.parametrize("case", CASES)
def test_bytes_equal_compressed_tensors_quantization(requantized, case):
    src_dir, dst_dir, _ = requantized[case]
    src, dst = open_checkpoint(src_dir), open_checkpoint(dst_dir)
    assert src.modules() == dst.modules()
    differing = []
    for m in src.modules():
        ct = ct_quantize(src, m)
        ours = {s: dst.tensor(m + s) for s in (SUFFIX_PACKED, SUFFIX_SCALE, SUFFIX_GLOBAL)}
        assert ours[SUFFIX_SCALE].dtype == torch.float8_e4m3fn
        if not (
            np.array_equal(u8(ct["weight_packed"]), u8(ours[SUFFIX_PACKED]))
            and np.array_equal(u8(ct["weight_scale"]), u8(ours[SUFFIX_SCALE]))
            and torch.equal(ct["weight_global_scale"].reshape(1), ours[SUFFIX_GLOBAL])
        ):
            differing.append(m)
    assert differing == []


@pytest.mark.parametrize("case", CASES)
def test_compressed_tensors_decompresses_the_output(requantized, case):
    _, dst_dir, _ = requantized[case]
    dst = open_checkpoint(dst_dir)
    cfg = QuantizationConfig.model_validate(dst.quant_config)
    scheme = group_for(cfg)
    assert is_fp4a16_nvfp4(scheme.weights, scheme.input_activations)
    for m in dst.modules():
        t = {s: dst.tensor(m + s) for s in (SUFFIX_PACKED, SUFFIX_SCALE, SUFFIX_GLOBAL)}
        w = NVFP4PackedCompressor.decompress(
            {"weight_packed": t[SUFFIX_PACKED], "weight_scale": t[SUFFIX_SCALE], "weight_global_scale": t[SUFFIX_GLOBAL]},
            scheme,
        )["weight"]
        assert torch.isfinite(w).all(), m
        # compressed-tensors computes scale / global in float32 and returns the unpacked dtype (BF16): the
        # exact value code x scale / global up to that dtype's rounding.
        exact = nvfp4_values(u8(t[SUFFIX_PACKED]), u8(t[SUFFIX_SCALE]), float(t[SUFFIX_GLOBAL][0]))
        np.testing.assert_allclose(w.to(torch.float64).numpy(), exact, rtol=torch.finfo(w.dtype).eps, atol=0)


@pytest.mark.parametrize("case", CASES)
def test_reported_errors_match_an_independent_recomputation(requantized, case):
    src_dir, dst_dir, report = requantized[case]
    src, dst = open_checkpoint(src_dir), open_checkpoint(dst_dir)
    table = {row["module"]: row for row in report["requantized"]}
    assert report["command"] == "requantize" and report["result"] == "ok"
    assert sorted(table) == src.modules()
    for m in src.modules():
        x = mxfp4_values(u8(src.tensor(m + SUFFIX_PACKED)), u8(src.tensor(m + SUFFIX_SCALE)))
        g = float(dst.tensor(m + SUFFIX_GLOBAL)[0])
        q = nvfp4_values(u8(dst.tensor(m + SUFFIX_PACKED)), u8(dst.tensor(m + SUFFIX_SCALE)), g)
        row = table[m]
        assert row["values"] == x.size
        assert row["global_scale"] == g
        assert row["relative_rmse"] == pytest.approx(np.sqrt(np.sum((q - x) ** 2) / np.sum(x**2)), rel=1e-9, abs=1e-300)
        cos = np.sum(q * x) / np.sqrt(np.sum(x**2) * np.sum(q**2))
        assert row["cosine"] == pytest.approx(cos, rel=1e-12)
        assert row["max_abs_error"] == pytest.approx(np.max(np.abs(q - x)), rel=1e-12)
    # Over-span modules cost precision, but the table must show a real error for them, not zero.
    if case == "wide":
        assert table[WIDE_MODULE]["relative_rmse"] > 0


def test_gate_up_pairs_keep_one_global(requantized):
    """vLLM applies the gate's global to both halves of w13: the pair's globals are equal,
    and come from the pair's absolute max, not each module's own."""
    src, dst = open_checkpoint(requantized["wide"][0]), open_checkpoint(requantized["wide"][1])
    own_differs = 0
    for m in src.modules():
        p = partner(m)
        if p is None:
            continue
        assert torch.equal(dst.tensor(m + SUFFIX_GLOBAL), dst.tensor(p + SUFFIX_GLOBAL)), m
        w = decoded(src, m)
        own_differs += int(not torch.equal(generate_gparam(w.min(), w.max()), dst.tensor(m + SUFFIX_GLOBAL)))
    assert own_differs > 0  # the fixture has pairs whose halves differ, so the rule is exercised
