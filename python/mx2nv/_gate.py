"""``mx2nv.gate``: the go/no-go of ``mx2nv gate``, with the runtimes' own
selectors asked in an interpreter (by default this one), as typed results
that mirror ``mx2nv gate --json`` field for field."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Mapping, Optional, Tuple

from . import _core
from ._errors import UsageError, error_for



@dataclasses.dataclass(frozen=True)
class GateVerdict:
    """One runtime backend at one activation dtype and TP degree."""

    runtime: str
    version: str  # the pinned release the rules were read from
    backend: str
    gpus: str
    dtype: str
    tp: int
    verdict: str  # "RUN" | "BLOCKED" | "UNVERIFIED" | "UNKNOWN" (no loader rule for the architecture)
    reasons: Tuple[str, ...]
    notes: Tuple[str, ...]
    ep: int = 1
    model_class: Optional[str] = None  # the class the release builds for the architecture; None: unknown
    per_rank: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # experts, dims and bytes one GPU holds

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "GateVerdict":
        return cls(d["runtime"], d["version"], d["backend"], d["gpus"], d["dtype"], d["tp"], d["verdict"],
                   tuple(d["reasons"]), tuple(d["notes"]), d["ep"], d["model_class"], dict(d["per_rank"]))


@dataclasses.dataclass(frozen=True)
class RuntimeSelection:
    """What an installed runtime's own code selected for the experts, next
    to gate's scheme rule."""

    runtime: str
    outcome: str  # "selected" | "refused" | "could-not-ask" | "not-installed"
    version: str  # installed ("" when unknown)
    pinned: str
    version_differs: bool
    selected: str  # "Class(arg=value)" when selected
    selects_nvfp4a16: bool
    gate_selects_nvfp4a16: bool
    agreement: str  # "AGREES" | "DISAGREES" | "NO OPINION"
    reason: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RuntimeSelection":
        return cls(d["runtime"], d["outcome"], d["version"], d["pinned"], d["version_differs"], d["selected"],
                   d["selects_nvfp4a16"], d["gate_selects_nvfp4a16"], d["agreement"], d["reason"])


@dataclasses.dataclass(frozen=True)
class GateResult:
    """``mx2nv gate --json`` as objects. ``result`` is gate's own verdict
    ("BLOCKED" if any verdict is, "RUN" if every one is, else "UNKNOWN" or
    "UNVERIFIED"); ``disagreement``: a runtime's own selector
    disagrees with gate's scheme rule; ``exit_code`` as the CLI's (1 when
    blocked or disagreeing)."""

    checkpoint: str
    result: str
    exit_code: int
    dims: Mapping[str, int]
    scales: Mapping[str, Any]
    verdicts: Tuple[GateVerdict, ...]
    asked: bool
    not_asked: str
    python: str
    python_version: str
    layer: str
    disagreement: bool
    selections: Tuple[RuntimeSelection, ...]
    tp_table: Tuple[Mapping[str, Any], ...]
    quick: bool = False  # gate --quick: the block-scale counts in ``scales`` are None (not read)
    architecture: Optional[str] = None  # config.json's architectures[0]
    format: str = "compressed-tensors"  # the layout judged: "compressed-tensors" or "modelopt" (mx2nv.FORMATS)

    @property
    def runs(self) -> bool:
        """Every verdict is RUN and no runtime's own selector disagrees
        (UNKNOWN and UNVERIFIED verdicts exit 0 but do not run for sure)."""
        return self.result == "RUN" and not self.disagreement

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "GateResult":
        a = d["runtime_selectors"]
        return cls(d["checkpoint"], d["result"], d["exit_code"], dict(d["dims"]), dict(d["scales"]),
                   tuple(GateVerdict.from_json(v) for v in d["verdicts"]), a["asked"], a["not_asked"], a["python"],
                   a["python_version"], a["layer"], a["disagreement"],
                   tuple(RuntimeSelection.from_json(r) for r in a["runtimes"]), tuple(d["tp_table"]),
                   bool(d.get("quick", False)), d.get("architecture"), d.get("format", "compressed-tensors"))


def gate(checkpoint: "os.PathLike[str] | str", *, runtime: str = "all", tp: int = 1, ep: int = 1, dtype: str = "both",
         threads: Optional[int] = None, ask_runtimes: bool = True, python: Optional[str] = None,
         ask_timeout: Optional[int] = None, quick: bool = False) -> GateResult:
    """``mx2nv gate``: will vLLM / SGLang run this NVFP4A16 checkpoint
    (compressed-tensors, or ModelOpt W4A16_NVFP4) exactly? BLOCKED and a disagreement are answers, not
    exceptions (see ``result``, ``disagreement``, ``exit_code``).

    With ``ask_runtimes`` the runtimes' own config parser and selector are
    asked too (``mx2nv.runtime_probe``), in ``python`` (default: this
    interpreter, ``sys.executable``), which may take ``ask_timeout`` seconds
    (default 120); both are refused (``UsageError``) without
    ``ask_runtimes``, where they could only be ignored. The probe runs as a child process:
    importing vLLM changes environment variables, logging and torch state,
    and a crash in a runtime's compiled extension must not take this process
    down. ``quick`` (``gate --quick``) reads the config, the headers and the
    globals only: the rules that need the block scales are reported as not
    checked, and the result's ``quick`` is true with those counts None. Raises
    ``InvalidInputError`` (not an NVFP4 checkpoint),
    ``UsageError``, ``MxIOError``."""
    from ._api import _threads

    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= 1024:
        raise UsageError(f"tp must be an integer in [1, 1024], got {tp!r}")
    if isinstance(ep, bool) or not isinstance(ep, int) or not 1 <= ep <= 1024:
        raise UsageError(f"ep must be an integer in [1, 1024], got {ep!r}")
    if not isinstance(quick, bool):
        raise UsageError(f"quick must be True or False, got {quick!r}")
    if not ask_runtimes:
        for name, value in (("python", python), ("ask_timeout", ask_timeout)):
            if value is not None:
                raise UsageError(f"{name} does not apply with ask_runtimes=False (nothing is asked)")
    if ask_timeout is None:
        ask_timeout = 120
    if isinstance(ask_timeout, bool) or not isinstance(ask_timeout, int) or not 1 <= ask_timeout <= 3600:
        raise UsageError(f"ask_timeout must be seconds in [1, 3600], got {ask_timeout!r}")
    interpreter = (python or sys.executable) if ask_runtimes else None
    if ask_runtimes and not interpreter:
        raise UsageError("ask_runtimes needs an interpreter: sys.executable is empty, pass python=")
    code, text, _ = _core.gate(os.fspath(checkpoint), runtime, tp, ep, dtype, _threads(threads), interpreter,
                               ask_timeout, quick)
    data = json.loads(text)
    if data["result"] == "error":
        raise error_for(code, data["error"], None)
    return GateResult.from_json(data)
