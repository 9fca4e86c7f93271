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


# The first wrong input gets the same plain words and next step through the
# API as on the command line (tests/corpus/test_first_wrong_input.py has every
# case for every command): the class says the exit code, the message the path
# and the command to run next.

def test_an_nvfp4_source_says_already_nvfp4_and_names_gate(demo_dst: Path, tmp_path: Path) -> None:
    for call in (lambda: mx2nv.inspect(demo_dst), lambda: mx2nv.convert(demo_dst, tmp_path / "out"),
                 lambda: mx2nv.plan(demo_dst, tmp_path / "out")):
        with pytest.raises(mx2nv.InvalidInputError) as caught:
            call()
        assert "already NVFP4" in caught.value.message and f"`mx2nv gate {demo_dst}`" in caught.value.message
        assert caught.value.exit_code == 3
    assert not (tmp_path / "out").exists()


def test_an_mxfp4_checkpoint_given_to_gate_says_convert_first(demo_src: Path) -> None:
    with pytest.raises(mx2nv.InvalidInputError) as caught:
        mx2nv.gate(demo_src, ask_runtimes=False)
    assert "this is MXFP4" in caught.value.message
    assert f"`mx2nv convert {demo_src} {demo_src}-nvfp4`" in caught.value.message


def test_missing_paths_and_files_for_folders(demo_src: Path, demo_dst: Path, tmp_path: Path) -> None:
    with pytest.raises(mx2nv.UsageError, match="does not exist"):
        mx2nv.verify(demo_src, tmp_path / "not converted")
    with pytest.raises(mx2nv.UsageError, match="is a file, not a folder"):
        mx2nv.inspect(demo_src / "config.json")
    with pytest.raises(mx2nv.MxIOError, match="mkdir -p"):
        mx2nv.convert(demo_src, tmp_path / "no such folder" / "out")
