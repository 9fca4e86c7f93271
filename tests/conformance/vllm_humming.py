"""vLLM 0.34.0's own load path for a compressed-tensors NVFP4A16 MoE layer on
the Humming backend (what vLLM selects on sm90, H100/H200:
utils/humming/priority.py:11, fused_moe/oracle/nvfp4.py:248), run on the CPU:

  from the vLLM wheel (wheels.py, ast-extracted as in vllm_marlin.py):
    RoutedExperts.weight_loader and helpers     fused_moe/routed_experts.py
    CompressedTensorsW4A4Nvfp4MoEMethod          compressed_tensors_moe_w4a4_nvfp4.py
      create_weights, process_weights_after_loading, get_fused_moe_quant_config
    convert_to_nvfp4_moe_kernel_format (its HUMMING branch, :413-448: the
      checkpoint's [E, 2] w13 globals go to Humming as they are, not the
      single w1 global the Marlin branch gets), make_nvfp4_moe_quant_config
                                                 fused_moe/oracle/nvfp4.py
    convert_to_humming_moe_kernel_format, _process_single_sublayer,
    _convert_sublayer_to_humming, _prepare_and_transform_sublayer,
    _extract_sublayer_tensors, _replace_layer_parameters,
    get_humming_moe_quant_config                 quantization/utils/humming/moe.py
    check_and_fallback_input_schema, humming_is_layer_skipped,
    resolve_humming_layer_config                 quantization/utils/humming/schema.py
    _EXPORTS, __getattr__ (the `vllm.utils.humming` facade: which humming
      object each name is, resolved lazily)      vllm/utils/humming.py:63-122
  from the humming-kernels 0.1.19 wheel (humming_code.py, imported):
    CompressedTensorsWeightSchema._convert_humming (1/global in FP32, one
      global per expert when gate and up agree, else per channel)
                                                 humming/schema/compressed_tensors.py:206-301
    BaseWeightSchema._may_process_global_scale   humming/schema/base.py:158-207
    prepare_and_transform_humming_tensors, LayerConfig (sm90 flags)
                                                 humming/transform.py, humming/config/config.py

What comes out is what vLLM hands the Humming kernel: the packed codes, the
E4M3 block-scale bytes in Humming's layout, weight_scale_2 (the per-expert
FP32 multiplier, or per-channel in the activation dtype), and the kernel's
LayerConfig. humming_kernel.py decodes them.

Stubs (besides humming_code.py's), each unable to change a value:
  * the loader's and the method's, as in vllm_marlin.py (logger, TPU-only
    loader wrapper, OnlineMoEMethodBase, the layer's plain configuration),
    with `nvfp4_backend = HUMMING`;
  * `current_platform.get_device_capability()` -> 9.0: the GPU Humming is
    selected on (it decides which input schema the fallback keeps; for 16-bit
    activations none is quantized);
  * `envs.VLLM_HUMMING_INPUT_QUANT_CONFIG = None` (its default: 16-bit
    activations);
  * `make_nvfp4_moe_kernel` (kernel objects) and `make_humming_moe_quant_config`
    (builds vLLM config dataclasses from the tensors it is given; recorded
    here as they are passed, e.g. which tensor is w1's gscale);
  * `GroupShape`: a (row, col) record.
"""

from __future__ import annotations

import collections
import functools
import mmap
import importlib
import re
import types
from dataclasses import dataclass
from enum import Enum

import torch

import humming_code
import vllm_marlin
from wheels import VLLM, RecordingLogger, WheelCode, stub_modules, wheel_dir

V = "vllm/model_executor/"
LOADER = V + "layers/fused_moe/routed_experts.py"
METHOD = V + "layers/quantization/compressed_tensors/compressed_tensors_moe/compressed_tensors_moe_w4a4_nvfp4.py"
ORACLE = V + "layers/fused_moe/oracle/nvfp4.py"
HMOE = V + "layers/quantization/utils/humming/moe.py"
HSCHEMA = V + "layers/quantization/utils/humming/schema.py"
HLINEAR = V + "layers/quantization/utils/humming/linear.py"
FACADE = "vllm/utils/humming.py"
UTILS = V + "utils.py"


@functools.cache
def code() -> WheelCode:
    h = humming_code.package()
    c = WheelCode(wheel_dir(*VLLM))
    ns = c.namespace
    ns.update(torch=torch, Enum=Enum, re=re, functools=functools, mmap=mmap, cache=functools.cache, importlib=importlib, Any=object, logger=RecordingLogger(), humming_dtypes=h.dtypes,
              envs=types.SimpleNamespace(VLLM_HUMMING_INPUT_QUANT_CONFIG=None),
              current_platform=types.SimpleNamespace(
                  get_device_capability=lambda: types.SimpleNamespace(to_int=lambda: humming_code.SM90)),
              GroupShape=collections.namedtuple("GroupShape", "row col"))
    c.functions(UTILS, *vllm_marlin.UTILS_NAMES, "get_live_param", "retire_parameter", "set_kernel_parameter")
    c.functions(HLINEAR, "_KEEP_UNUSED_FRACTION", "_nbytes", "replace_layer_parameters")
    c.functions(vllm_marlin.FLASHINFER, "trtllm_nvfp4_hidden_alignment")
    c.functions(FACADE, "_EXPORTS", "__getattr__")
    c.functions(HSCHEMA, "_humming_to_quant_dtype", "_humming_to_scale_dtype", "check_and_fallback_input_schema", "humming_is_layer_skipped", "resolve_humming_layer_config")
    ns["humming_schema"] = types.SimpleNamespace(check_and_fallback_input_schema=ns["check_and_fallback_input_schema"])
    c.functions(HMOE, "_extract_sublayer_tensors", "_replace_layer_parameters", "_convert_sublayer_to_humming",
                "_prepare_and_transform_sublayer", "_process_single_sublayer", "convert_to_humming_moe_kernel_format",
                "get_humming_moe_quant_config")
    ns["make_humming_moe_quant_config"] = lambda **kw: types.SimpleNamespace(**kw)
    c.functions(ORACLE, "NvFp4MoeBackend", "FLASHINFER_NVFP4_MOE_BACKENDS", "_use_a16",
                "convert_to_nvfp4_moe_kernel_format", "make_nvfp4_moe_quant_config")
    c.functions(LOADER, "FusedMoeWeightScaleSupported")
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


def _local_imports():
    ns = code().namespace
    return stub_modules({
        "vllm.model_executor.layers.quantization.online.moe_base":
            types.SimpleNamespace(OnlineMoEMethodBase=type("OnlineMoEMethodBase", (), {})),
        "vllm.platforms": types.SimpleNamespace(
            current_platform=types.SimpleNamespace(use_sync_weight_loader=lambda: False)),
        "vllm.model_executor.model_loader.reload.direct": types.SimpleNamespace(direct_reload_enabled=lambda: False),
        # The facade's own lazy __getattr__ (humming.py:112-122) over its _EXPORTS.
        "vllm.utils.humming": types.SimpleNamespace(__getattr__=ns["__getattr__"]),
        "vllm.model_executor.layers.quantization.utils.humming": types.SimpleNamespace(
            convert_to_humming_moe_kernel_format=ns["convert_to_humming_moe_kernel_format"],
            get_humming_moe_quant_config=ns["get_humming_moe_quant_config"]),
        "vllm.model_executor.layers.fused_moe": types.SimpleNamespace(RoutedExperts=ns["RoutedExperts"]),
    })


@dataclass
class KernelInputs:
    """What vLLM passes the Humming MoE kernel for one layer (per rank)."""

    w13: dict[str, torch.Tensor]   # weight (int32 codes), weight_scale (E4M3, Humming layout), weight_scale_2
    w2: dict[str, torch.Tensor]
    configs: dict[str, object]     # humming LayerConfig per sublayer
    quant_config: object           # what get_humming_moe_quant_config passed on
    hidden: int                    # K of w13
    intermediate: int              # N per rank
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
                                moe_parallel_config=types.SimpleNamespace(tp_size=tp_size), num_logical_experts=len(ids),
                                num_local_experts=len(ids), has_bias=False,
                                activation=types.SimpleNamespace(is_gated=True),
                                intermediate_size_per_partition=intermediate, hidden_dim=hidden,
                                num_experts=len(ids))
    method = ns["CompressedTensorsW4A4Nvfp4MoEMethod"]()
    method.moe, method.group_size, method.use_a16, method.per_token_activation = moe, 16, True, False
    method.nvfp4_backend, method.experts_cls = ns["NvFp4MoeBackend"].HUMMING, object
    layer = ns["RoutedExperts"]()
    layer.quant_config = types.SimpleNamespace(get_name=lambda: "compressed-tensors")
    layer.quant_method, layer.moe_config, layer.layer_name = method, moe, "model.layers.0.mlp.experts"
    layer.expert_map_manager = types.SimpleNamespace(map_global_to_local=lambda e: ids.index(e),
                                                     num_fused_shared_experts=0)
    layer.shared_expert_online_loader = None
    layer._expert_routing_tables = lambda: None
    layer.hidden_size, layer.intermediate_size_per_partition = hidden, intermediate
    layer.num_experts, layer.params_dtype = len(ids), dtype
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
    sub = {s: {n: getattr(layer, f"{s}_{n}").data for n in ("weight", "weight_scale", "weight_scale_2")}
           for s in ("w13", "w2")}
    return KernelInputs(sub["w13"], sub["w2"], dict(layer.humming_configs), method.moe_quant_config,
                        hidden, intermediate, list(ns["logger"].messages))
