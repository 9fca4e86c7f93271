"""vLLM 0.33.0's own load path for a compressed-tensors NVFP4A16 MoE layer on
the Marlin backend, run on the CPU from the released wheel (wheels.py):

  RoutedExperts.weight_loader and helpers    fused_moe/routed_experts.py
    (which row block of w13 each of w1/w3 fills, which global slot [e, 0|1])
  CompressedTensorsW4A4Nvfp4MoEMethod         compressed_tensors_moe_w4a4_nvfp4.py
    create_weights, process_weights_after_loading, get_fused_moe_quant_config
  convert_to_nvfp4_moe_kernel_format           fused_moe/oracle/nvfp4.py
  prepare_nvfp4_moe_layer_for_marlin, _repack_marlin_experts,
  _nvfp4_compute_scale_factor, nvfp4_marlin_process_scales,
  nvfp4_marlin_process_global_scale           quantization/utils/marlin_utils_fp4.py
  marlin_permute_scales, get_scale_perms, get_marlin_input_dtype
                                              quantization/utils/marlin_utils.py
  set_weight_attrs, replace_parameter          model_executor/utils.py
  round_up                                     utils/math_utils.py

What comes out is exactly what vLLM hands the Marlin MoE kernel: processed
S0E5M3 scale bytes and processed global scales (marlin_kernel.py decodes them).

Stubs, each unable to change a value:
  * `ops.gptq_marlin_repack` (CUDA op): returns the codes in checkpoint order
    instead of Marlin's tile order; the kernel decode below reads that order.
    A permutation of 4-bit codes moves values, it never changes one.
  * `logger`: records messages (RecordingLogger).
  * `envs.VLLM_MARLIN_INPUT_DTYPE = None`: the default (16-bit activations).
  * `current_platform.use_sync_weight_loader() -> False` (set_weight_attrs):
    a TPU-only wrapper around the loader function.
  * `OnlineMoEMethodBase` (weight_loader's isinstance test): a class the CT
    method is not an instance of, as in vLLM.
  * the layer's `quant_config.get_name()` ("compressed-tensors"), its
    `moe_config` (TP size/rank, gated, no padded TP), `expert_map_manager`
    (identity: no expert parallelism) and `_expert_routing_tables()`: plain
    configuration the functions read; RoutedExperts.__init__ needs a full
    vLLM engine config to build them.
  * the method's `nvfp4_backend = MARLIN` (what `--moe-backend marlin` or a
    GPU without FP4 tensor cores selects), `make_nvfp4_moe_kernel` and
    `make_nvfp4_moe_quant_config` (kernel objects; the quant config records
    the tensors it is given, which are the ones returned here).
"""

from __future__ import annotations

import functools
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
MATH = "vllm/utils/math_utils.py"
SELECT = V + "layers/quantization/compressed_tensors/compressed_tensors.py"


def _repack_in_checkpoint_order(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False):
    # The caller passed weight[i].view(int32).T; undo the transpose only.
    return b_q_weight.T.contiguous()


@functools.cache
def code() -> WheelCode:
    c = WheelCode(wheel_dir(*VLLM))
    ns = c.namespace
    ns.update(torch=torch, Enum=Enum, logger=RecordingLogger(),
              ops=types.SimpleNamespace(gptq_marlin_repack=_repack_in_checkpoint_order),
              envs=types.SimpleNamespace(VLLM_MARLIN_INPUT_DTYPE=None))
    c.functions(MATH, "round_up")
    c.functions(UTILS, "set_weight_attrs", "replace_parameter")
    c.functions(MARLIN, "get_scale_perms", "marlin_permute_scales", "get_marlin_input_dtype")
    c.functions(FP4, "_nvfp4_compute_scale_factor", "nvfp4_marlin_process_scales",
                "nvfp4_marlin_process_global_scale", "_repack_marlin_experts", "prepare_nvfp4_moe_layer_for_marlin")
    c.functions(ORACLE, "NvFp4MoeBackend", "FLASHINFER_NVFP4_MOE_BACKENDS", "_use_a16",
                "convert_to_nvfp4_moe_kernel_format")
    c.functions(LOADER, "FusedMoeWeightScaleSupported")
    ns["make_nvfp4_moe_quant_config"] = lambda **kw: dict(kw)
    ns["make_nvfp4_moe_kernel"] = lambda **kw: types.SimpleNamespace(
        fused_experts=types.SimpleNamespace(process_weights_after_loading=lambda layer: None))
    ns["RoutedExperts"] = c.methods(
        LOADER, "RoutedExperts", "weight_loader", "_map_global_expert_id_to_local_expert_id", "_to_scalar",
        "_load_per_tensor_weight_scale", "_load_model_weight_or_group_weight_scale", "_load_w13", "_load_w2",
        "_get_hidden_dim", "_narrow_expert_data_for_padding", "_load_single_value", base=torch.nn.Module)
    ns["CompressedTensorsW4A4Nvfp4MoEMethod"] = c.methods(
        METHOD, "CompressedTensorsW4A4Nvfp4MoEMethod", "create_weights", "process_weights_after_loading",
        "get_fused_moe_quant_config")
    return c


def _local_imports():
    return stub_modules({
        "vllm.model_executor.layers.quantization.online.moe_base":
            types.SimpleNamespace(OnlineMoEMethodBase=type("OnlineMoEMethodBase", (), {})),
        "vllm.platforms": types.SimpleNamespace(
            current_platform=types.SimpleNamespace(use_sync_weight_loader=lambda: False)),
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


def load_layer(experts: dict[int, dict[str, dict[str, torch.Tensor]]], dtype: torch.dtype,
               tp_size: int = 1, tp_rank: int = 0) -> KernelInputs:
    """experts: expert id -> {"w1"|"w2"|"w3": {"weight_packed", "weight_scale",
    "weight_global_scale"}} as read from the checkpoint."""
    c = code()
    ns = c.namespace
    ids = sorted(experts)
    n_full, k_half = experts[ids[0]]["w1"]["weight_packed"].shape
    hidden, intermediate = 2 * k_half, n_full // tp_size
    moe = types.SimpleNamespace(is_act_and_mul=True, tp_shard_with_padding=False, tp_size=tp_size, tp_rank=tp_rank,
                                moe_parallel_config=types.SimpleNamespace(tp_size=tp_size), num_logical_experts=len(ids))
    method = ns["CompressedTensorsW4A4Nvfp4MoEMethod"]()
    method.moe, method.group_size, method.use_a16 = moe, 16, True
    method.nvfp4_backend, method.experts_cls = ns["NvFp4MoeBackend"].MARLIN, object
    layer = ns["RoutedExperts"]()
    layer.quant_config = types.SimpleNamespace(get_name=lambda: "compressed-tensors")
    layer.quant_method, layer.moe_config = method, moe
    layer.expert_map_manager = types.SimpleNamespace(map_global_to_local=lambda e: ids.index(e))
    layer._fused_shared_expert_quantizer = None
    layer._expert_routing_tables = lambda: None
    layer.hidden_size, layer.intermediate_size_per_partition = hidden, intermediate
    ns["logger"].messages.clear()
    with _local_imports():
        method.create_weights(layer, num_experts=len(ids), hidden_size=hidden,
                              intermediate_size_per_partition=intermediate, params_dtype=dtype)
        params = dict(layer.named_parameters())
        for e in ids:
            for proj, stem in (("w1", "w13"), ("w3", "w13"), ("w2", "w2")):
                for suffix, tensor in experts[e][proj].items():
                    param = params[f"{stem}_{suffix}"]
                    layer.weight_loader(param, tensor, f"experts.{e}.{proj}.{suffix}", proj, e)
        method.process_weights_after_loading(layer)
    # The repack stub's int32 words are the checkpoint's bytes.
    return KernelInputs(layer.w13_weight.data.view(torch.uint8), layer.w13_weight_scale.data, layer.w13_weight_scale_2.data,
                        layer.w2_weight.data.view(torch.uint8), layer.w2_weight_scale.data, layer.w2_weight_scale_2.data,
                        hidden, intermediate, list(ns["logger"].messages))


def scale_order(size_k: int, size_n: int) -> torch.Tensor:
    """Where marlin_permute_scales (run from the wheel on indices) puts each
    scale of a [size_k/16, size_n] per-expert tensor: its inverse puts the
    processed scales back in checkpoint order."""
    ns = code().namespace
    index = torch.arange((size_k // 16) * size_n, dtype=torch.float64).reshape(size_k // 16, size_n)
    return ns["marlin_permute_scales"](s=index, size_k=size_k, size_n=size_n, group_size=16).reshape(-1).long()
