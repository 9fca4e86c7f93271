"""nvidia-modelopt 0.47.0's own dynamic NVFP4 weight quantizer, run on CPU
torch from the released wheel (wheels.py), without importing `modelopt`.

`import modelopt` pulls in requests, omegaconf, torch.distributed FSDP and
more, none of which the suite depends on. Instead, as for the runtimes, the
wheel's own functions are compiled from its own files (wheels.WheelCode) into
one namespace. What is taken, all from modelopt/torch/...:

  quantization/qtensor/nvfp4_tensor.py
    e2m1_bounds, e2m1_values (module tables), _cast_per_block_scale_to_fp8
    (clamp to [2^-9, 448], cast to float8_e4m3fn), and the whole class
    NVFP4QTensor: get_weights_scaling_factor_2_from_quantizer (amax / 2688),
    _is_static_quantizer / _get_static_global_amax (dynamic vs static),
    get_weights_scaling_factor (block amax / (6 * scale_2), 0 -> 1.0, cast),
    quantize (x / (scale * scale_2)), _cast_fp4 (E2M1 rounding)
  quantization/utils/core_utils.py
    reduce_amax, reduce_block_amax, reduce_block_padding, _FP8_DTYPES
  quantization/utils/numeric_utils.py
    E2M1_MAX, E4M3_MAX, E4M3_MAX_46, fp8_max_for_normalization
  quantization/nn/modules/tensor_quantizer.py
    TensorQuantizer.maxbound, TensorQuantizer._sanitize_export_amax
  export/quant_utils.py
    to_quantized_weight (the export's call into NVFP4QTensor.quantize)
  export/model_config.py
    the QUANTIZATION_* format names to_quantized_weight compares against

and the export's sequence for one weight of a dynamic NVFP4 quantizer
(export/unified_export_hf.py::_export_quantized_weight): weight_scale_2 =
get_weights_scaling_factor_2_from_quantizer(q).squeeze(); weight_scale =
NVFP4QTensor.get_weights_scaling_factor(weight, block_size, weight_scale_2)[0]
(the non-static branch); weight = to_quantized_weight(weight.to(dtype),
weight_scale, "w4a16_nvfp4", weight_scale_2, block_size).

Stubs, each unable to change a value:
  * `fp4_compatible() -> False` (backends/utils.py): it only gates
    NVFP4QTensor.quantize's TensorRT-LLM path, which also needs a CUDA input
    and try_tensorrt=True; the export never passes try_tensorrt.
  * `BaseQuantizedTensor` (qtensor/base_qtensor.py): the real one stores
    (shape, dtype) in `metadata` and the packed data in `_quantized_data`, and
    registers the class with torch.serialization; the stand-in does the first
    two only.
  * `QTensorWrapper`: to_quantized_weight's isinstance test for an already
    compressed weight; a plain tensor is never one, as in ModelOpt.
  * the weight quantizer: a namespace with the attributes the taken
    functions read, as the default NVFP4 numerics set them
    (modelopt_recipes/configs/numerics/nvfp4.yaml: num_bits e2m1 = (2, 1),
    block_sizes {-1: 16, type: dynamic, scale_bits: e4m3 = (4, 3)}; no
    four_over_six, no global_amax: the dynamic, max-calibrated quantizer of
    W4A16_NVFP4_CFG / NVFP4_DEFAULT_CFG) and `_amax`, the calibrated
    per-tensor max|W| (gate/up: the pair's max, export/quant_utils.py::
    preprocess_linear_fusion, export/layer_utils.py::sync_moe_gate_up_amax).

If a later wheel renames or moves any of these, `code()` fails with a message
naming what is missing; nothing here is ever skipped.
"""

from __future__ import annotations

import ast
import functools
import types
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from wheels import MODELOPT, WheelCode, wheel_dir

Q = "modelopt/torch/quantization/"
NVFP4 = Q + "qtensor/nvfp4_tensor.py"
CORE = Q + "utils/core_utils.py"
NUMERIC = Q + "utils/numeric_utils.py"
TENSOR_QUANTIZER = Q + "nn/modules/tensor_quantizer.py"
EXPORT = "modelopt/torch/export/quant_utils.py"
MODEL_CONFIG = "modelopt/torch/export/model_config.py"

BLOCK = 16
# nvfp4.yaml: num_bits e2m1, block_sizes {-1: 16, type: dynamic, scale_bits: e4m3}.
NUM_BITS = (2, 1)
BLOCK_SIZES = {-1: BLOCK, "type": "dynamic", "scale_bits": (4, 3)}
# The NVFP4QTensor members this module calls; checked by name so that a wheel
# that renames one fails here, with the name, rather than somewhere inside.
NVFP4_MEMBERS = ("get_weights_scaling_factor_2_from_quantizer", "get_weights_scaling_factor_from_quantizer",
                 "_is_static_quantizer", "_get_static_global_amax", "get_weights_scaling_factor", "quantize",
                 "_cast_fp4", "get_e2m1_bounds")


class _BaseQuantizedTensor:
    """Stand-in for qtensor/base_qtensor.py::BaseQuantizedTensor (its
    __init__ without the torch.serialization registration)."""

    def __init__(self, original_shape, original_dtype, quantized_data):
        self.metadata = {"shape": original_shape, "dtype": original_dtype}
        self._quantized_data = quantized_data


class _QTensorWrapper:
    """A class no plain tensor is an instance of (to_quantized_weight's test)."""


def _getter(c: WheelCode, rel: str, cls: str, name: str):
    """The getter of property `name` of class `cls` in `rel`, compiled under
    the wheel file's path with the wheel namespace as its globals
    (WheelCode.methods keeps only functions, not a property object)."""
    tree = c._tree(rel)
    (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    getters = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name
               and any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)]
    if len(getters) != 1:
        raise LookupError(f"{rel}: {cls}.{name} is not one property")
    (node,) = getters
    node.decorator_list = []
    c.where[f"{cls}.{name}"] = f"{rel}:{node.lineno}-{node.end_lineno}"
    scratch = dict(c.namespace)
    c._compile(rel, [node], scratch)
    fn = scratch[name]
    return types.FunctionType(fn.__code__, c.namespace, fn.__name__, fn.__defaults__, fn.__closure__)


@functools.cache
def code() -> WheelCode:
    version = MODELOPT[1]
    try:
        c = WheelCode(wheel_dir(*MODELOPT))
        ns = c.namespace
        ns.update(torch=torch, F=F, warnings=warnings, fp4_compatible=lambda: False,
                  BaseQuantizedTensor=_BaseQuantizedTensor, QTensorWrapper=_QTensorWrapper)
        c.functions(NUMERIC, "E2M1_MAX", "E4M3_MAX", "E4M3_MAX_46", "fp8_max_for_normalization")
        c.functions(CORE, "_FP8_DTYPES", "reduce_amax", "reduce_block_amax", "reduce_block_padding")
        c.functions(NVFP4, "e2m1_bounds", "e2m1_values", "_cast_per_block_scale_to_fp8", "NVFP4QTensor")
        c.functions(MODEL_CONFIG, "QUANTIZATION_FP8", "QUANTIZATION_INT8_SQ", "QUANTIZATION_INT8_WO",
                    "QUANTIZATION_INT4_AWQ", "QUANTIZATION_W4A8_AWQ", "QUANTIZATION_NVFP4",
                    "QUANTIZATION_NVFP4_SVDQUANT", "QUANTIZATION_W4A8_NVFP4_FP8", "QUANTIZATION_MXFP4",
                    "QUANTIZATION_MXFP8", "QUANTIZATION_W4A8_MXFP4_FP8", "QUANTIZATION_W4A16_NVFP4",
                    "QUANTIZATION_NVFP4_AWQ", "QUANTIZATION_FP8_PB_WO", "QUANTIZATION_FP8_PC_PT")
        c.functions(EXPORT, "to_quantized_weight")
        sanitize = c.methods(TENSOR_QUANTIZER, "TensorQuantizer", "_sanitize_export_amax")
        maxbound = property(_getter(c, TENSOR_QUANTIZER, "TensorQuantizer", "maxbound"))
        ns["TensorQuantizer"] = type("TensorQuantizer", (sanitize,), {"maxbound": maxbound})
    except (LookupError, SyntaxError, ValueError, OSError) as e:
        raise AssertionError(
            f"nvidia-modelopt {version}'s files no longer hold what modelopt_quantizer.py takes from them "
            f"({type(e).__name__}: {e}); adapt the oracle to the wheel, do not skip it") from e
    missing = [m for m in NVFP4_MEMBERS if not hasattr(ns["NVFP4QTensor"], m)]
    if missing:
        raise AssertionError(f"nvidia-modelopt {version}: NVFP4QTensor has no {missing} ({NVFP4}); "
                             "adapt modelopt_quantizer.py to the wheel")
    return c


def nvfp4_qtensor():
    return code()["NVFP4QTensor"]


def weight_quantizer(amax) -> types.SimpleNamespace:
    """The dynamic NVFP4 weight quantizer after max calibration, as the taken
    functions see it: `_amax` (float32; a per-tensor amax is 0-dim, and every
    amax here is a BF16 value, exact in float32) and `block_sizes`."""
    a = torch.as_tensor(amax, dtype=torch.float32)
    if not torch.equal(a.to(torch.float64), torch.as_tensor(amax, dtype=torch.float64)):
        raise ValueError(f"amax {amax!r} is not a float32 value")
    return types.SimpleNamespace(_amax=a, block_sizes=dict(BLOCK_SIZES), num_bits=NUM_BITS)


def tensor_quantizer():
    """TensorQuantizer with the NVFP4 numerics' attributes (only maxbound and
    _sanitize_export_amax are real; they read _num_bits and _block_sizes)."""
    tq = code()["TensorQuantizer"]()
    tq._num_bits, tq._block_sizes, tq._unsigned = NUM_BITS, dict(BLOCK_SIZES), False
    return tq


def sanitized_export_amax(amax) -> tuple[float, list[str]]:
    """TensorQuantizer._sanitize_export_amax: 0 (or NaN) -> maxbound (6 for
    E2M1 with E4M3 scales). ModelOpt applies it in export_amax(), which the
    NVFP4 weight path does NOT read (it reads `_amax`): mx2nv applies it to an
    all-zero module or pair as its one deliberate deviation. The warning
    ModelOpt emits is recorded and returned with the value."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = tensor_quantizer()._sanitize_export_amax(torch.as_tensor(amax, dtype=torch.float32).reshape(()))
    return float(out), [str(w.message) for w in caught]


def module_amax(w_bf16: torch.Tensor) -> torch.Tensor:
    """core_utils.reduce_amax over the whole tensor (what max calibration
    stores as `_amax`)."""
    return code()["reduce_amax"](w_bf16)


def pair_amax(*amaxes: torch.Tensor) -> torch.Tensor:
    """preprocess_linear_fusion's unification (export/quant_utils.py):
    torch.max(torch.stack(amaxes)); sync_moe_gate_up_amax takes the same max."""
    return torch.max(torch.stack([a.float().reshape(()) for a in amaxes]))


def weight_scale_2(amax) -> torch.Tensor:
    """get_weights_scaling_factor_2_from_quantizer(q).squeeze() (the F32
    scalar unified_export_hf.py registers as `weight_scale_2`; elementwise
    for a tensor of amaxes)."""
    return nvfp4_qtensor().get_weights_scaling_factor_2_from_quantizer(weight_quantizer(amax)).squeeze()


def cast_scale(per_block_scale: torch.Tensor) -> np.ndarray:
    """_cast_per_block_scale_to_fp8 on float32 block scales -> E4M3 bytes."""
    return code()["_cast_per_block_scale_to_fp8"](per_block_scale.float()).view(torch.uint8).numpy()


def cast_fp4(scaled: torch.Tensor) -> np.ndarray:
    """NVFP4QTensor._cast_fp4 on float32 scaled values -> 4-bit codes (uint8).
    _cast_fp4 takes abs_() in place: it gets a copy."""
    return nvfp4_qtensor()._cast_fp4(scaled.float().clone()).numpy()


def modelopt_requantize(w_bf16: torch.Tensor, amax) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """ModelOpt's export of one BF16 weight [N, K] under a dynamic NVFP4
    weight quantizer calibrated to `amax`: (packed uint8 [N, K/2], E4M3 scale
    bytes uint8 [N, K/16], weight_scale_2 as np.float32)."""
    if w_bf16.dtype != torch.bfloat16 or w_bf16.dim() != 2:
        raise ValueError(f"expected a 2-D bfloat16 weight, got {w_bf16.dtype} {tuple(w_bf16.shape)}")
    qt = nvfp4_qtensor()
    q = weight_quantizer(amax)
    if qt._is_static_quantizer(q):
        raise AssertionError("the quantizer stand-in reads as static; it must be the dynamic one")
    block = q.block_sizes[-1]
    w2 = qt.get_weights_scaling_factor_2_from_quantizer(q).squeeze()
    scale = qt.get_weights_scaling_factor(w_bf16, block_size=block, weights_scaling_factor_2=w2)[0]
    packed = code()["to_quantized_weight"](w_bf16.to(torch.bfloat16), scale, code()["QUANTIZATION_W4A16_NVFP4"],
                                           w2, block)
    if w2.dtype != torch.float32 or w2.dim() != 0:
        raise AssertionError(f"weight_scale_2 is {w2.dtype} {tuple(w2.shape)}, not a float32 scalar")
    if scale.dtype != torch.float8_e4m3fn or packed.dtype != torch.uint8:
        raise AssertionError(f"scale {scale.dtype}, packed {packed.dtype}")
    return packed.numpy().copy(), scale.view(torch.uint8).numpy().copy(), np.float32(w2.item())

