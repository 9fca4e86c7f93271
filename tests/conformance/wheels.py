"""The runtimes' released wheels, fetched from PyPI at test time, and their
functions run on the CPU without importing the packages.

Importing `vllm` or `sglang` pulls in CUDA extensions, so instead the suite
parses the wheel's own source files with `ast`, takes the functions and
methods it names, and compiles them under the wheel file's real path (so line
numbers in tracebacks and in `WheelCode.where` are the wheel's). They run with
torch on the CPU in a namespace that holds the other wheel functions they call
and a few stubs; every stub is declared where it is used, with why it cannot
change a value. Nothing from a wheel is ever copied into this repository: the
files live in a cache directory (MX2NV_WHEEL_CACHE, default build/wheels),
filled once by `pip download` and reused by later runs.
"""

from __future__ import annotations

import ast
import contextlib
import os
import subprocess
import sys
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("MX2NV_WHEEL_CACHE", REPO / "build" / "wheels"))

# The pinned releases the suite judges outputs with.
VLLM = ("vllm", "0.34.0")
SGLANG = ("sglang", "0.5.23")
MODELOPT = ("nvidia-modelopt", "0.47.0")
# vLLM 0.34.0's pin for its Humming backend (a hard dependency of that release,
# METADATA `Requires-Dist: humming-kernels[cu13]==0.1.19`, as 0.33.0's);
# the wheel ships the kernel's CUDA sources too (.cuh, JIT-compiled at run time).
HUMMING = ("humming-kernels", "0.1.19")

# Fixed target so the same wheel is chosen whatever Python runs the tests.
_PIP_TARGET = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
               *[arg for tag in ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                                 "manylinux2014_x86_64") for arg in ("--platform", tag)]]


def wheel_dir(package: str, version: str, suffixes: tuple[str, ...] = (".py",)) -> Path:
    """The wheel's unpacked .py files (and any other `suffixes`, e.g. kernel
    sources; the compiled parts are never needed). Downloads once; later calls
    reuse the cache."""
    root = CACHE / f"{package}-{version}"
    done = root / ".complete"
    if done.exists():
        return root
    download = CACHE / "download"
    download.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(download), *_PIP_TARGET,
                    f"{package}=={version}"], check=True)
    (wheel,) = [p for p in download.iterdir() if p.name.startswith(f"{package.replace('-', '_')}-{version}-")
                and p.suffix == ".whl"]
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith(suffixes) and not name.startswith("/") and ".." not in name.split("/"):
                z.extract(name, root)
    wheel.unlink()  # only the sources are kept; pip's own cache keeps the download
    done.write_text(f"{package}=={version}\n")
    return root


@dataclass
class WheelCode:
    """Functions and methods compiled from one wheel's files into one namespace."""

    root: Path
    namespace: dict = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)  # name -> "path:first-last"

    def _tree(self, rel: str) -> ast.Module:
        return ast.parse((self.root / rel).read_text(), filename=str(self.root / rel))

    def _compile(self, rel: str, nodes: list[ast.stmt], into: dict) -> None:
        for node in nodes:
            _drop_annotations(node)
        module = ast.Module(body=nodes, type_ignores=[])
        exec(compile(module, str(self.root / rel), "exec"), into)

    def functions(self, rel: str, *names: str) -> None:
        """Top-level functions, classes (e.g. an Enum) or assigned names of `rel`, into the namespace."""
        tree = self._tree(rel)
        found = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                name = getattr(target, "id", None)
            else:
                continue
            if name in names:
                found[name] = node
        missing = set(names) - set(found)
        if missing:
            raise LookupError(f"{rel}: {sorted(missing)} not found")
        for name in names:
            node = found[name]
            self.where[name] = f"{rel}:{node.lineno}-{node.end_lineno}"
            self._compile(rel, [node], self.namespace)

    def methods(self, rel: str, cls: str, *names: str, base: type = object) -> type:
        """A class holding the named methods of `cls` in `rel` (the last
        definition of each: `@overload` stubs come first). Decorators other
        than staticmethod/classmethod/property are dropped (typing only)."""
        tree = self._tree(rel)
        (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        defs = {}
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name in names:
                if any(isinstance(d, ast.Name) and d.id == "overload" for d in item.decorator_list):
                    continue
                defs[item.name] = item
        missing = set(names) - set(defs)
        if missing:
            raise LookupError(f"{rel}: {cls}.{sorted(missing)} not found")
        body = {}
        for name, item in defs.items():
            item.decorator_list = [d for d in item.decorator_list
                                   if isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod", "property")]
            self.where[f"{cls}.{name}"] = f"{rel}:{item.lineno}-{item.end_lineno}"
            scratch = dict(self.namespace)
            self._compile(rel, [item], scratch)
            body[name] = _rebind(scratch[name], self.namespace)
        return type(cls, (base,), body)

    def __getitem__(self, name: str):
        return self.namespace[name]


def _drop_annotations(node: ast.AST) -> None:
    """Type annotations name classes the suite does not load; they are typing
    only (evaluated at definition, never used), so they are removed."""
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n.returns = None
            for a in [*n.args.posonlyargs, *n.args.args, *n.args.kwonlyargs, n.args.vararg, n.args.kwarg]:
                if a is not None:
                    a.annotation = None


def _rebind(fn, namespace: dict):
    """The same code with the wheel namespace as its globals (so a method sees
    every function and stub added to it, also later)."""
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(_rebind(fn.__func__, namespace))
    return types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)


@contextlib.contextmanager
def stub_modules(modules: dict[str, types.SimpleNamespace]):
    """Modules a wheel function imports locally (`from x import y` inside a
    body), present only while it runs."""
    saved = {name: sys.modules.get(name) for name in modules}
    try:
        for name, attrs in modules.items():
            module = types.ModuleType(name)
            module.__dict__.update(vars(attrs))
            sys.modules[name] = module
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


class RecordingLogger:
    """Stub for the wheels' loggers: records messages (tests read the
    warnings, e.g. vLLM's gate/up global mismatch) and never touches a tensor."""

    def __init__(self):
        self.messages: list[str] = []

    def _record(self, msg, *args, **_kwargs):
        self.messages.append(str(msg) % args if args else str(msg))

    warning = warning_once = info = info_once = debug = debug_once = error = _record
