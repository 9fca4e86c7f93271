"""SGLang 0.5.23's own load path for a compressed-tensors NVFP4A16 MoE layer
(scheme CompressedTensorsW4A16Nvfp4MoE, FP4 Marlin runner), run on the CPU
from the released wheel (wheels.py):

  FusedMoE._weight_loader_impl and helpers      srt/layers/moe/fused_moe_triton/layer.py
    (which half of w13 w1/w3 fill, which global slot [e, 0|1])
  CompressedTensorsW4A16Nvfp4MoE                 srt/layers/quantization/compressed_tensors/
    create_weights, process_weights_after_loading  schemes/compressed_tensors_w4a16_nvfp4_moe.py
    (the exact gate/up global equality check, the shape checks)
  prepare_moe_nvfp4_layer_for_marlin, _repack_moe_fp4_weight_for_marlin,
  _permute_moe_fp4_scales_for_marlin, nvfp4_marlin_process_scales,
  nvfp4_marlin_process_global_scale             srt/layers/quantization/marlin_utils_fp4.py
  marlin_permute_scales, get_scale_perms         srt/layers/quantization/marlin_utils.py
  set_weight_attrs                               srt/utils/common.py

Its output is what SGLang hands the Marlin MoE kernel (decoded by
marlin_kernel.py). Unlike vLLM 0.34.0 it neither rescales nor clamps block
scales and casts the global to the activation dtype before x 2^(bias-7).

Stubs, each unable to change a value:
  * `gptq_marlin_repack` (CUDA op): codes kept in checkpoint order (as in vllm_marlin.py);
  * `marlin_make_workspace`: the kernel's scratch counters (torch.cuda query);
  * `logger` (RecordingLogger), `envs.SGLANG_MOE_COPY_WEIGHT_VIEWS_BEFORE_H2D`
    (its default, False), `_is_cpu = _is_hip = False` (a CUDA deployment);
  * classes the loader tests with isinstance (UnquantizedFusedMoEMethod,
    Fp8MoEMethod, CompressedTensorsMxInt4MoE, ModelOptNvFp4FusedMoEMethod):
    unrelated classes, as the scheme is none of them;
  * the layer's configuration (TP size/rank, gated, no padded or presharded
    loading, no fused shared expert, no triton kernels), which
    FusedMoE.__init__ would build from a full server config.
"""

from __future__ import annotations

import functools
import types
from enum import Enum

import torch

from vllm_marlin import KernelInputs
from wheels import SGLANG, RecordingLogger, WheelCode, stub_modules, wheel_dir

S = "sglang/srt/"
LOADER = S + "layers/moe/fused_moe_triton/layer.py"
SCHEME = S + "layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a16_nvfp4_moe.py"
FP4 = S + "layers/quantization/marlin_utils_fp4.py"
MARLIN = S + "layers/quantization/marlin_utils.py"
COMMON = S + "utils/common.py"
SELECT = S + "layers/quantization/compressed_tensors/compressed_tensors.py"


def _repack_in_checkpoint_order(b_q_weight, perm, size_k, size_n, num_bits):
    return b_q_weight.T.contiguous()


@functools.cache
def code() -> WheelCode:
    c = WheelCode(wheel_dir(*SGLANG))
    ns = c.namespace
    unrelated = {name: type(name, (), {}) for name in
                 ("UnquantizedFusedMoEMethod", "Fp8MoEMethod", "CompressedTensorsMxInt4MoE", "ModelOptNvFp4FusedMoEMethod")}
    ns.update(torch=torch, Enum=Enum, logger=RecordingLogger(), _is_cpu=False, _is_hip=False,
              gptq_marlin_repack=_repack_in_checkpoint_order,
              marlin_make_workspace=lambda device, max_blocks_per_sm=1: torch.zeros(1, dtype=torch.int),
              envs=types.SimpleNamespace(SGLANG_MOE_COPY_WEIGHT_VIEWS_BEFORE_H2D=types.SimpleNamespace(get=lambda: False)),
              **unrelated)
    c.functions(COMMON, "set_weight_attrs")
    c.functions(MARLIN, "get_scale_perms", "marlin_permute_scales")
    c.functions(FP4, "nvfp4_marlin_process_scales", "nvfp4_marlin_process_global_scale",
                "_repack_moe_fp4_weight_for_marlin", "_permute_moe_fp4_scales_for_marlin",
                "prepare_moe_nvfp4_layer_for_marlin")
    c.functions(LOADER, "FusedMoeWeightScaleSupported", "_weight_layout_method", "_copy_weight_view_before_h2d",
                "_maybe_copy_weight_view_before_h2d")
    ns["FusedMoE"] = c.methods(
        LOADER, "FusedMoE", "_weight_loader_impl", "_load_gguf_weight", "_maybe_load_bf16_shared_expert_as_fp4",
        "_maybe_load_fp8_shared_expert_as_fp4", "_load_per_tensor_weight_scale",
        "_load_model_weight_or_group_weight_scale", "_load_w13", "_load_w2", "_load_single_value",
        "weight_loader", "_map_global_expert_id_to_local_expert_id", "make_expert_params_mapping",
        base=torch.nn.Module)
    c.functions(SCHEME, "NVFP4_GROUP_SIZE")
    ns["CompressedTensorsW4A16Nvfp4MoE"] = c.methods(
        SCHEME, "CompressedTensorsW4A16Nvfp4MoE", "__init__", "create_weights", "process_weights_after_loading")
    return c


def local_imports():
    """The scheme's local imports: the wheel's own objects."""
    ns = code().namespace
    fused = types.SimpleNamespace(FusedMoeWeightScaleSupported=ns["FusedMoeWeightScaleSupported"])
    fp4 = types.SimpleNamespace(prepare_moe_nvfp4_layer_for_marlin=ns["prepare_moe_nvfp4_layer_for_marlin"])
    return stub_modules({"sglang.srt.layers.moe.fused_moe_triton": fused,
                         "sglang.srt.layers.quantization.marlin_utils_fp4": fp4})


def make_layer(ids: list[int], hidden: int, intermediate: int, dtype: torch.dtype, tp_size: int = 1,
               tp_rank: int = 0):
    """A FusedMoE layer holding the parameters CompressedTensorsW4A16Nvfp4MoE's
    own create_weights registers, each with the layer's own weight_loader.
    Returns (layer, scheme)."""
    ns = code().namespace
    scheme = ns["CompressedTensorsW4A16Nvfp4MoE"]()
    layer = ns["FusedMoE"]()
    layer.moe_runner_config = types.SimpleNamespace(is_gated=True)
    layer.quant_method = layer.scheme = scheme
    layer.quant_config = types.SimpleNamespace(get_name=lambda: "compressed-tensors")
    layer.moe_tp_size, layer.moe_tp_rank = tp_size, tp_rank
    layer.use_padded_loading = layer.use_presharded_weights = layer.use_triton_kernels = False
    layer.use_flashinfer_trtllm_moe = layer._has_fused_shared = False
    layer._num_local_routed = len(ids)
    # FusedMoE.weight_loader's expert-id mapping (layer.py:1153-1161, 1188-1195):
    # no expert-location metadata (no EPLB), storage rank 0 of 1 (no EP).
    layer.uses_expert_location, layer._expert_storage_rank = False, 0
    layer._num_global_routed, layer.num_local_experts = len(ids), len(ids)
    with local_imports():
        scheme.create_weights(layer, num_experts=len(ids), hidden_size=hidden,
                              intermediate_size_per_partition=intermediate, params_dtype=dtype,
                              weight_loader=layer.weight_loader)
    return layer, scheme


def finish_layer(layer, scheme, warnings: list[str]) -> KernelInputs:
    with local_imports():
        scheme.process_weights_after_loading(layer)
    return KernelInputs(layer.w13_weight.data.view(torch.uint8), layer.w13_weight_scale.data,
                        layer.w13_weight_scale_2.data.reshape(-1), layer.w2_weight.data.view(torch.uint8),
                        layer.w2_weight_scale.data, layer.w2_weight_scale_2.data.reshape(-1),
                        layer.hidden_size, layer.intermediate_size_per_partition,
                        warnings + list(code().namespace["logger"].messages))


def load_layer(experts: dict[int, dict[str, dict[str, torch.Tensor]]], dtype: torch.dtype,
               tp_size: int = 1, tp_rank: int = 0) -> KernelInputs:
    """As vllm_marlin.load_layer; raises SGLang's own ValueError where it refuses."""
    ns = code().namespace
    ids = sorted(experts)
    n_full, k_half = experts[ids[0]]["w1"]["weight_packed"].shape
    hidden, intermediate = 2 * k_half, n_full // tp_size
    ns["logger"].messages.clear()
    layer, scheme = make_layer(ids, hidden, intermediate, dtype, tp_size, tp_rank)
    params = dict(layer.named_parameters())
    with local_imports():
        for local, e in enumerate(ids):
            for proj, stem in (("w1", "w13"), ("w3", "w13"), ("w2", "w2")):
                for suffix, tensor in experts[e][proj].items():
                    layer._weight_loader_impl(params[f"{stem}_{suffix}"], tensor, f"experts.{e}.{proj}.{suffix}",
                                              proj, local)
    return finish_layer(layer, scheme, [])


def scale_order(size_k: int, size_n: int) -> torch.Tensor:
    ns = code().namespace
    index = torch.arange((size_k // 16) * size_n, dtype=torch.float64).reshape(size_k // 16, size_n)
    return ns["marlin_permute_scales"](s=index, size_k=size_k, size_n=size_n, group_size=16).reshape(-1).long()
