"""What mx2nv prints or emits as JSON from text it did not write (issue 20):
paths, tensor names, a runtime probe's answers, the command line's own
arguments. On a terminal nothing may arrive that a terminal or a text
renderer acts on: C0 controls and DEL (shown as \\xNN), C1 controls such as
U+009B, a CSI on many terminals, the bidirectional controls of "Trojan
Source" and the line separators (shown as \\uXXXX), and bytes that are not
UTF-8 (\\xNN). JSON output carries them as JSON escapes, and bytes that are
not UTF-8 as the text \\xNN, so two paths never print the same.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]
MX2NV = Path(os.environ.get("MX2NV", REPO / "build" / "mx2nv")).absolute()

# Everything printable() escapes (common/printable.hpp), decoded with
# surrogateescape so a byte that is not UTF-8 shows as a lone surrogate.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\udc80-\udcff]")
# A name with one of each: ESC and BEL (C0), DEL, CSI and NEL (C1), RLO and
# LRI (bidi), LINE SEPARATOR, and a byte that is not UTF-8.
HOSTILE = "evil\x1b]0;owned\x07\x7f\u009b31m\u0085\u202e\u2066\u2028"
HOSTILE_ESCAPED = "evil\\x1b]0;owned\\x07\\x7f\\u009b31m\\u0085\\u202e\\u2066\\u2028"


def run(*args, cwd=None) -> subprocess.CompletedProcess:
    r = subprocess.run([os.fsencode(MX2NV), *[os.fsencode(a) for a in args]], capture_output=True, timeout=120, cwd=cwd)
    r.stdout = r.stdout.decode("utf-8", "surrogateescape")
    r.stderr = r.stderr.decode("utf-8", "surrogateescape")
    return r


def assert_terminal_safe(text: str) -> None:
    bad = sorted({f"U+{ord(c):04X}" for c in UNSAFE.findall(text)})
    assert not bad, (bad, text)


def hostile_path(base: Path, name: str = HOSTILE, raw: bytes = b"\xff") -> Path:
    return Path(os.fsdecode(bytes(base) + b"/" + name.encode() + raw))


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("escaping")
    src = root / "src"
    r = run("generate", src, "--shards", "2", "--hidden", "256", "--intermediate", "128")
    assert r.returncode == 0, r.stderr
    assert run("convert", src, root / "dst").returncode == 0
    return root


@pytest.mark.parametrize("command", [["inspect"], ["convert", "{p}", "{p}-dst"], ["verify", "{p}", "{p}-dst"],
                                     ["gate"], ["plan", "{p}", "{p}-dst"], ["requantize", "{p}", "{p}-dst"]])
def test_a_hostile_path_in_an_error_is_escaped(tmp_path, command):
    p = hostile_path(tmp_path)
    args = [a.replace("{p}", os.fsdecode(bytes(p))) if isinstance(a, str) else a for a in command]
    if len(args) == 1:
        args.append(os.fsdecode(bytes(p)))
    r = run(*args)
    assert r.returncode in (2, 3, 4), r
    assert_terminal_safe(r.stdout + r.stderr)
    assert HOSTILE_ESCAPED + "\\xff" in r.stderr, r.stderr
    assert "internal error" not in r.stderr


def test_a_hostile_checkpoint_directory_prints_escaped_and_reports_as_json(tmp_path):
    src = hostile_path(tmp_path)
    dst = hostile_path(tmp_path, HOSTILE + "-dst", b"\xfe")
    assert run("generate", src, "--shards", "2", "--hidden", "64", "--intermediate", "64").returncode == 0
    for r in (run("convert", src, dst, "--report", tmp_path / "c.json"), run("verify", src, dst),
              run("inspect", src), run("inspect", src, "--json")):
        assert r.returncode == 0, r.stderr
        assert_terminal_safe(r.stdout + r.stderr)
    report = (tmp_path / "c.json").read_text()
    assert_terminal_safe(report.replace("\n", ""))
    source = json.loads(report)["provenance"]["source"]
    assert source.endswith(HOSTILE + "\\xff")  # the bytes as \xNN text, the characters as they are
    assert json.loads(run("inspect", src, "--json").stdout)["provenance"]["source"] == source


def test_a_hostile_tensor_name_in_an_error_is_escaped(tmp_path):
    ck = tmp_path / "ck"
    assert run("generate", ck, "--shards", "2", "--hidden", "64", "--intermediate", "64").returncode == 0
    shard = ck / "model-00001-of-00002.safetensors"
    raw = shard.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + n].decode()
    name = json.dumps(HOSTILE)  # JSON escapes: the header stays valid UTF-8 text
    entry = f'{name}:{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'
    header = "{" + entry + "," + entry + "," + header.lstrip()[1:]
    blob = header.encode()
    shard.write_bytes(len(blob).to_bytes(8, "little") + blob + raw[8 + n:])
    r = run("inspect", ck)
    assert r.returncode == 3, r.stderr
    assert_terminal_safe(r.stdout + r.stderr)
    assert HOSTILE_ESCAPED in r.stderr, r.stderr


def fake_python(path: Path, answer: dict) -> Path:
    path.write_text("#!/bin/sh\ncat >/dev/null\ncat <<'EOF'\n" + json.dumps(answer) + "\nEOF\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("field", ["reason", "version", "python"])
def test_a_runtime_probes_answer_is_escaped(converted, tmp_path, field):
    entry = {"runtime": "vllm", "version": "0.34.0", "outcome": "refused", "reason": "ValueError: unsupported"}
    answer = {"probe": 1, "python": "3.99", "runtimes": [entry]}
    if field == "python":
        answer["python"] = "3.99 " + HOSTILE
    else:
        entry[field] = entry[field] + " " + HOSTILE
    py = fake_python(tmp_path / "python", answer)
    text = run("gate", converted / "dst", "--runtime", "vllm", "--python", py)
    assert text.returncode == 1, text.stderr
    assert_terminal_safe(text.stdout + text.stderr)
    assert HOSTILE_ESCAPED in text.stdout, text.stdout
    js = run("gate", converted / "dst", "--runtime", "vllm", "--python", py, "--json")
    assert js.returncode == 1
    assert_terminal_safe(js.stdout.replace("\n", ""))
    doc = json.loads(js.stdout)["runtime_selectors"]
    said = doc["python_version"] if field == "python" else doc["runtimes"][0][field]
    assert said.endswith(HOSTILE)  # the same text to a JSON reader


def test_gate_json_keeps_paths_that_differ_in_bytes_apart(converted, tmp_path):
    seen = set()
    for raw in (b"\xff", b"\xfe", b"\xef\xbf\xbd"):  # the last is U+FFFD itself, valid UTF-8
        ck = Path(os.fsdecode(bytes(tmp_path) + b"/ck" + raw))
        os.symlink(converted / "dst", ck)
        r = run("gate", ck, "--json", "--ask-runtimes", "never", "--runtime", "vllm")
        assert r.returncode == 0, r.stderr
        checkpoint = json.loads(r.stdout)["checkpoint"]
        seen.add(checkpoint)
        if raw != b"\xef\xbf\xbd":
            assert checkpoint.endswith("/ck\\x" + raw.hex()), checkpoint
            assert "\ufffd" not in checkpoint
    assert len(seen) == 3


def test_the_command_lines_own_messages_are_escaped(tmp_path):
    for args in (["convert", "a", "b", "--window", "x\x1b]0;t\x07\u009b"], ["convert", "a", "b", "--bogus\u202e"],
                 ["verify", "a", "b", "--shards", "1\x1b/2"], ["gate", "x", "--runtime", "\u2066vllm"]):
        r = run(*args)
        assert r.returncode == 2, r
        assert_terminal_safe(r.stdout + r.stderr)


def test_the_html_report_escapes_too(tmp_path):
    src = hostile_path(tmp_path)
    assert run("generate", src, "--hidden", "64", "--intermediate", "64").returncode == 0
    r = run("inspect", src, "--html", tmp_path / "r.html")
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "r.html").read_bytes().decode("utf-8", "surrogateescape")
    assert_terminal_safe(page.replace("\n", "").replace("\t", ""))
    assert HOSTILE_ESCAPED.replace("&", "&amp;").replace("<", "&lt;") in page or "\\u009b" in page
