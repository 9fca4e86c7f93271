"""Independent oracles. Each returns a report whose `mismatches` (or
`problems`) must be empty for a good output and non-empty for a broken one.

1. numerics: ml_dtypes decodes E2M1, E8M0 and E4M3; numpy compares.
2. compressed-tensors: its own config model and its own MXFP4 / NVFP4
   compressors decompress both sides.
3. vLLM's load path for NVFP4A16 MoE through Marlin, emulated with torch on
   the CPU from vLLM's code (see marlin.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from checkpoints import SUFFIX_GLOBAL, SUFFIX_PACKED, SUFFIX_SCALE, Checkpoint


def u8(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


def raw(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, whatever its dtype and rank."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def e2m1(packed: np.ndarray) -> np.ndarray:
    """[N, K/2] bytes -> [N, K] float64; element 2j in the low nibble."""
    n, half = packed.shape
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, 2 * half).astype(np.uint8)
    return codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64)


def mxfp4_values(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    s = scale.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    return e2m1(packed) * np.repeat(s, 32, axis=1)


def nvfp4_values(packed: np.ndarray, scale: np.ndarray, global_scale: float) -> np.ndarray:
    s = scale.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return e2m1(packed) * np.repeat(s, 16, axis=1) / np.float64(global_scale)


def numerics(src: Checkpoint, dst: Checkpoint) -> dict:
    """Every value of every module equal, packed bytes equal, pass-through bytes equal."""
    report = {"values": 0, "mismatches": 0, "max_abs_error": 0.0, "problems": []}
    modules = src.modules()
    for m in modules:
        sp, ss = u8(src.tensor(m + SUFFIX_PACKED)), u8(src.tensor(m + SUFFIX_SCALE))
        dp, ds = u8(dst.tensor(m + SUFFIX_PACKED)), u8(dst.tensor(m + SUFFIX_SCALE))
        g = dst.tensor(m + SUFFIX_GLOBAL)
        if g.dtype != torch.float32 or tuple(g.shape) != (1,):
            report["problems"].append(f"{m}: global is {g.dtype} {tuple(g.shape)}")
            continue
        if not np.array_equal(sp, dp):
            report["problems"].append(f"{m}: packed bytes differ")
        a = mxfp4_values(sp, ss)
        b = nvfp4_values(dp, ds, float(g[0]))
        report["values"] += a.size
        bad = ~(a == b)
        report["mismatches"] += int(bad.sum())
        if bad.any():
            with np.errstate(invalid="ignore"):
                err = np.abs(a - b)[bad]
            report["max_abs_error"] = max(report["max_abs_error"], float(np.nan_to_num(err, nan=np.inf).max()))
    module_tensors = {m + s for m in modules for s in (SUFFIX_PACKED, SUFFIX_SCALE)}
    for name, shard in src.weight_map.items():
        if name in module_tensors:
            continue
        if dst.weight_map.get(name) != shard:
            report["problems"].append(f"{name}: not in {shard} in the output")
            continue
        if not torch.equal(raw(src.tensor(name)), raw(dst.tensor(name))):
            report["problems"].append(f"{name}: pass-through bytes differ")
    return report
