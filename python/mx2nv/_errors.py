"""Exceptions whose classes are mx2nv's exit codes (1 refused, 2 usage,
3 invalid input, 4 I/O), each carrying the message and the report."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional, Union

if TYPE_CHECKING:
    from ._report import Inspection, Report

# What a terminal acts on, as the command line escapes it (common/printable.hpp):
# C0 controls and DEL as \xNN; C1 controls, the bidirectional controls and the
# line and paragraph separators as \uXXXX; and lone surrogates (a path decoded
# with surrogateescape), which cannot even be printed, as \uXXXX too.
_TERMINAL_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` safe to show on a terminal, escaped as the ``mx2nv`` command's
    messages are (a message quotes tensor names and paths from the checkpoint)."""
    return _TERMINAL_UNSAFE.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x80 else f"\\u{ord(m.group()):04x}", text
    )


class Mx2nvError(Exception):
    """Base class; ``exit_code`` is what the ``mx2nv`` command would exit with.
    The message is terminal-safe (see ``printable``); ``report.error`` keeps
    the library's text as the JSON report has it."""

    exit_code: int = 0

    def __init__(self, message: str, report: Optional[Union["Report", "Inspection"]] = None) -> None:
        message = printable(message)
        super().__init__(message)
        self.message = message
        self.report = report


class RefusedError(Mx2nvError):
    """Exit 1: refused by policy (a module's span does not fit the window, a
    global scale would not be a normal FP32), or verify found a difference.
    ``report.over_span`` lists every offending module."""

    exit_code = 1


class MismatchError(RefusedError):
    """Exit 1 from verify: DST differs from SRC; ``report.differences`` says where."""


class UsageError(Mx2nvError, ValueError):
    """Exit 2: bad arguments, DST not empty (without resume), DST inside SRC,
    DST locked by another running mx2nv."""

    exit_code = 2


class InvalidInputError(Mx2nvError):
    """Exit 3: the checkpoint is malformed or unsupported."""

    exit_code = 3


class MxIOError(Mx2nvError, OSError):
    """Exit 4: an I/O or system error (disk full, permissions, interruption)."""

    exit_code = 4


_BY_EXIT_CODE = {1: RefusedError, 2: UsageError, 3: InvalidInputError, 4: MxIOError}


def error_for(exit_code: int, message: str, report: Optional[Union["Report", "Inspection"]]) -> Mx2nvError:
    if exit_code == 1 and report is not None and report.result == "mismatch":
        return MismatchError(message, report)
    cls = _BY_EXIT_CODE.get(exit_code)
    if cls is None:  # the library has no other codes; anything else is a bug
        raise RuntimeError(f"mx2nv: unexpected exit code {exit_code}: {message}")
    return cls(message, report)
