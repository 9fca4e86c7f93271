"""Oracle 3: the runtimes' own code. Every NVFP4 output goes through vLLM
0.34.0's and SGLang 0.5.23's released load paths (their expert weight
loaders, NVFP4 MoE method/scheme and Marlin or Humming scale/global
processing, run from the wheels on the CPU: vllm_marlin.py, sglang_marlin.py,
vllm_humming.py with humming-kernels 0.1.19's own Python); the kernel's byte
decode (marlin_kernel.py, humming_kernel.py) turns what they hand the kernel
into weights, and every weight must equal the MXFP4 source value, in fp16 and
in bf16.

Backends judged: vLLM Marlin (GPUs without FP4 tensor cores except sm90, or
--moe-backend marlin), vLLM Humming (sm90: H100/H200) and SGLang's
CompressedTensorsW4A16Nvfp4MoE (FP4 Marlin). Humming-only facts (windows it
also reproduces, gate/up globals, its compile-time flags) are in
test_humming.py."""

import json
import shutil

import numpy as np
import pytest
import torch

import humming_kernel
import sglang_marlin
import vllm_humming
import vllm_marlin
from checkpoints import SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, open_checkpoint, patch_bytes, tensor_location
from conftest import MARLIN_WINDOW_CASES, QUIET_MODULE, mx2nv, report_of
from oracles import mxfp4_values, numerics, u8
from runtime_judge import judge, marlin_decoder, moe_layers

# backend -> (its load path, the kernel's decode)
BACKENDS = {"vllm-marlin": (vllm_marlin.load_layer, marlin_decoder(vllm_marlin.scale_order)),
            "vllm-humming": (vllm_humming.load_layer, humming_kernel.weights),
            "sglang-marlin": (sglang_marlin.load_layer, marlin_decoder(sglang_marlin.scale_order, w13_global_in_dtype=True))}
MARLIN_BACKENDS = ["vllm-marlin", "sglang-marlin"]
# The demo has the k3 case's layout at 4x the size; the other oracles cover it.
RUNTIME_CASES = [c for c in MARLIN_WINDOW_CASES if c != "demo"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def source_values(ck, module):
    return torch.from_numpy(mxfp4_values(u8(ck.tensor(module + SUFFIX_PACKED)), u8(ck.tensor(module + SUFFIX_SCALE))))


def run(backend: str, src, dst, dtype: str) -> dict:
    load, decode = BACKENDS[backend]
    return judge(open_checkpoint(src), open_checkpoint(dst), load, decode, DTYPES[dtype], source_values)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", RUNTIME_CASES)
def test_marlin_window_output_is_exact_through_the_runtime(outputs, case, backend, dtype):
    src, dst = outputs[case]
    report = run(backend, src, dst, dtype)
    assert report["layers"] > 0 and report["values"] > 0
    assert report["bad"] == []
    assert report["mismatches"] == 0
    assert report["zeroed_groups"] == 0
    assert not any("must match" in w for w in report["warnings"])


def test_quiet_fixture_exercises_raised_globals(outputs):
    """The quiet case really is quiet: m = k_max - 8 would leave the fp16
    range, and the plan raised those globals (the module at the boundary to
    exactly 2^-14 after x 2^7)."""
    src, dst = outputs["quiet"]
    report = json.loads(mx2nv("inspect", src, "--json").stdout)
    assert report["outcomes"]["marlin"]["raised_globals"] == report["counts"]["scale_groups"]
    g = float(open_checkpoint(dst).tensor(QUIET_MODULE + SUFFIX_GLOBAL)[0])
    assert g == 2.0**21  # multiplier 2^-21: x 2^7 = 2^-14, the smallest normal fp16


@pytest.mark.parametrize("backend", MARLIN_BACKENDS)
def test_e4m3_window_quiet_output_fails_in_fp16(outputs, backend):
    """The e4m3 window keeps m = k_max - 8 for quiet experts: right on disk,
    but the fp16 global leaves the normal range, so the Marlin paths' fp16
    weights are wrong (vLLM: folded into the routing weight; SGLang: the global itself
    is cast to fp16 first). bf16 has the range and stays exact."""
    src, dst = outputs["quiet_e4m3"]
    assert numerics(open_checkpoint(src), open_checkpoint(dst))["mismatches"] == 0
    assert run(backend, src, dst, "bf16")["mismatches"] == 0
    fp16 = run(backend, src, dst, "fp16")
    assert fp16["mismatches"] > 0
    assert any(m.endswith(".w2") for m in fp16["bad"])
    assert report_of("verify", src, dst, "--window", "marlin")["result"] == "mismatch"  # verify under marlin says so too


@pytest.mark.parametrize("dtype", DTYPES)
def test_vllm_zeroes_exactly_the_groups_mx2nv_predicts(outputs, dtype):
    """An e4m3-window output with span 16: vLLM's clamp zeroes block scales
    below 2^-6 in both dtypes, and those are exactly the groups inspect and
    verify count."""
    src, dst = outputs["wide_e4m3"]
    report = run("vllm-marlin", src, dst, dtype)
    verify = report_of("verify", src, dst, "--window", "e4m3")
    predicted = json.loads(mx2nv("inspect", src, "--window", "e4m3", "--json").stdout)["outcomes"]["e4m3"]
    assert verify["result"] == "ok"
    assert report["zeroed_groups"] > 0
    assert report["zeroed_groups"] == verify["counts"]["marlin_zeroed_groups"] == predicted["marlin_zeroed_groups"]
    assert report["mismatches"] > 0
    assert report_of("verify", src, dst, "--window", "marlin")["result"] == "mismatch"


def test_sglang_misreads_small_scales_in_bf16_only(outputs):
    """SGLang 0.5.23 has no clamp: block scales below 2^-6 reach the kernel,
    whose bf16 scale decode is wrong for them (about 2^-112 too small; fp16's
    decode is right)."""
    src, dst = outputs["wide_e4m3"]
    bf16 = run("sglang-marlin", src, dst, "bf16")
    assert bf16["mismatches"] > 0
    assert run("sglang-marlin", src, dst, "fp16")["mismatches"] == 0


def _damage_one_scale(dst, module):
    ck = open_checkpoint(dst)
    shard = dst / ck.weight_map[module + SUFFIX_SCALE]
    begin, _ = tensor_location(shard, module + SUFFIX_SCALE)
    old = shard.read_bytes()[begin]
    patch_bytes(shard, begin, bytes([old + 8 if old < 0x70 else old - 8]))  # one block scale x2 or /2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_broken_output_fails(outputs, broken_copy, backend, dtype):
    src, dst = broken_copy("k3")
    module = moe_layers(open_checkpoint(dst))[0].names[(1, "w3")]
    _damage_one_scale(dst, module)
    report = run(backend, src, dst, dtype)
    assert report["bad"] == [module]
    assert report["mismatches"] > 0


def _mismatch_up_global(good, tmp_path):
    """A hand-made NVFP4 output whose first expert's w3 carries its own global
    (divisor and block scales both halved: right value for value on disk)."""
    dst = tmp_path / "mismatched-globals"
    shutil.copytree(good, dst)
    ck = open_checkpoint(dst)
    layer = moe_layers(ck)[0]
    up = layer.names[(layer.experts[0], "w3")]
    g_shard = dst / ck.weight_map[up + SUFFIX_GLOBAL]
    g_at, _ = tensor_location(g_shard, up + SUFFIX_GLOBAL)
    g = np.frombuffer(g_shard.read_bytes()[g_at : g_at + 4], dtype=np.float32)
    patch_bytes(g_shard, g_at, (g / 2).astype(np.float32).tobytes())
    s_shard = dst / ck.weight_map[up + SUFFIX_SCALE]
    s_at, s_end = tensor_location(s_shard, up + SUFFIX_SCALE)
    scales = torch.frombuffer(bytearray(s_shard.read_bytes()[s_at:s_end]), dtype=torch.uint8).view(torch.float8_e4m3fn)
    patch_bytes(s_shard, s_at, (scales.float() / 2).to(torch.float8_e4m3fn).view(torch.uint8).numpy().tobytes())
    return dst, up


def test_gate_up_global_mismatch_vllm_warns_and_is_wrong(outputs, tmp_path):
    src, good = outputs["k3"]
    dst, up = _mismatch_up_global(good, tmp_path)
    assert numerics(open_checkpoint(src), open_checkpoint(dst))["mismatches"] == 0  # file-level values agree
    report = run("vllm-marlin", src, dst, "bf16")
    assert any("w1_weight_global_scale must match w3_weight_global_scale" in w for w in report["warnings"])
    assert report["bad"] == [up]
    result = mx2nv("verify", src, dst, check=False)
    assert result.returncode == 1
    assert "vLLM applies the gate's to both" in result.stderr
    gate = mx2nv("gate", dst, "--runtime", "all", "--json", check=False)
    assert gate.returncode == 1
    verdicts = {(v["runtime"], v["backend"]): v for v in json.loads(gate.stdout)["verdicts"]}
    assert verdicts[("vllm", "marlin")]["verdict"] == "BLOCKED"
    assert verdicts[("sglang", "marlin")]["verdict"] == "BLOCKED"


def test_gate_up_global_mismatch_sglang_refuses_to_load(outputs, tmp_path):
    src, good = outputs["k3"]
    dst, _ = _mismatch_up_global(good, tmp_path)
    with pytest.raises(ValueError, match="share one weight_global_scale"):
        run("sglang-marlin", src, dst, "bf16")
