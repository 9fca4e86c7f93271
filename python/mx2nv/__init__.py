"""mx2nv: lossless MXFP4 -> NVFP4A16 transcoding for MoE checkpoints.

    import mx2nv
    plan = mx2nv.inspect("model-mxfp4")           # spans, outcome under both windows
    report = mx2nv.convert("model-mxfp4", "model-nvfp4", progress=True)
    mx2nv.verify("model-mxfp4", "model-nvfp4")    # raises MismatchError on any difference
    mx2nv.compare("model-mxfp4", "other-nvfp4")   # any NVFP4 checkpoint against its source, a dict
    mx2nv.gate("model-nvfp4").runs                # vLLM/SGLang go/no-go, their own selectors asked

Results mirror the JSON report; failures raise exceptions named after the
command line's exit codes (RefusedError 1, UsageError 2, InvalidInputError 3,
MxIOError 4) with the message and the report attached.
"""

from ._api import (FORMATS, WINDOWS, PlannedConversion, convert, convert_hub, convert_shards, finalize, inspect, plan,
                   resolve_hub_snapshot, verify)
from ._card import CardResult, card
from ._compare import compare
from ._core import version as _version
from ._gate import GateResult, GateVerdict, RuntimeSelection, gate
from ._errors import InvalidInputError, MismatchError, Mx2nvError, MxIOError, RefusedError, UsageError
from ._progress import Progress
from ._report import (CopyAccount, Counts, GlobalConflict, Inspection, ModuleSpan, MoeDims, OverSpan, Provenance, Report,
                      WindowOutcome)

__version__: str = _version()

__all__ = [
    "FORMATS",
    "WINDOWS",
    "CardResult",
    "CopyAccount",
    "Counts",
    "GateResult",
    "GateVerdict",
    "GlobalConflict",
    "Inspection",
    "InvalidInputError",
    "MismatchError",
    "ModuleSpan",
    "MoeDims",
    "Mx2nvError",
    "MxIOError",
    "OverSpan",
    "PlannedConversion",
    "Progress",
    "Provenance",
    "RefusedError",
    "RuntimeSelection",
    "Report",
    "UsageError",
    "WindowOutcome",
    "card",
    "compare",
    "convert",
    "convert_hub",
    "convert_shards",
    "finalize",
    "gate",
    "inspect",
    "plan",
    "resolve_hub_snapshot",
    "verify",
]
