"""The runtimes' own model-class weight loading, run on the CPU from the
released wheels (wheels.py): every tensor of a converted checkpoint goes, in
the order the runtime's default loader reads the shards, through the model
class's `load_weights` into parameters created by the runtime's own NVFP4 MoE
method/scheme (`create_weights`) and loaded by its own FusedMoE weight loader.

What it tells: which checkpoint tensors no parameter loader was handed, and
which elements of the routed experts' parameters were never written from the
file (every such parameter is filled with a sentinel byte before loading; the
chain runs twice with two different sentinels, so an element is unwritten
exactly when it holds the sentinel both times). For the chains that load
everything, test_model_loaders.py runs the existing post-load processing and
kernel decode (vllm_marlin.py / sglang_marlin.py, runtime_judge.py) on what
was loaded.

SGLang 0.5.23 (sglang/srt/...):
  KimiK3ForConditionalGeneration.load_weights, its hf_to_sglang_mapper
    (`language_model.layers.` prefix, `block_sparse_moe` -> `mlp`)
                                            models/kimi_k3.py:3839-3873, :3476-3483
  KimiK3LinearForCausalLM.load_weights (renames every `weight_packed` to
    `weight` off NPU, :3209-3210; skips names missing from params_dict)
                                            models/kimi_k3.py:3128-3204
  _EXPERT_WEIGHT_NAME, _cdiv, _maybe_map_fp8_pb_scale_name
                                            models/kimi_k3.py:159, :165-166, :183-189
  WeightsMapper                             models/utils.py:56-127
  FusedMoE.make_expert_params_mapping, weight_loader,
    _map_global_expert_id_to_local_expert_id (+ sglang_marlin.py's loader)
                                            layers/moe/fused_moe_triton/layer.py
  get_layer_id                              layers/utils/common.py:12-17
  default_weight_loader, maybe_remap_kv_scale_name
                                            model_loader/weight_utils.py:1574-1586, :1779-
  shard order: sorted file names (model_loader/loader.py:588), each file's
  tensors in safe_open's key order (model_loader/weight_utils.py:1177-1179).

vLLM 0.34.0 (vllm/...):
  KimiK3ForConditionalGeneration.load_weights, hf_to_vllm_mapper
                                            models/kimi_k3/nvidia/model.py:2119-2121, :1697-1703
  KimiLinearForCausalLM.load_weights        models/kimi_k3/nvidia/model.py:1642-1644
  KimiLinearModel.load_weights (renames `.weight_packed` -> `.weight` only
    when no parameter ends in `w13_weight_packed`, :1403-1415; KeyError on
    a name it cannot place)                 models/kimi_k3/nvidia/model.py:1331-1500
  get_spec_layer_idx_from_weight_name       models/kimi_k3/nvidia/model.py
  AutoWeightsLoader (+ its torchao reload decorator, a pass-through unless a
    model asks for a torchao reload), WeightsMapper, maybe_prefix,
    get_pp_missing_layer_names, is_pp_missing_parameter
                                            model_executor/models/utils.py,
                                            model_loader/reload/torchao_decorator.py
  QuantizationConfig.get_cache_scale_mapper / get_checkpoint_weight_mapper
                                            model_executor/layers/quantization/base_config.py
  fused_moe_make_expert_params_mapping, RoutedExperts.make_expert_params_mapping,
  build_expert_params_mapping, EplbState.build_initial_global_physical_to_logical_map
  default_weight_loader, maybe_remap_kv_scale_name, _natural_sort_key
                                            model_loader/weight_utils.py
  shard order: files by _natural_sort_key (weight_utils.py:1144), tensors in
  safe_open's key order (:1258-1262).

The quant method is the one DST's config.json declares: compressed-tensors
(sglang_marlin.py / vllm_marlin.py's schemes) or ModelOpt (`--format
modelopt`: the wheel's own ModelOpt config from DST's config, its own
get_quant_method for each experts layer, modelopt_loaders.py).

Stubs, each unable to change the verdict (which tensor reaches which routed
expert parameter, and what that parameter then holds):
  * the model's non-expert modules (attention, norms, embeddings, router
    gate, shared experts, lm_head): one plain parameter per non-expert
    checkpoint tensor, of its shape and dtype, under the name the runtime's
    own chain hands it to the parameter lookup with (found by running the
    outer, wheel-owned name mapping once), loaded by the wheel's
    default_weight_loader. They only receive non-expert tensors, and no
    expert name is derived from them.
  * the model configs the loaders read: no KDA/MLA/DSA/mega-MoE layers, no
    MTP layers, no pipeline parallelism (single stage), language model only
    plus no vision tower (the fixture has none); `post_load_weights`
    (SGLang: MLA absorption of kv_b_proj, non-expert) is not run.
  * `KimiMoE` (vLLM's isinstance test for mega-MoE): the stub MoE module
    class, `use_mega_moe = False` (DeepGEMM mega MoE is an FP8 path).
  * `VocabParallelEmbedding`: a class no stub module is, so no parameter
    is tied (K3 and DeepSeek V3 do not tie word embeddings).
  * the recording wrapper around every parameter's weight_loader: notes the
    tensor it is handed, then calls the runtime's own loader unchanged.
"""

from __future__ import annotations

import ast
import functools
import itertools
import json
import os
import re
import types
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from safetensors import safe_open

import modelopt_loaders
import sglang_marlin
import vllm_marlin
from wheels import SGLANG, VLLM, RecordingLogger, WheelCode, stub_modules, wheel_dir

SENTINELS = (0x5A, 0xA5)
# Routed-expert parameters a 16-bit-activation NVFP4 kernel reads.
# (compressed-tensors: weight_packed, weight_scale, weight_global_scale;
# ModelOpt: weight, weight_scale, weight_scale_2.)
ROUTED = re.compile(r"(?:^|\.)(w13|w2)_(weight_packed|weight|weight_scale|weight_global_scale|weight_scale_2)$")


def class_attribute(c: WheelCode, rel: str, cls: str, name: str):
    """A class-level assignment of the wheel's class, evaluated in the namespace."""
    tree = ast.parse((c.root / rel).read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    for item in node.body:
        if isinstance(item, ast.Assign) and any(getattr(t, "id", None) == name for t in item.targets):
            c.where[f"{cls}.{name}"] = f"{rel}:{item.lineno}-{item.end_lineno}"
            return eval(compile(ast.Expression(item.value), str(c.root / rel), "eval"), c.namespace)
    raise LookupError(f"{rel}: {cls}.{name} not found")


# ---------------------------------------------------------------- checkpoints

def shard_files(dst: Path) -> list[str]:
    index = dst / "model.safetensors.index.json"
    if index.exists():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return [p.name for p in dst.glob("*.safetensors")]


def read_stream(dst: Path, files: list[str]) -> list[tuple[str, torch.Tensor]]:
    out = []
    for f in files:
        with safe_open(str(dst / f), framework="pt", device="cpu") as h:
            for name in h.keys():  # noqa: SIM118 (the runtimes' own iteration)
                out.append((name, h.get_tensor(name)))
    return out


@dataclass
class Fed:
    """The tensors handed to the chain, and which of them some parameter's
    weight_loader received."""

    stream: list[tuple[str, torch.Tensor]]
    by_id: dict[int, str] = field(default_factory=dict)
    consumed: set[str] = field(default_factory=set)

    def __post_init__(self):
        self.by_id = {id(t): n for n, t in self.stream}

    def record(self, loader):
        def recording(param, loaded_weight, *args, **kwargs):
            name = self.by_id.get(id(loaded_weight))
            if name is not None:
                self.consumed.add(name)
            return loader(param, loaded_weight, *args, **kwargs)
        return recording

    def unconsumed(self) -> list[str]:
        return [n for n, _ in self.stream if n not in self.consumed]


def put(root: torch.nn.Module, dotted: str, value) -> None:
    """Place a module or parameter at a dotted path, creating plain modules."""
    *path, leaf = dotted.split(".")
    m = root
    for part in path:
        if part not in m._modules:
            m.add_module(part, torch.nn.Module())
        m = m._modules[part]
    if isinstance(value, torch.nn.Module):
        m.add_module(leaf, value)
    else:
        m.register_parameter(leaf, value)


def record_loader(p: torch.nn.Parameter, fed: Fed) -> None:
    """Wrap a parameter's weight_loader with the recording one. SGLang's
    BasevLLMParameter (ModelOpt's parameters) exposes `weight_loader` as a
    read-only property over `_weight_loader` (sglang/srt/layers/parameter.py:
    93-108), so that attribute is wrapped instead. A parameter without a
    loader (SGLang ModelOpt's w*_blockscale_swizzled, derived from the
    scales, modelopt_quant.py:2562-2583) is never loaded from a file."""
    if not hasattr(p, "weight_loader"):
        return
    try:
        p.weight_loader = fed.record(p.weight_loader)
    except AttributeError:
        p._weight_loader = fed.record(p.weight_loader)


def fill_sentinel(layer: torch.nn.Module, value: int) -> None:
    for name, p in layer.named_parameters(recurse=False):
        if ROUTED.search(name):
            p.data.view(torch.uint8).fill_(value)


def sentinel_elements(p: torch.Tensor, value: int) -> torch.Tensor:
    """Per element: every byte equals the sentinel."""
    b = p.data.reshape(-1).view(torch.uint8).reshape(p.numel(), -1) if p.numel() else p.data.view(torch.uint8)
    return (b == value).all(dim=-1)


@dataclass
class Run:
    """One chain run over one checkpoint."""

    runtime: str
    version: str
    model_class: str
    architecture: str
    unconsumed: list[str]                  # checkpoint tensors no loader received
    experts: dict[str, object]             # layer prefix (as named in the model) -> (layer, method)
    sentinel: int
    fed: Fed
    sources: dict[str, str] = field(default_factory=dict)  # layer prefix -> checkpoint `...experts` prefix
    proj_names: dict[str, str] = field(default_factory=lambda: {"w1": "w1", "w3": "w3", "w2": "w2"})
    quant_format: str = "compressed-tensors"  # DST's quant_method (modelopt_loaders.quant_format)
    quant_config: object = None            # ModelOpt: the wheel's config object from DST's config.json
    finish: Callable | None = None         # (layer, method, warnings) -> KernelInputs: post-load processing
    placed: dict[str, str] = field(default_factory=dict)  # non-expert tensor -> model parameter it was placed at

    def source_module(self, prefix: str, expert: int, proj: str) -> str:
        return f"{self.sources[prefix]}.{expert}.{self.proj_names[proj]}"


@dataclass
class Report:
    runtime: str
    version: str
    model_class: str
    architecture: str
    tensors: int
    unconsumed: list[str]
    unwritten: dict[str, int]              # routed parameter -> elements never written from the file
    routed_elements: int
    runs: tuple[Run, Run]

    @property
    def loads_everything(self) -> bool:
        return not self.unconsumed and not any(self.unwritten.values())


def judge_writes(a: Run, b: Run) -> tuple[dict[str, int], int]:
    unwritten, total = {}, 0
    for prefix, (layer_a, _) in a.experts.items():
        layer_b = b.experts[prefix][0]
        pb = dict(layer_b.named_parameters(recurse=False))
        for name, p in layer_a.named_parameters(recurse=False):
            if not ROUTED.search(name):
                continue
            both = sentinel_elements(p, a.sentinel) & sentinel_elements(pb[name], b.sentinel)
            unwritten[f"{prefix}.{name}"] = int(both.sum())
            total += p.numel()
    return unwritten, total


def report(chain: Callable[[Path, torch.dtype, int], Run], dst: Path, dtype: torch.dtype) -> Report:
    a, b = (chain(dst, dtype, s) for s in SENTINELS)
    unwritten, total = judge_writes(a, b)
    return Report(a.runtime, a.version, a.model_class, a.architecture, len(a.fed.stream), a.unconsumed,
                  unwritten, total, (a, b))


def model_class(dst: Path) -> str:
    """The class both runtimes' registries map config.json's `architectures` to
    (the same name in both)."""
    return json.loads((dst / "config.json").read_text())["architectures"][0]


# ---------------------------------------------------------------- SGLang

SG_K3 = "sglang/srt/models/kimi_k3.py"
SG_UTILS = "sglang/srt/models/utils.py"
SG_COMMON = "sglang/srt/layers/utils/common.py"
SG_WEIGHTS = "sglang/srt/model_loader/weight_utils.py"


@functools.cache
def sglang_code() -> WheelCode:
    """SGLang's K3 model classes over the common pieces."""
    c = _sglang_common()
    outer = c.methods(SG_K3, "KimiK3ForConditionalGeneration", "load_weights", base=torch.nn.Module)
    outer.hf_to_sglang_mapper = class_attribute(c, SG_K3, "KimiK3ForConditionalGeneration", "hf_to_sglang_mapper")
    c.namespace["KimiK3ForConditionalGeneration"] = outer
    c.namespace["KimiK3LinearForCausalLM"] = c.methods(SG_K3, "KimiK3LinearForCausalLM", "load_weights",
                                                       base=torch.nn.Module)
    return c


def _sglang_common() -> WheelCode:
    """A fresh namespace per model file: each model's module globals are its own."""
    moe = sglang_marlin.code()
    c = WheelCode(wheel_dir(*SGLANG))
    ns = c.namespace
    ns.update(torch=torch, re=re, nn=torch.nn, dataclass=dataclass, field=field, Mapping=Mapping, Iterable=Iterable,
              Optional=lambda t: t, WeightsMapping=Mapping, logger=RecordingLogger(), _is_npu=False,
              print_warning_once=lambda *a, **k: None, FusedMoE=moe["FusedMoE"])
    c.functions(SG_UTILS, "WeightsMapper")
    c.functions(SG_COMMON, "get_layer_id")
    c.functions(SG_WEIGHTS, "default_weight_loader", "maybe_remap_kv_scale_name")
    c.functions(SG_K3, "_EXPERT_WEIGHT_NAME", "_cdiv", "_maybe_map_fp8_pb_scale_name")
    return c


def _non_expert(stream, expert_re: re.Pattern) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for n, t in stream if not expert_re.search(n)]


def _stub_param(t: torch.Tensor, fed: Fed) -> torch.nn.Parameter:
    """A non-expert stub: its loader records receipt (with any shard id) and
    writes nothing, as nothing downstream reads it."""
    p = torch.nn.Parameter(torch.empty(0, dtype=t.dtype), requires_grad=False)
    p.weight_loader = fed.record(lambda param, loaded_weight, *args, **kwargs: None)
    return p


SG_EXPERT = re.compile(r"\.experts\.\d+\.")


def _sglang_experts(root: torch.nn.Module, layers: int, experts: int, hidden: int, inter: int, dtype, fed: Fed,
                    sentinel: int, mlp: str, quant_config=None) -> dict:
    """quant_config None: compressed-tensors (sglang_marlin.py's scheme);
    else the ModelOpt config, whose own get_quant_method picks the method."""
    out = {}
    for layer_id in range(layers):
        prefix = f"model.layers.{layer_id}.{mlp}.experts"
        if quant_config is None:
            layer, scheme = sglang_marlin.make_layer(list(range(experts)), hidden, inter, dtype)
        else:
            layer, scheme = modelopt_loaders.sglang_make_layer(quant_config, prefix, list(range(experts)), hidden,
                                                               inter, dtype)
            assert scheme is not None, f"SGLang's ModelOpt config excludes the routed experts {prefix}"
        for _, p in layer.named_parameters(recurse=False):
            record_loader(p, fed)
        fill_sentinel(layer, sentinel)
        put(root, prefix, layer)
        out[prefix] = (layer, scheme)
    return out


def _k3_sources(experts: dict) -> dict[str, str]:
    return {p: "language_model.model.layers.{}.block_sparse_moe.experts".format(p.split(".layers.")[1].split(".")[0])
            for p in experts}


def _sglang_quant(dst: Path, packed: dict, mapper) -> tuple[str, object, Callable]:
    """DST's format; for ModelOpt the wheel's ModelOptFp4Config from DST's
    config.json (modelopt_loaders.sglang_config); the post-load processing."""
    fmt = modelopt_loaders.quant_format(dst)
    if fmt != "modelopt":
        return fmt, None, sglang_marlin.finish_layer
    return fmt, modelopt_loaders.sglang_config(dst, packed, mapper), modelopt_loaders.sglang_finish_layer


def _vllm_quant(dst: Path, c: WheelCode, packed: dict, mapper) -> tuple[str, object, Callable]:
    """As _sglang_quant; compressed-tensors keeps the base QuantizationConfig
    (its checkpoint/cache-scale mappers are all the chain asks of it)."""
    fmt = modelopt_loaders.quant_format(dst)
    if fmt != "modelopt":
        return fmt, _vllm_quant_config(c), vllm_marlin.finish_layer
    return fmt, modelopt_loaders.vllm_config(dst, packed, mapper), modelopt_loaders.vllm_finish_layer


def _vllm_layer(config, fmt: str, prefix: str, n_exp: int, hidden: int, inter: int, dtype):
    if fmt != "modelopt":
        return vllm_marlin.make_layer(list(range(n_exp)), hidden, inter, dtype, layer_name=prefix)
    layer, method = modelopt_loaders.vllm_make_layer(config, prefix, list(range(n_exp)), hidden, inter, dtype)
    assert method is not None, f"vLLM's ModelOpt config excludes the routed experts {prefix}"
    return layer, method


def sglang_k3(dst: Path, dtype: torch.dtype, sentinel: int) -> Run:
    """SGLang 0.5.23's KimiK3ForConditionalGeneration over every tensor of `dst`."""
    c = sglang_code()
    ns = c.namespace
    cfg = json.loads((dst / "config.json").read_text())
    text = cfg["text_config"]
    stream = read_stream(dst, sorted(shard_files(dst)))  # loader.py:588: plain sort
    fed = Fed(stream)

    # The names the outer, wheel-owned step hands the language model (mapper,
    # then `language_model.` stripped): found by running it once.
    outer = ns["KimiK3ForConditionalGeneration"]()
    outer.config = types.SimpleNamespace(language_only=False)
    delivered: list[str] = []
    outer.language_model = types.SimpleNamespace(load_weights=lambda ws: delivered.extend(n for n, _ in ws))
    outer.load_weights(iter(stream))
    by_source = dict(zip([n for n, _ in stream], delivered)) if len(delivered) == len(stream) else None
    assert by_source is not None, "the outer step dropped tensors (vision tower?)"

    inner = ns["KimiK3LinearForCausalLM"]()
    layers = text["num_hidden_layers"]
    inner.config = types.SimpleNamespace(
        linear_attn_config=None, is_moe=True, num_experts=text["n_routed_experts"], num_hidden_layers=layers,
        is_kda_layer=lambda i: False, is_linear_attn=False, q_lora_rank=None, full_attention_layer_ids=[])
    inner.post_load_weights = lambda: None
    model = torch.nn.Module()
    model.start_layer, model.end_layer = 0, layers
    inner.add_module("model", model)
    # The loader seeds packed_modules_mapping from the outer class (loader.py:180),
    # KimiK3LinearForCausalLM.__init__ merges its own (kimi_k3.py:3002-3016).
    packed = {**class_attribute(c, SG_K3, "KimiK3ForConditionalGeneration", "packed_modules_mapping"),
              **class_attribute(c, SG_K3, "KimiK3LinearForCausalLM", "packed_modules_mapping")}
    fmt, quant_config, finish = _sglang_quant(dst, packed, ns["KimiK3ForConditionalGeneration"].hf_to_sglang_mapper)
    experts = _sglang_experts(inner, layers, text["n_routed_experts"], text["hidden_size"],
                              text["moe_intermediate_size"], dtype, fed, sentinel, "mlp", quant_config)
    for n, t in _non_expert(stream, SG_EXPERT):
        put(inner, by_source[n], _stub_param(t, fed))

    outer = ns["KimiK3ForConditionalGeneration"]()
    outer.config = types.SimpleNamespace(language_only=False)
    outer.language_model = inner
    ns["logger"].messages.clear()
    sglang_marlin.code()["logger"].messages.clear()
    with sglang_marlin.local_imports():
        outer.load_weights(iter(stream))
    return Run("sglang", SGLANG[1], "KimiK3ForConditionalGeneration", cfg["architectures"][0], fed.unconsumed(),
               experts, sentinel, fed, _k3_sources(experts), quant_format=fmt, quant_config=quant_config,
               finish=finish, placed={n: by_source[n] for n, _ in _non_expert(stream, SG_EXPERT)})


# ---------------------------------------------------------------- vLLM

VL_K3 = "vllm/models/kimi_k3/nvidia/model.py"
VL_UTILS = "vllm/model_executor/models/utils.py"
VL_WEIGHTS = "vllm/model_executor/model_loader/weight_utils.py"
VL_TORCHAO = "vllm/model_executor/model_loader/reload/torchao_decorator.py"
VL_BASE = "vllm/model_executor/layers/quantization/base_config.py"
VL_LAYER = "vllm/model_executor/layers/fused_moe/layer.py"
VL_EPLB = "vllm/distributed/eplb/eplb_state.py"


@functools.cache
def vllm_code() -> WheelCode:
    """vLLM's K3 model classes over the common pieces."""
    c = _vllm_common()
    ns = c.namespace
    c.functions(VL_K3, "get_spec_layer_idx_from_weight_name")
    outer = c.methods(VL_K3, "KimiK3ForConditionalGeneration", "load_weights", base=torch.nn.Module)
    outer.hf_to_vllm_mapper = class_attribute(c, VL_K3, "KimiK3ForConditionalGeneration", "hf_to_vllm_mapper")
    ns["KimiK3ForConditionalGeneration"] = outer
    ns["KimiLinearForCausalLM"] = c.methods(VL_K3, "KimiLinearForCausalLM", "load_weights", base=torch.nn.Module)
    ns["KimiLinearModel"] = c.methods(VL_K3, "KimiLinearModel", "load_weights", base=torch.nn.Module)
    ns["KimiMoE"] = type("KimiMoE", (torch.nn.Module,), {"use_mega_moe": False})
    return c


def _vllm_common() -> WheelCode:
    moe = vllm_marlin.code()
    c = WheelCode(wheel_dir(*VLLM))
    ns = c.namespace
    stage_missing = type("StageMissingLayer", (torch.nn.Module,), {})
    pp_missing = type("PPMissingLayer", (torch.nn.Module,), {})
    ns.update(torch=torch, re=re, os=os, nn=torch.nn, itertools=itertools, dataclass=dataclass, field=field,
              replace=replace, Mapping=Mapping, Iterable=Iterable, Callable=Callable, Any=object,
              ShardIds=object, WeightsTransformFn=object, wraps=functools.wraps, logger=RecordingLogger(),
              StageMissingLayer=stage_missing, PPMissingLayer=pp_missing,
              VocabParallelEmbedding=type("VocabParallelEmbedding", (), {}),
              copy_weight_=moe["copy_weight_"], RoutedExperts=moe["RoutedExperts"],
              _model_to_pp_missing_layer_names={})
    c.functions(VL_TORCHAO, "support_quantized_model_reload_from_hp_weights")
    c.functions(VL_UTILS, "WeightsMapper", "_get_tied_embedding_params", "AutoWeightsLoader", "maybe_prefix",
                "get_pp_missing_layer_names", "is_pp_missing_parameter")
    c.functions(VL_WEIGHTS, "default_weight_loader", "maybe_remap_kv_scale_name", "_natural_sort_key")
    c.functions(VL_LAYER, "fused_moe_make_expert_params_mapping")
    ns["EplbState"] = c.methods(VL_EPLB, "EplbState", "build_initial_global_physical_to_logical_map")
    ns["QuantizationConfig"] = c.methods(VL_BASE, "QuantizationConfig", "get_cache_scale_mapper",
                                         "get_checkpoint_weight_mapper")
    ns["QuantizationConfig"]._ignore_unexpected_suffixes = class_attribute(
        c, VL_BASE, "QuantizationConfig", "_ignore_unexpected_suffixes")
    # RoutedExperts' mapping helpers: staticmethods, taken from the wheel.
    for name in ("make_expert_params_mapping", "build_expert_params_mapping"):
        helper = moe.methods(vllm_marlin.LOADER, "RoutedExperts", name)
        setattr(moe["RoutedExperts"], name, staticmethod(getattr(helper, name)))
    moe.namespace.setdefault("EplbState", ns["EplbState"])
    return c


VL_EXPERT = re.compile(r"\.experts\.\d+\.")


def _vllm_quant_config(c: WheelCode):
    return c["QuantizationConfig"]()


def vllm_k3(dst: Path, dtype: torch.dtype, sentinel: int) -> Run:
    """vLLM 0.34.0's KimiK3ForConditionalGeneration over every tensor of `dst`."""
    c = vllm_code()
    ns = c.namespace
    cfg = json.loads((dst / "config.json").read_text())
    text = cfg["text_config"]
    stream = read_stream(dst, sorted(shard_files(dst), key=ns["_natural_sort_key"]))
    fed = Fed(stream)
    layers, n_exp = text["num_hidden_layers"], text["n_routed_experts"]

    top = ns["KimiK3ForConditionalGeneration"]()
    # SupportsQuant (interfaces.py:1291-1298): the outer class's rename mapper;
    # KimiLinearModel (also SupportsQuant) adds its packed_modules_mapping.
    fmt, top.quant_config, finish = _vllm_quant(
        dst, c, class_attribute(c, VL_K3, "KimiLinearModel", "packed_modules_mapping"), top.hf_to_vllm_mapper)
    lm = ns["KimiLinearForCausalLM"]()
    lm.quant_config = top.quant_config
    model = ns["KimiLinearModel"]()
    model.config = types.SimpleNamespace(
        linear_attn_config=None, q_lora_rank=None, dsa_config=None, is_moe=True, num_experts=n_exp,
        is_linear_attn=False, num_hidden_layers=layers, num_nextn_predict_layers=0)
    lm.add_module("model", model)
    top.add_module("language_model", lm)
    experts = {}
    for layer_id in range(layers):
        moe_module = ns["KimiMoE"]()
        put(model, f"layers.{layer_id}.block_sparse_moe", moe_module)
        layer, method = _vllm_layer(top.quant_config, fmt, f"language_model.model.layers.{layer_id}.block_sparse_moe.experts",
                                    n_exp, text["hidden_size"], text["moe_intermediate_size"], dtype)
        for _, p in layer.named_parameters(recurse=False):
            record_loader(p, fed)
        fill_sentinel(layer, sentinel)
        put(moe_module, "experts.routed_experts", layer)
        experts[f"language_model.model.layers.{layer_id}.block_sparse_moe.experts.routed_experts"] = (layer, method)
    # Non-expert stubs: the names are the checkpoint's after the wheel's own
    # hf_to_vllm_mapper (AutoWeightsLoader routes by module path from there).
    mapper = top.hf_to_vllm_mapper
    for n, t in _non_expert(stream, VL_EXPERT):
        put(top, mapper.map_name(n), _stub_param(t, fed))
    ns["logger"].messages.clear()
    vllm_marlin.code()["logger"].messages.clear()
    with vllm_marlin.local_imports(), stub_modules({  # base_config.py's local import: the wheel's own class
            "vllm.model_executor.models.utils": types.SimpleNamespace(WeightsMapper=ns["WeightsMapper"])}):
        top.load_weights(iter(stream))
    return Run("vllm", VLLM[1], "KimiK3ForConditionalGeneration", cfg["architectures"][0], fed.unconsumed(),
               experts, sentinel, fed, _k3_sources(experts), quant_format=fmt,
               quant_config=top.quant_config if fmt == "modelopt" else None, finish=finish,
               placed={n: mapper.map_name(n) for n, _ in _non_expert(stream, VL_EXPERT)})


# ---------------------------------------------------------------- DeepSeek V3 (flat layout)

SG_DS = "sglang/srt/models/deepseek_v2.py"
SG_DSL = "sglang/srt/models/deepseek_common/deepseek_weight_loader.py"
SG_MLU = "sglang/srt/model_loader/utils.py"
VL_DS = "vllm/model_executor/models/deepseek_v2.py"
FLAT_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


@functools.cache
def sglang_deepseek_code() -> WheelCode:
    c = _sglang_common()
    ns = c.namespace
    import concurrent.futures
    ns.update(concurrent=concurrent, tqdm=types.SimpleNamespace(tqdm=lambda x, **k: x),
              envs=types.SimpleNamespace(SGLANG_NVFP4_CKPT_FP8_GEMM_IN_ATTN=types.SimpleNamespace(get=lambda: False)),
              is_wint4afp8_or_wint4a16_config=lambda quant_config: False,
              log_info_on_rank0=lambda logger, msg: None, List=list, Dict=dict, Tuple=tuple)
    c.functions(SG_WEIGHTS, "RUNAI_STREAMER_TENSOR_ATTR")
    c.functions(SG_MLU, "should_async_load", "maybe_executor_submit")
    c.functions(SG_DSL, "NVFP4_CKPT_FP8_ATTN_QUANT_MODULES", "_clone_if_runai_streamed_tensor",
                "_resolve_quark_fp8_block_scale_name", "_load_fused_expert_tensor", "NextNEnabledConfig",
                "NextNDisabledConfig")
    mixin = c.methods(SG_DSL, "DeepseekV2WeightLoaderMixin", "do_load_weights", "_initialize_nextn_conf",
                      "_maybe_quant_weights_to_fp8_ue8m0", base=torch.nn.Module)
    ns["DeepseekV2ForCausalLM"] = c.methods(SG_DS, "DeepseekV2ForCausalLM", "load_weights", base=mixin)
    return c


def sglang_deepseek(dst: Path, dtype: torch.dtype, sentinel: int) -> Run:
    """SGLang 0.5.23's DeepseekV3ForCausalLM (DeepseekV2ForCausalLM.load_weights
    -> DeepseekV2WeightLoaderMixin.do_load_weights) over every tensor of `dst`."""
    c = sglang_deepseek_code()
    ns = c.namespace
    cfg = json.loads((dst / "config.json").read_text())
    stream = read_stream(dst, sorted(shard_files(dst)))
    fed = Fed(stream)
    layers, n_exp = cfg["num_hidden_layers"], cfg["n_routed_experts"]
    top = ns["DeepseekV2ForCausalLM"]()
    top.config = types.SimpleNamespace(n_routed_experts=n_exp, num_hidden_layers=layers, num_nextn_predict_layers=0)
    # DeepseekV2ForCausalLM.packed_modules_mapping is {} (deepseek_v2.py:3250);
    # __init__ adds fused_qkv_a_proj_with_mqa only with q_lora_rank (:3262-3270).
    fmt, quant_config, finish = _sglang_quant(dst, {}, None)  # DeepSeek has no hf_to_sglang_mapper
    top.quant_config = quant_config or types.SimpleNamespace(get_name=lambda: "compressed-tensors")
    top.num_fused_shared_experts = 0
    top.pp_group = types.SimpleNamespace(is_last_rank=True)
    top.post_load_weights = lambda is_nextn=False, weight_names=None: None
    model = torch.nn.Module()
    model.start_layer, model.end_layer = 0, layers
    top.add_module("model", model)
    experts = _sglang_experts(top, layers, n_exp, cfg["hidden_size"], cfg["moe_intermediate_size"], dtype, fed,
                              sentinel, "mlp", quant_config)
    for n, t in _non_expert(stream, SG_EXPERT):
        put(top, n, _stub_param(t, fed))
    ns["logger"].messages.clear()
    with sglang_marlin.local_imports():
        top.load_weights(iter(stream))
    return Run("sglang", SGLANG[1], "DeepseekV3ForCausalLM", cfg["architectures"][0], fed.unconsumed(), experts,
               sentinel, fed, {p: p for p in experts}, FLAT_PROJ, quant_format=fmt, quant_config=quant_config,
               finish=finish, placed={n: n for n, _ in _non_expert(stream, SG_EXPERT)})


@functools.cache
def vllm_deepseek_code() -> WheelCode:
    c = _vllm_common()
    ns = c.namespace
    ns.update(typing=__import__("typing"),
              rocm_aiter_ops=types.SimpleNamespace(is_fusion_moe_shared_experts_enabled=lambda: False))
    c.functions(VL_UTILS, "extract_layer_index", "get_spec_layer_idx_from_weight_name")
    c.functions(VL_DS, "_try_load_fp8_indexer_wk")
    ns["DeepseekV2ForCausalLM"] = c.methods(VL_DS, "DeepseekV2ForCausalLM", "load_weights", base=torch.nn.Module)
    ns["DeepseekV2Model"] = c.methods(VL_DS, "DeepseekV2Model", "load_weights", base=torch.nn.Module)
    return c


def vllm_deepseek(dst: Path, dtype: torch.dtype, sentinel: int) -> Run:
    """vLLM 0.34.0's DeepseekV3ForCausalLM (DeepseekV2ForCausalLM.load_weights
    -> AutoWeightsLoader -> DeepseekV2Model.load_weights) over every tensor."""
    c = vllm_deepseek_code()
    ns = c.namespace
    cfg = json.loads((dst / "config.json").read_text())
    stream = read_stream(dst, sorted(shard_files(dst), key=ns["_natural_sort_key"]))
    fed = Fed(stream)
    layers, n_exp = cfg["num_hidden_layers"], cfg["n_routed_experts"]
    top = ns["DeepseekV2ForCausalLM"]()
    # Not SupportsQuant: configure_quant_config hands it the class's
    # packed_modules_mapping (model_loader/utils.py:381-388); no hf_to_vllm_mapper.
    fmt, top.quant_config, finish = _vllm_quant(
        dst, c, dict(class_attribute(c, VL_DS, "DeepseekV2ForCausalLM", "packed_modules_mapping")), None)
    model = ns["DeepseekV2Model"]()
    model.config = types.SimpleNamespace(n_routed_experts=n_exp, n_shared_experts=1, num_hidden_layers=layers,
                                         num_nextn_predict_layers=0)
    # DeepSeek V3's MLA (qk_nope_head_dim/qk_rope_head_dim non-zero) -> use_mha
    # False (deepseek_v2.py:1496-1500); no AITER shared-expert fusion, no EPLB.
    model.use_mha, model.fused_shared_expert_layers, model.num_redundant_experts = False, frozenset(), 0
    top.add_module("model", model)
    experts = {}
    for layer_id in range(layers):
        layer, method = _vllm_layer(top.quant_config, fmt, f"model.layers.{layer_id}.mlp.experts", n_exp,
                                    cfg["hidden_size"], cfg["moe_intermediate_size"], dtype)
        for _, p in layer.named_parameters(recurse=False):
            record_loader(p, fed)
        fill_sentinel(layer, sentinel)
        put(model, f"layers.{layer_id}.mlp.experts.routed_experts", layer)
        experts[f"model.layers.{layer_id}.mlp.experts"] = (layer, method)
    for n, t in _non_expert(stream, VL_EXPERT):
        put(top, n, _stub_param(t, fed))
    ns["logger"].messages.clear()
    with vllm_marlin.local_imports(), stub_modules({
            "vllm.model_executor.models.utils": types.SimpleNamespace(WeightsMapper=ns["WeightsMapper"])}):
        top.load_weights(iter(stream))
    return Run("vllm", VLLM[1], "DeepseekV3ForCausalLM", cfg["architectures"][0], fed.unconsumed(), experts,
               sentinel, fed, {p: p for p in experts}, FLAT_PROJ, quant_format=fmt,
               quant_config=top.quant_config if fmt == "modelopt" else None, finish=finish,
               placed={n: n for n, _ in _non_expert(stream, VL_EXPERT)})


CHAINS = {("sglang", "DeepseekV3ForCausalLM"): sglang_deepseek,
          ("vllm", "DeepseekV3ForCausalLM"): vllm_deepseek, ("sglang", "KimiK3ForConditionalGeneration"): sglang_k3,
          ("vllm", "KimiK3ForConditionalGeneration"): vllm_k3}
