"""Test-side writers of NVFP4 checkpoints ("OTHER") made from an MXFP4 SRC
written by `mx2nv generate`, for testing `mx2nv compare` against checkpoints
other tools would produce. numpy + ml_dtypes (pinned in requirements.txt);
safetensors files are read and written directly (8-byte little-endian header
length, JSON header, data), so hostile files can be produced too.

Every writer keeps SRC's shards (same file names, same tensor order, module
tensors replaced in place), copies the other files, and rewrites config.json
and the index. The formats and the upstream code each writer follows are in
docs/reference/nvfp4-checkpoint-formats.md; the short version:

write_modelopt_cast       ModelOpt's published MXFP4->NVFP4 cast, as NVIDIA
    Model-Optimizer's examples/kimi/kimi_k3/quantize_to_nvfp4.py runs it with
    its published recipe (--cast_mxfp4_to_nvfp4; PR #2206, commit 575c27ae,
    examples/_shard_cast_utils.py::quantize_mxfp4_to_nvfp4_lossless):
    dequantize to BF16, scale_2 = 2^(k_max - 8) with k_max shared by the
    expert's w1/w3 (gate/up), per-block amax from
    numeric_utils.mxfp4_to_nvfp4_per_block_amax (closed form 6*2^k_j in the
    window of the tensor's OWN k_max, max_nibble*2^k_j outside), block scale
    = amax / (6*scale_2) clamped to [2^-9, 448] and cast to E4M3, then
    NVFP4QTensor.quantize: value / (scale*scale_2) rounded by _cast_fp4
    (sign from `x < 0`, so -0 becomes +0; ties to even), packed low nibble
    first. input_scale = 1.0 (recipe constant_amax 2688). Config:
    hf_quant_config.json MIXED_PRECISION with per-bank quantized_layers and
    the script's exclude_modules, config.json quantization_config with
    quant_method "modelopt_mixed" (text_config's MXFP4 config removed).

write_modelopt_calibrated ModelOpt's export of a calibrated NVFP4 weight
    quantizer (modelopt/torch/export/unified_export_hf.py::
    _export_quantized_weight, commit a2fbac7b):
      mode "dynamic" (default NVFP4 config: max-calibrated per-tensor amax,
        dynamic blocks; also the K3 script without --cast): amax = max|W|,
        shared by gate/up (layer_utils.sync_moe_gate_up_amax /
        quant_utils.preprocess_linear_fusion take the max), scale_2 =
        amax/2688, block scale = block_amax/(6*scale_2), 0 -> 1.0, clamp
        [2^-9, 448], E4M3 (NVFP4QTensor.get_weights_scaling_factor);
      mode "static" (NVFP4StaticQuantizer after static-block max
        calibration): per-block amax = block max, global_amax = max of them
        (shared by gate/up), scale = (amax/6, 0 -> 1.0) * 448 /
        (global_amax/6), clamp, E4M3
        (get_weights_scaling_factor_from_quantizer, static branch);
      mode "static_cast" (hf_ptq --cast_mxfp4_to_nvfp4, examples/hf_ptq/
        cast_mxfp4_to_nvfp4.py::apply_to_model): the static export with
        per-block amax from mxfp4_to_nvfp4_per_block_amax and global_amax =
        6*448*2^(k_max-8) of each tensor, then the max over gate/up.
    algo "NVFP4" writes input_scale = input_amax/2688 (gate/up share the
    max); "W4A16_NVFP4" writes none. Config: hf_quant_config.json with
    quant_algo, group_size 16, exclude_modules; config.json
    quantization_config from convert_hf_config.convert_hf_quant_config_format
    (quant_method "modelopt").

write_compressed_tensors  compressed-tensors nvfp4-pack-quantized, requantized
    from the decoded values the way compressed-tensors computes it
    (generate_gparam: global = 448*6/amax; calculate_qparams: block scale =
    global*amax_block/6 rounded to E4M3, 0 -> 0.125; quantize: x/(scale/
    global), E2M1 thresholds of fp4_utils, sign kept, so -0 stays -0). By
    default each module gets its own global (gate and up differ:
    "deliberate mismatch"); global_factor multiplies every global (non-power
    of two by construction). w4a4=True adds input_global_scale and the NVFP4
    preset's input_activations. Not byte-faithful to compressed-tensors
    (`mx2nv requantize` and test_requantize.py cover that); what matters
    here is a valid CT NVFP4 checkpoint with non-power-of-two globals.

write_hostile             a damaged copy of a written OTHER; returns the tensor
    (or file) compare must name when it exits 3.

Options shared by the writers: unquantized (module names OTHER stores as
BF16 `<m>.weight` holding SRC's decoded values; added to the exclude/ignore
list), drop (modules left out: missing_in_other), extra (module -> new name:
a quantized copy under a name SRC lacks: extra_in_other), rename (a function
applied to every module prefix OTHER writes).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import ml_dtypes
import numpy as np

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
            "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MODELOPT_VERSION = "0.47.0"

E2M1_MAX = np.float32(6.0)
E4M3_MAX = np.float32(448.0)
E4M3_MIN_CLAMP = np.float32(2.0 ** -9)
MAGNITUDE = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
ODD_BOUNDS = np.array([0.75, 1.75, 3.5], dtype=np.float32)

GATE_UP = {".w1": ".w3", ".w3": ".w1", ".gate_proj": ".up_proj", ".up_proj": ".gate_proj"}
PROJ = {".w1": "gate", ".gate_proj": "gate", ".w3": "up", ".up_proj": "up", ".w2": "down", ".down_proj": "down"}


# ---------------------------------------------------------------- safetensors

Entry = tuple  # (name, dtype, shape, bytes)


def read_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header, 8 + n


def read_entries(path: Path) -> tuple[list[Entry], dict | None]:
    """Every tensor of a file, in data order, with its bytes."""
    header, base = read_header(path)
    meta = header.pop("__metadata__", None)
    data = Path(path).read_bytes()
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return [(k, v["dtype"], list(v["shape"]), data[base + v["data_offsets"][0]: base + v["data_offsets"][1]])
            for k, v in items], meta


def write_safetensors(path: Path, entries: list[Entry], metadata: dict | None = None,
                      duplicate: str | None = None) -> None:
    """Write entries in order. `duplicate` names a tensor listed twice in the
    JSON header (same offsets): a file the format forbids."""
    parts, offset, head = [], 0, []
    if metadata is not None:
        head.append('"__metadata__":' + json.dumps(metadata))
    for name, dtype, shape, data in entries:
        info = json.dumps({"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]})
        head.append(json.dumps(name) + ":" + info)
        if name == duplicate:
            head.append(json.dumps(name) + ":" + info)
        parts.append(data)
        offset += len(data)
    text = ("{" + ",".join(head) + "}").encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for p in parts:
            f.write(p)


# ---------------------------------------------------------------- source

@dataclass
class Source:
    root: Path
    config: dict
    weight_map: dict[str, str] | None
    shards: list[str]
    info: dict[str, tuple[str, str, list[int]]] = field(default_factory=dict)  # name -> (shard, dtype, shape)
    _cache: dict = field(default_factory=dict)

    def entries(self, shard: str) -> list[Entry]:
        if shard not in self._cache:
            self._cache[shard] = read_entries(self.root / shard)[0]
        return self._cache[shard]

    def raw(self, name: str) -> bytes:
        shard = self.info[name][0]
        for n, _, _, data in self.entries(shard):
            if n == name:
                return data
        raise KeyError(name)

    @property
    def modules(self) -> list[str]:
        return sorted(n[: -len(".weight_packed")] for n in self.info if n.endswith(".weight_packed"))

    def packed(self, m: str) -> np.ndarray:
        shape = self.info[m + ".weight_packed"][2]
        return np.frombuffer(self.raw(m + ".weight_packed"), dtype=np.uint8).reshape(shape)

    def scale(self, m: str) -> np.ndarray:
        shape = self.info[m + ".weight_scale"][2]
        return np.frombuffer(self.raw(m + ".weight_scale"), dtype=np.uint8).reshape(shape)


def load_source(root) -> Source:
    root = Path(root)
    config = json.loads((root / "config.json").read_text())
    if (root / INDEX).exists():
        weight_map = json.loads((root / INDEX).read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    else:
        weight_map, shards = None, [SINGLE]
    src = Source(root, config, weight_map, shards)
    for shard in shards:
        header, _ = read_header(root / shard)
        header.pop("__metadata__", None)
        for name, v in header.items():
            src.info[name] = (shard, v["dtype"], v["shape"])
    return src


def partner(module: str) -> str | None:
    for suffix, other in GATE_UP.items():
        if module.endswith(suffix):
            return module[: -len(suffix)] + other
    return None


def projection(module: str) -> str | None:
    for suffix, p in PROJ.items():
        if module.endswith(suffix):
            return p
    return None


def quant_config_location(config: dict) -> dict:
    """The dict that holds SRC's quantization_config (top level or text_config)."""
    if "quantization_config" in config:
        return config
    text = config.get("text_config")
    if isinstance(text, dict) and "quantization_config" in text:
        return text
    return config


# ---------------------------------------------------------------- numerics (ModelOpt's, in float32)

def codes_of(packed: np.ndarray) -> np.ndarray:
    n, half = packed.shape
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, 2 * half)


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """(q[..., 1::2] << 4) | q[..., 0::2]: element 2j in the low nibble."""
    return ((codes[:, 1::2] << 4) | codes[:, 0::2]).astype(np.uint8)


def decoded_f64(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Exact SRC values (float64)."""
    c = codes_of(packed)
    mag = MAGNITUDE.astype(np.float64)[c & 7]
    v = np.where(c & 8, -mag, mag)
    return v * np.repeat(np.ldexp(1.0, scale.astype(np.int64) - 127), 32, axis=1)


def mxfp4_dequantize_bf16(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """MXFP4QTensor.dequantize(dtype=bfloat16): sign*magnitude in float32,
    times exp2(e8m0 - 127) in float32, cast to BF16 (round to nearest even)."""
    c = codes_of(packed)
    sign = np.float32(1.0) - np.float32(2.0) * ((c >> 3) & 1).astype(np.float32)
    x = sign * MAGNITUDE[c & 7]
    f = np.ldexp(np.float32(1.0), scale.astype(np.int32) - 127).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        x = x * np.repeat(f, 32, axis=1)
    return x.astype(ml_dtypes.bfloat16)


def cast_fp4(x: np.ndarray) -> np.ndarray:
    """NVFP4QTensor._cast_fp4: sign bit from (x < 0) (so -0.0 -> +0),
    searchsorted over the bounds, +1 at the odd bounds (ties to even)."""
    sign = (x < 0).astype(np.uint8)
    a = np.abs(x)
    ordv = np.searchsorted(E2M1_BOUNDS, a, side="left").astype(np.uint8)
    eq = np.isin(a, ODD_BOUNDS).astype(np.uint8)
    return (sign << 3) + ordv + eq


def to_e4m3(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def e4m3_f32(b: np.ndarray) -> np.ndarray:
    return b.view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def nvfp4_quantize(w_bf16: np.ndarray, scale_e4m3: np.ndarray, scale_2: np.float32) -> np.ndarray:
    """NVFP4QTensor.quantize with given scales: input / (scale.float()*scale_2)
    in float32, _cast_fp4, pack."""
    n, k = w_bf16.shape
    x = w_bf16.astype(np.float32).reshape(n, k // 16, 16)
    denom = (e4m3_f32(scale_e4m3) * np.float32(scale_2)).astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = (x / denom).astype(np.float32).reshape(n, k)
    return pack_codes(cast_fp4(scaled))


def block_amax16(w_bf16: np.ndarray) -> np.ndarray:
    n, k = w_bf16.shape
    return np.abs(w_bf16.astype(np.float32)).reshape(n, k // 16, 16).max(axis=-1)


def clamp_cast_e4m3(per_block_scale: np.ndarray) -> np.ndarray:
    """_cast_per_block_scale_to_fp8 without normalization: clamp to
    [2^-9, 448] (NaN stays NaN) and cast to float8_e4m3fn."""
    s = np.where(np.isnan(per_block_scale), per_block_scale,
                 np.clip(per_block_scale, E4M3_MIN_CLAMP, E4M3_MAX)).astype(np.float32)
    return to_e4m3(s)


def mxfp4_kmax(e8m0: np.ndarray) -> int:
    """_shard_cast_utils.mxfp4_kmax / numeric_utils.mxfp4_to_nvfp4_global_amax:
    max k over bytes > 0, 0 when every byte is 0."""
    nz = e8m0 > 0
    return int(e8m0[nz].astype(np.int32).max()) - 127 if nz.any() else 0


def per_block_amax(packed: np.ndarray, e8m0: np.ndarray) -> np.ndarray:
    """numeric_utils.mxfp4_to_nvfp4_per_block_amax, float32, [N, K/16].
    k_max here is the tensor's own (byte-0 blocks excluded; -127 if none)."""
    k = e8m0.astype(np.int32) - 127
    pow2 = np.ldexp(np.float32(1.0), k).astype(np.float32)
    closed = (E2M1_MAX * pow2).astype(np.float32)
    k_max = int(np.where(e8m0 > 0, k, -127).max())
    delta = k - (k_max - 8)
    in_range = (delta >= -9) & (delta <= 8)
    if in_range.all():
        amax = closed
    else:
        n = packed.shape[0]
        blocks = packed.reshape(n, e8m0.shape[1], 16)
        max_idx = np.maximum(blocks & 7, (blocks >> 4) & 7).max(axis=-1)
        with np.errstate(over="ignore", invalid="ignore"):
            data = (MAGNITUDE[max_idx] * pow2).astype(np.float32)
        amax = np.where(in_range, closed, data)
    return np.repeat(amax, 2, axis=1)


# ---------------------------------------------------------------- per-module casts

@dataclass
class Quantized:
    weight: np.ndarray        # uint8 [N, K/2]
    scale: np.ndarray         # uint8 E4M3 bytes [N, K/16]
    scale_2: np.float32       # ModelOpt multiplier (CT: the divisor is stored instead)
    info: dict = field(default_factory=dict)


def modelopt_cast(packed: np.ndarray, e8m0: np.ndarray, k_max: int) -> Quantized:
    """_shard_cast_utils.quantize_mxfp4_to_nvfp4_lossless."""
    bf16 = mxfp4_dequantize_bf16(packed, e8m0)
    amax = per_block_amax(packed, e8m0)
    s2 = np.float32(2.0 ** (k_max - 8))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        pbs = (amax / (E2M1_MAX * s2)).astype(np.float32)
    scale = clamp_cast_e4m3(pbs)
    k = e8m0.astype(np.int32) - 127
    lossless = (k >= k_max - 17) | (e8m0 == 0)
    clamped_low = int((pbs < E4M3_MIN_CLAMP).sum())
    return Quantized(nvfp4_quantize(bf16, scale, s2), scale, s2,
                     {"k_max": k_max, "blocks": int(k.size), "lossless_blocks": int(lossless.sum()),
                      "scales_clamped_low": clamped_low})


def modelopt_dynamic(w_bf16: np.ndarray, amax: np.float32) -> Quantized:
    """get_weights_scaling_factor_2_from_quantizer (amax/2688) +
    get_weights_scaling_factor + NVFP4QTensor.quantize."""
    s2 = np.float32(np.float32(amax) / np.float32(2688.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        pbs = (block_amax16(w_bf16) / (E2M1_MAX * s2)).astype(np.float32)
    pbs[pbs == 0] = np.float32(1.0)
    scale = clamp_cast_e4m3(pbs)
    return Quantized(nvfp4_quantize(w_bf16, scale, s2), scale, s2)


def modelopt_static(w_bf16: np.ndarray, pb_amax: np.ndarray, global_amax: np.float32) -> Quantized:
    """Static branch of get_weights_scaling_factor_from_quantizer."""
    ga = np.float32(global_amax)
    s2 = np.float32(ga / np.float32(2688.0))
    pbs = (pb_amax.astype(np.float32) / E2M1_MAX).astype(np.float32)
    pbs[pbs == 0] = np.float32(1.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        pbs = ((pbs * E4M3_MAX).astype(np.float32) / np.float32(ga / E2M1_MAX)).astype(np.float32)
    scale = clamp_cast_e4m3(pbs)
    return Quantized(nvfp4_quantize(w_bf16, scale, s2), scale, s2)


def ct_round_fp4(x: np.ndarray) -> np.ndarray:
    """compressed-tensors fp4_utils thresholds; sign bit kept (signbit)."""
    a = np.abs(x)
    r = np.zeros_like(a)
    r = np.where(a > 0.25, 0.5, r)
    r = np.where(a >= 0.75, 1.0, r)
    r = np.where(a > 1.25, 1.5, r)
    r = np.where(a >= 1.75, 2.0, r)
    r = np.where(a > 2.5, 3.0, r)
    r = np.where(a >= 3.5, 4.0, r)
    r = np.where(a > 5.0, 6.0, r)
    idx = np.searchsorted(MAGNITUDE, r).astype(np.uint8)
    return idx | (np.signbit(x).astype(np.uint8) << 3)


def ct_quantize(w: np.ndarray, global_scale: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Block scales and packed codes for a given CT global (divisor)."""
    n, k = w.shape
    x = w.astype(np.float32)
    bmax = np.abs(x).reshape(n, k // 16, 16).max(axis=-1)
    s = (np.float32(global_scale) * (bmax / np.float32(6.0))).astype(np.float32)
    s = np.clip(s, -E4M3_MAX, E4M3_MAX)
    scale = to_e4m3(s)
    scale[scale == 0] = to_e4m3(np.float32(0.125))  # eps for E4M3
    eff = (e4m3_f32(scale) / np.float32(global_scale)).astype(np.float32)
    q = ct_round_fp4((x.reshape(n, k // 16, 16) / eff[..., None]).astype(np.float32).reshape(n, k))
    return pack_codes(q), scale


# ---------------------------------------------------------------- tree writer

Rename = Callable[[str], str]


def _identity(name: str) -> str:
    return name


@dataclass
class Plan:
    """What a writer produces per SRC module: a dict of suffix -> (dtype,
    shape, bytes), or None to drop it."""
    tensors: dict[str, dict[str, Entry] | None]
    extra: dict[str, dict[str, Entry]]  # new module name -> tensors
    config: dict
    hf_quant_config: dict | None = None


def _copy_aux(src: Path, dst: Path) -> None:
    for p in src.iterdir():
        if p.suffix == ".safetensors" or p.name in ("config.json", INDEX, "hf_quant_config.json"):
            continue
        if p.is_dir():
            shutil.copytree(p, dst / p.name)
        else:
            shutil.copy2(p, dst / p.name)


def _write_tree(src: Source, dst: Path, plan: Plan, rename: Rename) -> None:
    dst.mkdir(parents=True, exist_ok=False)
    _copy_aux(src.root, dst)
    module_of = {}
    for m in src.modules:
        module_of[m + ".weight_packed"] = m
        module_of[m + ".weight_scale"] = m
    weight_map, total = {}, 0
    for i, shard in enumerate(src.shards):
        out: list[Entry] = []
        for name, dtype, shape, data in src.entries(shard):
            m = module_of.get(name)
            if m is None:
                out.append((name, dtype, shape, data))
            elif name.endswith(".weight_packed") and plan.tensors.get(m) is not None:
                for suffix, (dt, sh, by) in plan.tensors[m].items():
                    out.append((rename(m) + suffix, dt, sh, by))
        if i == len(src.shards) - 1:
            for m, tensors in plan.extra.items():
                for suffix, (dt, sh, by) in tensors.items():
                    out.append((m + suffix, dt, sh, by))
        write_safetensors(dst / shard, out, {"format": "pt"})
        for name, _, _, data in out:
            weight_map[name] = shard
            total += len(data)
    if src.weight_map is not None:
        (dst / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                                            indent=2))
    (dst / "config.json").write_text(json.dumps(plan.config, indent=2, sort_keys=True) + "\n")
    if plan.hf_quant_config is not None:
        (dst / "hf_quant_config.json").write_text(json.dumps(plan.hf_quant_config, indent=4))


def _bf16_tensor(src: Source, m: str) -> dict[str, Entry]:
    w = decoded_f64(src.packed(m), src.scale(m)).astype(np.float32).astype(ml_dtypes.bfloat16)
    return {".weight": ("BF16", list(w.shape), w.tobytes())}


def _f32(x) -> bytes:
    return np.asarray(x, dtype=np.float32).tobytes()


def _modelopt_tensors(q: Quantized, input_scale: float | None) -> dict[str, Entry]:
    t = {".weight": ("U8", list(q.weight.shape), q.weight.tobytes()),
         ".weight_scale": ("F8_E4M3", list(q.scale.shape), q.scale.tobytes()),
         ".weight_scale_2": ("F32", [], _f32(q.scale_2))}
    if input_scale is not None:
        t[".input_scale"] = ("F32", [], _f32(input_scale))
    return t


# ModelOpt K3 script: _EXCLUDE_MODULES and _module_name_aliases (PR #2206).
K3_EXCLUDE = ["*block_sparse_moe.gate*", "*block_sparse_moe.routed_expert_up_proj*",
              "*block_sparse_moe.routed_expert_down_proj*", "*block_sparse_moe.routed_expert_norm*",
              "*block_sparse_moe.shared_experts*", "*self_attn.q_conv1d*", "*self_attn.k_conv1d*",
              "*self_attn.v_conv1d*", "*self_attn.f_b_proj*", "*self_attn.o_norm*", "*self_attn.q_a_layernorm*",
              "*self_attn.kv_a_layernorm*", "*_res_proj*", "*_res_norm*", "*layernorm*",
              "language_model.model.layers.0.mlp.*", "language_model.lm_head", "vision_tower*", "mm_projector*"]


def module_name_aliases(name: str) -> list[str]:
    names = {name}
    if "block_sparse_moe" in name:
        names.add(name.replace("block_sparse_moe", "mlp"))
    runtime = set()
    for n in names:
        if n.startswith("language_model.model."):
            suffix = n[len("language_model.model."):]
            runtime.add("model." + suffix)
            runtime.add(suffix)
        elif n.startswith("language_model."):
            runtime.add(n[len("language_model."):])
    names.update(runtime)
    return sorted(names)


def convert_hf_quant_config_format(hf: dict) -> dict:
    """modelopt/torch/export/convert_hf_config.py::convert_hf_quant_config_format
    for the algorithms written here (NVFP4, W4A16_NVFP4, MIXED_PRECISION)."""
    q = hf.get("quantization", {})
    algo = q.get("quant_algo")

    def group(a, gs):
        w = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": gs or 16}
        if a == "NVFP4":
            return {"input_activations": dict(w), "weights": w}
        if a == "W4A16_NVFP4":
            return {"weights": w}
        return {"quant_algo": a}

    new: dict = {}
    if algo in ("NVFP4", "W4A16_NVFP4"):
        new["config_groups"] = {"group_0": {**group(algo, q.get("group_size", 16)), "targets": ["Linear"]}}
    elif algo == "MIXED_PRECISION":
        layers = q.get("quantized_layers", {})
        by_cfg: dict = {}
        for name, cfg in layers.items():
            by_cfg.setdefault(tuple(sorted(cfg.items())), []).append(name)
        groups = {}
        for i, (key, names) in enumerate(by_cfg.items()):
            cfg = dict(key)
            g = group(cfg.get("quant_algo", ""), cfg.get("group_size"))
            g["targets"] = sorted(names)
            groups[f"group_{i}"] = g
        new["config_groups"] = groups
        new["quantized_layers"] = layers
    new["ignore"] = q.get("exclude_modules") if q.get("exclude_modules") is not None else []
    if algo:
        new["quant_algo"] = algo
    if q.get("kv_cache_quant_algo"):
        new["kv_cache_scheme"] = q["kv_cache_quant_algo"]
    if hf.get("producer"):
        new["producer"] = hf["producer"]
    new["quant_method"] = "modelopt"
    return new


def _bank(module: str) -> str:
    return module.rsplit(".", 2)[0]  # ...experts.E.w1 -> ...experts


def _modelopt_config(src: Source, quantized: Iterable[str], unquantized: Iterable[str], mixed: bool,
                     algo: str, rename: Rename) -> tuple[dict, dict]:
    excludes = []
    for m in sorted(unquantized):
        excludes.extend(module_name_aliases(rename(m)))
    if mixed:
        layers = {}
        for bank in sorted({_bank(rename(m)) for m in quantized}):
            for alias in module_name_aliases(bank):
                layers[alias] = {"quant_algo": algo, "group_size": 16}
        for pattern in K3_EXCLUDE:
            excludes.extend(module_name_aliases(pattern))
        quant = {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "group_size": 16,
                 "quantized_layers": layers, "exclude_modules": list(dict.fromkeys(excludes))}
    else:
        excludes += ["lm_head", "language_model.lm_head", "*self_attn*", "*shared_experts*", "*block_sparse_moe.gate",
                     "*mlp.gate", "vision_tower*"]
        quant = {"quant_algo": algo, "kv_cache_quant_algo": None, "group_size": 16,
                 "exclude_modules": sorted(set(excludes))}
    hf = {"producer": {"name": "modelopt", "version": MODELOPT_VERSION}, "quantization": quant}
    config = json.loads(json.dumps(src.config))
    qc = convert_hf_quant_config_format(hf)
    if quant["quant_algo"] == "MIXED_PRECISION":
        qc["quant_method"] = "modelopt_mixed"
    text = config.get("text_config")
    if isinstance(text, dict):
        text.pop("quantization_config", None)
    config["quantization_config"] = qc
    return config, hf


def _shared_over_gate_up(values: dict[str, float], modules: list[str]) -> dict[str, float]:
    out = dict(values)
    for m in modules:
        p = partner(m)
        if p is not None and p in values:
            out[m] = max(values[m], values[p])
    return out


def _input_amax(m: str, seed: int) -> float:
    """A deterministic stand-in for a calibrated activation amax."""
    h = sum(ord(c) * (i + 1) for i, c in enumerate(re.sub(r"\.(w1|w3|gate_proj|up_proj)$", "", m)))
    return 2688.0 * (0.5 + ((h * 2654435761 + seed) % 1000) / 1000.0)


@dataclass
class WriterReport:
    dst: Path
    modules: dict[str, dict]  # SRC module -> facts the writer knows (global, counts)


def _prepare(src_dir, unquantized, drop, extra) -> tuple[Source, set, set, dict]:
    src = load_source(src_dir)
    unq, dr = set(unquantized), set(drop)
    ex = dict(extra or {})
    for m in unq | dr | set(ex):
        if m not in src.modules:
            raise KeyError(f"{m}: not a module of SRC")
    return src, unq, dr, ex


def _per_module(src: Source, unq: set, dr: set, ex: dict, quantize) -> tuple[dict, dict, dict]:
    """Each SRC module's OTHER tensors and facts (None for a dropped module, a
    BF16 weight for an unquantized one, quantize(m) -> (tensors, facts) for
    the rest), and the extra modules' tensors (copies under new names)."""
    tensors, facts = {}, {}
    for m in src.modules:
        if m in dr:
            tensors[m] = None
        elif m in unq:
            tensors[m] = _bf16_tensor(src, m)
            facts[m] = {"quantized": False}
        else:
            tensors[m], facts[m] = quantize(m)
    extra = {new: tensors[m] for m, new in ex.items() if tensors.get(m) is not None}
    return tensors, facts, extra


def write_modelopt_cast(src_dir, dst_dir, *, unquantized=(), drop=(), extra=None, rename: Rename = _identity,
                        mixed: bool = True, input_scale: float | None = 1.0) -> WriterReport:
    """ModelOpt's published cast (Kimi-K3 streaming script, --cast_mxfp4_to_nvfp4)."""
    src, unq, dr, ex = _prepare(src_dir, unquantized, drop, extra)
    kmax = {m: mxfp4_kmax(src.scale(m)) for m in src.modules}
    shared = _shared_over_gate_up(kmax, src.modules)  # build_w13_kmax_overrides

    def quantize(m):
        q = modelopt_cast(src.packed(m), src.scale(m), int(shared[m]))
        return _modelopt_tensors(q, input_scale), {"quantized": True, "global": float(q.scale_2), **q.info}

    tensors, facts, extra_t = _per_module(src, unq, dr, ex, quantize)
    quantized = [m for m in src.modules if m not in dr and m not in unq]
    config, hf = _modelopt_config(src, quantized, unq, mixed, "NVFP4" if input_scale is not None else "W4A16_NVFP4",
                                  rename)
    _write_tree(src, Path(dst_dir), Plan(tensors, extra_t, config, hf), rename)
    return WriterReport(Path(dst_dir), facts)


def write_modelopt_calibrated(src_dir, dst_dir, *, mode: str = "dynamic", algo: str = "NVFP4", unquantized=(),
                              drop=(), extra=None, rename: Rename = _identity, mixed: bool = False,
                              seed: int = 0) -> WriterReport:
    """ModelOpt's export of a calibrated NVFP4 weight quantizer (see module doc)."""
    if mode not in ("dynamic", "static", "static_cast") or algo not in ("NVFP4", "W4A16_NVFP4"):
        raise ValueError(f"mode {mode!r} / algo {algo!r}")
    src, unq, dr, ex = _prepare(src_dir, unquantized, drop, extra)
    live = [m for m in src.modules if m not in dr and m not in unq]
    bf16 = {m: mxfp4_dequantize_bf16(src.packed(m), src.scale(m)) for m in live}
    if mode == "dynamic":
        amax = {m: float(np.abs(bf16[m].astype(np.float32)).max()) for m in live}
    elif mode == "static":
        pb = {m: block_amax16(bf16[m]) for m in live}
        amax = {m: float(pb[m].max()) for m in live}  # promote: reduce_amax of the per-block amax
    else:
        pb = {m: per_block_amax(src.packed(m), src.scale(m)) for m in live}
        amax = {m: float(np.float32(6.0 * 448.0 * 2.0 ** (mxfp4_kmax(src.scale(m)) - 8))) for m in live}
    amax = _shared_over_gate_up(amax, live)
    in_amax = _shared_over_gate_up({m: _input_amax(m, seed) for m in live}, live)

    def quantize(m):
        a = np.float32(amax[m])
        q = modelopt_dynamic(bf16[m], a) if mode == "dynamic" else modelopt_static(bf16[m], pb[m], a)
        isc = float(np.float32(np.float32(in_amax[m]) / np.float32(2688.0))) if algo == "NVFP4" else None
        return _modelopt_tensors(q, isc), {"quantized": True, "global": float(q.scale_2), "input_scale": isc}

    tensors, facts, extra_t = _per_module(src, unq, dr, ex, quantize)
    config, hf = _modelopt_config(src, live, unq, mixed, algo, rename)
    _write_tree(src, Path(dst_dir), Plan(tensors, extra_t, config, hf), rename)
    return WriterReport(Path(dst_dir), facts)


def _ct_config(src: Source, w4a4: bool, unquantized: Iterable[str], rename: Rename) -> dict:
    config = json.loads(json.dumps(src.config))
    holder = quant_config_location(config)
    old = holder.get("quantization_config", {})
    weights = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 16, "num_bits": 4,
               "observer": "minmax", "observer_kwargs": {}, "scale_dtype": "torch.float8_e4m3fn",
               "strategy": "tensor_group", "symmetric": True, "type": "float", "zp_dtype": None}
    inputs = None
    if w4a4:
        inputs = dict(weights, dynamic="local", observer="static_minmax")
    holder["quantization_config"] = {
        "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "input_activations": inputs,
                                      "output_activations": None, "targets": ["Linear"], "weights": weights}},
        "format": "nvfp4-pack-quantized", "global_compression_ratio": None,
        "ignore": list(old.get("ignore", [])) + sorted(rename(m) for m in unquantized),
        "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed",
        "sparsity_config": {}, "transform_config": {}, "version": "0.20.1"}
    return config


def write_compressed_tensors(src_dir, dst_dir, *, w4a4: bool = False, global_factor: float = 1.0,
                             share_gate_up: bool = False, unquantized=(), drop=(), extra=None,
                             rename: Rename = _identity, seed: int = 0) -> WriterReport:
    """compressed-tensors nvfp4-pack-quantized (NVFP4A16, or NVFP4 W4A4)."""
    src, unq, dr, ex = _prepare(src_dir, unquantized, drop, extra)
    live = [m for m in src.modules if m not in dr and m not in unq]
    vals = {m: decoded_f64(src.packed(m), src.scale(m)).astype(np.float32) for m in live}
    amax = {m: float(np.abs(vals[m]).max()) for m in live}
    if share_gate_up:
        amax = _shared_over_gate_up(amax, live)

    def quantize(m):
        a = np.float32(max(amax[m], float(np.finfo(np.float32).tiny)))
        g = np.float32(np.float32(448.0 * 6.0) / a)
        if not np.isfinite(g):
            g = np.float32(1.0)
        g = np.float32(g * np.float32(global_factor))
        packed, scale = ct_quantize(vals[m], g)
        t = {".weight_packed": ("U8", list(packed.shape), packed.tobytes()),
             ".weight_scale": ("F8_E4M3", list(scale.shape), scale.tobytes()),
             ".weight_global_scale": ("F32", [1], _f32([g]))}
        isc = None
        if w4a4:
            isc = float(np.float32(np.float32(2688.0) / np.float32(_input_amax(m, seed))))
            t[".input_global_scale"] = ("F32", [1], _f32([isc]))
        return t, {"quantized": True, "global": float(g), "input_scale": isc}

    tensors, facts, extra_t = _per_module(src, unq, dr, ex, quantize)
    _write_tree(src, Path(dst_dir), Plan(tensors, extra_t, _ct_config(src, w4a4, unq, rename)), rename)
    return WriterReport(Path(dst_dir), facts)


# ---------------------------------------------------------------- hostile variants

HOSTILE_KINDS = (
    "packed_dtype", "packed_shape", "scale_dtype", "scale_shape", "scale_nan", "global_nan", "global_inf",
    "global_neg_inf", "global_zero", "global_negative", "global_dtype", "global_shape", "missing_scale",
    "missing_global", "missing_packed", "collision_shards", "collision_alias", "collision_conventions",
    "duplicate_header_key", "truncated_shard", "index_points_elsewhere",
)


def _tree_files(root: Path) -> tuple[dict | None, list[str]]:
    if (root / INDEX).exists():
        index = json.loads((root / INDEX).read_text())
        return index, sorted(set(index["weight_map"].values()))
    return None, [SINGLE]


def _alias(name: str) -> str:
    """Another spelling compare must map to the same module."""
    if name.startswith("language_model.model."):
        return "model.language_model." + name[len("language_model.model."):]
    if name.startswith("model."):
        return name[len("model."):]
    return "model." + name


def write_hostile(other_dir, dst_dir, kind: str, module: str | None = None) -> tuple[Path, str]:
    """Copy a written OTHER and damage it. Returns (dst, the tensor or file
    name compare's error must contain). `module` defaults to the first
    quantized module found (by name)."""
    if kind not in HOSTILE_KINDS:
        raise ValueError(kind)
    other, dst = Path(other_dir), Path(dst_dir)
    shutil.copytree(other, dst)
    index, shards = _tree_files(dst)
    where, dtype_of = {}, {}
    for shard in shards:
        header, _ = read_header(dst / shard)
        header.pop("__metadata__", None)
        for name, v in header.items():
            where[name] = shard
            dtype_of[name] = v["dtype"]
    ct = any(n.endswith(".weight_packed") for n in where)
    wsuf, gsuf = (".weight_packed", ".weight_global_scale") if ct else (".weight", ".weight_scale_2")
    if module is None:
        module = sorted(n[: -len(gsuf)] for n in where if n.endswith(gsuf))[0]
    wname, sname, gname = module + wsuf, module + ".weight_scale", module + gsuf
    shard = where[wname]
    entries, meta = read_entries(dst / shard)
    by = {e[0]: i for i, e in enumerate(entries)}

    def replace(name, dtype=None, shape=None, data=None):
        i = by[name]
        n, dt, sh, d = entries[i]
        entries[i] = (n, dtype or dt, shape if shape is not None else sh, data if data is not None else d)

    def drop_tensor(name):
        s = where[name]
        if s == shard:
            entries.pop(by[name])
        else:
            es, m2 = read_entries(dst / s)
            write_safetensors(dst / s, [e for e in es if e[0] != name], m2)
        if index is not None:
            index["weight_map"].pop(name, None)

    def global_bytes(value: float) -> bytes:
        shape = entries[by[gname]][2] if gname in by else [1]
        return struct.pack("<f", value) * max(1, math.prod(shape))

    target, dup = None, None
    w = entries[by[wname]]
    if kind == "packed_dtype":
        replace(wname, dtype="I8"); target = wname
    elif kind == "packed_shape":
        n, half = w[2]
        replace(wname, shape=[n // 2, half * 2] if n % 2 == 0 else [n * half]); target = wname
    elif kind in ("scale_dtype", "scale_shape", "scale_nan"):
        s = entries[by[sname]] if sname in by else None
        if s is None:
            raise ValueError("scale in another shard")
        if kind == "scale_dtype":
            replace(sname, dtype="U8")
        elif kind == "scale_shape":
            n, c = s[2]
            replace(sname, shape=[n * 2, c // 2])
        else:
            b = bytearray(s[3]); b[0] = 0x7F
            replace(sname, data=bytes(b))
        target = sname
    elif kind.startswith("global_"):
        if gname not in by:
            raise ValueError("global in another shard")
        target = gname
        if kind == "global_dtype":
            replace(gname, dtype="BF16", shape=[1], data=entries[by[gname]][3][2:4])
        elif kind == "global_shape":
            replace(gname, shape=[2], data=entries[by[gname]][3][:4] * 2)
        else:
            value = {"global_nan": math.nan, "global_inf": math.inf, "global_neg_inf": -math.inf,
                     "global_zero": 0.0, "global_negative": -1.0}[kind]
            replace(gname, data=global_bytes(value))
    elif kind == "missing_scale":
        drop_tensor(sname); target = sname
    elif kind == "missing_global":
        drop_tensor(gname); target = gname
    elif kind == "missing_packed":
        drop_tensor(wname); target = wname
    elif kind == "collision_shards":
        if len(shards) < 2:
            raise ValueError("needs two shards")
        other_shard = next(s for s in shards if s != shard)
        es, m2 = read_entries(dst / other_shard)
        write_safetensors(dst / other_shard, es + [w], m2)
        target = wname
    elif kind == "collision_alias":
        alias = _alias(module)
        for suffix in (wsuf, ".weight_scale", gsuf):
            e = entries[by[module + suffix]]
            entries.append((alias + suffix,) + tuple(e[1:]))
            if index is not None:
                index["weight_map"][alias + suffix] = shard
        target = alias
    elif kind == "collision_conventions":
        foreign = module + (".weight" if ct else ".weight_packed")
        n, half = w[2]
        if ct:
            entries.append((foreign, "BF16", [n, 2 * half], bytes(4 * n * half)))
        else:
            entries.append((foreign, "U8", [n, half], w[3]))
        if index is not None:
            index["weight_map"][foreign] = shard
        target = foreign
    elif kind == "duplicate_header_key":
        dup = wname; target = wname
    elif kind == "truncated_shard":
        target = shard
    elif kind == "index_points_elsewhere":
        if index is None or len(shards) < 2:
            raise ValueError("needs an index and two shards")
        index["weight_map"][wname] = next(s for s in shards if s != shard)
        target = wname
    write_safetensors(dst / shard, entries, meta, duplicate=dup)
    if kind == "truncated_shard":
        data = (dst / shard).read_bytes()
        (dst / shard).write_bytes(data[:-1])
    if index is not None:
        (dst / INDEX).write_text(json.dumps(index, indent=2))
    return dst, target
