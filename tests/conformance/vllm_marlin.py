"""vLLM 0.34.0's own load path for a compressed-tensors NVFP4A16 MoE layer on
the Marlin backend, run on the CPU from the released wheel (wheels.py):

  RoutedExperts.weight_loader and helpers    fused_moe/routed_experts.py
    (which row block of w13 each of w1/w3 fills, which global slot [e, 0|1])
  CompressedTensorsW4A4Nvfp4MoEMethod         compressed_tensors_moe_w4a4_nvfp4.py
    create_weights, process_weights_after_loading, get_fused_moe_quant_config
  convert_to_nvfp4_moe_kernel_format           fused_moe/oracle/nvfp4.py
  prepare_nvfp4_moe_layer_for_marlin (pads the per-rank intermediate size N
    to Marlin's tiles: round_up(N, 64) when K % 128 == 0, else 128; the pad
    is zero codes and zero scales), _repack_marlin_experts,
  _nvfp4_compute_scale_factor, nvfp4_marlin_process_scales,
  nvfp4_marlin_process_global_scale           quantization/utils/marlin_utils_fp4.py
  marlin_permute_scales, get_scale_perms      quantization/utils/marlin_utils.py
  trtllm_nvfp4_hidden_alignment               quantization/utils/flashinfer_utils.py
  set_weight_attrs, replace_parameter (+ _in_own_storage, storage_view,
  _extent), copy_weight_, move_parameter, refill_derived, kernel_parameters
                                              model_executor/utils.py
  round_up                                     utils/math_utils.py

What comes out is exactly what vLLM hands the Marlin MoE kernel: processed
S0E5M3 scale bytes and processed global scales (marlin_kernel.py decodes them).

Stubs, each unable to change a value:
  * `ops.gptq_marlin_repack` (CUDA op): returns the codes in checkpoint order
    instead of Marlin's tile order; the kernel decode below reads that order.
    A permutation of 4-bit codes moves values, it never changes one.
  * `logger`: records messages (RecordingLogger).
  * `current_platform.use_sync_weight_loader() -> False` (set_weight_attrs):
    a TPU-only wrapper around the loader function; `is_integrated_gpu` is
    only asked for CUDA tensors (copy_weight_), never here.
  * `direct_reload_enabled() -> False` (replace_parameter): a first load, not
    a reload into existing storage.
  * `OnlineMoEMethodBase` (weight_loader's isinstance test): a class the CT
    method is not an instance of, as in vLLM.
  * the layer's `quant_config.get_name()` ("compressed-tensors"), its
    `moe_config` (TP size/rank, gated, no padded TP), `expert_map_manager`
    (identity: no expert parallelism, no fused shared expert),
    `shared_expert_online_loader = None` (no online-quantized shared expert)
    and `_expert_routing_tables()`: plain configuration the functions read;
    RoutedExperts.__init__ needs a full vLLM engine config to build them.
  * the method's `nvfp4_backend = MARLIN` (what `--moe-backend marlin` or a
    GPU without FP4 tensor cores selects), `per_token_activation = False`
    (what __init__ sets for use_a16: no activation key), `make_nvfp4_moe_kernel`
    and `make_nvfp4_moe_quant_config` (kernel objects; the quant config
    records the tensors it is given, which are the ones returned here).
"""

from __future__ import annotations

import functools
import mmap
import types
from dataclasses import dataclass
from enum import Enum

import torch

from wheels import VLLM, RecordingLogger, WheelCode, stub_modules, wheel_dir

V = "vllm/model_executor/"
LOADER = V + "layers/fused_moe/routed_experts.py"
METHOD = V + "layers/quantization/compressed_tensors/compressed_tensors_moe/compressed_tensors_moe_w4a4_nvfp4.py"
ORACLE = V + "layers/fused_moe/oracle/nvfp4.py"
FP4 = V + "layers/quantization/utils/marlin_utils_fp4.py"
MARLIN = V + "layers/quantization/utils/marlin_utils.py"
UTILS = V + "utils.py"
UTILS_NAMES = ("set_weight_attrs", "_extent", "storage_view", "_in_own_storage", "replace_parameter",
               "_is_integrated_gpu", "copy_weight_", "move_parameter", "refill_derived", "_is_live",
               "kernel_parameters")
FLASHINFER = V + "layers/quantization/utils/flashinfer_utils.py"
MATH = "vllm/utils/math_utils.py"
SELECT = V + "layers/quantization/compressed_tensors/compressed_tensors.py"


def _repack_in_checkpoint_order(b_q_weight, size_k, size_n, num_bits):
    # The caller passed weight[i].view(int32).T; undo the transpose only.
    return b_q_weight.T.contiguous()


@functools.cache
def code() -> WheelCode:
    c = WheelCode(wheel_dir(*VLLM))
    ns = c.namespace
    ns.update(torch=torch, Enum=Enum, functools=functools, mmap=mmap, logger=RecordingLogger(),
              ops=types.SimpleNamespace(gptq_marlin_repack=_repack_in_checkpoint_order))
    c.functions(MATH, "round_up")
    c.functions(UTILS, *UTILS_NAMES)
    c.functions(MARLIN, "get_scale_perms", "marlin_permute_scales")
    c.functions(FP4, "_nvfp4_compute_scale_factor", "nvfp4_marlin_process_scales",
                "nvfp4_marlin_process_global_scale", "_repack_marlin_experts", "prepare_nvfp4_moe_layer_for_marlin")
    c.functions(ORACLE, "NvFp4MoeBackend", "FLASHINFER_NVFP4_MOE_BACKENDS", "_use_a16",
                "convert_to_nvfp4_moe_kernel_format")
    c.functions(LOADER, "FusedMoeWeightScaleSupported")
    c.functions(FLASHINFER, "trtllm_nvfp4_hidden_alignment")
    ns["make_nvfp4_moe_quant_config"] = lambda **kw: dict(kw)
    ns["make_nvfp4_moe_kernel"] = lambda **kw: types.SimpleNamespace(
        fused_experts=types.SimpleNamespace(process_weights_after_loading=lambda layer: None,
                                            keep_constants=lambda layer: None))
    ns["RoutedExperts"] = c.methods(
        LOADER, "RoutedExperts", "weight_loader", "_map_global_expert_id_to_local_expert_id", "_to_scalar",
        "_load_per_tensor_weight_scale", "_load_model_weight_or_group_weight_scale", "_load_w13", "_load_w2",
        "_get_hidden_dim", "_narrow_expert_data_for_padding", "_load_single_value", base=torch.nn.Module)
    ns["CompressedTensorsW4A4Nvfp4MoEMethod"] = c.methods(
        METHOD, "CompressedTensorsW4A4Nvfp4MoEMethod", "create_weights", "process_weights_after_loading",
        "get_fused_moe_quant_config")
    return c


def local_imports():
    return stub_modules({
        "vllm.model_executor.layers.quantization.online.moe_base":
            types.SimpleNamespace(OnlineMoEMethodBase=type("OnlineMoEMethodBase", (), {})),
        "vllm.platforms": types.SimpleNamespace(
            current_platform=types.SimpleNamespace(use_sync_weight_loader=lambda: False)),
        "vllm.model_executor.model_loader.reload.direct": types.SimpleNamespace(direct_reload_enabled=lambda: False),
    })


@dataclass
class KernelInputs:
    """What vLLM passes the Marlin MoE kernel for one layer (per rank)."""

    w13_packed: torch.Tensor   # [E, 2N, K/2] uint8, checkpoint order (see the repack stub)
    w13_scale: torch.Tensor    # processed S0E5M3 bytes, Marlin's scale order
    w13_global: torch.Tensor   # [E] float32, processed
    w2_packed: torch.Tensor
    w2_scale: torch.Tensor
    w2_global: torch.Tensor
    hidden: int                # K
    intermediate: int          # N per rank
    warnings: list[str]


def make_layer(ids: list[int], hidden: int, intermediate: int, dtype: torch.dtype, tp_size: int = 1,
               tp_rank: int = 0, layer_name: str = "model.layers.0.mlp.experts"):
    """A RoutedExperts layer holding the parameters the CT NVFP4 method's own
    create_weights registers (experts `ids`, K = hidden, N = intermediate per
    rank), each with the layer's own weight_loader. Returns (layer, method)."""
    ns = code().namespace
    moe = types.SimpleNamespace(is_act_and_mul=True, tp_shard_with_padding=False, tp_size=tp_size, tp_rank=tp_rank,
                                moe_parallel_config=types.SimpleNamespace(tp_size=tp_size), num_logical_experts=len(ids),
                                num_experts=len(ids))
    method = ns["CompressedTensorsW4A4Nvfp4MoEMethod"]()
    method.moe, method.group_size, method.use_a16, method.per_token_activation = moe, 16, True, False
    method.nvfp4_backend, method.experts_cls = ns["NvFp4MoeBackend"].MARLIN, object
    layer = ns["RoutedExperts"]()
    layer.quant_config = types.SimpleNamespace(get_name=lambda: "compressed-tensors")
    layer.quant_method, layer.moe_config = method, moe
    layer.expert_map_manager = types.SimpleNamespace(map_global_to_local=lambda e: ids.index(e),
                                                     num_fused_shared_experts=0)
    layer.shared_expert_online_loader = None
    layer._expert_routing_tables = lambda: None
    layer.layer_name = layer_name
    layer.hidden_size, layer.intermediate_size_per_partition = hidden, intermediate
    layer.num_experts, layer.params_dtype = len(ids), dtype
    with local_imports():
        # RoutedExperts.__init__ hands the layer's own weight_loader (routed_experts.py:220-232).
        method.create_weights(layer, num_experts=len(ids), hidden_size=hidden,
                              intermediate_size_per_partition=intermediate, params_dtype=dtype,
                              weight_loader=layer.weight_loader)
    return layer, method


def finish_layer(layer, method, warnings: list[str]) -> KernelInputs:
    """process_weights_after_loading, then what the kernel is handed."""
    with local_imports():
        method.process_weights_after_loading(layer)
    # The repack stub's int32 words are the checkpoint's bytes.
    return KernelInputs(layer.w13_weight.data.view(torch.uint8), layer.w13_weight_scale.data, layer.w13_weight_scale_2.data,
                        layer.w2_weight.data.view(torch.uint8), layer.w2_weight_scale.data, layer.w2_weight_scale_2.data,
                        layer.hidden_size, layer.intermediate_size_per_partition,
                        warnings + list(code().namespace["logger"].messages))


def load_layer(experts: dict[int, dict[str, dict[str, torch.Tensor]]], dtype: torch.dtype,
               tp_size: int = 1, tp_rank: int = 0) -> KernelInputs:
    """experts: expert id -> {"w1"|"w2"|"w3": {"weight_packed", "weight_scale",
    "weight_global_scale"}} as read from the checkpoint."""
    ns = code().namespace
    ids = sorted(experts)
    n_full, k_half = experts[ids[0]]["w1"]["weight_packed"].shape
    ns["logger"].messages.clear()
    layer, method = make_layer(ids, 2 * k_half, n_full // tp_size, dtype, tp_size, tp_rank)
    params = dict(layer.named_parameters())
    with local_imports():
        for e in ids:
            for proj, stem in (("w1", "w13"), ("w3", "w13"), ("w2", "w2")):
                for suffix, tensor in experts[e][proj].items():
                    param = params[f"{stem}_{suffix}"]
                    layer.weight_loader(param, tensor, f"experts.{e}.{proj}.{suffix}", proj, e)
    return finish_layer(layer, method, [])


def scale_order(size_k: int, size_n: int) -> torch.Tensor:
    """Where marlin_permute_scales (run from the wheel on indices) puts each
    scale of a [size_k/16, size_n] per-expert tensor: its inverse puts the
    processed scales back in checkpoint order."""
    ns = code().namespace
    index = torch.arange((size_k // 16) * size_n, dtype=torch.float64).reshape(size_k // 16, size_n)
    return ns["marlin_permute_scales"](s=index, size_k=size_k, size_n=size_n, group_size=16).reshape(-1).long()
