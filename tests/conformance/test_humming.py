"""vLLM 0.34.0's Humming backend (sm90: H100/H200) beyond the common matrix
of test_runtimes.py: the compile-time path the decode emulates is the one
humming's own LayerConfig selects, the kernel source still holds the
instructions humming_kernel.py relies on, and what Humming does with the
outputs Marlin cannot run (block scales below 2^-6, quiet experts' globals,
gate and up globals that differ)."""

import json

import pytest
import torch

import humming_code
import humming_kernel
import marlin_kernel
import vllm_humming
from checkpoints import open_checkpoint
from conftest import mx2nv
from runtime_judge import checkpoint_experts, moe_layers
from test_runtimes import DTYPES, _mismatch_up_global, run, source_values


@pytest.mark.parametrize("dtype", DTYPES)
def test_humming_compiles_the_path_the_decode_emulates(outputs, dtype):
    src, dst = outputs["k3"]
    ck = open_checkpoint(dst)
    k = vllm_humming.load_layer(checkpoint_experts(ck, moe_layers(ck)[0]), DTYPES[dtype])
    h = humming_code.package()
    for name, config in k.configs.items():
        assert config.sm_version == humming_code.SM90
        assert config.a_dtype == config.c_dtype == h.dtypes.DataType.from_torch_dtype(DTYPES[dtype])
        assert config.b_dtype == h.dtypes.float4e2m1 and config.bs_dtype == h.dtypes.float8e4m3
        assert config.weight_scale_group_size == 16 and config.is_group_weight_scale
        # One FP32 multiplier per expert: mx2nv's gate and up share their global.
        assert config.is_tensor_weight_scale_2, name
        assert not (config.use_native_dequant or config.use_block_scaled_mma or config.use_fused_e8m0_scale
                    or config.use_int_weight_scale or config.should_apply_bs_on_c), name
        t = getattr(k, name)
        assert t["weight_scale_2"].dtype == torch.float32 and t["weight_scale_2"].shape == (len(moe_layers(ck)[0].experts),)
    # What vLLM hands the kernel as w1's global is that FP32 tensor (moe.py:177-178).
    assert k.quant_config.w1_gscale is not None
    assert torch.equal(k.quant_config.w1_gscale, k.w13["weight_scale_2"])


@pytest.mark.parametrize(("rel", "line", "text"), [
    ("include/humming/datatype/dequant_native.cuh", 92, "cvt.rn.f16x2.e4m3x2"),
    ("include/humming/datatype/dequant_native.cuh", 10, "__CUDA_ARCH__ >= 890"),
    ("include/humming/datatype/dequant.cuh", 143, "dequant_native<SourceType, Float16>"),
    ("include/humming/datatype/dequant.cuh", 147, "__float22bfloat162_rn"),
    ("include/humming/datatype/dequant_single.cuh", 112, "diff_exp_bits = TargetType::kExponentBits - SourceType::kExponentBits"),
    ("include/humming/arith/mainloop_arith.cuh", 45, "kUseNativeDequantBS"),
    ("include/humming/arith/mainloop_arith.cuh", 231, "__hmul2(b_f16_ptr[i * 2 + k], bs_single)"),
    ("include/humming/arith/exp_offset.cuh", 99, "max_allowed_offset - ElementQB::kBits + 1"),
    ("include/humming/arith/epilogue_arith.cuh", 122, "gs_f32 *= prepare_exp_scale_factor<float, kExpOffset.x>()"),
    ("include/humming/arith/epilogue_arith.cuh", 148, "regs.x = regs.x * gs_f32"),
    ("include/humming/arith/epilogue_arith.cuh", 220, "__hmul2(regs_half2[0], cs_half2[col])"),
    ("schema/compressed_tensors.py", 248, "1 / weight_scale_2"),
    ("schema/compressed_tensors.py", 261, "to(param_dtype)"),
])
def test_kernel_source_holds_what_the_decode_relies_on(rel, line, text):
    assert text in humming_code.source_line(rel, line)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["wide_e4m3", "quiet_e4m3"])
def test_humming_is_exact_where_marlin_is_not(outputs, case, dtype):
    """Humming decodes every E4M3 block scale in hardware (subnormals too) and
    applies the per-expert global in FP32: the e4m3 window's outputs, which
    vLLM's Marlin path zeroes (span 16) or misreads in fp16 (quiet experts),
    are exact through it."""
    src, dst = outputs[case]
    report = run("vllm-humming", src, dst, dtype)
    assert report["values"] > 0 and report["mismatches"] == 0 and report["zeroed_groups"] == 0
    gate = json.loads(mx2nv("gate", dst, "--runtime", "vllm", "--dtype", dtype, "--json", check=False).stdout)
    verdicts = {v["backend"]: v for v in gate["verdicts"]}
    assert verdicts["humming"]["verdict"] == "RUN", verdicts["humming"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_gate_up_globals_that_differ_stay_exact_through_humming(outputs, tmp_path, dtype):
    """Humming keeps both halves' globals (per channel, in the activation
    dtype): a power-of-two pair of normal multipliers is exact, where vLLM's
    Marlin path applies w1's to both."""
    src, good = outputs["k3"]
    dst, up = _mismatch_up_global(good, tmp_path)
    report = run("vllm-humming", src, dst, dtype)
    assert report["mismatches"] == 0 and report["values"] > 0
    assert run("vllm-marlin", src, dst, dtype)["bad"] == [up]
    ck = open_checkpoint(dst)
    k = vllm_humming.load_layer(checkpoint_experts(ck, moe_layers(ck)[0]), DTYPES[dtype])
    assert k.configs["w13"].is_channel_weight_scale_2 and k.configs["w2"].is_tensor_weight_scale_2
    assert k.w13["weight_scale_2"].dtype == DTYPES[dtype]
    gate = json.loads(mx2nv("gate", dst, "--runtime", "vllm", "--dtype", dtype, "--json", check=False).stdout)
    verdicts = {v["backend"]: v for v in gate["verdicts"]}
    assert verdicts["humming"]["verdict"] == "RUN", verdicts["humming"]
    assert verdicts["marlin"]["verdict"] == "BLOCKED"


def test_per_channel_globals_below_the_fp16_range_fail_in_fp16(outputs, tmp_path):
    """On the quiet output (multipliers 2^-21 .. 2^-15), a differing gate/up
    pair moves every w13 global of the layer into fp16, where they are
    subnormal: Humming's fp16 output is wrong there, bf16 stays exact, and
    gate says so."""
    src, good = outputs["quiet"]
    dst, _ = _mismatch_up_global(good, tmp_path)
    fp16 = run("vllm-humming", src, dst, "fp16")
    assert fp16["mismatches"] > 0
    assert all(m.endswith((".w1", ".w3")) for m in fp16["bad"])
    assert run("vllm-humming", src, dst, "bf16")["mismatches"] == 0
    gate = json.loads(mx2nv("gate", dst, "--runtime", "vllm", "--json", check=False).stdout)
    verdicts = {(v["backend"], v["dtype"]): v for v in gate["verdicts"]}
    assert verdicts[("humming", "fp16")]["verdict"] == "BLOCKED"
    assert verdicts[("humming", "bf16")]["verdict"] == "RUN"


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_code_times_every_block_scale_is_exact_in_the_decode(dtype):
    """Exhaustive over the small domain: each of the 16 FP4 codes times each
    finite E4M3 block scale (subnormals included), decoded as the kernel does,
    equals e2m1 x scale x 2^-2 (the 2^2 goes on the global): no E4M3 scale is
    off-limits for Humming, unlike Marlin's 2^-6 floor."""
    t = DTYPES[dtype]
    scales = torch.arange(256, dtype=torch.uint8)
    scales = scales[(scales & 0x7F) != 0x7F]  # the two NaN encodings
    codes = torch.arange(16, dtype=torch.uint8)
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
    exact_codes = torch.cat([e2m1, -e2m1])
    exact_scales = scales.view(torch.float8_e4m3fn).double()
    b = marlin_kernel.fp4(codes | (codes << 4), t)[::2] * torch.tensor(2.0 ** humming_kernel.MAINLOOP_OFFSET[t], dtype=t)
    w = b.view(-1, 1) * humming_kernel.scale_to_dtype(scales, t).view(1, -1)
    want = exact_codes.view(-1, 1) * exact_scales.view(1, -1) / 4
    assert torch.equal(w.double(), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tp", [2, 4])
def test_each_tensor_parallel_rank_is_exact_through_humming(outputs, tp, dtype):
    """Per rank, vLLM's loader takes a slice of w1/w3 rows and w2 columns, and
    Humming pads N to 256 and K to 128 (utils/humming/moe.py:414-415): at TP 2
    and 4 the k3 layer (intermediate 128) is padded on both sublayers, and every
    rank's weights still equal the source's slice."""
    src, dst = outputs["k3"]
    s, d = open_checkpoint(src), open_checkpoint(dst)
    layer = moe_layers(d)[0]
    for rank in range(tp):
        k = vllm_humming.load_layer(checkpoint_experts(d, layer), DTYPES[dtype], tp_size=tp, tp_rank=rank)
        got = humming_kernel.weights(k, DTYPES[dtype])
        n = k.intermediate
        for i, e in enumerate(layer.experts):
            for proj in ("w1", "w3", "w2"):
                want = source_values(s, layer.names[(e, proj)])
                want = want[rank * n:(rank + 1) * n] if proj != "w2" else want[:, rank * n:(rank + 1) * n]
                assert torch.equal(got[proj][i], want), (rank, e, proj)
