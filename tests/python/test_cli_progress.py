"""The command line's progress: a live line on a real pseudo-terminal
(util-linux `script` allocates one), nothing when stderr is not a terminal,
JSON lines on request."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import generate


@pytest.fixture(scope="module")
def big_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("progress") / "src", "--layers", "2", "--experts", "16", "--hidden",
                    "1024", "--intermediate", "512", "--shards", "4")


def frames(raw: str) -> list[str]:
    """The successive states of the live line: each redraw starts with \\r."""
    return [f.replace("\x1b[K", "").strip() for f in raw.split("\r") if f.replace("\x1b[K", "").strip()]


def test_live_line_on_a_terminal(tmp_path: Path, big_src: Path, mx2nv_command: str) -> None:
    if shutil.which("script") is None:
        pytest.skip("util-linux `script` is not installed: no pseudo-terminal to test on")
    dst = tmp_path / "dst"
    # stdout goes to a file, so the typescript holds only what went to the
    # terminal through stderr.
    inner = f"{shlex.quote(mx2nv_command)} convert {big_src} {dst} --threads 1 > {tmp_path / 'stdout.txt'}"
    typescript = tmp_path / "typescript"
    subprocess.run(["script", "-q", "-e", "-c", inner, str(typescript)], check=True, capture_output=True,
                   timeout=120)
    raw = typescript.read_bytes().decode(errors="replace")  # bytes: keep the \r
    raw = raw.split("\n", 1)[1] if raw.startswith("Script started") else raw  # script's own header
    raw = raw.split("\nScript done", 1)[0]  # and footer
    lines = [f for f in frames(raw) if f.startswith("convert ")]
    assert len(lines) >= 3, raw
    assert lines[0].startswith("convert plan")
    shards = [f for f in lines if f.startswith("convert shards")]
    assert shards, lines
    last = shards[-1]
    assert re.search(r"\d+\.\d\d/\d+\.\d\d [MG]B 100%", last) and "GB/s" in last and "4/4 shards" in last, last
    assert any(f.startswith("convert finalize") for f in lines)
    # The line updates in place (no newline between frames) and is erased at
    # the end, so the summary on stdout starts on a clean line.
    progress_part = raw[raw.index("\rconvert plan"):]
    assert "\n" not in progress_part.rstrip("\r\n\x1b[K")
    assert raw.rstrip("\r\n").endswith("\r\x1b[K")
    assert "mx2nv convert: ok" in (tmp_path / "stdout.txt").read_text()


def test_no_progress_without_a_terminal(tmp_path: Path, big_src: Path, mx2nv_command: str) -> None:
    done = subprocess.run([mx2nv_command, "convert", str(big_src), str(tmp_path / "dst")], capture_output=True,
                          text=True, check=True)
    assert done.stderr == ""
    assert "mx2nv convert: ok" in done.stdout
    verified = subprocess.run([mx2nv_command, "verify", str(big_src), str(tmp_path / "dst")], capture_output=True,
                              text=True, check=True)
    assert verified.stderr == ""


def test_json_lines(tmp_path: Path, big_src: Path, mx2nv_command: str) -> None:
    done = subprocess.run([mx2nv_command, "convert", str(big_src), str(tmp_path / "dst"), "--progress", "json"],
                          capture_output=True, text=True, check=True)
    updates = [json.loads(line) for line in done.stderr.splitlines()]
    assert updates[0]["phase"] == "plan" and updates[-1]["phase"] == "done"
    shards = [u for u in updates if u["phase"] == "shards"]
    assert shards[-1]["bytes_done"] == shards[-1]["bytes_total"] > 0
    assert shards[-1]["units_done"] == shards[-1]["units_total"] == 4
    assert set(updates[0]) == {"command", "phase", "bytes_done", "bytes_total", "units_done", "units_total", "unit",
                               "seconds", "bytes_per_second", "eta_seconds"}
    # --progress always draws the line even into a pipe; never draws nothing.
    always = subprocess.run([mx2nv_command, "verify", str(big_src), str(tmp_path / "dst"), "--progress", "always"],
                            capture_output=True, check=True)
    assert b"\rverify shards" in always.stderr
    never = subprocess.run([mx2nv_command, "verify", str(big_src), str(tmp_path / "dst"), "--progress", "never"],
                           capture_output=True, text=True, check=True)
    assert never.stderr == ""
