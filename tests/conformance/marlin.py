"""vLLM's NVFP4A16 fused-MoE load path through Marlin, emulated with torch on
the CPU. Followed from vLLM's code (compressed-tensors MoE method with
use_a16=True, `prepare_nvfp4_moe_layer_for_marlin` and
`marlin_utils_fp4.py` after PR #37502, the kernel's `dequant_fp8_scales` and
FP4 `dequant` in csrc/quantization/marlin/dequant.h); see
../shared/reference/formats.md section 2. Written for this suite, not copied.

What is emulated, bit for bit:
  * w13 = [w1; w3] per expert, `w13_weight_global_scale[:, 0]` (the gate's)
    used for both halves, the divisor inverted to a multiplier;
  * block scales: cast to fp16, the layer-wide power-of-two rescale `sf`
    (bf16 only: 2^floor(log2(448*2^7 / max(scale*2^7)))), x2^7 in fp16, the
    clamp `scale*2^7 < 2 -> 0`, and the S0E5M3 byte (fp16 bits << 1, high byte);
  * the kernel's decoding: FP4 codes placed into fp16/bf16 bit fields without
    bias correction, S0E5M3 bytes widened into fp16 / bf16 (E4 000 E3..E0 for
    bf16), weight x scale in the activation dtype, then the global scale times
    2^(bias - 7) / sf (bias 14 for fp16, 126 for bf16).
Not emulated: the Marlin tile permutations (they move values, never change them)
and the GEMM itself.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

from checkpoints import SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, Checkpoint

EXPERT = re.compile(r"^(?P<layer>.*)\.(?P<expert>\d+)\.(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)$")
GATE, UP, DOWN = {"w1", "gate_proj"}, {"w3", "up_proj"}, {"w2", "down_proj"}


@dataclass
class MoeLayer:
    prefix: str
    experts: list[int]
    names: dict[tuple[int, str], str] = field(default_factory=dict)  # (expert, gate|up|down) -> module


def moe_layers(ck: Checkpoint) -> list[MoeLayer]:
    layers: dict[str, MoeLayer] = {}
    for m in ck.modules():
        hit = EXPERT.match(m)
        if not hit:
            continue
        role = "gate" if hit["proj"] in GATE else "up" if hit["proj"] in UP else "down"
        layer = layers.setdefault(hit["layer"], MoeLayer(hit["layer"], []))
        e = int(hit["expert"])
        if e not in layer.experts:
            layer.experts.append(e)
        layer.names[(e, role)] = m
    for layer in layers.values():
        layer.experts.sort()
    return list(layers.values())


# --- the load-time processing ------------------------------------------------

def scale_factor(scales_e4m3: torch.Tensor, dtype: torch.dtype) -> float:
    """`_nvfp4_compute_scale_factor`: one power of two for all experts of a weight."""
    if dtype == torch.float16:
        return 1.0
    ws = scales_e4m3.float() * 2**7
    positive = ws[ws > 0]
    if positive.numel() == 0:
        return 1.0
    peak = float(positive.max())
    if peak < 448 * 2**7:
        return float(2 ** math.floor(math.log2(448 * 2**7 / peak)))
    return 1.0


def process_scales(scales_e4m3: torch.Tensor, sf: float) -> torch.Tensor:
    """`nvfp4_marlin_process_scales` without the tile permutation: E4M3 -> S0E5M3 bytes."""
    s = scales_e4m3.to(torch.float16)
    if sf > 1.0:
        s = (s.float() * sf).to(torch.float16)
    s = s * 2**7
    s[s < 2] = 0
    bits = s.view(torch.int16).to(torch.int32) & 0xFFFF
    return ((bits << 1) >> 8) & 0xFF


def process_global(multiplier: torch.Tensor, dtype: torch.dtype, sf: float) -> torch.Tensor:
    """`nvfp4_marlin_process_global_scale` followed by the division by sf."""
    target_exponent = 5 if dtype == torch.float16 else 8
    bias = 2 ** (target_exponent - 1) - 2 ** (2 - 1)
    return (multiplier.float() * 2.0 ** (bias - 7)) / sf


# --- what the kernel computes from those bytes -------------------------------

def kernel_fp4(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """FP4 codes placed into the fp16/bf16 bit field (no bias correction)."""
    lo, hi = packed & 0x0F, packed >> 4
    codes = torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2).to(torch.int32)
    shift = 9 if dtype == torch.float16 else 6  # mantissa width - 1
    bits = ((codes & 0x8) << 12) | ((codes & 0x7) << shift)
    return bits.to(torch.int16).view(dtype)


def kernel_scale(code: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`dequant_fp8_scales`: fp16 takes the byte as exponent+mantissa; bf16
    widens the 5-bit exponent as E4 0 0 0 E3..E0, exact only when E4 is 1."""
    if dtype == torch.float16:
        bits = code << 7
    else:
        bits = ((code & 0x80) << 7) | ((code & 0x7F) << 4)
    return bits.to(torch.int16).view(dtype)


@dataclass
class MarlinWeights:
    w13: torch.Tensor          # [E, 2N, K] float32: what the kernel multiplies by
    w2: torch.Tensor           # [E, K, N]
    zeroed_groups: int         # active 32-groups whose block scale Marlin flushed
    globals_differ: list[int]  # experts whose w1 and w3 globals differ (vLLM warns and uses w1's)


def dequantize(packed: torch.Tensor, scale_e4m3: torch.Tensor, global_divisor: torch.Tensor, dtype: torch.dtype):
    """packed [E, R, K/2] u8, scale [E, R, K/16] e4m3, divisor [E] f32 -> ([E, R, K] f32, zeroed groups)."""
    sf = scale_factor(scale_e4m3, dtype)
    codes = process_scales(scale_e4m3, sf)
    g = process_global(1.0 / global_divisor.float(), dtype, sf)  # CT stores the divisor; vLLM inverts it
    w = kernel_fp4(packed, dtype) * kernel_scale(codes, dtype).repeat_interleave(16, dim=-1)
    weight = w.float() * g.view(-1, 1, 1)
    # Which active halves lost their scale, counted per 32-group.
    nibbles = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1)
    active_half = ((nibbles & 0x7) != 0).reshape(*nibbles.shape[:-1], -1, 16).any(dim=-1)
    flushed = (scale_e4m3.float() > 0) & (codes == 0) & active_half
    zeroed = int(flushed.reshape(*flushed.shape[:-1], -1, 2).any(dim=-1).sum())
    return weight, zeroed


def load_layer(ck: Checkpoint, layer: MoeLayer, dtype: torch.dtype) -> MarlinWeights:
    def stack(role: str, suffix: str) -> torch.Tensor:
        return torch.stack([ck.tensor(layer.names[(e, role)] + suffix) for e in layer.experts])

    w13_packed = torch.cat([stack("gate", SUFFIX_PACKED), stack("up", SUFFIX_PACKED)], dim=1)
    w13_scale = torch.cat([stack("gate", SUFFIX_SCALE), stack("up", SUFFIX_SCALE)], dim=1)
    w13_global = torch.cat([stack("gate", SUFFIX_GLOBAL), stack("up", SUFFIX_GLOBAL)], dim=1)  # [E, 2]
    differ = [e for i, e in enumerate(layer.experts) if not torch.equal(w13_global[i, 0], w13_global[i, 1])]
    w13, z13 = dequantize(w13_packed, w13_scale, w13_global[:, 0], dtype)
    w2, z2 = dequantize(stack("down", SUFFIX_PACKED), stack("down", SUFFIX_SCALE), stack("down", SUFFIX_GLOBAL)[:, 0], dtype)
    return MarlinWeights(w13, w2, z13 + z2, differ)


def compare_with_source(src: Checkpoint, dst: Checkpoint, dtype: torch.dtype, source_values) -> dict:
    """Every Marlin-dequantized weight against the MXFP4 source value."""
    report = {"layers": 0, "values": 0, "mismatches": 0, "zeroed_groups": 0, "globals_differ": []}
    for layer in moe_layers(dst):
        mw = load_layer(dst, layer, dtype)
        report["layers"] += 1
        report["zeroed_groups"] += mw.zeroed_groups
        report["globals_differ"] += [f"{layer.prefix}.{e}" for e in mw.globals_differ]
        for i, e in enumerate(layer.experts):
            gate, up, down = (source_values(src, layer.names[(e, r)]) for r in ("gate", "up", "down"))
            expected_w13 = torch.cat([gate, up], dim=0)
            for got, want in ((mw.w13[i], expected_w13), (mw.w2[i], down)):
                report["values"] += want.numel()
                report["mismatches"] += int((got.double() != want).sum())
    return report
