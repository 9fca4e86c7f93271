"""``mx2nv.compare``: how far an NVFP4 checkpoint made from an MXFP4 source
is from the source's values (docs/compare.md). The result is compare's JSON
document as a dict; a difference is a result (``exit_code`` 1), not an
exception. Invalid input raises ``InvalidInputError`` (exit 3)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Union

from . import _core
from ._errors import error_for
from ._progress import ProgressArg, make_progress
from ._report import Report

PathLike = Union[str, "os.PathLike[str]"]


def compare(src: PathLike, other: PathLike, *, threads: Optional[int] = None, modules: Optional[str] = None,
            report: Optional[PathLike] = None, html: Optional[PathLike] = None,
            progress: ProgressArg = None) -> Dict[str, Any]:
    """Compare every value of ``other`` (compressed-tensors or ModelOpt
    NVFP4) with ``src`` (MXFP4); ``modules`` is a regular expression
    selecting SRC modules; ``report`` and ``html`` are paths the document and
    the HTML page are written to (checked before any work, as the CLI's)."""
    from ._api import _threads

    sink = make_progress(progress)
    try:
        code, text, _ = _core.compare(os.fspath(src), os.fspath(other), _threads(threads), modules or "", sink,
                                      None if report is None else os.fspath(report),
                                      None if html is None else os.fspath(html))
    finally:
        if sink is not None:
            sink.close()
    data = json.loads(text)
    if code in (0, 1) and data.get("command") == "compare":
        return data
    raise error_for(code, data.get("error") or "compare failed", Report.from_json(data))
