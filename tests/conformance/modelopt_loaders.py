"""The runtimes' own ModelOpt NVFP4 path for a `--format modelopt` output
(ModelOpt W4A16_NVFP4: `weight`, `weight_scale`, `weight_scale_2`), run on the
CPU from the released wheels (wheels.py), for model_loaders.py's chains.

Everything a verdict depends on is the wheel's own code: the config object
comes from the wheel's `from_config` on DST's config.json (the dict the
runtime's loader resolves), the routed-expert method from the config's own
`get_quant_method` on the FusedMoE/RoutedExperts layer, the parameters from
that method's `create_weights`, the loading from the layer's own weight
loader (model_loaders.py feeds it through the model class's load_weights),
and the post-load processing from the method's `process_weights_after_loading`
(FP4 Marlin, as sglang_marlin.py / vllm_marlin.py for compressed-tensors).

SGLang 0.5.23 (sglang/srt/...):
  resolve_checkpoint_quant_spec (top-level quantization_config, then
    text_config's; deep-copied, + packed_modules_mapping, hf_config)
                                        model_loader/checkpoint_quantization.py:53-98,
                                        model_loader/weight_utils.py:269-312
  packed_modules_mapping: the model class's (loader.py:180), K3's inner
    class merges its own (models/kimi_k3.py:2991-3016); DeepSeek's is {}
    without q_lora_rank (models/deepseek_v2.py:3248-3275)
  apply_weight_name_mapper with the model's hf_to_sglang_mapper
                                        model_loader/loader.py:273-280
  QuantizationConfig                    layers/quantization/base_config.py
  _compile_exclusion_pattern, ModelOptQuantConfig (_get_quant_method,
    apply_weight_name_mapper, is_layer_excluded), ModelOptFp4Config
    (from_config, get_quant_method), ModelOptNvFp4FusedMoEMethod
    (__init__, create_weights, process_weights_after_loading: the Marlin
    branch, gate/up global collapse to column 0)
                                        layers/quantization/modelopt_quant.py
  is_layer_skipped, _module_path_match, swizzle_blockscale
                                        layers/quantization/utils.py
  BasevLLMParameter, ModelWeightParameter, PerTensorScaleParameter
                                        layers/parameter.py
  MoeRunnerBackend                      layers/moe/utils.py
  copy_or_rebind_param                  layers/utils/common.py
  FusedMoE's loader (its ModelOpt branch, layer.py:1457-1482) and
  prepare_moe_nvfp4_layer_for_marlin: sglang_marlin.py's.

vLLM 0.34.0 (vllm/model_executor/...):
  get_quant_config: top-level quantization_config, then text_config's
                                        model_loader/weight_utils.py:256-292
  apply_vllm_mapper(hf_to_vllm_mapper.get_rename_mapper()) and the model's
    packed_modules_mapping (SupportsQuant, models/interfaces.py:1291-1298;
    else model_loader/utils.py:381-388)
  QuantizationConfig                    layers/quantization/base_config.py
  ModelOptQuantConfigBase (is_layer_excluded, get_quant_method,
    apply_vllm_mapper, from_config), ModelOptNvFp4Config, ModelOptNvFp4FusedMoE
    (__init__, create_weights, process_weights_after_loading)
                                        layers/quantization/modelopt.py
  is_layer_skipped                      layers/quantization/utils/quant_utils.py
  BasevLLMParameter, ModelWeightParameter, PerTensorScaleParameter
                                        parameter.py
  retire_parameter, is_weights_pre_processed   utils.py
  RoutedExperts.weight_loader (its ModelOpt branch, routed_experts.py:882-
  932), convert_to_nvfp4_moe_kernel_format and the Marlin preparation:
  vllm_marlin.py's.

Stubs, each unable to change a value or a verdict (besides those of
sglang_marlin.py / vllm_marlin.py):
  * the MoE backend: SGLang `get_moe_runner_backend() -> MARLIN` (what
    `--moe-runner-backend marlin` gives), not Blackwell, no A2A backend
    (so `_use_nvfp4_dispatch() -> False`);
    vLLM `select_nvfp4_moe_backend -> MARLIN` (what the oracle picks for
    W4A16 where no FP4 tensor-core backend serves A16).
  * base classes the wheels' classes derive from for typing/dispatch
    (LinearBase, ParallelLMHead, RadixAttention, Attention, MLAAttention,
    UnquantizedLinearMethod, SharedExperts, QuantizeMethodBase) and the
    quantized linear methods (SGLang ModelOptNvFp4A16LinearMethod /
    ModelOptFp4LinearMethod, vLLM build_linear_method): plain classes, only
    ever told apart from UnquantizedLinearMethod; the layers asked about are instances of exactly the class the
    runtime would build (a linear -> LinearBase, the experts -> FusedMoE /
    RoutedExperts).
  * tensor-parallel rank 0 of 1.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import json
import re
import types
from abc import ABC, abstractmethod
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional

import torch

import sglang_marlin
import vllm_marlin
from vllm_marlin import KernelInputs
from wheels import SGLANG, VLLM, RecordingLogger, WheelCode, stub_modules, wheel_dir

# ---------------------------------------------------------------- DST's config


def quant_format(dst: Path) -> str:
    """`compressed-tensors` or `modelopt`, by the quant_method of the dict
    both runtimes resolve (top-level quantization_config, else text_config's)."""
    return str(resolved_quant_config(dst).get("quant_method", "")).lower()


def resolved_quant_config(dst: Path) -> dict:
    """SGLang checkpoint_quantization.py:53-98 / vLLM weight_utils.py:256-292:
    top-level `quantization_config`, then `text_config.quantization_config`."""
    cfg = json.loads((Path(dst) / "config.json").read_text())
    if cfg.get("quantization_config") is not None:
        return copy.deepcopy(cfg["quantization_config"])
    return copy.deepcopy(cfg["text_config"]["quantization_config"])


def _plain(name: str, **attrs) -> type:
    """A stand-in class; instances are only ever tested with isinstance."""
    return type(name, (), {"__init__": lambda self, *args, **kwargs: None, **attrs})


# ---------------------------------------------------------------- SGLang

S = "sglang/srt/"
SG_MO = S + "layers/quantization/modelopt_quant.py"
SG_BASE = S + "layers/quantization/base_config.py"
SG_QUTILS = S + "layers/quantization/utils.py"
SG_PARAM = S + "layers/parameter.py"
SG_MOE_UTILS = S + "layers/moe/utils.py"
SG_LUTILS = S + "layers/utils/common.py"


@functools.cache
def sglang_code() -> WheelCode:
    marlin = sglang_marlin.code()
    c = WheelCode(wheel_dir(*SGLANG))
    ns = c.namespace
    ns.update(marlin.namespace)  # the Marlin preparation, set_weight_attrs, FusedMoE, ...
    import regex  # the wheel's `import regex as re`

    ns.update(torch=torch, re=regex, Parameter=torch.nn.Parameter, lru_cache=functools.lru_cache, ABC=ABC,
              abstractmethod=abstractmethod, Any=Any, Optional=Optional, Dict=dict, List=list, Tuple=tuple,
              Mapping=Mapping, MappingProxyType=MappingProxyType, Enum=Enum, logger=RecordingLogger(),
              QuantizeMethodBase=_plain("QuantizeMethodBase"), LinearMethodBase=_plain("LinearMethodBase"),
              UnquantizedLinearMethod=_plain("UnquantizedLinearMethod"), RadixAttention=_plain("RadixAttention"),
              ModelOptNvFp4A16LinearMethod=_plain("ModelOptNvFp4A16LinearMethod"),
              ModelOptFp4LinearMethod=_plain("ModelOptFp4LinearMethod"),
              is_cuda=lambda: True, get_device_capability=lambda: (9, 0),
              get_platform=lambda: types.SimpleNamespace(is_blackwell=False),
              get_moe_a2a_backend=lambda: types.SimpleNamespace(is_megamoe=lambda: False),
              round_up=lambda x, m: (x + m - 1) // m * m,
              _use_nvfp4_dispatch=lambda: False)  # :299-302: no A2A backend
    ns["FusedMoEMethodBase"] = _plain("FusedMoEMethodBase", runner=None)
    c.functions(SG_MOE_UTILS, "_MoeRunnerBackendPredicates", "MoeRunnerBackend")
    ns["get_moe_runner_backend"] = lambda: ns["MoeRunnerBackend"].MARLIN
    c.functions(SG_QUTILS, "_module_path_match", "_FALLBACK_FUSED_SHARDS", "is_layer_skipped", "swizzle_blockscale")
    c.functions(SG_PARAM, "BasevLLMParameter", "_ColumnvLLMParameter", "RowvLLMParameter", "ModelWeightParameter",
                "PerTensorScaleParameter")
    c.functions(SG_LUTILS, "copy_or_rebind_param")
    c.functions(SG_BASE, "QuantizationConfig")
    c.functions(SG_MO, "_compile_exclusion_pattern", "_make_per_tensor_scale_parameter", "ModelOptQuantConfig",
                "ModelOptFp4Config", "ModelOptNvFp4FusedMoEMethod")
    # FusedMoE's loader takes its ModelOpt branch by isinstance on this class
    # (layer.py:1457-1459); sglang_marlin.py's stand-in is replaced by it (the
    # CT scheme is no instance of either).
    marlin.namespace["ModelOptNvFp4FusedMoEMethod"] = ns["ModelOptNvFp4FusedMoEMethod"]
    ns["LinearBase"] = _plain("LinearBase")
    ns["ParallelLMHead"] = _plain("ParallelLMHead")
    return c


def _sglang_imports():
    ns = sglang_code().namespace
    return stub_modules({
        "sglang.srt.layers.linear": types.SimpleNamespace(LinearBase=ns["LinearBase"]),
        "sglang.srt.layers.moe.fused_moe_triton": types.SimpleNamespace(
            FusedMoE=ns["FusedMoE"], FusedMoeWeightScaleSupported=ns["FusedMoeWeightScaleSupported"]),
        "sglang.srt.layers.vocab_parallel_embedding": types.SimpleNamespace(ParallelLMHead=ns["ParallelLMHead"]),
        "sglang.srt.layers.moe": types.SimpleNamespace(get_moe_runner_backend=ns["get_moe_runner_backend"]),
    })


def sglang_config(dst: Path, packed_modules_mapping: dict, hf_to_sglang_mapper=None):
    """ModelOptFp4Config.from_config on the dict SGLang's loader resolves
    (weight_utils.py:280-302), then the model's name mapper (loader.py:273-280)."""
    ns = sglang_code().namespace
    d = resolved_quant_config(dst)
    d["packed_modules_mapping"] = packed_modules_mapping
    d["hf_config"] = None
    config = ns["ModelOptFp4Config"].from_config(d)
    if hf_to_sglang_mapper is not None:
        config.apply_weight_name_mapper(hf_to_sglang_mapper)
    return config


def sglang_is_quantized_linear(config, prefix: str) -> bool:
    """What the config's own get_quant_method gives a linear layer at `prefix`."""
    ns = sglang_code().namespace
    with _sglang_imports():
        method = config.get_quant_method(ns["LinearBase"](), prefix)
    return not isinstance(method, ns["UnquantizedLinearMethod"])


def sglang_make_layer(config, prefix: str, ids: list[int], hidden: int, intermediate: int, dtype: torch.dtype):
    """A FusedMoE layer with the method the config's own get_quant_method
    selects for it (None where the layer is excluded), created by that method."""
    ns = sglang_code().namespace
    layer = ns["FusedMoE"]()
    layer.moe_runner_config = types.SimpleNamespace(is_gated=True)
    layer.moe_tp_size, layer.moe_tp_rank, layer.moe_ep_size, layer.moe_ep_rank = 1, 0, 1, 0
    layer.use_padded_loading = layer.use_presharded_weights = layer.use_triton_kernels = False
    layer.use_flashinfer_trtllm_moe = layer._has_fused_shared = False
    layer._num_local_routed = len(ids)
    layer.uses_expert_location, layer._expert_storage_rank = False, 0
    layer._num_global_routed, layer.num_local_experts, layer.num_experts = len(ids), len(ids), len(ids)
    layer.hidden_size = hidden
    layer.scheme = None
    with _sglang_imports():
        method = config.get_quant_method(layer, prefix)
    if method is None:
        return layer, None
    layer.quant_method = method
    with _sglang_imports():
        method.create_weights(layer, num_experts=len(ids), hidden_size=hidden,
                              intermediate_size_per_partition=intermediate, params_dtype=dtype,
                              weight_loader=layer.weight_loader)
    return layer, method


def sglang_finish_layer(layer, method, warnings: list[str]) -> KernelInputs:
    ns = sglang_code().namespace
    with _sglang_imports(), sglang_marlin.local_imports():
        method.process_weights_after_loading(layer)
    return KernelInputs(layer.w13_weight.data.view(torch.uint8), layer.w13_weight_scale.data,
                        layer.w13_weight_scale_2.data.reshape(-1), layer.w2_weight.data.view(torch.uint8),
                        layer.w2_weight_scale.data, layer.w2_weight_scale_2.data.reshape(-1),
                        layer.hidden_size, layer.intermediate_size_per_partition,
                        warnings + list(ns["logger"].messages) + list(sglang_marlin.code()["logger"].messages))


# ---------------------------------------------------------------- vLLM

V = "vllm/model_executor/"
VL_MO = V + "layers/quantization/modelopt.py"
VL_BASE = V + "layers/quantization/base_config.py"
VL_QUTILS = V + "layers/quantization/utils/quant_utils.py"
VL_PARAM = V + "parameter.py"
VL_UTILS = V + "utils.py"


@functools.cache
def vllm_code() -> WheelCode:
    marlin = vllm_marlin.code()
    c = WheelCode(wheel_dir(*VLLM))
    ns = c.namespace
    ns.update(marlin.namespace)  # RoutedExperts, the oracle's conversion, replace_parameter, ...
    ns.update(torch=torch, re=re, fnmatch=fnmatch.fnmatch, ABC=ABC, abstractmethod=abstractmethod, Any=Any,
              Mapping=Mapping, MappingProxyType=MappingProxyType, Parameter=torch.nn.Parameter,
              logger=RecordingLogger(), QuantizeMethodBase=_plain("QuantizeMethodBase"),
              LinearBase=_plain("LinearBase"), ParallelLMHead=_plain("ParallelLMHead"),
              Attention=_plain("Attention"), MLAAttention=_plain("MLAAttention"),
              UnquantizedLinearMethod=_plain("UnquantizedLinearMethod"), SharedExperts=_plain("SharedExperts"),
              BaseKVCacheMethod=_plain("BaseKVCacheMethod"),
              get_tensor_model_parallel_rank=lambda: 0, get_tensor_model_parallel_world_size=lambda: 1,
              kNvfp4Static="kNvfp4Static", kNvfp4Dynamic="kNvfp4Dynamic", kNvfp4DynamicToken="kNvfp4DynamicToken",
              select_nvfp4_moe_backend=lambda config, weight_key, activation_key:
                  (ns["NvFp4MoeBackend"].MARLIN, object),
              build_linear_method=lambda config, quant_method, prefix: ("quantized linear", quant_method))

    class FusedMoEMethodBase(ns["QuantizeMethodBase"]):  # fused_moe_method_base.py:31-35
        def __init__(self, moe):
            self.moe, self.moe_quant_config, self.moe_kernel = moe, None, None

    ns["FusedMoEMethodBase"] = FusedMoEMethodBase
    c.functions(VL_UTILS, "retire_parameter")
    ns["is_weights_pre_processed"] = lambda: False  # utils.py:35-36: a first load, not pre-processed weights
    c.functions(V + "layers/fused_moe/oracle/nvfp4.py", "is_global_sf_supported_for_nvfp4_backend")
    c.functions(VL_QUTILS, "is_layer_skipped")
    c.functions(VL_PARAM, "BasevLLMParameter", "_ColumnvLLMParameter", "RowvLLMParameter", "ModelWeightParameter",
                "PerTensorScaleParameter")
    c.functions(VL_BASE, "QuantizationConfig")
    c.functions(VL_MO, "LINEAR_ALGOS", "QUANT_ALGOS", "algos_owned_by", "ModelOptQuantConfigBase",
                "ModelOptNvFp4Config", "ModelOptNvFp4FusedMoE")
    ns["ModelOptNvFp4Config"].FusedMoEMethodCls = ns["ModelOptNvFp4FusedMoE"]  # modelopt.py:1244
    return c


def vllm_config(dst: Path, packed_modules_mapping: dict, hf_to_vllm_mapper=None):
    """ModelOptNvFp4Config.from_config on the dict vLLM resolves, then the
    model's rename mapper and packed_modules_mapping."""
    ns = vllm_code().namespace
    config = ns["ModelOptNvFp4Config"].from_config(resolved_quant_config(dst))
    if hf_to_vllm_mapper is not None:
        config.apply_vllm_mapper(hf_to_vllm_mapper.get_rename_mapper())
    config.packed_modules_mapping.update(packed_modules_mapping)
    return config


def vllm_is_quantized_linear(config, prefix: str) -> bool:
    ns = vllm_code().namespace
    return not isinstance(config.get_quant_method(ns["LinearBase"](), prefix), ns["UnquantizedLinearMethod"])


def vllm_make_layer(config, prefix: str, ids: list[int], hidden: int, intermediate: int, dtype: torch.dtype):
    """A RoutedExperts layer (vllm_marlin.py's configuration) with the method
    the config's own get_quant_method selects (None where excluded)."""
    ns = vllm_code().namespace
    moe = types.SimpleNamespace(is_act_and_mul=True, tp_shard_with_padding=False, tp_size=1, tp_rank=0,
                                moe_parallel_config=types.SimpleNamespace(tp_size=1), num_logical_experts=len(ids),
                                num_experts=len(ids))
    layer = ns["RoutedExperts"]()
    layer.moe_config = moe
    layer.expert_map_manager = types.SimpleNamespace(map_global_to_local=lambda e: ids.index(e),
                                                     num_fused_shared_experts=0)
    layer.shared_expert_online_loader = None
    layer._expert_routing_tables = lambda: None
    layer.layer_name = prefix
    layer.hidden_size, layer.intermediate_size_per_partition = hidden, intermediate
    method = config.get_quant_method(layer, prefix)
    if method is None:
        return layer, None
    layer.quant_method = method
    with vllm_marlin.local_imports():
        method.create_weights(layer, num_experts=len(ids), hidden_size=hidden,
                              intermediate_size_per_partition=intermediate, params_dtype=dtype,
                              weight_loader=layer.weight_loader, global_num_experts=len(ids))
    return layer, method


def vllm_finish_layer(layer, method, warnings: list[str]) -> KernelInputs:
    ns = vllm_code().namespace
    with vllm_marlin.local_imports():
        method.process_weights_after_loading(layer)
    return KernelInputs(layer.w13_weight.data.view(torch.uint8), layer.w13_weight_scale.data,
                        layer.w13_weight_scale_2.data, layer.w2_weight.data.view(torch.uint8),
                        layer.w2_weight_scale.data, layer.w2_weight_scale_2.data,
                        layer.hidden_size, layer.intermediate_size_per_partition,
                        warnings + list(ns["logger"].messages) + list(vllm_marlin.code()["logger"].messages))
