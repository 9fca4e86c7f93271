"""Ask the installed runtimes themselves which MoE scheme they select.

`mx2nv gate` judges a checkpoint with rules read from the pinned vLLM and
SGLang releases. Where vLLM or SGLang is importable, this probe asks the
runtime's own code instead: its CompressedTensorsConfig parses the
checkpoint's quantization_config (`from_config`) and its real selection entry
point, `CompressedTensorsConfig.get_quant_method(layer, prefix)`, picks the
method for one routed-expert layer of the checkpoint. gate compares that
answer with its own scheme rule (gate/opinion.cpp).

Only the constructors of the runtime's MoE methods/schemes are replaced, by
recorders, while the selector runs: they would select GPU kernels (vLLM's
`select_nvfp4_moe_backend`), which needs a GPU and is not the decision asked
here (gate's backend rules cover it). Which class the selector constructs,
and with which arguments, is the runtime's decision and is reported as is.

The probe never raises: an import failure or an exception underneath the
selector is "could-not-ask"; an exception raised by the selector or parser
itself (the runtime refusing the config) is "refused". Whatever the runtime
prints goes to stderr; stdout carries exactly one JSON document.

Runs three ways: `python -m mx2nv.runtime_probe CHECKPOINT`; embedded in the
mx2nv binary and run as `python -c <this file> --request -` (the request, a
JSON object, on stdin; no mx2nv package needed); imported (`ask_all`). It
uses the standard library only and keeps to Python 3.9 syntax, since it runs
in whatever interpreter holds the runtime.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import sys
import traceback

PROTOCOL = 1
# The releases gate's rules were read from (gate/rules.cpp).
PINNED = {"vllm": "0.34.0", "sglang": "0.5.23"}
RUNTIMES = ("vllm", "sglang")
_MAX_TEXT = 2000  # characters of any message kept in the answer

# The runtimes' own modules (vLLM 0.34.0 / SGLang 0.5.23 paths).
_VLLM_CT = "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors"
_VLLM_MOE_PKG = "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe"
_VLLM_EXPERTS = "vllm.model_executor.layers.fused_moe"  # RoutedExperts
_VLLM_METHOD_BASE = "vllm.model_executor.layers.fused_moe"  # FusedMoEMethodBase
_SGLANG_CT = "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors"
_SGLANG_EXPERTS = "sglang.srt.layers.moe.fused_moe_triton"  # FusedMoE
_SGLANG_SCHEME_BASE = "sglang.srt.layers.quantization.compressed_tensors.schemes"  # CompressedTensorsMoEScheme


def _short(text: object) -> str:
    s = str(text)
    return s if len(s) <= _MAX_TEXT else s[: _MAX_TEXT - 3] + "..."


def _describe(exc: BaseException) -> str:
    return _short(f"{type(exc).__name__}: {exc}")


def find_quantization_config(config: dict):
    """As gate finds it (gate/rules.cpp quantization_config_of): the
    top-level one, else the one of the last nested object, in key order, that
    holds one (e.g. text_config)."""
    if not isinstance(config, dict):
        return None
    if "quantization_config" in config:
        return config["quantization_config"]
    found = None
    for key in sorted(config):
        value = config[key]
        if isinstance(value, dict) and "quantization_config" in value:
            found = value["quantization_config"]
    return found


_EXPERT = re.compile(r"^(.+)\.(\d+)\.(w1|w3|w2|gate_proj|up_proj|down_proj)\.weight(_packed)?$")
_PROJECTIONS = {"w1": ["w1", "w3", "w2"], "w2": ["w1", "w3", "w2"], "w3": ["w1", "w3", "w2"]}


def expert_layer(weight_names) -> tuple:
    """(layer prefix, [gate, up, down] projection names) of the first routed
    expert among checkpoint tensor names, as gate's parse_expert_module reads
    them; ("model.layers.0.mlp.experts", gate/up/down_proj) when none."""
    for name in sorted(weight_names):
        m = _EXPERT.match(name)
        if m:
            return m.group(1), _PROJECTIONS.get(m.group(3), ["gate_proj", "up_proj", "down_proj"])
    return "model.layers.0.mlp.experts", ["gate_proj", "up_proj", "down_proj"]


class _Recorded:
    """Stands for a MoE method/scheme the selector constructed."""

    def __init__(self, cls_name: str, args: tuple, kwargs: dict):
        self.cls_name = cls_name
        self.kwargs = {k: v for k, v in kwargs.items() if isinstance(v, (bool, int, float, str, type(None)))}
        self.positional = len(args)


def _recorder(cls: type) -> type:
    """A subclass of `cls` whose construction records instead of building:
    class attributes the selector reads (e.g. SGLang's
    `get_min_capability()`) stay the runtime's own."""

    def construct(_cls, *args, **kwargs):
        return _Recorded(cls.__name__, args, kwargs)

    return type(cls.__name__, (cls,), {"__new__": construct, "__module__": cls.__module__})


@contextlib.contextmanager
def _recording(modules, base: type):
    """Replaces, in each module, every class deriving from `base` by a
    recorder, for the duration (restored after)."""
    saved = []
    try:
        for module in modules:
            for name, value in list(vars(module).items()):
                if isinstance(value, type) and issubclass(value, base):
                    saved.append((module, name, value))
                    setattr(module, name, _recorder(value))
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _raised_by(exc: BaseException, files) -> bool:
    """Whether the innermost frame of `exc` is in one of `files` (the
    selector's own code), as opposed to something it called (torch.cuda...)."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and os.path.realpath(last) in {os.path.realpath(f) for f in files}


def _version(module) -> str:
    v = getattr(module, "__version__", None)
    return v if isinstance(v, str) else ""


def _answer(runtime: str) -> dict:
    return {"runtime": runtime, "installed": False, "version": "", "pinned": PINNED[runtime],
            "outcome": "not-installed", "selected": None, "reason": ""}


def _ask(runtime: str, quantization_config, layer_name: str, projections) -> dict:
    import importlib
    import pkgutil

    out = _answer(runtime)
    try:
        top = importlib.import_module(runtime)
    except ModuleNotFoundError as e:
        if e.name == runtime:
            return out  # not installed: no opinion, no error
        out.update(installed=True, outcome="could-not-ask", reason=f"import {runtime}: {_describe(e)}")
        return out
    except BaseException as e:  # noqa: BLE001 - anything a runtime's import does is reported
        out.update(installed=True, outcome="could-not-ask", reason=f"import {runtime}: {_describe(e)}")
        return out
    out.update(installed=True, version=_version(top))
    stage = "import"
    try:
        import torch

        if runtime == "vllm":
            ct = importlib.import_module(_VLLM_CT)
            package = importlib.import_module(_VLLM_MOE_PKG)
            experts_cls = importlib.import_module(_VLLM_EXPERTS).RoutedExperts
            base = importlib.import_module(_VLLM_METHOD_BASE).FusedMoEMethodBase
            # Every module of the MoE-method package that imports here; the
            # selector imports its method from one of them.
            modules = []
            for info in pkgutil.iter_modules(package.__path__):
                with contextlib.suppress(Exception):
                    modules.append(importlib.import_module(f"{_VLLM_MOE_PKG}.{info.name}"))
            selector_files = [ct.__file__] + [m.__file__ for m in modules]
        else:
            ct = importlib.import_module(_SGLANG_CT)
            experts_cls = importlib.import_module(_SGLANG_EXPERTS).FusedMoE
            base = importlib.import_module(_SGLANG_SCHEME_BASE).CompressedTensorsMoEScheme
            modules = [ct]
            selector_files = [ct.__file__]
        stage = "parse"
        config = ct.CompressedTensorsConfig.from_config(copy.deepcopy(quantization_config))
        stage = "select"
        # The runtime's own expert-layer class, built bare (no engine config):
        # the selector reads only its class (target matching) and names.
        layer = experts_cls.__new__(experts_cls)
        torch.nn.Module.__init__(layer)
        if runtime == "vllm":
            layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name, layer.ckpt_down_proj_name = projections
            layer.moe_config = None
        with _recording(modules, base):
            method = config.get_quant_method(layer, layer_name)
        chosen = method if runtime == "vllm" else getattr(layer, "scheme", None)
        if isinstance(chosen, _Recorded):
            out.update(outcome="selected", selected={"class": chosen.cls_name, "args": chosen.kwargs})
        elif chosen is None:
            out.update(outcome="selected", selected={"class": "none (layer not quantized)", "args": {}})
        else:
            out.update(outcome="selected", selected={"class": type(chosen).__name__, "args": {}})
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        refused = (stage == "parse" and isinstance(e, (ValueError, TypeError, KeyError))) or (
            stage == "select" and _raised_by(e, selector_files))
        where = {"import": "import", "parse": "CompressedTensorsConfig.from_config",
                 "select": "CompressedTensorsConfig.get_quant_method"}[stage]
        out.update(outcome="refused" if refused else "could-not-ask", reason=f"{where}: {_describe(e)}")
        traceback.print_exc(file=sys.stderr)
    return out


def ask_all(quantization_config, layer_name: str, projections, runtimes=RUNTIMES) -> dict:
    """The probe's answer for each requested runtime (never raises)."""
    answers = []
    for runtime in runtimes:
        if runtime not in PINNED:
            continue
        try:
            answers.append(_ask(runtime, quantization_config, layer_name, list(projections)))
        except BaseException as e:  # noqa: BLE001 - the probe itself must not fail
            if isinstance(e, KeyboardInterrupt):
                raise
            a = _answer(runtime)
            a.update(outcome="could-not-ask", reason=f"probe: {_describe(e)}")
            answers.append(a)
    return {"probe": PROTOCOL, "python": sys.version.split()[0], "layer": layer_name,
            "projections": list(projections), "runtimes": answers}


def _request_from_checkpoint(path: str, runtimes) -> dict:
    config_path = os.path.join(path, "config.json") if os.path.isdir(path) else path
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    qc = find_quantization_config(config)
    if qc is None:
        raise SystemExit(f"{config_path}: no quantization_config")
    names = []
    directory = os.path.dirname(config_path)
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            names = list(json.load(f).get("weight_map", {}))
    layer, projections = expert_layer(names)
    return {"quantization_config": qc, "layer": layer, "projections": projections, "runtimes": list(runtimes)}


def _checked_request(request) -> dict:
    if not isinstance(request, dict) or not isinstance(request.get("quantization_config"), dict):
        raise ValueError("request: needs an object quantization_config")
    layer, projections = request.get("layer"), request.get("projections")
    if not isinstance(layer, str) or not (isinstance(projections, list) and len(projections) == 3
                                          and all(isinstance(p, str) for p in projections)):
        raise ValueError("request: needs layer (a string) and projections (three strings)")
    runtimes = request.get("runtimes", list(RUNTIMES))
    if not isinstance(runtimes, list) or not all(r in PINNED for r in runtimes):
        raise ValueError(f"request: runtimes must be a list of {sorted(PINNED)}")
    return request


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mx2nv.runtime_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", nargs="?", help="checkpoint directory or its config.json")
    parser.add_argument("--request", metavar="FILE", help="a JSON request ('-' reads stdin), as mx2nv gate sends")
    parser.add_argument("--runtime", choices=["vllm", "sglang", "all"], default="all")
    args = parser.parse_args(argv)
    if (args.checkpoint is None) == (args.request is None):
        parser.error("give a CHECKPOINT or --request")
    runtimes = list(RUNTIMES) if args.runtime == "all" else [args.runtime]
    # stdout is the answer's alone: whatever the runtimes print at import or
    # while selecting (vLLM logs to stdout) goes to stderr, down to the fd.
    answer_fd = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        if args.request is not None:
            text = sys.stdin.read() if args.request == "-" else open(args.request, encoding="utf-8").read()
            request = _checked_request(json.loads(text))
        else:
            request = _request_from_checkpoint(args.checkpoint, runtimes)
        answer = ask_all(request["quantization_config"], request["layer"], request["projections"],
                         request.get("runtimes", runtimes))
    finally:
        sys.stdout.flush()
        os.dup2(answer_fd, 1)
        os.close(answer_fd)
    sys.stdout.write(json.dumps(answer, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if sys.argv[0] == "-c" and sys.path and sys.path[0] in ("", os.getcwd()):
        # Embedded (`python -c`): do not import modules from the caller's
        # working directory, which may be the checkpoint's.
        del sys.path[0]
    sys.exit(main())
