"""The only emulated piece of the Humming backend: how its kernel turns what
vLLM's and humming's Python prepared (vllm_humming.py) into the weights it
multiplies with. Everything before is the runtimes' own code.

Read from the kernel sources in the humming-kernels 0.1.19 wheel
(humming/include/humming/..., JIT-compiled by NVRTC for the GPU at hand),
for sm90 with 16-bit activations and FP32 accumulation (vLLM's default,
VLLM_HUMMING_USE_F16_ACCUM=0: vllm/envs.py:1651-1652). The LayerConfig
humming's Python built fixes the compile-time flags (test_humming.py checks
them: no native FP4 dequant on sm90, config/config.py:196-198; no
block-scaled MMA, :176-185; group scales applied to B, :484-492):

  * FP4 codes: `fp_to_fp<Float4E2M1, half|bfloat16>` (datatype/dequant_single.cuh:85-118)
    places sign and the three E2M1 bits into the 16-bit field without bias
    correction: e2m1 x 2^-14 (fp16) or e2m1 x 2^-126 (bf16);
  * the bias is restored in two parts (arith/exp_offset.cuh:69-78, :85-131,
    :138-160): x 2^12 (fp16) or x 2^124 (bf16) on every weight in the
    activation dtype (arith/mainloop_arith.cuh:159-169), the remaining x 2^2
    on the global in FP32 (arith/epilogue_arith.cuh:119-122);
  * block scales: E4M3 bytes are converted by the hardware,
    `cvt.rn.f16x2.e4m3x2` (datatype/dequant_native.cuh:92, available from
    sm89, :8-15), for bf16 through fp16 and float (datatype/dequant.cuh:
    141-149): exact for every E4M3 value, subnormals included; no clamp,
    no rescale;
  * weight x block scale in the activation dtype (`__hmul2`,
    arith/mainloop_arith.cuh:229-231), then the MMA accumulates in FP32;
  * the global: one per expert (weight_scale_2 TENSOR) multiplies the FP32
    accumulator in FP32 (arith/epilogue_arith.cuh:146-149); per channel (a
    layer where some expert's gate and up globals differ) it is held in the
    activation dtype and multiplies the output after the accumulator was
    narrowed to that dtype (:217-220): judged exact iff the multiplier is a
    normal number of the dtype (a subnormal one drops bits of every output).

torch on the CPU computes a product of two fp16 (or two bf16) values in
float and rounds once, as __hmul2 does (both products fit a float exactly).
Not emulated: the GEMM and the tile order (the repack stub keeps codes in
checkpoint order; the scale order is inverted with humming's own
transform_humming_weight_scale run on indices).
"""

from __future__ import annotations

import torch

import humming_code
import marlin_kernel

# arith/exp_offset.cuh: total offset 14 (fp16) / 126 (bf16) for E2M1, of which
# the mainloop takes min(15 - 4 + 1, 14) = 12 / min(127 - 4 + 1, 126) = 124.
MAINLOOP_OFFSET = {torch.float16: 12, torch.bfloat16: 124}
EPILOGUE_OFFSET = 2


def _unpermute(processed: torch.Tensor, order: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    out = torch.empty_like(processed.reshape(-1))
    out[order] = processed.reshape(-1)
    return out.reshape(shape)


def scale_order(config, rows: int, groups: int) -> torch.Tensor:
    """Where humming's transform_humming_weight_scale (transform.py:477-527)
    puts each block scale of one expert's [rows, groups] tensor."""
    h = humming_code.package()
    index = torch.arange(rows * groups, dtype=torch.int64).reshape(1, rows, groups)
    return h.transform.transform_humming_weight_scale(index, to_apply_on_c=config.should_apply_bs_on_c).reshape(-1)


def channel_order(rows: int) -> torch.Tensor:
    """Where transform_humming_bias (transform.py:571-572) puts each
    per-channel global."""
    h = humming_code.package()
    return h.transform.transform_humming_bias(torch.arange(rows, dtype=torch.int64).reshape(1, rows)).reshape(-1)


def scale_to_dtype(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """E4M3 -> fp16 exactly (cvt.rn.f16x2.e4m3x2); bf16 via fp16 and float."""
    half = scale.view(torch.float8_e4m3fn).to(torch.float16)
    return half if dtype == torch.float16 else half.float().to(torch.bfloat16)


def sublayer_weights(t: dict[str, torch.Tensor], config, dtype: torch.dtype) -> torch.Tensor:
    """One sublayer's kernel inputs -> [E, N_pad, K_pad] float64 weights the
    kernel computes with (NaN where the output cannot be exact)."""
    experts, rows, words = t["weight"].shape
    codes = t["weight"].contiguous().view(torch.uint8).reshape(experts, rows, words * 4)
    groups = words * 8 // config.weight_scale_group_size
    order = scale_order(config, rows, groups)
    scales = torch.stack([_unpermute(t["weight_scale"][e].view(torch.uint8), order, (rows, groups))
                          for e in range(experts)])
    b = marlin_kernel.fp4(codes, dtype) * torch.tensor(2.0 ** MAINLOOP_OFFSET[dtype], dtype=dtype)
    w = b * scale_to_dtype(scales, dtype).repeat_interleave(config.weight_scale_group_size, dim=-1)
    if config.is_tensor_weight_scale_2:
        g = t["weight_scale_2"].float() * 2.0**EPILOGUE_OFFSET  # FP32, as the epilogue
        return w.double() * g.double().view(-1, 1, 1)
    assert config.is_channel_weight_scale_2, "NVFP4 through Humming has a second-level scale"
    gc = torch.stack([_unpermute(t["weight_scale_2"][e], channel_order(rows), (rows,)) for e in range(experts)])
    out = w.double() * 2.0**EPILOGUE_OFFSET * gc.double().unsqueeze(-1)
    normal = gc.abs() >= torch.finfo(dtype).tiny
    out[~normal.unsqueeze(-1).expand_as(out)] = float("nan")
    return out


def weights(k, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Kernel inputs of one layer -> {"w1", "w3": [E, N, K], "w2": [E, K, N]}."""
    w13 = sublayer_weights(k.w13, k.configs["w13"], dtype)
    w2 = sublayer_weights(k.w2, k.configs["w2"], dtype)
    n, hidden = k.intermediate, k.hidden
    return {"w1": w13[:, :n, :hidden], "w3": w13[:, n:2 * n, :hidden], "w2": w2[:, :hidden, :n]}
