"""``mx2nv.card``: DST/README.md, the Hugging Face model card written from a
verify (or requantize) report of these very files (docs/card.md)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from . import _core
from ._errors import UsageError, error_for
from ._report import Report

PathLike = Union[str, "os.PathLike[str]"]


@dataclasses.dataclass(frozen=True)
class CardResult:
    """What ``mx2nv.card`` wrote."""

    path: Path  # DST/README.md
    source_card: Optional[str]  # "README.source.md" when SRC's README.md was kept, else None
    sha256: str  # of the card's bytes
    text: str  # the card
    front_matter: Dict[str, Any]  # the metadata written, in order
    inherited: Tuple[str, ...]  # SRC card keys inherited
    dropped: Tuple[str, ...]  # SRC card keys not carried over
    not_inherited: Tuple[str, ...]  # inheritable SRC keys whose value was unusable
    source_card_problem: Optional[str]  # why nothing could be inherited, or None
    warnings: Tuple[str, ...]  # what the command line prints on stderr


def card(src: PathLike, dst: PathLike, *, verify_report: Optional[Union[PathLike, Report]] = None,
         requantize_report: Optional[PathLike] = None, base_model: Optional[str] = None,
         companion: Optional[str] = None, tp: int = 1, repo_id: Optional[str] = None,
         gpu_check: Optional[PathLike] = None, threads: Optional[int] = None) -> CardResult:
    """``mx2nv card``: write ``dst/README.md`` from exactly one of
    ``verify_report`` (a path, or the ``Report`` ``mx2nv.verify`` returned)
    and ``requantize_report``. Every refusal (a report that does not prove
    this DST, a DST changed since verify, bad options) raises ``UsageError``
    with nothing written; ``InvalidInputError``, ``MxIOError`` as elsewhere.
    An option given is used as given or refused: ``""`` raises ``UsageError``,
    a value of another type (``0`` among them) ``TypeError``; only ``None``
    is "not given". A source card mx2nv cannot read is not an error: nothing
    is inherited."""
    from ._api import _threads

    if (verify_report is None) == (requantize_report is None):
        raise UsageError("give exactly one of verify_report and requantize_report")
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= 1024:
        raise UsageError(f"tp must be an integer in [1, 1024], got {tp!r}")
    # A given option is used as given or refused: "" (an unset variable) and
    # 0 never count as "not given".
    for name, value in (("base_model", base_model), ("companion", companion), ("repo_id", repo_id)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, got {type(value).__name__}")
        if value == "":
            raise UsageError(f"{name} was given an empty value")
    for name, value in (("verify_report", verify_report), ("requantize_report", requantize_report),
                        ("gpu_check", gpu_check)):
        if value is None or isinstance(value, Report):
            continue
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a path or None, got {type(value).__name__}")
        if os.fspath(value) in ("", b""):
            raise UsageError(f"{name} was given an empty value")
    kind = "verify" if verify_report is not None else "requantize"
    given = verify_report if verify_report is not None else requantize_report
    text: Optional[str] = None
    if isinstance(given, Report):
        text = json.dumps(given.to_dict(), indent=2, ensure_ascii=False) + "\n"
        path = ""
    else:
        path = os.fspath(given)  # type: ignore[arg-type]
    code, out, _ = _core.card(os.fspath(src), os.fspath(dst), kind, path, text, base_model, companion,
                              tp, repo_id, None if gpu_check is None else os.fspath(gpu_check),
                              _threads(threads))
    data = json.loads(out)
    if data["result"] == "error":
        raise error_for(code, data["error"], None)
    return CardResult(path=Path(data["path"]), source_card=data["source_card"], sha256=data["sha256"],
                      text=data["text"], front_matter={k: v for k, v in data["front_matter"]},
                      inherited=tuple(data["inherited"]), dropped=tuple(data["dropped"]),
                      not_inherited=tuple(data["not_inherited"]), source_card_problem=data["source_card_problem"],
                      warnings=tuple(data["warnings"]))
