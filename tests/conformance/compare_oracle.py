"""Independent oracle for `mx2nv compare SRC OTHER`: every figure compare
reports, recomputed with numpy and the standard library from the files alone.

Nothing here imports mx2nv, the writers in nvfp4_writers.py, ml_dtypes or
torch: safetensors headers are parsed by hand and E2M1 / E8M0 / E4M3 are
decoded from their bit fields. The sources behind each format rule are cited in
docs/reference/nvfp4-checkpoint-formats.md. Everything compare must match is
defined below; where a choice was needed it is marked CHOICE.

Usage:  python compare_oracle.py SRC OTHER [--modules REGEX]   (prints JSON,
exit status 0 / 1 / 3 as compare's).  From Python: `compare(src, other)`
returns the report dict; invalid input raises `InvalidInput`.

1. Reading checkpoints
----------------------
A checkpoint is a directory with config.json and either
model.safetensors.index.json (every shard its weight_map names is read, and
every tensor in those shards counts) or a single model.safetensors.
Invalid input (exit 3, the message names the tensor or file):
  - a safetensors file that breaks the format: header length over 100,000,000
    or past the end of the file, header not a JSON object, a duplicate key in
    the header, unknown dtype, negative or non-integer shape, offsets not
    contiguous from 0 (holes or overlaps), a tensor's byte length not
    numel x itemsize, bytes after the last tensor;
  - a tensor name present in two shards, or an index entry whose shard lacks
    the tensor ("name collision" / "missing");
  - any of the per-module rules below.

2. Modules
----------
SRC (MXFP4, compressed-tensors mxfp4-pack-quantized): every prefix P with
P.weight_packed is a module; P.weight_packed must be U8 [N, K/2] and
P.weight_scale U8 [N, K/32] (K = 2 x packed columns, K % 32 == 0).
Value (OCP MX / compressed-tensors): v = e2m1(code) x 2^(byte - 127).
Byte 0xFF (E8M0 NaN) in a SRC scale is invalid input (CHOICE: SRC must be a
checkpoint convert would accept; a NaN source cannot be compared).

OTHER, format decided from its config (section 4):
  compressed-tensors ("ct"): module P has P.weight_packed U8 [N, K/2],
    P.weight_scale F8_E4M3 [N, K/16], P.weight_global_scale F32 with one
    element (shape [1], also accepted: []), optional P.input_global_scale F32
    one element.  v = e2m1 x scale / global.
  ModelOpt ("modelopt"): module P has P.weight U8 [N, K/2], P.weight_scale
    F8_E4M3 [N, K/16], P.weight_scale_2 F32 one element (shape [], also [1]),
    optional P.input_scale F32 one element.  v = e2m1 x scale x scale_2.
  Unquantized: P.weight in BF16, F16 or F32, shape [N, K]; v = the number.
    Only prefixes that map to a SRC module, or that name a routed expert,
    are modules of OTHER; every other BF16 tensor (attention, norms...) is
    not a module and is ignored.
  A quantized module whose scale or global tensor is missing, whose dtype or
  shape is not the one above, whose shapes disagree with SRC's module, that
  carries tensors of both conventions (e.g. P.weight_packed and P.weight), or
  whose global is NaN, +-Inf, 0 or negative, or that has an E4M3 NaN block
  scale (0x7F / 0xFF) is invalid input.  An unquantized module of another
  dtype or shape is invalid input.  (CHOICE: NaN block scales and bad globals
  are refused rather than reported, so every reported figure is finite.)
  input_scale / input_global_scale values are reported, never judged (only
  dtype and shape are checked; a non-finite value is reported as null).
  An unquantized weight holding NaN or +-Inf is invalid input (CHOICE: every
  reported figure stays a finite JSON number).

3. Matching names (OTHER to SRC)
--------------------------------
key(name):
  routed expert: name matches
    ^(model\\.|language_model\\.model\\.|model\\.language_model\\.|language_model\\.)?
     layers\\.L\\.(block_sparse_moe|mlp|ffn)\\.experts\\.E\\.(w1|w2|w3|gate_proj|up_proj|down_proj)$
    key = ("expert", L, E, proj) with w1 = gate_proj = "gate",
    w3 = up_proj = "up", w2 = down_proj = "down";
  anything else: the name with one leading "language_model.model.",
    "model.language_model.", "language_model." or "model." removed.
Two SRC modules with one key, or two OTHER modules with one key, is invalid
input ("name collision", both names given).  missing_in_other: SRC modules
whose key no OTHER module has.  extra_in_other: OTHER modules whose key no
SRC module has.  Both lists are sorted by name and always present.
--modules REGEX (Python re.search) keeps the SRC modules whose name matches;
OTHER modules mapping to dropped SRC modules are ignored, and an OTHER module
with no SRC counterpart is extra only if its own name matches.

4. Format of OTHER
------------------
quantization_config = config.json's top-level "quantization_config", else
"text_config"."quantization_config".
  quant_method "compressed-tensors" -> ct; its "format" or some config group's
    "format" must be "nvfp4-pack-quantized", else invalid.
  quant_method starting with "modelopt" (modelopt, modelopt_mixed) -> modelopt.
  no quantization_config, or one with another method, and an
    hf_quant_config.json whose "producer"."name" is "modelopt" or that has a
    "quantization" object -> modelopt.
  anything else -> invalid.
report["format"] is "compressed-tensors" or "modelopt";
report["activations"] is "A16" when no module has an input scale tensor, "A4"
when every quantized module has one, "mixed" otherwise.

5. Figures per module (one record per compared module, sorted by SRC name)
----------------------------------------------------------------------------
All arithmetic in IEEE binary64, round to nearest even.  s_i = SRC value,
o_i = OTHER value:
  SRC: e2m1 x 2^(b-127) is exact.  ModelOpt: (e2m1 x scale) x scale_2 is
  exact (at most 30 significant bits).  ct: (e2m1 x scale) / global is one
  correctly rounded division (exact whenever the global is a power of two;
  a non-representable quotient can never equal a SRC value, so "exact" does
  not depend on this rounding).  Unquantized: the stored number, exact.
  values                  N x K, the number of SRC values compared.
  exact_values            count of o_i == s_i (IEEE equality: -0 == +0).
  max_abs_error           max |fl(o_i - s_i)|; 0.0 when all equal.
  rel_rmse                sqrt(D) / sqrt(S) with D = fsum(fl(d_i*d_i)),
                          S = fsum(fl(s_i*s_i)), d_i = fl(o_i - s_i), fsum =
                          the correctly rounded sum (math.fsum).  0.0 when
                          D == 0 (including 0/0); null (JSON) when D > 0 and
                          S == 0 (CHOICE: undefined, source all zero).
  cosine                  1.0 when every value is exact (exactly 1, also for
                          two zero vectors); otherwise with P = fsum(o_i*s_i),
                          O = fsum(o_i^2): 0.0 if O == 0 or S == 0, else
                          P / sqrt(O*S) clamped to [-1, 1] (CHOICE).
  packed_bytes            quantized OTHER: N x K/2 (bytes of SRC's
                          weight_packed compared); unquantized: 0.
  packed_bytes_identical  bytes equal at the same position.
  zero_sign_rewrites      NIBBLES whose SRC code and OTHER code differ but
                          both are zeros (0x0 / 0x8): a -0 <-> +0 flip.  Counted
                          on codes alone, whatever the scales.
  zero_sign_rewrite_bytes bytes that differ and in which every differing
                          nibble is such a flip (so the byte's two values are
                          unchanged if the scales agree).
  active_block_scales_below_2^-6
                          OTHER blocks of 16 whose E4M3 scale byte has
                          exponent field 0 and mantissa != 0 (|scale| in
                          [2^-9, 7x2^-9], the E4M3 subnormals, i.e. 0 <
                          |scale| < 2^-6) and that hold at least one code with
                          non-zero magnitude (code & 7 != 0).  vLLM's Marlin
                          (after PR #37502) zeroes such scales for fp16, and
                          for bf16 whenever the bank's largest scale >= 224.
  global_scale            the stored F32 global as a number (ct: the
                          divisor weight_global_scale; modelopt: the
                          multiplier weight_scale_2); null if unquantized.
  global_power_of_two     the stored global is a positive power of two
                          (normal with zero mantissa, or subnormal with a
                          single mantissa bit).  1/x is a power of two iff x
                          is, so the test is the same for both conventions.
  input_scale             input_global_scale (ct) / input_scale (modelopt)
                          as a number; null when absent or not finite.
  gate_up_globals_bit_equal  gate and up modules whose partner (same layer,
                          expert, other projection) is also quantized in
                          OTHER: the two stored F32 globals have identical
                          bit patterns; null otherwise (down projections,
                          unquantized, or partner not compared).
  quantized               false for a module OTHER holds as BF16/F16/F32.
  name / other_name / layer / expert / projection: the SRC name, OTHER's
  name, and for routed experts their layer, expert and gate|up|down.

6. Totals and projections
-------------------------
totals: values, exact_values, packed_bytes, packed_bytes_identical,
zero_sign_rewrites, zero_sign_rewrite_bytes, active_block_scales_below_2^-6:
sums over modules; max_abs_error: max over modules (0.0 if none);
rel_rmse and cosine: the same formulas with D, S, O, P replaced by the fsum of
the per-module D, S, O, P (CHOICE: two-level summation, so a streaming
implementation only keeps four numbers per module), exact cases 0.0 / 1.0 as
above; modules_compared, modules_exact (every value exact), modules_quantized,
modules_unquantized; non_power_of_two_globals (quantized modules whose global
is not a power of two); gate_up_pairs (pairs with gate_up_globals_bit_equal
not null, counted once per pair) and gate_up_pairs_globals_differ.
projections: {"gate"|"up"|"down"|"other": the same totals over those modules}.
unquantized_in_other: sorted SRC names of modules OTHER left unquantized.

7. Exit status
--------------
0: every compared value exact and missing_in_other and extra_in_other empty;
1: otherwise (CHOICE: a missing or an extra module is a difference, as it is
for verify); 3: invalid input (nothing else is reported).
Gate/up global mismatches, non-power-of-two globals and scales below 2^-6
are reported and never change the exit status.
Floating-point figures derived from sums (rel_rmse, cosine) should be
compared with a relative tolerance of 1e-12; counts, max_abs_error and the
exact 0.0 / 1.0 cases exactly.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_HEADER = 100_000_000
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
            "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
E2M1_MAGNITUDE = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)
BELOW = "active_block_scales_below_2^-6"

EXPERT_RE = re.compile(
    r"^(?:model\.|language_model\.model\.|model\.language_model\.|language_model\.)?"
    r"layers\.(\d+)\.(?:block_sparse_moe|mlp|ffn)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)$")
PROJECTION = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}
PREFIXES = ("language_model.model.", "model.language_model.", "language_model.", "model.")


class InvalidInput(Exception):
    """Exit 3. The message names the tensor or file."""


# ---------------------------------------------------------------- safetensors

@dataclass(frozen=True)
class TensorRef:
    path: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offset
    end: int

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.begin)
            data = f.read(self.end - self.begin)
        if len(data) != self.end - self.begin:
            raise InvalidInput(f"{self.name}: short read from {self.path}")
        return data


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise InvalidInput(f"{k}: duplicate key in a safetensors header")
        out[k] = v
    return out


def read_header(path: Path) -> dict[str, TensorRef]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InvalidInput(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise InvalidInput(f"{path}: header length {n} invalid")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except InvalidInput as e:
        raise InvalidInput(f"{e} ({path})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidInput(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise InvalidInput(f"{path}: header is not a JSON object")
    header.pop("__metadata__", None)
    base = 8 + n
    spans = []
    out = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise InvalidInput(f"{name}: malformed header entry in {path}")
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in ITEMSIZE:
            raise InvalidInput(f"{name}: unknown dtype {dtype!r} in {path}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise InvalidInput(f"{name}: bad shape {shape!r} in {path}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs) or offs[0] > offs[1]):
            raise InvalidInput(f"{name}: bad data_offsets {offs!r} in {path}")
        if offs[1] - offs[0] != math.prod(shape) * ITEMSIZE[dtype]:
            raise InvalidInput(f"{name}: {offs[1] - offs[0]} bytes for {dtype} {shape} in {path}")
        spans.append((offs[0], offs[1], name))
        out[name] = TensorRef(path, name, dtype, tuple(shape), base + offs[0], base + offs[1])
    pos = 0
    for b, e, name in sorted(spans):
        if b != pos:
            raise InvalidInput(f"{name}: data offsets not contiguous in {path}")
        pos = e
    if base + pos > size:
        raise InvalidInput(f"{path}: file ends {base + pos - size} bytes before its last tensor")
    if base + pos < size:
        raise InvalidInput(f"{path}: {size - base - pos} bytes after the last tensor")
    return out


@dataclass
class Tree:
    root: Path
    config: dict
    tensors: dict[str, TensorRef]


def open_tree(root: Path) -> Tree:
    root = Path(root)
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidInput(f"{root / 'config.json'}: {e}") from None
    tensors: dict[str, TensorRef] = {}
    index_path = root / INDEX
    if index_path.exists():
        try:
            weight_map = json.loads(index_path.read_text(), object_pairs_hook=_no_duplicates)["weight_map"]
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise InvalidInput(f"{index_path}: {e}") from None
        shards = sorted(set(weight_map.values()))
    else:
        weight_map = None
        shards = [SINGLE]
    for shard in shards:
        p = root / shard
        if not p.is_file():
            raise InvalidInput(f"{p}: shard missing")
        for name, ref in read_header(p).items():
            if name in tensors:
                raise InvalidInput(f"{name}: name collision, in {tensors[name].path.name} and {shard}")
            tensors[name] = ref
    if weight_map is not None:
        for name, shard in weight_map.items():
            if name not in tensors or tensors[name].path.name != shard:
                raise InvalidInput(f"{name}: the index maps it to {shard}, which does not hold it")
    return Tree(root, config, tensors)


# ---------------------------------------------------------------- numbers

def e2m1_codes(packed: np.ndarray) -> np.ndarray:
    """[N, K/2] bytes -> [N, K] codes; element 2j is the low nibble."""
    n, half = packed.shape
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, 2 * half)


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    mag = E2M1_MAGNITUDE[codes & 7]
    return np.where(codes & 8, -mag, mag)  # code 8 gives -0.0


def e8m0_decode(b: np.ndarray) -> np.ndarray:
    """2^(b-127); b = 255 (NaN) must be rejected by the caller."""
    return np.ldexp(1.0, b.astype(np.int64) - 127)


def e4m3_decode(b: np.ndarray) -> np.ndarray:
    """FP8 E4M3FN (bias 7, no inf, S.1111.111 = NaN) from the bit fields."""
    b = b.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = b & 7
    mag = np.where(exp == 0, np.ldexp(man.astype(np.float64), -9), np.ldexp((8 + man).astype(np.float64), exp - 10))
    mag = np.where((exp == 15) & (man == 7), np.nan, mag)
    return sign * mag


def bf16_decode(raw: bytes) -> np.ndarray:
    u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return u.view(np.float32).astype(np.float64)


def f32_bits(raw: bytes) -> int:
    return struct.unpack("<I", raw)[0]


def f32_value(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def f32_is_power_of_two(bits: int) -> bool:
    if bits & 0x80000000:
        return False
    exp, man = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exp == 0xFF:
        return False
    if exp == 0:
        return man != 0 and man & (man - 1) == 0
    return man == 0


def fsum(a: np.ndarray) -> float:
    return math.fsum(a.ravel().tolist())


# ---------------------------------------------------------------- names

def module_key(name: str):
    m = EXPERT_RE.match(name)
    if m:
        return ("expert", int(m.group(1)), int(m.group(2)), PROJECTION[m.group(3)])
    for p in PREFIXES:
        if name.startswith(p):
            return ("module", name[len(p):])
    return ("module", name)


def quant_config(config: dict) -> dict | None:
    if isinstance(config.get("quantization_config"), dict):
        return config["quantization_config"]
    text = config.get("text_config")
    if isinstance(text, dict) and isinstance(text.get("quantization_config"), dict):
        return text["quantization_config"]
    return None


def detect_format(tree: Tree) -> str:
    qc = quant_config(tree.config)
    method = str((qc or {}).get("quant_method", ""))
    if method == "compressed-tensors":
        formats = {qc.get("format")} | {g.get("format") for g in (qc.get("config_groups") or {}).values()
                                        if isinstance(g, dict)}
        if "nvfp4-pack-quantized" not in formats:
            raise InvalidInput(f"{tree.root / 'config.json'}: compressed-tensors config without nvfp4-pack-quantized")
        return "ct"
    if method.startswith("modelopt"):
        return "modelopt"
    hf = tree.root / "hf_quant_config.json"
    if hf.exists():
        try:
            h = json.loads(hf.read_text())
        except json.JSONDecodeError as e:
            raise InvalidInput(f"{hf}: {e}") from None
        if isinstance(h, dict) and ((h.get("producer") or {}).get("name") == "modelopt"
                                    or isinstance(h.get("quantization"), dict)):
            return "modelopt"
    raise InvalidInput(f"{tree.root}: no NVFP4 quantization config (compressed-tensors or ModelOpt)")


# ---------------------------------------------------------------- modules

@dataclass
class SrcModule:
    name: str
    packed: TensorRef
    scale: TensorRef
    n: int
    k: int


@dataclass
class OtherModule:
    name: str
    quantized: bool
    weight: TensorRef               # packed U8 or the float weight
    scale: TensorRef | None = None
    global_: TensorRef | None = None
    input_scale: TensorRef | None = None


def _expect(ref: TensorRef | None, name: str, dtypes: tuple[str, ...], shapes: tuple[tuple[int, ...], ...]):
    if ref is None:
        raise InvalidInput(f"{name}: missing")
    if ref.dtype not in dtypes:
        raise InvalidInput(f"{name}: dtype {ref.dtype}, expected {' or '.join(dtypes)}")
    if ref.shape not in shapes:
        raise InvalidInput(f"{name}: shape {list(ref.shape)}, expected {' or '.join(str(list(s)) for s in shapes)}")
    return ref


def src_modules(tree: Tree) -> dict[str, SrcModule]:
    out = {}
    for name in sorted(tree.tensors):
        if not name.endswith(".weight_packed"):
            continue
        p = name[: -len(".weight_packed")]
        packed = tree.tensors[name]
        if packed.dtype != "U8" or len(packed.shape) != 2:
            raise InvalidInput(f"{name}: SRC packed weight is {packed.dtype} {list(packed.shape)}, expected U8 2-D")
        n, half = packed.shape
        k = 2 * half
        if k % 32:
            raise InvalidInput(f"{name}: {k} columns, not a multiple of 32")
        scale = _expect(tree.tensors.get(p + ".weight_scale"), p + ".weight_scale", ("U8",), ((n, k // 32),))
        out[p] = SrcModule(p, packed, scale, n, k)
    return out


ONE = ((1,), ())


def other_modules(tree: Tree, fmt: str, src_keys: set) -> dict[str, OtherModule]:
    t = tree.tensors
    out: dict[str, OtherModule] = {}
    if fmt == "ct":
        for name in sorted(t):
            if name.endswith(".weight_packed"):
                p = name[: -len(".weight_packed")]
                for foreign in (".weight", ".weight_scale_2", ".input_scale"):
                    if p + foreign in t:
                        raise InvalidInput(f"{p + foreign}: name collision with {name}")
                out[p] = OtherModule(p, True, t[name], t.get(p + ".weight_scale"), t.get(p + ".weight_global_scale"),
                                     t.get(p + ".input_global_scale"))
            elif name.endswith((".weight_global_scale", ".input_global_scale")):
                p = name.rsplit(".", 1)[0]
                if p + ".weight_packed" not in t:
                    raise InvalidInput(f"{name}: no {p}.weight_packed beside it")
    else:
        for name in sorted(t):
            if name.endswith(".weight_scale_2") or (name.endswith(".weight") and t[name].dtype == "U8"):
                p = name.rsplit(".", 1)[0]
                if p in out:
                    continue
                for foreign in (".weight_packed", ".weight_global_scale", ".input_global_scale"):
                    if p + foreign in t:
                        raise InvalidInput(f"{p + foreign}: name collision with {p}.weight")
                out[p] = OtherModule(p, True, t.get(p + ".weight"), t.get(p + ".weight_scale"),
                                     t.get(p + ".weight_scale_2"), t.get(p + ".input_scale"))
                if out[p].weight is None:
                    raise InvalidInput(f"{p}.weight: missing")
    for name in sorted(t):
        if not name.endswith(".weight"):
            continue
        p = name[: -len(".weight")]
        if p in out:
            continue
        key = module_key(p)
        if key[0] == "expert" or key in src_keys:
            out[p] = OtherModule(p, False, t[name])
    return out


# ---------------------------------------------------------------- comparison

@dataclass
class Sums:
    values: int = 0
    exact_values: int = 0
    max_abs_error: float = 0.0
    D: list = field(default_factory=list)
    S: list = field(default_factory=list)
    O: list = field(default_factory=list)
    P: list = field(default_factory=list)
    packed_bytes: int = 0
    packed_bytes_identical: int = 0
    zero_sign_rewrites: int = 0
    zero_sign_rewrite_bytes: int = 0
    below: int = 0
    modules_compared: int = 0
    modules_exact: int = 0
    modules_quantized: int = 0
    modules_unquantized: int = 0
    non_power_of_two_globals: int = 0
    gate_up_pairs: int = 0
    gate_up_pairs_globals_differ: int = 0

    def add(self, rec: dict, parts: tuple[float, float, float, float]):
        self.values += rec["values"]
        self.exact_values += rec["exact_values"]
        self.max_abs_error = max(self.max_abs_error, rec["max_abs_error"])
        for lst, v in zip((self.D, self.S, self.O, self.P), parts):
            lst.append(v)
        self.packed_bytes += rec["packed_bytes"]
        self.packed_bytes_identical += rec["packed_bytes_identical"]
        self.zero_sign_rewrites += rec["zero_sign_rewrites"]
        self.zero_sign_rewrite_bytes += rec["zero_sign_rewrite_bytes"]
        self.below += rec[BELOW]
        self.modules_compared += 1
        self.modules_exact += rec["exact_values"] == rec["values"]
        self.modules_quantized += rec["quantized"]
        self.modules_unquantized += not rec["quantized"]
        if rec["quantized"] and not rec["global_power_of_two"]:
            self.non_power_of_two_globals += 1
        if rec["projection"] == "gate" and rec["gate_up_globals_bit_equal"] is not None:
            self.gate_up_pairs += 1
            self.gate_up_pairs_globals_differ += not rec["gate_up_globals_bit_equal"]

    def report(self) -> dict:
        exact = self.exact_values == self.values
        D, S, O, P = (math.fsum(x) for x in (self.D, self.S, self.O, self.P))
        return {
            "values": self.values, "exact_values": self.exact_values, "max_abs_error": self.max_abs_error,
            "rel_rmse": rel_rmse(D, S), "cosine": cosine(exact, P, O, S),
            "packed_bytes": self.packed_bytes, "packed_bytes_identical": self.packed_bytes_identical,
            "zero_sign_rewrites": self.zero_sign_rewrites, "zero_sign_rewrite_bytes": self.zero_sign_rewrite_bytes,
            BELOW: self.below, "modules_compared": self.modules_compared, "modules_exact": self.modules_exact,
            "modules_quantized": self.modules_quantized, "modules_unquantized": self.modules_unquantized,
            "non_power_of_two_globals": self.non_power_of_two_globals, "gate_up_pairs": self.gate_up_pairs,
            "gate_up_pairs_globals_differ": self.gate_up_pairs_globals_differ,
        }


def rel_rmse(D: float, S: float):
    if D == 0.0:
        return 0.0
    if S == 0.0:
        return None
    return math.sqrt(D) / math.sqrt(S)


def cosine(exact: bool, P: float, O: float, S: float) -> float:
    if exact:
        return 1.0
    if O == 0.0 or S == 0.0:
        return 0.0
    return max(-1.0, min(1.0, P / math.sqrt(O * S)))


def _u8(ref: TensorRef, shape) -> np.ndarray:
    return np.frombuffer(ref.read(), dtype=np.uint8).reshape(shape)


def _scalar_f32(ref: TensorRef) -> int:
    return f32_bits(ref.read())


def _finite_or_none(ref: TensorRef | None) -> float | None:
    if ref is None:
        return None
    v = f32_value(_scalar_f32(ref))
    return v if math.isfinite(v) else None


def compare_module(src: SrcModule, oth: OtherModule, fmt: str) -> tuple[dict, tuple, int | None]:
    """Returns (record without the gate/up field, (D, S, O, P), global bits or None)."""
    n, k = src.n, src.k
    s_packed = _u8(src.packed, (n, k // 2))
    s_scale = _u8(src.scale, (n, k // 32))
    if (s_scale == 0xFF).any():
        raise InvalidInput(f"{src.name}.weight_scale: E8M0 NaN (0xFF) in SRC")
    s_codes = e2m1_codes(s_packed)
    s = e2m1_decode(s_codes) * np.repeat(e8m0_decode(s_scale), 32, axis=1)

    rec = {"name": src.name, "other_name": oth.name, "quantized": oth.quantized}
    gbits = None
    if oth.quantized:
        wname = oth.name + (".weight_packed" if fmt == "ct" else ".weight")
        sname = oth.name + ".weight_scale"
        gname = oth.name + (".weight_global_scale" if fmt == "ct" else ".weight_scale_2")
        iname = oth.name + (".input_global_scale" if fmt == "ct" else ".input_scale")
        _expect(oth.weight, wname, ("U8",), ((n, k // 2),))
        _expect(oth.scale, sname, ("F8_E4M3",), ((n, k // 16),))
        _expect(oth.global_, gname, ("F32",), ONE)
        if oth.input_scale is not None:
            _expect(oth.input_scale, iname, ("F32",), ONE)
        o_packed = _u8(oth.weight, (n, k // 2))
        o_scale_b = _u8(oth.scale, (n, k // 16))
        if ((o_scale_b & 0x7F) == 0x7F).any():
            raise InvalidInput(f"{sname}: E4M3 NaN block scale")
        gbits = _scalar_f32(oth.global_)
        g = f32_value(gbits)
        if not (math.isfinite(g) and g > 0.0):
            raise InvalidInput(f"{gname}: global is {g!r}, must be finite and > 0")
        o_codes = e2m1_codes(o_packed)
        prod = e2m1_decode(o_codes) * np.repeat(e4m3_decode(o_scale_b), 16, axis=1)
        o = prod / np.float64(g) if fmt == "ct" else prod * np.float64(g)
        diff_bytes = s_packed != o_packed
        zero_flip = (s_codes != o_codes) & ((s_codes & 7) == 0) & ((o_codes & 7) == 0)
        nib_same_or_flip = (s_codes == o_codes) | zero_flip
        byte_ok = nib_same_or_flip.reshape(n, k // 2, 2).all(axis=-1)
        active = ((o_codes & 7) != 0).reshape(n, k // 16, 16).any(axis=-1)
        subnormal = (((o_scale_b >> 3) & 0xF) == 0) & ((o_scale_b & 7) != 0)
        rec.update({
            "packed_bytes": n * k // 2,
            "packed_bytes_identical": int((~diff_bytes).sum()),
            "zero_sign_rewrites": int(zero_flip.sum()),
            "zero_sign_rewrite_bytes": int((diff_bytes & byte_ok).sum()),
            BELOW: int((active & subnormal).sum()),
            "global_scale": g,
            "global_power_of_two": f32_is_power_of_two(gbits),
            "input_scale": _finite_or_none(oth.input_scale),
        })
    else:
        w = oth.weight
        _expect(w, oth.name + ".weight", ("BF16", "F16", "F32"), ((n, k),))
        raw = w.read()
        if w.dtype == "BF16":
            o = bf16_decode(raw).reshape(n, k)
        elif w.dtype == "F16":
            o = np.frombuffer(raw, dtype="<f2").astype(np.float64).reshape(n, k)
        else:
            o = np.frombuffer(raw, dtype="<f4").astype(np.float64).reshape(n, k)
        if not np.isfinite(o).all():
            raise InvalidInput(f"{w.name}: non-finite value in an unquantized weight")
        rec.update({"packed_bytes": 0, "packed_bytes_identical": 0, "zero_sign_rewrites": 0,
                    "zero_sign_rewrite_bytes": 0, BELOW: 0, "global_scale": None, "global_power_of_two": None,
                    "input_scale": None})

    with np.errstate(invalid="ignore", over="ignore"):
        d = o - s
        equal = o == s
        absd = np.abs(d)
        exact = int(equal.sum())
        D, S, O, P = fsum(d * d), fsum(s * s), fsum(o * o), fsum(o * s)
    max_abs = float(absd.max()) if absd.size else 0.0
    rec.update({
        "values": n * k, "exact_values": exact, "max_abs_error": 0.0 if exact == n * k else max_abs,
        "rel_rmse": rel_rmse(D, S), "cosine": cosine(exact == n * k, P, O, S),
    })
    return rec, (D, S, O, P), gbits


def compare(src_dir, other_dir, modules: str | None = None) -> dict:
    src_tree, other_tree = open_tree(Path(src_dir)), open_tree(Path(other_dir))
    fmt = detect_format(other_tree)
    pattern = re.compile(modules) if modules else None

    src_all = src_modules(src_tree)
    by_key: dict = {}
    for name in src_all:
        key = module_key(name)
        if key in by_key:
            raise InvalidInput(f"{name}: name collision with {by_key[key]} in SRC")
        by_key[key] = name
    others = other_modules(other_tree, fmt, set(by_key))
    other_by_key: dict = {}
    for name in sorted(others):
        key = module_key(name)
        if key in other_by_key:
            raise InvalidInput(f"{name}: name collision with {other_by_key[key]} in OTHER")
        other_by_key[key] = name

    selected = {key: name for key, name in by_key.items() if pattern is None or pattern.search(name)}
    missing = sorted(name for key, name in selected.items() if key not in other_by_key)
    extra = sorted(name for key, name in other_by_key.items()
                   if key not in by_key and (pattern is None or pattern.search(name)))

    records, parts, gbits = {}, {}, {}
    for key, name in sorted(selected.items(), key=lambda kv: kv[1]):
        if key not in other_by_key:
            continue
        rec, p, g = compare_module(src_all[name], others[other_by_key[key]], fmt)
        if key[0] == "expert":
            rec.update({"layer": key[1], "expert": key[2], "projection": key[3]})
        else:
            rec.update({"layer": None, "expert": None, "projection": None})
        records[key], parts[key], gbits[key] = rec, p, g

    for key, rec in records.items():
        rec["gate_up_globals_bit_equal"] = None
        if key[0] == "expert" and key[3] in ("gate", "up"):
            pkey = key[:3] + ("up" if key[3] == "gate" else "gate",)
            if gbits[key] is not None and pkey in gbits and gbits[pkey] is not None:
                rec["gate_up_globals_bit_equal"] = gbits[key] == gbits[pkey]

    totals, proj = Sums(), {}
    for key, rec in records.items():
        totals.add(rec, parts[key])
        proj.setdefault(rec["projection"] or "other", Sums()).add(rec, parts[key])

    has_input = [r["input_scale"] is not None for r in records.values() if r["quantized"]]
    activations = "A4" if has_input and all(has_input) else ("mixed" if any(has_input) else "A16")
    ordered = sorted(records.values(), key=lambda r: r["name"])
    all_exact = all(r["exact_values"] == r["values"] for r in ordered)
    return {
        "format": "compressed-tensors" if fmt == "ct" else "modelopt",
        "activations": activations,
        "totals": totals.report(),
        "projections": {k: v.report() for k, v in sorted(proj.items())},
        "modules": ordered,
        "missing_in_other": missing,
        "extra_in_other": extra,
        "unquantized_in_other": sorted(r["name"] for r in ordered if not r["quantized"]),
        "exit_code": 0 if all_exact and not missing and not extra else 1,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("other")
    ap.add_argument("--modules")
    args = ap.parse_args(argv)
    try:
        report = compare(args.src, args.other, args.modules)
    except InvalidInput as e:
        print(f"invalid input: {e}", file=sys.stderr)
        return 3
    json.dump(report, sys.stdout, indent=1)
    print()
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
