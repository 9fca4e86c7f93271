"""Exception messages are shown on terminals (a traceback prints them): text
from the checkpoint or the file system in them is escaped as the command
line escapes it, while the report keeps the library's text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mx2nv

UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]")
HOSTILE = "evil\x1b]0;owned\x07\x7f\u009b31m\u202e\u2066\u2028"
ESCAPED = "evil\\x1b]0;owned\\x07\\x7f\\u009b31m\\u202e\\u2066\\u2028"


def test_a_hostile_path_in_an_exception_is_escaped(tmp_path: Path) -> None:
    with pytest.raises(mx2nv.Mx2nvError) as caught:
        mx2nv.inspect(tmp_path / HOSTILE)
    message = str(caught.value)
    assert not UNSAFE.search(message), message
    assert ESCAPED in message
    assert caught.value.message == message
    assert caught.value.report is not None and HOSTILE in caught.value.report.error  # the report's text as it was


def test_every_exception_class_escapes(tmp_path: Path) -> None:
    for cls in (mx2nv.RefusedError, mx2nv.MismatchError, mx2nv.UsageError, mx2nv.InvalidInputError, mx2nv.MxIOError):
        e = cls("tensor \"" + HOSTILE + "\": bad \udcff")
        assert not UNSAFE.search(str(e)), str(e)
        assert ESCAPED in str(e) and "\\udcff" in str(e)
        assert str(cls("caf\u00e9 \u5c02\u9580 \\x1b")) == "caf\u00e9 \u5c02\u9580 \\x1b"  # text and backslashes stay
