"""SGLang 0.5.23's NVFP4 Marlin MoE scale path, re-derived from its released
wheel and checked value for value through its own code (sglang_marlin.py)
and the kernel decode (marlin_kernel.py). SGLang JIT-compiles the MoE kernel
from sources the sglang wheel itself ships (sglang/kernels/jit/csrc/gemm/
marlin_moe/marlin_template.h with gemm/marlin/dequant.h; sglang-kernel 0.4.10
is not involved on this path).

The path, for a block scale s (E4M3) and a global g = 1/weight_global_scale:
  * s -> fp16, x 2^7, the fp16 bits [14:7] kept as the S0E5M3 byte
    (srt/layers/quantization/marlin_utils_fp4.py:29-44); no rescale, no clamp;
  * the kernel reads that byte back as fp16 bits [14:7] (exact: s x 2^7) or,
    for bf16, widens its 5-bit exponent as E4 0 0 0 E3..E0 (dequant.h:476-488):
    right only when s x 2^7 >= 2, i.e. s >= 2^-6, the E4M3 normal range;
    E4M3 subnormal scales (2^-7, 2^-8, 2^-9 among mx2nv's powers of two) come
    out 2^-112 times too small;
  * g = 1 / weight_global_scale in FP32 (schemes/compressed_tensors_w4a16_
    nvfp4_moe.py:207, :212), cast to the activation dtype, then x 2^7 (fp16)
    or x 2^119 (bf16) in that dtype (marlin_utils_fp4.py:519-520, :47-59);
  * the kernel reads it in the activation dtype (marlin_template.h:626-629);
    w13's multiplies the output after the fp32 accumulator is narrowed to the
    activation dtype (:1615-1633), w2's is folded into the top-k routing
    weight in that dtype (:580-585): exact iff g x 2^(7|119) is a normal,
    finite number of the dtype.

So, for power-of-two values (what mx2nv writes):
  block scale 2^j (and 0x00): exact for every E4M3 power of two in fp16
    (2^-9 .. 2^8); in bf16 exact iff j >= -6.
  global g = 2^i: fp16 exact iff -21 <= i <= 8 (g x 2^7 in [2^-14, 2^15]);
    bf16 exact iff i <= 8 (g x 2^119 <= 2^127; any FP32 power of two g >=
    2^-127 casts exactly and lands far above bf16's smallest normal).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sglang_marlin
from checkpoints import SUFFIX_GLOBAL, SUFFIX_SCALE, open_checkpoint
from conftest import MARLIN_WINDOW_CASES
from oracles import e2m1, u8
from runtime_judge import marlin_decoder, moe_layers

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DECODE = marlin_decoder(sglang_marlin.scale_order, w13_global_in_dtype=True)
E4M3_POWERS = range(-9, 9)  # every power of two E4M3 holds


def scale_exact(j: int | None, dtype: str) -> bool:
    """Block scale 2^j (None: the 0x00 byte) decodes exactly."""
    return j is None or dtype == "fp16" or j >= -6


def global_exact(i: int, dtype: str) -> bool:
    """Multiplier g = 2^i (weight_global_scale 2^-i) is exact."""
    if dtype == "fp16":
        return -21 <= i <= 8
    return -127 <= i <= 8


def _experts(scales: list[float | None], globals_: list[float], seed: int = 0, hidden: int = 128, inter: int = 64):
    """One expert per global; row r of every projection has block scale
    scales[r % len(scales)] (None: 0x00)."""
    gen = torch.Generator().manual_seed(seed)

    def proj(rows, k, g):
        row_scales = torch.tensor([0.0 if scales[r % len(scales)] is None else scales[r % len(scales)]
                                   for r in range(rows)])
        return {"weight_packed": torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=gen),
                "weight_scale": row_scales[:, None].expand(rows, k // 16).to(torch.float8_e4m3fn),
                "weight_global_scale": torch.tensor([1.0 / g], dtype=torch.float32)}

    return {e: {"w1": proj(inter, hidden, g), "w3": proj(inter, hidden, g), "w2": proj(hidden, inter, g)}
            for e, g in enumerate(globals_)}


def _exact_rows(experts, dtype: str) -> dict[tuple[int, str], torch.Tensor]:
    """(expert, projection) -> per row: every weight SGLang's path and kernel
    compute equals code x scale x g."""
    got = DECODE(sglang_marlin.load_layer(experts, DTYPES[dtype]), DTYPES[dtype])
    out = {}
    for e, projs in experts.items():
        for proj, t in projs.items():
            s = t["weight_scale"].float().numpy().astype(np.float64)
            g = 1.0 / float(t["weight_global_scale"][0])
            want = torch.from_numpy(e2m1(u8(t["weight_packed"])) * np.repeat(s, 16, axis=1) * g)
            out[(e, proj)] = (got[proj][e] == want).all(dim=-1)
    return out


SCALES = [None, *E4M3_POWERS]


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_scale_rule(dtype):
    """Every E4M3 power of two, and 0x00, as block scales of a layer (one
    per row): exact exactly where the rule says (fp16: all; bf16: 2^-6 and
    up), in w1, w3 and w2."""
    values = [None if j is None else 2.0**j for j in SCALES]
    assert all(torch.tensor(v).to(torch.float8_e4m3fn).float().item() == v for v in values if v is not None)
    rows = _exact_rows(_experts(values, [1.0]), dtype)
    for (_, proj), exact in rows.items():
        want = torch.tensor([scale_exact(SCALES[r % len(SCALES)], dtype) for r in range(exact.numel())])
        assert torch.equal(exact, want), (proj, dtype)


BOUNDARY_GLOBALS = [-127, -25, -22, -21, -14, 0, 8, 9]


@pytest.mark.parametrize("dtype", DTYPES)
def test_global_rule_at_the_boundaries(dtype):
    """The smallest and largest multipliers that stay exact, and the first
    beyond them (fp16: 2^-22 gives a subnormal 2^-15 after x 2^7, 2^-25 casts
    to 0, 2^9 gives 2^16 = inf; bf16: 2^9 x 2^119 = 2^128 = inf), one expert
    each, for w13 and w2."""
    rows = _exact_rows(_experts([1.0], [2.0**i for i in BOUNDARY_GLOBALS]), dtype)
    for (e, proj), exact in rows.items():
        assert bool(exact.all()) == global_exact(BOUNDARY_GLOBALS[e], dtype), (proj, BOUNDARY_GLOBALS[e], dtype)
        assert bool(exact.any()) == bool(exact.all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_smallest_and_largest_exact_scale_with_extreme_globals(dtype):
    """The limits hold together: the smallest exact block scale with the
    smallest exact global, the largest with the largest."""
    lo, g_lo = (-9, -21) if dtype == "fp16" else (-6, -127)
    rows = _exact_rows(_experts([2.0**lo, 2.0**8], [2.0**g_lo, 2.0**8]), dtype)
    assert all(bool(exact.all()) for exact in rows.values())


@pytest.mark.parametrize("case", [c for c in MARLIN_WINDOW_CASES if c != "demo"])
def test_marlin_window_stays_inside_sglang_rules(outputs, case):
    """Every block scale and global mx2nv's marlin window wrote lies in the
    exact sets of both dtypes (powers of two or zero), so the window is exact
    on SGLang by these rules, not only on the fixtures test_runtimes.py runs."""
    ck = open_checkpoint(outputs[case][1])
    for layer in moe_layers(ck):
        for module in layer.names.values():
            scales = ck.tensor(module + SUFFIX_SCALE).float()
            active = scales[scales != 0]
            js = torch.log2(active)
            assert torch.equal(js, js.round()), module
            g = 1.0 / float(ck.tensor(module + SUFFIX_GLOBAL).reshape(-1)[0])
            i = float(np.log2(g))
            assert i == round(i), module
            for dtype in DTYPES:
                assert all(scale_exact(int(j), dtype) for j in js.unique().tolist()), (module, dtype)
                assert global_exact(int(i), dtype), (module, dtype, i)


def test_e4m3_window_leaves_the_rules_where_sglang_fails(outputs):
    """The e4m3 window's wide span puts block scales below 2^-6 (bf16 rule
    broken) and its quiet case a global below 2^-21 (fp16 rule broken):
    the rules predict the failures test_runtimes.py observes."""
    wide = open_checkpoint(outputs["wide_e4m3"][1])
    small = [m for layer in moe_layers(wide) for m in layer.names.values()
             if (lambda s: bool(((s != 0) & (s < 2.0**-6)).any()))(wide.tensor(m + SUFFIX_SCALE).float())]
    assert small
    quiet = open_checkpoint(outputs["quiet_e4m3"][1])
    gs = [1.0 / float(quiet.tensor(m + SUFFIX_GLOBAL).reshape(-1)[0])
          for layer in moe_layers(quiet) for m in layer.names.values()]
    assert any(not global_exact(int(np.log2(g)), "fp16") for g in gs)
    assert all(global_exact(int(np.log2(g)), "bf16") for g in gs)
