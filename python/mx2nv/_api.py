"""The typed API over the C++ library (the nanobind extension ``_core``):
the same code as the ``mx2nv`` command, in process, with the GIL released
while it works."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Optional, Tuple, Union

from . import _core
from ._errors import error_for
from ._progress import ProgressArg, make_progress
from ._report import Inspection, Report

PathLike = Union[str, "os.PathLike[str]"]
# The names each choice accepts, from the library's choice tables (one spelling).
WINDOWS = _core.CHOICES["window"]
FORMATS = _core.CHOICES["format"]  # convert(format=...), plan(format=...)


def _threads(threads: Optional[int]) -> int:
    if threads is None:
        return max(1, os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
        from ._errors import UsageError

        raise UsageError(f"threads must be an integer in [1, 1024], got {threads!r}")
    return threads


def _path(path: Optional[PathLike]) -> Optional[str]:
    return None if path is None else os.fspath(path)


def _finish(outcome: Tuple[int, str, Optional[str]], kind: Any) -> Any:
    """The result of a command the library ran. Its report and HTML page
    were written by the library (to the paths checked before any work, as
    the command line does), not here."""
    code, text, _ = outcome
    data = json.loads(text)
    # A failed command's report is the plain report, for inspect too.
    result = (Report if data["result"] == "error" else kind).from_json(data)
    if code != 0 and not (kind is Inspection and data["result"] == "refused"):
        message = data.get("error") or _refusal_message(data)
        raise error_for(code, message, result)
    return result


def _refusal_message(data: Any) -> str:
    if data["result"] == "mismatch":
        return f"verify found {data['mismatches']} value mismatches and {len(data['differences'])} differences"
    spans = ", ".join(f"{o['module']} (span {o['span']} > {o['limit']})" for o in data["over_span"][:3])
    more = len(data["over_span"]) - 3
    text = f"refused under window {data['window']}: {len(data['over_span'])} modules over span"
    if spans:
        text += f": {spans}" + (f" and {more} more" if more > 0 else "")
    if data["unrepresentable_globals"]:
        text += f"; {len(data['unrepresentable_globals'])} global scales not a normal FP32"
    return text


def inspect(src: PathLike, *, window: str = "marlin", threads: Optional[int] = None,
            html: Optional[PathLike] = None) -> Inspection:
    """Dry run: every module's span, the outcome under both windows, sizes.

    A source that convert would refuse is not an error here: look at
    ``result`` and ``over_span``. Raises ``InvalidInputError`` (malformed
    checkpoint), ``UsageError``, ``MxIOError``."""
    outcome = _core.inspect(os.fspath(src), window, _threads(threads), _path(html))
    return _finish(outcome, Inspection)


def convert(src: PathLike, dst: PathLike, *, window: str = "marlin", threads: Optional[int] = None,
            resume: bool = False, copy: str = "auto", overspan: str = "fail", format: str = "compressed-tensors",
            progress: ProgressArg = None, report: Optional[PathLike] = None,
            html: Optional[PathLike] = None) -> Report:
    """Transcode the MXFP4 checkpoint ``src`` (a directory or a Hugging Face
    cache snapshot) into ``dst`` (absent or empty, unless ``resume``).

    ``copy``: how unchanged bytes reach ``dst`` (``--copy``): "auto" shares
    them with ``src`` where the file system can (reflink), else lets the kernel
    copy them; "reflink" shares or raises UsageError before writing; "copy"
    reads and writes every byte. ``overspan`` (``--overspan``): what to do with
    scale groups the window refuses: "fail" (refuse, nothing written), "bf16"
    (those modules stored dequantized, exact) or "requantize" (LOSSY, those
    modules only). ``format`` (``--format``): the NVFP4 layout written,
    "compressed-tensors" (``weight_packed``/``weight_global_scale``) or
    "modelopt" (ModelOpt ``W4A16_NVFP4``: ``weight``/``weight_scale_2`` and
    ``hf_quant_config.json``; the same packed and block-scale bytes).
    ``progress``: a callable taking ``Progress``, or True for a tqdm bar (a
    plain stderr line without tqdm). ``report``/``html``: also write the JSON
    report / HTML page there (checked before any work as ``--report`` is:
    never inside ``src`` or ``dst``, else ``UsageError``). Ctrl-C stops like SIGINT on the command line
    (temporary files removed, finished shards kept for ``resume=True``) and
    raises KeyboardInterrupt. Raises ``RefusedError`` with the report when a
    module does not fit the window (nothing written), ``UsageError``,
    ``InvalidInputError``, ``MxIOError``."""
    sink = make_progress(progress)
    try:
        outcome = _core.convert(os.fspath(src), os.fspath(dst), window, _threads(threads), bool(resume), copy,
                                overspan, format, sink, _path(report), _path(html))
    finally:
        if sink is not None:
            sink.close()
    return _finish(outcome, Report)


def verify(src: PathLike, dst: PathLike, *, window: Optional[str] = None, threads: Optional[int] = None,
           progress: ProgressArg = None, report: Optional[PathLike] = None,
           html: Optional[PathLike] = None) -> Report:
    """Prove every value of ``dst`` equals the value in ``src``. Raises
    ``MismatchError`` (a ``RefusedError``, exit code 1) with the report when
    anything differs; otherwise as ``convert``. ``window`` None: the window
    ``dst`` records (convert's), else marlin, as the CLI's verify."""
    if window is not None and not isinstance(window, str):
        raise TypeError(f"window must be a str or None, not {type(window).__name__}")
    if window == "":
        from ._errors import UsageError
        raise UsageError("window: empty value; give marlin or e4m3, or None for the window dst records")
    sink = make_progress(progress)
    try:
        outcome = _core.verify(os.fspath(src), os.fspath(dst), "" if window is None else window, _threads(threads),
                               sink, _path(report),
                               _path(html))
    finally:
        if sink is not None:
            sink.close()
    return _finish(outcome, Report)


@dataclasses.dataclass(frozen=True)
class PlannedConversion:
    """``mx2nv.plan``'s result: the plan report and where the plan file is
    (None when DST already holds this conversion: nothing left to plan)."""

    report: Report
    plan: Optional[Path]
    shards: int  # how many shards the plan has (``convert_shards(plan, shard=0..shards-1)``)


def plan(src: PathLike, dst: PathLike, *, window: str = "marlin", threads: Optional[int] = None,
         plan_out: Optional[PathLike] = None, overspan: str = "fail",
         format: str = "compressed-tensors") -> PlannedConversion:
    """``mx2nv plan``: plan the conversion of ``src`` into ``dst`` once, for
    ``convert_shards`` in other processes or on other machines, then
    ``finalize``. The plan goes to ``dst/.mx2nv/plan.json`` unless
    ``plan_out``. Refusals happen here (``RefusedError``, nothing written);
    planning again gives the same plan (another one is a ``UsageError``).
    ``overspan`` and ``format`` as ``convert``'s, recorded in the plan."""
    code, text, written = _core.plan(os.fspath(src), os.fspath(dst), window, _threads(threads),
                                     None if plan_out is None else os.fspath(plan_out), overspan, format)
    report = _finish((code, text, None), Report)
    return PlannedConversion(report, None if written is None else Path(written), report.counts.shards)


def _selection(shard: Optional[int], shards: Optional[str]) -> str:
    from ._errors import UsageError

    if (shard is None) == (shards is None):
        raise UsageError("give exactly one of shard=I or shards='I/N'")
    if shard is not None:
        if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
            raise UsageError(f"shard must be a shard number, got {shard!r}")
        return str(shard)
    if not isinstance(shards, str) or "/" not in shards:
        raise UsageError(f"shards must be 'I/N', got {shards!r}")
    return shards


def convert_shards(plan: PathLike, *, shard: Optional[int] = None, shards: Optional[str] = None,
                   src: Optional[PathLike] = None, dst: Optional[PathLike] = None, threads: Optional[int] = None,
                   copy: str = "auto", progress: ProgressArg = None, report: Optional[PathLike] = None) -> Report:
    """``mx2nv convert --plan P --shard I`` (``shard=I``) or ``--shards I/N``
    (``shards="I/N"``): the execute step for those shards only, in this
    process. Idempotent (a shard whose record matches is skipped), safe to run
    twice at once on one shard, refused when SRC no longer matches the plan.
    ``src``/``dst`` default to the plan's paths (give them where this machine
    mounts the storage elsewhere). ``report`` is checked before any work
    against the SRC and DST the step uses and the plan itself."""
    selection = _selection(shard, shards)
    sink = make_progress(progress)
    try:
        outcome = _core.convert_shards(os.fspath(plan), selection, _path(src), _path(dst), _threads(threads), copy,
                                       sink, _path(report))
    finally:
        if sink is not None:
            sink.close()
    return _finish(outcome, Report)


def finalize(plan: PathLike, *, src: Optional[PathLike] = None, dst: Optional[PathLike] = None,
             threads: Optional[int] = None, copy: str = "auto", report: Optional[PathLike] = None,
             html: Optional[PathLike] = None) -> Report:
    """``mx2nv convert --plan P --finalize``: check every shard record, then
    write companions, config and the index last. Raises ``UsageError`` naming
    the shards not finished yet; a finished DST answers ``already_complete``."""
    outcome = _core.finalize(os.fspath(plan), _path(src), _path(dst), _threads(threads), copy, _path(report),
                             _path(html))
    return _finish(outcome, Report)


def resolve_hub_snapshot(repo_id: str, *, revision: Optional[str] = None, cache_dir: Optional[PathLike] = None,
                         local_files_only: bool = False) -> Path:
    """The local snapshot directory of ``repo_id`` at ``revision`` (a branch,
    tag or commit), through huggingface_hub. With ``local_files_only`` it
    only reads the cache; otherwise huggingface_hub may download."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:  # an optional dependency: pip install mx2nv[hub]
        from ._errors import UsageError

        raise UsageError("convert_hub needs huggingface_hub (pip install 'mx2nv[hub]')") from e
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=os.fspath(cache_dir) if cache_dir else None,
                                 local_files_only=local_files_only)
    except Exception as e:  # huggingface_hub's own errors: not found in the cache, bad repo id, network
        from ._errors import InvalidInputError, UsageError

        cls = UsageError if isinstance(e, ValueError) else InvalidInputError
        raise cls(f"{repo_id}@{revision or 'main'}: cannot resolve the snapshot: {e}") from e
    return Path(path)


def convert_hub(repo_id: str, *, dst: PathLike, revision: Optional[str] = None,
                cache_dir: Optional[PathLike] = None, local_files_only: bool = False, **options: Any) -> Report:
    """``convert`` a Hugging Face model from its cache snapshot (see
    ``resolve_hub_snapshot``); the report's ``provenance.revision`` is the
    snapshot's commit. ``options`` are ``convert``'s keyword arguments."""
    snapshot = resolve_hub_snapshot(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only)
    return convert(snapshot, dst, **options)
