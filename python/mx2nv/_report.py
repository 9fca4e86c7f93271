"""Results as frozen dataclasses whose fields are the JSON report's fields
(``mx2nv convert --report``, ``mx2nv inspect --json``), nested the same way.
``to_dict()`` gives back exactly the JSON object."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Type, TypeVar

T = TypeVar("T")


def _build(cls: Type[T], data: Mapping[str, Any], convert: Optional[Dict[str, Any]] = None) -> T:
    """Builds ``cls`` from ``data``; a field missing from ``data`` or a key
    ``cls`` does not know is a contract break between the library and this
    package, reported as such rather than silently dropped."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    missing = [n for n in names if n not in data]
    unknown = [k for k in data if k not in names]
    if missing or unknown:
        raise RuntimeError(f"mx2nv: report does not match {cls.__name__}: missing {missing}, unknown {unknown}")
    convert = convert or {}
    return cls(**{n: convert[n](data[n]) if n in convert else data[n] for n in names})


@dataclass(frozen=True)
class Provenance:
    tool: str
    tool_version: str
    source: str
    revision: Optional[str]  # Hugging Face snapshot revision when SRC is one
    target: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Provenance":
        return _build(cls, {"target": None, **data})


@dataclass(frozen=True)
class Counts:
    """Every figure is None where the command did not compute it (never 0
    for "not computed"): a failed command's, verify's resumed_shards,
    convert's groups when the packed bytes were shared or kernel-copied."""

    shards: Optional[int]
    resumed_shards: Optional[int]  # convert only
    modules: Optional[int]
    scale_groups: Optional[int]
    active_groups: Optional[int]  # None when the packed bytes were shared or kernel-copied, never seen
    zero_groups: Optional[int]
    canonicalised_zero_groups: Optional[int]  # convert and inspect: planned; verify: counted in the two trees
    marlin_zeroed_groups: Optional[int]
    raised_globals: Optional[int]  # scale groups whose global was raised so fp16 activations stay normal
    global_conflicts: int  # scale groups no global exponent serves (refused)
    passthrough_tensors: Optional[int]
    companion_files: Optional[int]


@dataclass(frozen=True)
class CopyAccount:
    """convert: how the output bytes came to be (``--copy``); None where
    nothing was written (a refused convert)."""

    mode: str  # auto | reflink | copy
    shared_bytes: Optional[int]  # unchanged bytes shared with SRC (reflink)
    copied_bytes: Optional[int]  # unchanged bytes copied (copy_file_range or read/write)
    written_bytes: Optional[int]  # new bytes: headers, scales, globals, config, index


@dataclass(frozen=True)
class OverSpan:
    module: str
    span: int
    limit: int
    groups_outside: int


def _over_span(items: Any) -> Tuple[OverSpan, ...]:
    return tuple(_build(OverSpan, o) for o in items)


@dataclass(frozen=True)
class GlobalConflict:
    """A scale group (gate/up members joined by '+') whose members need
    global exponents in ``needed`` while the window allows only ``allowed``."""

    scale_group: str
    k_max: int
    k_min: int
    needed: Tuple[int, int]
    allowed: Tuple[int, int]


def _global_conflicts(items: Any) -> Tuple[GlobalConflict, ...]:
    return tuple(_build(GlobalConflict, c, {"needed": tuple, "allowed": tuple}) for c in items)


def _float(value: Any) -> Optional[float]:
    if value is None:
        return None  # not computed
    return math.inf if value == "inf" else float(value)


# Keys the library writes only for some commands or results.
_OPTIONAL_KEYS = ("already_complete", "copy", "shard_subset", "resolved", "requantized", "overspan", "error",
                  "error_kind", "fingerprint")
_ABSENT = {k: None for k in _OPTIONAL_KEYS}

_REPORT_FIELDS = {
    "provenance": Provenance.from_json,
    "counts": lambda d: _build(Counts, d),
    "copy": lambda d: None if d is None else _build(CopyAccount, d),
    "over_span": _over_span,
    "unrepresentable_globals": tuple,
    "global_conflicts": _global_conflicts,
    "differences": tuple,
    "max_abs_error": _float,
    "requantized": lambda rows: None if rows is None else tuple(rows),
}


@dataclass(frozen=True)
class Report:
    """The report of convert or verify (``--report FILE``)."""

    command: str
    result: str  # ok | refused | mismatch | error
    window: str
    provenance: Provenance
    counts: Counts
    already_complete: Optional[bool]  # convert, requantize: DST already held this output, nothing written
    copy: Optional[CopyAccount]  # convert only
    shard_subset: Optional[str]  # verify --shards I/N: the part this report covers
    resolved: Optional[Dict[str, str]]  # verify --shards I/N: {"source", "target"} as they resolved then
    source_tensor_bytes: Optional[int]
    target_tensor_bytes: Optional[int]  # None: nothing written (a refused convert)
    size_change_percent: Optional[float]
    values_compared: Optional[int]  # None where no value was compared (convert, plan, inspect)
    mismatches: Optional[int]
    max_abs_error: Optional[float]
    over_span: Tuple[OverSpan, ...]
    # convert/plan overspan= (--overspan), read back by verify:
    # the JSON objects as the library writes them, None when absent.
    requantized: Optional[Tuple[Dict[str, Any], ...]]  # lossy modules with their measured error
    overspan: Optional[Dict[str, Any]]  # the choice and what it did; inspect: each choice's cost
    unrepresentable_globals: Tuple[str, ...]
    global_conflicts: Tuple[GlobalConflict, ...]
    # verify, requantize: {"scheme", "source", "target", "source_files", "target_files"}
    fingerprint: Optional[Dict[str, Any]]
    differences: Tuple[str, ...]
    error: Optional[str]  # result "error" only
    error_kind: Optional[str]  # result "error" only: usage, invalid input, io
    exit_code: int  # what the mx2nv command exits with for this result
    seconds: float

    @property
    def ok(self) -> bool:
        return self.result == "ok"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Report":
        return _build(cls, {**_ABSENT, **data}, _REPORT_FIELDS)

    def to_dict(self) -> Dict[str, Any]:
        """The JSON report this object was built from."""
        return _to_json(self)


@dataclass(frozen=True)
class ModuleSpan:
    """One quantized module as inspect sees it."""

    name: str
    rows: int
    groups_per_row: int
    k_max: Optional[int]  # None: every group of the module is zero
    k_min: Optional[int]
    span: int
    shares_global: bool  # a gate/up pair sharing one global scale


@dataclass(frozen=True)
class WindowOutcome:
    result: str  # ok | refused
    over_span: Tuple[OverSpan, ...]
    unrepresentable_globals: Tuple[str, ...]
    global_conflicts: Tuple[GlobalConflict, ...]
    raised_globals: int
    canonicalised_zero_groups: int
    marlin_zeroed_groups: int


@dataclass(frozen=True)
class MoeDims:
    """The routed experts' dimensions, when every expert module agrees."""

    hidden: int
    intermediate: int
    experts: int
    moe_layers: int


@dataclass(frozen=True)
class Inspection(Report):
    """``mx2nv inspect --json``: the report plus both windows' outcomes and
    every module's span. ``result`` is the outcome under the chosen window."""

    max_span: int
    packed_groups_probed: int
    modules_fully_scanned: int
    outcomes: Dict[str, WindowOutcome]
    moe_dims: Optional[MoeDims]  # None when the experts' dimensions are not uniform
    tp_table: Optional[Tuple[Dict[str, Any], ...]]  # per TP degree, each runtime backend's "ok" or why not
    modules: Tuple[ModuleSpan, ...]
    # Per --format: the tensor names and shapes it writes, its config files and TP table.
    formats: Dict[str, Dict[str, Any]]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Inspection":
        fields = dict(_REPORT_FIELDS)
        fields["outcomes"] = lambda d: {
            w: _build(WindowOutcome, o, {"over_span": _over_span, "unrepresentable_globals": tuple,
                                         "global_conflicts": _global_conflicts})
            for w, o in d.items()
        }
        fields["moe_dims"] = lambda d: None if d is None else _build(MoeDims, d)
        fields["tp_table"] = lambda rows: None if rows is None else tuple(rows)
        fields["modules"] = lambda ms: tuple(_build(ModuleSpan, m) for m in ms)
        return _build(cls, {**_ABSENT, "moe_dims": None, "tp_table": None, **data}, fields)


def _to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if v is None and f.name in (*_OPTIONAL_KEYS, "target", "moe_dims", "tp_table"):
                continue  # absent from the JSON, as the library writes it
            out[f.name] = _to_json(v)
        return out
    if isinstance(value, (tuple, list)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return value
