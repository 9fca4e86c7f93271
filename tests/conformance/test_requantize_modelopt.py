"""`mx2nv requantize --format modelopt` and `convert --format modelopt
--overspan requantize` against nvidia-modelopt 0.47.0's own dynamic NVFP4
weight quantizer (modelopt_quantizer.py: the wheel's NVFP4QTensor,
core_utils reductions and to_quantized_weight, on CPU torch).

The recipe a ModelOpt requantized module must follow, per module (gate/up of
one expert share one amax):
  amax = max|W| of the BF16-decoded MXFP4 values (core_utils.reduce_amax),
      the max over gate and up (quant_utils.preprocess_linear_fusion);
      amax 0 -> 6, TensorQuantizer._sanitize_export_amax (the one deliberate
      deviation: ModelOpt's NVFP4 path reads `_amax` unsanitized and writes
      weight_scale_2 = 0 with NaN block scales, see the test below);
  weight_scale_2 w = amax / 2688 in float32
      (NVFP4QTensor.get_weights_scaling_factor_2_from_quantizer);
  block scale = block amax / (6 * w), 0 -> 1.0, clamp [2^-9, 448], E4M3
      (get_weights_scaling_factor, _cast_per_block_scale_to_fp8);
  codes = _cast_fp4(x / (scale * w)) (NVFP4QTensor.quantize), low nibble first.

Benign data cannot tell this recipe from compressed-tensors' (the same codes
and bytes wherever no block is zero and no block scale falls under 2^-9), nor
ModelOpt's single division from a two-step one (only when amax has mantissa
1, which `generate` never writes), so the `adversarial` source holds zero
blocks, all-zero modules, wide spans and amaxes of mantissa 1; the oracle
self-checks assert that it does hold elements where these recipes differ.

The first group of tests needs no mx2nv feature beyond `generate`/`demo`:
they check the oracle (ModelOpt's code) against nvfp4_writers.modelopt_dynamic
(an independent numpy re-implementation), against bit patterns computed
independently (numpy's IEEE float32, or by hand), and say where
compressed-tensors (its own 0.20.1 code) differs. The rest judge mx2nv's
outputs: `requantize --format modelopt` on four sources, and `convert
--format modelopt --overspan requantize` on the wide one, which is also the
output `verify` judges (verify holds a DST to what convert writes, so it
refuses any `requantize` output, compressed-tensors' too: every in-window
module there is requantized where convert writes it exact).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from safetensors import safe_open

import modelopt_loaders as mo
import modelopt_quantizer as mq
import nvfp4_writers as nw
from checkpoints import SUFFIX_PACKED, SUFFIX_SCALE, open_checkpoint, patch_bytes, tensor_location
from conftest import WIDE_MODULE, mx2nv
from oracles import e2m1, mxfp4_values, u8

NVFP4A16 = preset_name_to_scheme("NVFP4A16", ["Linear"])
PARTNERS = {".w1": ".w3", ".w3": ".w1", ".gate_proj": ".up_proj", ".up_proj": ".gate_proj"}
W, WS, WS2 = ".weight", ".weight_scale", ".weight_scale_2"
COMMON = ["--layers", "2", "--experts", "3", "--hidden", "128", "--intermediate", "64"]
EXPERTS = "language_model.model.layers.{}.block_sparse_moe.experts.{}.{}"
# The `adversarial` source: an all-zero gate whose up is not (the pair's amax
# is the up's), an all-zero pair (amax 0 for both: the deviation) and an
# all-zero down projection (amax 0 alone).
ZERO_GATE = EXPERTS.format(0, 0, "w1")
ZERO_PAIR = (EXPERTS.format(1, 1, "w1"), EXPERTS.format(1, 1, "w3"))
ZERO_DOWN = EXPERTS.format(0, 2, "w2")
ZERO_MODULES = {ZERO_GATE, *ZERO_PAIR, ZERO_DOWN}
REQUANTIZE_CASES = ["demo", "wide", "flat_single_file", "adversarial"]
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def partner(module: str) -> str | None:
    for suffix, other in PARTNERS.items():
        if module.endswith(suffix):
            return module[: -len(suffix)] + other
    return None


def f32_bits(x) -> int:
    return int(np.float32(x).view(np.uint32))


def bf16_numpy(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def modelopt_values(packed: np.ndarray, scale: np.ndarray, w2: float) -> np.ndarray:
    """e2m1 x S x weight_scale_2 in float64: exact (2 + 4 + 24 significant bits)."""
    s = scale.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return e2m1(packed) * np.repeat(s, 16, axis=1) * np.float64(w2)


def marlin_zeroed(scale: np.ndarray) -> int:
    """Blocks whose E4M3 scale is subnormal (exponent bits 0, mantissa not 0):
    exact on disk, flushed to zero by the runtimes' FP4 Marlin path."""
    return int((((scale & 0x78) == 0) & ((scale & 0x07) != 0)).sum())


# ---------------------------------------------------------------- sources and the oracle's expectations


def decoded_bf16(src, module: str) -> torch.Tensor:
    """SRC's MXFP4 values as BF16 (what ModelOpt quantizes): every MXFP4 value
    is a BF16 value, so the cast is exact (checked), -0.0 included."""
    x = mxfp4_values(u8(src.tensor(module + SUFFIX_PACKED)), u8(src.tensor(module + SUFFIX_SCALE)))
    w = torch.from_numpy(x).to(torch.bfloat16)
    back = w.to(torch.float64).numpy()
    assert np.array_equal(back, x) and np.array_equal(np.signbit(back), np.signbit(x)), module
    return w


@dataclass
class Expected:
    packed: np.ndarray
    scale: np.ndarray
    w2: np.float32
    amax: float       # the amax the quantizer was calibrated to (pair max; 6 where that is 0)
    own_amax: float   # the module's own max|W|
    sanitized: bool   # amax 0 replaced by ModelOpt's maxbound


_EXPECTED: dict[str, dict[str, Expected]] = {}


def expected_modelopt(src_dir) -> dict[str, Expected]:
    """module -> ModelOpt's own export of it (cached per source)."""
    key = str(src_dir)
    if key not in _EXPECTED:
        src = open_checkpoint(src_dir)
        modules = src.modules()
        weights = {m: decoded_bf16(src, m) for m in modules}
        own = {m: mq.module_amax(weights[m]) for m in modules}
        out = {}
        for m in modules:
            p = partner(m)
            amax = mq.pair_amax(own[m], own[p]) if p in own else own[m].float()
            sanitized = float(amax) == 0
            if sanitized:
                amax, _ = mq.sanitized_export_amax(amax)
            packed, scale, w2 = mq.modelopt_requantize(weights[m], amax)
            out[m] = Expected(packed, scale, w2, float(amax), float(own[m]), sanitized)
        _EXPECTED[key] = out
    return _EXPECTED[key]


def unit_mantissa_amax(root: Path) -> None:
    """Rewrites an MXFP4 source in place: in each module's top groups (the
    largest scale byte among groups holding a nonzero code), every magnitude-6
    code becomes 4, sign kept, so the module's amax becomes 4 * 2^k_max.
    `generate` always puts a 6 at the top, an amax of mantissa 1.5, and then
    x / fl32(S * w) and (x / S) / w never round apart on MXFP4 values; with
    mantissa 1 they do (S a subnormal 3 * 2^-9, t = 1.75 or 3.5 up to an
    ulp), so the case tells ModelOpt's single division from a two-step one.
    Only packed bytes change, in place (same length): still a valid source."""
    ck = open_checkpoint(root)
    for m in ck.modules():
        scale, packed = u8(ck.tensor(m + SUFFIX_SCALE)), u8(ck.tensor(m + SUFFIX_PACKED))
        lo, hi = packed & 0x0F, packed >> 4
        active = np.maximum(lo & 7, hi & 7).reshape(packed.shape[0], -1, 16).max(axis=-1) > 0
        if not active.any():
            continue
        top = np.repeat((scale == scale[active].max()) & active, 16, axis=1)  # 16 packed bytes per 32-group
        lo = np.where(top & ((lo & 7) == 7), lo - 1, lo)
        hi = np.where(top & ((hi & 7) == 7), hi - 1, hi)
        shard = Path(root) / ck.weight_map[m + SUFFIX_PACKED]
        begin, end = tensor_location(shard, m + SUFFIX_PACKED)
        assert end - begin == packed.size
        patch_bytes(shard, begin, ((hi << 4) | lo).astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def sources(outputs, tmp_path_factory) -> dict[str, Path]:
    """case -> MXFP4 source (only mx2nv generate / demo)."""
    root = tmp_path_factory.mktemp("requantize-modelopt-src")
    out = {"demo": outputs["demo"][0]}
    # One module over every window (convert refuses it; requantize must not).
    mx2nv("generate", root / "wide", "--layout", "k3", "--shards", "2", "--set-span", f"{WIDE_MODULE}=30", *COMMON)
    out["wide"] = root / "wide"
    mx2nv("generate", root / "flat", "--layout", "flat", "--shards", "1", "--seed", "11", "--span", "24", *COMMON)
    out["flat_single_file"] = root / "flat"
    # Wide spans everywhere (block scales under 2^-9: ModelOpt clamps them up
    # to 0x01 where compressed-tensors rounds to 0 and writes 0x20), many
    # all-zero groups, some with extreme scales (0x38 against CT's 0x20),
    # all-zero modules (the amax-0 deviation), and amaxes of mantissa 1 (see
    # unit_mantissa_amax: where the order of ModelOpt's division shows).
    zeros = ["--all-zero", ZERO_GATE, "--all-zero", ZERO_PAIR[0], "--all-zero", ZERO_PAIR[1], "--all-zero", ZERO_DOWN]
    mx2nv("generate", root / "adversarial", "--layout", "k3", "--shards", "2", "--seed", "5", "--span", "20",
          "--zero-percent", "30", "--extreme-zero-scales", "on", "--set-span", f"{WIDE_MODULE}=30", *zeros, *COMMON)
    unit_mantissa_amax(root / "adversarial")
    out["adversarial"] = root / "adversarial"
    return out


# ---------------------------------------------------------------- the oracle itself (no mx2nv feature needed)


def test_oracle_is_the_wheels_own_code():
    """Every function the oracle calls was compiled from the pinned wheel's
    own file, and the wheel's own constants give the default recipe's
    numbers: 448 (no four_over_six), maxbound 6, dynamic (not static)."""
    c = mq.code()
    for name, rel in (("NVFP4QTensor", mq.NVFP4), ("_cast_per_block_scale_to_fp8", mq.NVFP4),
                      ("reduce_amax", mq.CORE), ("reduce_block_amax", mq.CORE), ("reduce_block_padding", mq.CORE),
                      ("to_quantized_weight", mq.EXPORT), ("TensorQuantizer.maxbound", mq.TENSOR_QUANTIZER),
                      ("TensorQuantizer._sanitize_export_amax", mq.TENSOR_QUANTIZER)):
        assert c.where[name].startswith(rel + ":"), name
    q = mq.weight_quantizer(6.0)
    assert c["fp8_max_for_normalization"](q) == 448.0 and c["E2M1_MAX"] == 6.0
    assert mq.tensor_quantizer().maxbound == 6.0
    assert not mq.nvfp4_qtensor()._is_static_quantizer(q)


# amax -> weight_scale_2 bits: the float32 nearest amax / 2688 (design note,
# computed there with numpy; checked again below with numpy's IEEE division).
WEIGHT_SCALE_2 = [
    (6.0, 0x3B124925),            # 6/2688 = 1/448
    (3.0, 0x3A924925),            # 1/896
    (0.5, 0x39430C31),            # 1/5376
    (1.5 * 2.0**127, 0x79924925),  # the largest c * 2^k below BF16's max: w stays finite
    (2.0**-128, 0x0000030C),      # subnormal w (mx2nv refuses it; ModelOpt writes it)
]


@pytest.mark.parametrize(("amax", "bits"), WEIGHT_SCALE_2, ids=[f"{a!r}-{b:#010x}" for a, b in WEIGHT_SCALE_2])
def test_weight_scale_2_bit_patterns(amax, bits):
    w2 = mq.weight_scale_2(amax)
    assert w2.dtype == torch.float32 and w2.dim() == 0
    assert f32_bits(w2.item()) == bits
    # numpy's IEEE float32 division gives the same (the torch CPU kernel divides, it does not
    # multiply by a rounded reciprocal).
    assert f32_bits(np.float32(amax) / np.float32(2688.0)) == bits
    # Never a power of two (mx2nv verify tells requantized from exact modules by this).
    assert bits & 0x7FFFFF != 0


def test_weight_scale_2_is_never_a_power_of_two_for_an_mxfp4_amax():
    """Every amax an MXFP4 source can give is m * 2^k (m an E2M1 magnitude,
    k from E8M0's range, within BF16's); ModelOpt's weight_scale_2 of it is
    never a power of two, normal or subnormal, so verify never mistakes a
    requantized ModelOpt module for an exact one."""
    bf16_max = torch.finfo(torch.bfloat16).max
    amax = [m * 2.0**k for m in E2M1_MAGNITUDES[1:] for k in range(-127, 128) if m * 2.0**k <= bf16_max]
    bits = mq.weight_scale_2(torch.tensor(amax, dtype=torch.float32)).view(torch.int32).numpy().astype(np.uint32)
    exponent, mantissa = bits >> 23, bits & 0x7FFFFF
    power_of_two = np.where(exponent != 0, mantissa == 0, (mantissa & (mantissa - 1)) == 0)
    assert not power_of_two.any(), [a for a, p in zip(amax, power_of_two) if p]
    assert (bits != 0).all()


def test_weight_scale_2_is_the_same_on_a_gpu_for_every_mxfp4_amax():
    """get_weights_scaling_factor_2_from_quantizer divides a tensor by a Python
    float (`_amax.float() / (E2M1_MAX * m_fp8)`). CPU torch divides (the
    oracle here); CUDA torch multiplies by the divisor's float32 reciprocal
    instead (aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu,
    div_true_kernel_cuda: a CPU-scalar divisor becomes a * (1 / b)), and
    ModelOpt usually exports on a GPU. For every amax an MXFP4 source can give
    (m * 2^k, subnormal results included) the two agree, so one expectation
    holds for both; for other BF16 amaxes they can differ in the last bit."""
    bf16_max = torch.finfo(torch.bfloat16).max
    amax = np.array([m * 2.0**k for m in E2M1_MAGNITUDES[1:] for k in range(-127, 128) if m * 2.0**k <= bf16_max],
                    dtype=np.float32)
    cpu = mq.weight_scale_2(torch.from_numpy(amax)).numpy()
    gpu = (amax * (np.float32(1.0) / np.float32(2688.0))).astype(np.float32)
    assert np.array_equal(cpu.view(np.uint32), gpu.view(np.uint32))
    other = np.float32(1.03125)  # a BF16 amax no MXFP4 block can have: the two differ
    assert f32_bits(mq.weight_scale_2(float(other)).item()) != f32_bits(other * (np.float32(1.0) / np.float32(2688.0)))


def test_amax_zero_is_what_the_deviation_replaces():
    """ModelOpt's own code on an all-zero weight with amax 0: weight_scale_2 0,
    every block scale 0/0 = NaN (kept by the clamp), every code 7. Its own
    sanitizer (export_amax's) gives 6 instead, and then scales 0x38 and codes 0."""
    zeros = torch.zeros(2, 32, dtype=torch.bfloat16)
    packed, scale, w2 = mq.modelopt_requantize(zeros, 0.0)
    assert w2 == 0
    assert np.all((scale & 0x7F) == 0x7F)  # E4M3 NaN
    assert np.all(packed == 0x77)
    amax, warned = mq.sanitized_export_amax(0.0)
    assert amax == 6.0 and warned
    packed, scale, w2 = mq.modelopt_requantize(zeros, amax)
    assert f32_bits(w2) == 0x3B124925 and np.all(scale == 0x38) and np.all(packed == 0)
    # The numpy re-implementation follows ModelOpt on both.
    q = nw.modelopt_dynamic(bf16_numpy(zeros), np.float32(0.0))
    assert q.scale_2 == 0 and np.all((q.scale & 0x7F) == 0x7F) and np.all(q.weight == 0x77)


def _weight(rows: list[list[float]]) -> torch.Tensor:
    """A BF16 weight whose rows are padded with zeros to a multiple of 16;
    every value given must be a BF16 value."""
    k = max(16, -(-max(len(r) for r in rows) // 16) * 16)
    w = torch.zeros(len(rows), k, dtype=torch.float64)
    for i, r in enumerate(rows):
        w[i, : len(r)] = torch.tensor(r, dtype=torch.float64)
    b = w.to(torch.bfloat16)
    assert torch.equal(b.to(torch.float64), w)
    return b


def _ct_scale_bytes(w: torch.Tensor) -> np.ndarray:
    """compressed-tensors 0.20.1's own block scales (NVFP4A16, generate_gparam
    global from the tensor's min/max) as E4M3 bytes."""
    x = w.to(torch.float32)
    g = generate_gparam(x.min(), x.max())
    blocks = x.reshape(x.shape[0], -1, 16)
    s, _ = calculate_qparams(blocks.amin(dim=-1), blocks.amax(dim=-1), NVFP4A16.weights, global_scale=g)
    return s.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def _agree_with_numpy(w: torch.Tensor, amax: float) -> tuple[np.ndarray, np.ndarray, np.float32]:
    packed, scale, w2 = mq.modelopt_requantize(w, amax)
    q = nw.modelopt_dynamic(bf16_numpy(w), np.float32(amax))
    assert np.array_equal(q.weight, packed) and np.array_equal(q.scale, scale)
    assert f32_bits(q.scale_2) == f32_bits(w2)
    return packed, scale, w2


def test_block_scale_vectors():
    """Row 0 holds the amax 6 (b = amax: s = 6 / fl32(6 * fl32(6/2688)) =
    447.99997 -> 448 = 0x7E), row 1 a zero block and a tiny block
    (b = 2^-18: s = 2^-18 * 448/6 = 2^-11.8 < 2^-9, clamped up: 0x01)."""
    w = _weight([[6.0], [0.0] * 16 + [2.0**-18]])
    _, scale, _ = _agree_with_numpy(w, 6.0)
    assert scale.tolist() == [[0x7E, 0x38], [0x38, 0x01]]
    # compressed-tensors writes 0x20 (0.125) for both the zero and the tiny block.
    assert _ct_scale_bytes(w).tolist() == [[0x7E, 0x20], [0x20, 0x20]]


@pytest.mark.parametrize("amax", [6.0, 3.0, 1.0, 0.5, 1.5 * 2.0**-7, 4.0 * 2.0**-20, 2.0**100])
def test_block_holding_the_amax_gets_448(amax):
    _, scale, _ = _agree_with_numpy(_weight([[amax, -amax / 2]]), amax)
    assert scale[0, 0] == 0x7E


def test_block_scale_clamps():
    """The clamp's two ends, through ModelOpt's own functions: a subnormal w
    (amax 2^-128) makes the unclamped scale of the amax block 448.1094,
    clamped to 448 (0x7E); at amax 1.5 * 2^127 a block of 2^-128 gives
    b / (6 w) = 0 in float32, which becomes 1.0 (0x38), and its code 0."""
    qt = mq.nvfp4_qtensor()
    tiny = _weight([[2.0**-128] * 16])
    raw = qt.get_weights_scaling_factor(tiny, 16, mq.weight_scale_2(2.0**-128), keep_high_precision=True)[0]
    assert raw.item() > 448.0 and np.float32(raw.item()) == np.float32(448.109405517578125)
    _, scale, _ = _agree_with_numpy(tiny, 2.0**-128)
    assert scale[0, 0] == 0x7E
    packed, scale, _ = _agree_with_numpy(_weight([[1.5 * 2.0**127], [2.0**-128]]), 1.5 * 2.0**127)
    assert scale[1, 0] == 0x38 and packed[1, 0] == 0
    # _cast_per_block_scale_to_fp8 directly: the 2^-9 floor (CT has none), 448 ceiling, NaN kept.
    s = torch.tensor([2.0**-10, 2.0**-9 * 0.75, 2.0**-9, 448.0, 448.1094, 1e30, float("nan")], dtype=torch.float32)
    assert mq.cast_scale(s)[:6].tolist() == [0x01, 0x01, 0x01, 0x7E, 0x7E, 0x7E]
    assert mq.cast_scale(s)[6] & 0x7F == 0x7F


def nearest_even_e2m1(t: float) -> int:
    """The E2M1 code of t by definition: the nearest magnitude, a tie to the
    even code; sign bit from t < 0 (ModelOpt's rule: -0.0 is +0)."""
    a = abs(t)
    if a == float("inf"):
        code = 7
    else:
        d = [abs(a - m) for m in E2M1_MAGNITUDES]
        best = [i for i, x in enumerate(d) if x == min(d)]
        code = best[0] if len(best) == 1 else next(i for i in best if i % 2 == 0)
    return code | (8 if t < 0 else 0)


def test_code_thresholds_and_ties():
    """_cast_fp4 on every threshold and tie, the float32 next to each, both
    signs: the nearest E2M1 value, ties to even; +-inf saturate to +-6."""
    ts = [0.0, -0.0, float("inf")]
    for bound in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0):
        b = np.float32(bound)
        ts += [float(b), float(np.nextafter(b, np.float32(0))), float(np.nextafter(b, np.float32(np.inf)))]
    ts += [-t for t in ts if t != 0]
    scaled = torch.tensor(ts, dtype=torch.float32)
    got = mq.cast_fp4(scaled).tolist()
    assert got == [nearest_even_e2m1(t) for t in ts]
    assert np.array_equal(nw.cast_fp4(scaled.numpy()), np.array(got, dtype=np.uint8))
    # Spot values fixed by hand: each tie goes to the even code.
    spot = {0.25: 0, 0.75: 2, 1.25: 2, 1.75: 4, 2.5: 4, 3.5: 6, 5.0: 6}
    assert mq.cast_fp4(torch.tensor(list(spot), dtype=torch.float32)).tolist() == list(spot.values())


def test_negative_zero_and_small_negatives():
    """Through the whole export: -0.0 becomes code 0x0 (the sign is x < 0;
    compressed-tensors keeps -0.0's sign bit instead: 0x8), a negative whose
    magnitude rounds to 0 keeps its sign: 0x8. Row: amax 6 (S = 448,
    w = fl32(6/2688), S*w = 1 in float32), -0.0, -2^-12 (t = -2^-12), +2^-12,
    -0.25 (a tie: magnitude 0, sign 1: 0x8)."""
    packed, scale, w2 = _agree_with_numpy(_weight([[6.0, -0.0, -(2.0**-12), 2.0**-12, -0.25]]), 6.0)
    assert scale[0, 0] == 0x7E and np.float32(np.float32(448.0) * w2) == np.float32(1.0)
    codes = nw.codes_of(packed)[0, :5].tolist()
    assert codes == [7, 0x0, 0x8, 0x0, 0x8]


def test_division_order_vector():
    """x = 2^-18 in a block whose scale is 0.75 (0x34), amax 2^-7: ModelOpt
    divides once by fl32(S * w): t = 1.7499999, code 3 (1.5). Dividing in two
    steps, (x / S) / w, gives the tie 1.75 exactly, code 4 (2.0)."""
    amax = 2.0**-7
    b = 1.7109375 * 2.0**-17  # the block's amax: b / (6 w) = 0.7485 -> E4M3 0.75
    packed, scale, w2 = _agree_with_numpy(_weight([[b, 2.0**-18], [amax]]), amax)
    assert scale[0, 0] == 0x34
    x, s = np.float32(2.0**-18), np.float32(0.75)
    assert np.float32(x / np.float32(s * w2)) == np.nextafter(np.float32(1.75), np.float32(0))
    assert np.float32(np.float32(x / s) / w2) == np.float32(1.75)
    assert nw.codes_of(packed)[0, 1] == 3


def test_random_tensors_agree_with_numpy():
    """Property check over random BF16 weights spanning 2^-60..2^60, with zero
    blocks, -0.0 and negatives, and amaxes above the tensor's own (a pair's):
    ModelOpt's code and the numpy re-implementation agree bit for bit."""
    rng = np.random.default_rng(20260101)
    for trial in range(24):
        rows, cols = 32, 128
        mag = np.ldexp(rng.uniform(0.5, 1.0, (rows, cols)), rng.integers(-60, 60, (rows, cols)) // (1 + trial % 4))
        x = np.where(rng.random((rows, cols)) < 0.5, -mag, mag)
        x[rng.random((rows, cols)) < 0.1] = 0.0
        x[rng.random((rows, cols)) < 0.05] = -0.0
        x.reshape(rows, -1, 16)[rng.random((rows, cols // 16)) < 0.1] = 0.0
        w = torch.from_numpy(x).to(torch.bfloat16)
        own = float(mq.module_amax(w))
        for amax in (own, own * 2 if trial % 3 else own * 1.5):
            _agree_with_numpy(w, amax)




@pytest.mark.parametrize("case", REQUANTIZE_CASES)
def test_oracle_equals_numpy_on_the_conformance_sources(sources, case):
    """ModelOpt's code, on every module of the sources the mx2nv cases use,
    equals nvfp4_writers.modelopt_dynamic (same amax: the pair's)."""
    src = open_checkpoint(sources[case])
    exp = expected_modelopt(sources[case])
    assert sorted(exp) == src.modules() and exp
    for m, e in exp.items():
        q = nw.modelopt_dynamic(bf16_numpy(decoded_bf16(src, m)), np.float32(e.amax))
        assert np.array_equal(q.weight, e.packed) and np.array_equal(q.scale, e.scale), m
        assert f32_bits(q.scale_2) == f32_bits(e.w2), m


def test_sources_hold_what_tells_the_recipes_apart(sources):
    """The `adversarial` and `wide` sources hold zero blocks (0x38, CT 0x20),
    nonzero blocks clamped up to 0x01 (CT: 0x20 or another byte), all-zero
    modules (sanitized), an all-zero gate beside a nonzero up, and codes where
    a two-step division (x / S) / w would round otherwise than ModelOpt's
    x / fl32(S * w); without them a wrong recipe could pass every byte check."""
    exp = expected_modelopt(sources["adversarial"])
    src = open_checkpoint(sources["adversarial"])
    zero_blocks = clamped = two_step = 0
    for m, e in exp.items():
        x = mxfp4_values(u8(src.tensor(m + SUFFIX_PACKED)), u8(src.tensor(m + SUFFIX_SCALE))).astype(np.float32)
        n, k = x.shape
        b = np.abs(x).reshape(n, -1, 16).max(axis=-1)
        zero_blocks += int(((b == 0) & (e.scale == 0x38)).sum())
        clamped += int(((b > 0) & (e.scale == 0x01)).sum())
        s = e.scale.view(ml_dtypes.float8_e4m3fn).astype(np.float32)[..., None]
        t = ((x.reshape(n, -1, 16) / s).astype(np.float32) / e.w2).astype(np.float32).reshape(n, k)
        two_step += int((nw.cast_fp4(t) != nw.codes_of(e.packed)).sum())
    assert zero_blocks > 0 and clamped > 0 and two_step > 0
    assert {m for m, e in exp.items() if e.sanitized} == set(ZERO_PAIR) | {ZERO_DOWN}
    assert exp[ZERO_GATE].own_amax == 0 and exp[ZERO_GATE].amax > 0 and not exp[ZERO_GATE].sanitized
    wide = expected_modelopt(sources["wide"])[WIDE_MODULE]
    assert (wide.scale == 0x01).sum() > 0


# ---------------------------------------------------------------- mx2nv's outputs


@pytest.fixture(scope="module")
def requantized(sources, tmp_path_factory) -> dict[str, tuple[Path, Path, dict]]:
    """case -> (MXFP4 source, ModelOpt requantized output, report)."""
    root = tmp_path_factory.mktemp("requantize-modelopt")
    out = {}
    for name in REQUANTIZE_CASES:
        dst, report = root / name, root / f"{name}-report.json"
        mx2nv("requantize", sources[name], dst, "--format", "modelopt", "--threads", "2", "--report", report)
        out[name] = (sources[name], dst, json.loads(report.read_text()))
    return out


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory) -> tuple[Path, Path, dict]:
    """(wide source, convert --format modelopt --overspan requantize output, report)."""
    root = tmp_path_factory.mktemp("convert-modelopt-overspan")
    dst, report = root / "wide", root / "wide-report.json"
    mx2nv("convert", sources["wide"], dst, "--format", "modelopt", "--overspan", "requantize", "--threads", "2",
          "--report", report)
    return sources["wide"], dst, json.loads(report.read_text())


def modelopt_modules(ck) -> list[str]:
    return sorted(n[: -len(WS2)] for n in ck.weight_map if n.endswith(WS2))


def dtype_of(ck, name: str) -> str:
    with safe_open(ck.root / ck.weight_map[name], framework="pt") as f:
        return f.get_slice(name).get_dtype()


def assert_equals_oracle(dst, m: str, e: Expected) -> None:
    assert (dtype_of(dst, m + W), dtype_of(dst, m + WS), dtype_of(dst, m + WS2)) == ("U8", "F8_E4M3", "F32"), m
    weight, scale, w2 = dst.tensor(m + W), dst.tensor(m + WS), dst.tensor(m + WS2)
    assert tuple(weight.shape) == e.packed.shape and tuple(scale.shape) == e.scale.shape and w2.shape == (), m
    assert np.array_equal(u8(weight), e.packed), (m, int((u8(weight) != e.packed).sum()))
    assert np.array_equal(u8(scale), e.scale), (m, int((u8(scale) != e.scale).sum()))
    assert f32_bits(w2.item()) == f32_bits(e.w2), (m, w2.item(), float(e.w2))


@pytest.mark.parametrize("case", REQUANTIZE_CASES)
def test_bytes_equal_modelopts_own_quantization(requantized, case):
    src_dir, dst_dir, _ = requantized[case]
    src, dst = open_checkpoint(src_dir), open_checkpoint(dst_dir)
    assert modelopt_modules(dst) == src.modules()
    for m, e in expected_modelopt(src_dir).items():
        assert_equals_oracle(dst, m, e)


@pytest.mark.parametrize("case", REQUANTIZE_CASES)
def test_modelopt_tensor_names_only(requantized, case):
    """Each module is `weight`, `weight_scale`, `weight_scale_2` (W4A16: no
    input_scale), nothing of compressed-tensors' names; every other tensor of
    SRC is there under its own name."""
    src_dir, dst_dir, _ = requantized[case]
    src, dst = open_checkpoint(src_dir), open_checkpoint(dst_dir)
    modules = src.modules()
    want = {m + s for m in modules for s in (W, WS, WS2)}
    want |= {n for n in src.weight_map if n.rsplit(".", 1)[0] not in set(modules)}
    assert set(dst.weight_map) == want
    assert not [n for n in dst.weight_map if n.endswith(("input_scale", ".weight_packed", ".weight_global_scale"))]


@pytest.mark.parametrize("case", REQUANTIZE_CASES)
def test_gate_and_up_share_weight_scale_2(requantized, case):
    """Both runtimes use the gate's weight_scale_2 for w13; ModelOpt unifies
    the pair's amax, so the two are bit-identical."""
    _, dst_dir, _ = requantized[case]
    dst = open_checkpoint(dst_dir)
    pairs = 0
    for m in modelopt_modules(dst):
        p = partner(m)
        if p is not None:
            assert f32_bits(dst.tensor(m + WS2).item()) == f32_bits(dst.tensor(p + WS2).item()), m
            pairs += 1
    assert pairs > 0


def test_pair_rule_is_exercised(sources):
    """The fixtures hold pairs whose halves' own amaxes differ (so a per-module
    amax would give other bytes), on the wide and the adversarial source."""
    for case in ("wide", "adversarial"):
        exp = expected_modelopt(sources[case])
        assert any(e.own_amax != e.amax for m, e in exp.items() if partner(m) in exp), case


def expected_row(src, dst, m: str) -> dict:
    """The report row recomputed: against SRC's exact MXFP4 values, in float64,
    with the report's conventions for an all-zero module (error 0: relative
    RMSE 0, cosine 1)."""
    x = mxfp4_values(u8(src.tensor(m + SUFFIX_PACKED)), u8(src.tensor(m + SUFFIX_SCALE)))
    w2 = dst.tensor(m + WS2).item()
    scale = u8(dst.tensor(m + WS))
    q = modelopt_values(u8(dst.tensor(m + W)), scale, w2)
    err2, ref2, q2 = np.sum((q - x) ** 2), np.sum(x**2), np.sum(q**2)
    rmse = 0.0 if err2 == 0 else (np.inf if ref2 == 0 else np.sqrt(err2 / ref2))
    cos = 1.0 if ref2 == 0 and q2 == 0 else (0.0 if ref2 == 0 or q2 == 0 else np.sum(q * x) / np.sqrt(ref2 * q2))
    return {"values": x.size, "global_scale": w2, "relative_rmse": rmse, "cosine": cos,
            "max_abs_error": float(np.max(np.abs(q - x))), "marlin_zeroed_blocks": marlin_zeroed(scale)}


def assert_row(row: dict, want: dict) -> None:
    m = row["module"]
    assert row["values"] == want["values"], m
    assert row["global_scale"] == want["global_scale"], m  # weight_scale_2 itself: the stored F32, a multiplier
    assert row["marlin_zeroed_blocks"] == want["marlin_zeroed_blocks"], m
    assert row["relative_rmse"] == pytest.approx(want["relative_rmse"], rel=1e-9, abs=1e-300), m
    assert row["cosine"] == pytest.approx(want["cosine"], rel=1e-12), m
    assert row["max_abs_error"] == pytest.approx(want["max_abs_error"], rel=1e-12, abs=0), m


@pytest.mark.parametrize("case", REQUANTIZE_CASES)
def test_reported_errors_match_an_independent_recomputation(requantized, case):
    src_dir, dst_dir, report = requantized[case]
    src, dst = open_checkpoint(src_dir), open_checkpoint(dst_dir)
    assert report["command"] == "requantize" and report["result"] == "ok"
    table = {row["module"]: row for row in report["requantized"]}
    assert sorted(table) == src.modules()
    for m in src.modules():
        assert_row(table[m], expected_row(src, dst, m))
    if case == "wide":
        assert table[WIDE_MODULE]["relative_rmse"] > 0
    if case == "adversarial":
        # ModelOpt's 2^-9 floor writes subnormal block scales, which the table must count.
        assert sum(row["marlin_zeroed_blocks"] for row in table.values()) > 0
        for m in ZERO_MODULES:
            assert table[m]["max_abs_error"] == 0 and table[m]["relative_rmse"] == 0, m


def _assert_modelopt_config(dst_dir: Path) -> dict:
    cfg = json.loads((dst_dir / "config.json").read_text())
    top = cfg["quantization_config"]
    assert top["quant_method"] == "modelopt" and top["quant_algo"] == "W4A16_NVFP4"
    assert "quantization" not in top  # vLLM's _normalize_quantization_config raises for a nested W4A16
    if "text_config" in cfg:
        assert cfg["text_config"]["quantization_config"] == top
    hf = json.loads((dst_dir / "hf_quant_config.json").read_text())
    assert hf["quantization"]["quant_algo"] == "W4A16_NVFP4" and hf["quantization"]["group_size"] == 16
    return top


@pytest.mark.parametrize("case", REQUANTIZE_CASES)
def test_config_is_modelopt_w4a16_nvfp4(requantized, case):
    _assert_modelopt_config(requantized[case][1])


def test_both_runtimes_parse_the_config(requantized, converted):
    """SGLang 0.5.23's and vLLM 0.34.0's own from_config read the config of a
    requantized output (and of convert's, which names the lossy modules under
    an extra key) as W4A16 NVFP4, group 16."""
    for dst in (requantized["demo"][1], requantized["flat_single_file"][1], converted[1]):
        for d in (mo.resolved_quant_config(dst), json.loads((dst / "hf_quant_config.json").read_text())):
            s = mo.sglang_code()["ModelOptFp4Config"].from_config(dict(d, packed_modules_mapping={}))
            v = mo.vllm_code()["ModelOptNvFp4Config"].from_config(dict(d))
            assert s.is_w4a16 and s.group_size == 16 and s.is_checkpoint_nvfp4_serialized, dst
            assert v.quant_method == "W4A16_NVFP4" and v.group_size == 16, dst


# ---------------------------------------------------------------- convert --overspan requantize


def test_convert_requantizes_only_the_over_span_module(converted):
    src_dir, dst_dir, report = converted
    src, dst = open_checkpoint(src_dir), open_checkpoint(dst_dir)
    lossy = {row["module"] for row in report["requantized"]}
    assert lossy == {WIDE_MODULE}
    assert report["overspan"]["choice"] == "requantize" and report["overspan"]["lossy"] is True
    assert report["overspan"]["requantized_marlin_zeroed_blocks"] == sum(
        row["marlin_zeroed_blocks"] for row in report["requantized"])
    top = _assert_modelopt_config(dst_dir)
    assert set(top["mx2nv_requantized_modules"]) == lossy
    assert modelopt_modules(dst) == src.modules()
    exp = expected_modelopt(src_dir)
    for m in src.modules():
        if m in lossy:
            assert_equals_oracle(dst, m, exp[m])
            continue
        # Exact: SRC's codes, a power-of-two weight_scale_2, every value SRC's.
        assert np.array_equal(u8(dst.tensor(m + W)), u8(src.tensor(m + SUFFIX_PACKED))), m
        w2 = np.float32(dst.tensor(m + WS2).item())
        assert w2 > 0 and f32_bits(w2) & 0x7FFFFF == 0 and (f32_bits(w2) >> 23) != 0, m
        x = mxfp4_values(u8(src.tensor(m + SUFFIX_PACKED)), u8(src.tensor(m + SUFFIX_SCALE)))
        assert np.array_equal(modelopt_values(u8(dst.tensor(m + W)), u8(dst.tensor(m + WS)), w2), x), m
    for row in report["requantized"]:
        assert_row(row, expected_row(src, dst, row["module"]))


def test_verify_accepts_the_convert_output(converted):
    mx2nv("verify", converted[0], converted[1])


def _flip(dst: Path, name: str, pick) -> None:
    """XOR one byte of tensor `name` in its shard: pick(data) -> (offset, mask)."""
    ck = open_checkpoint(dst)
    shard = dst / ck.weight_map[name]
    begin, end = tensor_location(shard, name)
    data = shard.read_bytes()[begin:end]
    offset, mask = pick(data)
    patch_bytes(shard, begin + offset, bytes([data[offset] ^ mask]))


def _scale_byte(data: bytes) -> tuple[int, int]:
    """The first scale byte whose flipped lowest bit is still a finite E4M3
    value (not 0x7F/0xFF): a plausible, wrong scale."""
    return next(i for i, b in enumerate(data) if (b ^ 0x01) & 0x7F != 0x7F), 0x01


FLIPS = {
    "code_nibble": (W, lambda data: (0, 0x01)),        # element 0's magnitude changes
    "scale_byte": (WS, _scale_byte),
    "weight_scale_2_lsb": (WS2, lambda data: (0, 0x01)),  # little-endian: byte 0 holds the lowest mantissa bit
}


@pytest.mark.parametrize("flip", FLIPS)
def test_verify_reports_a_changed_requantized_module(converted, tmp_path, flip):
    """A flipped code nibble, scale byte, or the last mantissa bit of
    weight_scale_2 of the requantized module: verify recomputes the module from
    SRC (under the plan's weight_scale_2, not DST's) and must exit 1."""
    src, dst, _ = converted
    copy = tmp_path / "broken"
    shutil.copytree(dst, copy)
    suffix, pick = FLIPS[flip]
    _flip(copy, WIDE_MODULE + suffix, pick)
    result = mx2nv("verify", src, copy, check=False)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert WIDE_MODULE in result.stdout + result.stderr
