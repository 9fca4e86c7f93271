"""`mx2nv verify --merge` with hostile parts and report paths (issue 20).

The parts of a split verify are input, not trusted state. Whatever a part
says, the merge answers with the documented exit code (3: a part that is not
a verify report on its own, naming the part and the key; 2: parts that do not
make one whole, or a wrong invocation) and a message, never "internal error",
never a signal or a hang, in bounded memory; it prints ok only when every part
is ok and the set is complete; and it never writes into the SRC and DST the
parts name, nor over a part.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]
MX2NV = Path(os.environ.get("MX2NV", REPO / "build" / "mx2nv")).absolute()
# Under AddressSanitizer the shadow memory counts too.
RSS_LIMIT_KIB = (1536 if "ASAN_OPTIONS" in os.environ else 400) * 1024
TIMEOUT_S = 60
WIDE = "language_model.model.layers.1.block_sparse_moe.experts.2.w2"


@dataclass
class Run:
    code: int
    out: str
    err: str
    rss_kib: int


# mx2nv is started by a small launcher that reports its peak RSS (wait4): a
# child forked straight from this test process would count this process's own
# RSS (hundreds of MB once the conformance suite has imported torch), since
# the kernel records the pre-exec high-water mark too.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
os.write(int(sys.argv[1]), f"{status} {usage.ru_maxrss}".encode())
"""


def run(*args, cwd=None) -> Run:
    """One mx2nv run: exit code, output, and its own peak RSS."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        report_r, report_w = os.pipe()
        p = subprocess.Popen([sys.executable, "-I", "-c", LAUNCHER, str(report_w), os.fsencode(MX2NV),
                              *[os.fsencode(a) for a in args]],
                             stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True,
                             pass_fds=(report_w,))
        os.close(report_w)
        timer = threading.Timer(TIMEOUT_S, lambda: os.killpg(p.pid, 9))
        timer.start()
        try:
            p.wait()
        finally:
            timer.cancel()
        with os.fdopen(report_r, "rb") as f:
            said = f.read().split()
        # A launcher killed at the timeout said nothing: report a SIGKILL.
        status, rss = (int(x) for x in said) if said else (9, 0)
        out.seek(0)
        err.seek(0)
        return Run(os.waitstatus_to_exitcode(status), out.read().decode("utf-8", "surrogateescape"),
                   err.read().decode("utf-8", "surrogateescape"), rss)


def tree(root: Path) -> dict:
    """Every file below root (relative name -> content hash), links as links."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            rel = os.fsdecode(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


@dataclass
class World:
    root: Path
    src: Path
    dst: Path
    parts: list[Path]
    whole: dict

    def part(self, i: int) -> dict:
        return json.loads(self.parts[i].read_text())

    @property
    def lossy(self) -> int:
        """A part that lists requantized modules (so every key is there)."""
        return next(i for i in range(3) if self.part(i).get("requantized"))

    def state(self) -> tuple:
        return tree(self.src), tree(self.dst), [p.read_bytes() for p in self.parts]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    """SRC with one module over the window, converted with --overspan
    requantize (so parts carry requantized rows), verified in 3 parts."""
    root = tmp_path_factory.mktemp("merge")
    src, dst = root / "src", root / "dst"
    r = run("generate", src, "--shards", "3", "--layers", "2", "--experts", "3", "--hidden", "128",
            "--intermediate", "64", "--set-span", f"{WIDE}=30")
    assert r.code == 0, r.err
    assert run("convert", src, dst, "--overspan", "requantize").code == 0
    parts = []
    for i in range(3):
        p = root / f"part{i}.json"
        r = run("verify", src, dst, "--shards", f"{i}/3", "--report", p)
        assert r.code == 0, r.err
        parts.append(p)
    assert run("verify", src, dst, "--report", root / "whole.json").code == 0
    return World(root, src, dst, parts, json.loads((root / "whole.json").read_text()))


def hostile(world: World, tmp_path: Path, edits: dict[int, dict] | None = None, raw: dict[int, bytes] | None = None):
    """The three parts as files in tmp_path, part i replaced by edits[i] (a
    JSON value) or raw[i] (bytes)."""
    paths = []
    for i in range(3):
        p = tmp_path / f"p{i}.json"
        if raw and i in raw:
            p.write_bytes(raw[i])
        elif edits and i in edits:
            p.write_text(json.dumps(edits[i]))
        else:
            shutil.copy(world.parts[i], p)
        paths.append(p)
    return paths


def check_refused(world: World, r: Run, code: int, *pieces: str) -> None:
    assert r.code == code, (r.code, r.out, r.err)
    assert "internal error" not in r.err
    assert "merged" not in r.out  # no summary, above all no "ok"
    assert r.rss_kib < RSS_LIMIT_KIB, r.rss_kib
    for piece in pieces:
        assert piece in r.err, (piece, r.err)


def set_at(j: dict, path: list, value) -> dict:
    j = copy.deepcopy(j)
    node = j
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return j


def leaves(j, path=()):
    """(path, dotted name as the merge's messages write it) of every value."""
    if isinstance(j, dict):
        for k, v in j.items():
            yield from leaves(v, path + (k,))
    elif isinstance(j, list):
        for i, v in enumerate(j):
            yield from leaves(v, path + (i,))
    if path:
        name = ""
        for k in path:
            name += f"[{k}]" if isinstance(k, int) else (("." if name else "") + k)
        yield list(path), name


def kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return type(v).__name__


# --- the set as verify wrote it -------------------------------------------------------------------

def test_the_parts_merge_into_the_whole_report(world, tmp_path):
    r = run("verify", "--merge", *reversed(world.parts), "--report", tmp_path / "merged.json")
    assert r.code == 0, r.err
    assert "merged 3 parts: ok, LOSSY modules equal the documented requantization" in r.out
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged.pop("merged_parts") == 3
    whole = dict(world.whole)
    for report in (merged, whole):
        report.pop("seconds")
    assert merged == whole


# --- every key, every wrong type ------------------------------------------------------------------

# Figures verify writes as null where it did not compute them (a part whose
# DST did not open, verify's resumed_shards): null is their other type.
NULLABLE = {f"counts.{k}" for k in ("resumed_shards", "active_groups", "zero_groups", "canonicalised_zero_groups",
                                    "marlin_zeroed_groups", "raised_globals", "passthrough_tensors",
                                    "global_conflicts")} | {
    "source_tensor_bytes", "target_tensor_bytes", "size_change_percent"}


def test_a_wrong_type_for_any_key_is_exit_3_naming_part_and_key(world, tmp_path):
    i = world.lossy
    base = world.part(i)
    failures = []
    tried = 0
    for path, name in leaves(base):
        original = base
        for k in path:
            original = original[k]
        for value in (None, True, 7, "x", [], {}):
            if kind(value) == kind(original) or (name == "provenance.revision" and isinstance(value, str)):
                continue
            if value is None and name in NULLABLE:
                continue
            paths = hostile(world, tmp_path, {i: set_at(base, path, value)})
            r = run("verify", "--merge", *paths)
            tried += 1
            if (r.code != 3 or "internal error" in r.err or str(paths[i]) not in r.err or f'"{name}"' not in r.err
                    or r.rss_kib > RSS_LIMIT_KIB or "merged" in r.out):
                failures.append((name, value, r.code, r.err))
    assert tried > 200
    assert not failures, failures[:10]


def test_type_errors_name_the_key(world, tmp_path):
    i = world.lossy
    base = world.part(i)
    cases = {
        ("counts", "active_groups"): "counts.active_groups",
        ("values_compared",): "values_compared",
        ("provenance", "source"): "provenance.source",
        ("overspan", "lossy"): "overspan.lossy",
        ("requantized", 0, "cosine"): "requantized[0].cosine",
        ("requantized", 0, "module"): "requantized[0].module",
        ("differences",): "differences",
        ("shard_subset",): "shard_subset",
        ("exit_code",): "exit_code",
        ("result",): "result",
    }
    for path, name in cases.items():
        for value in (None, {}, [1], "7"):
            if name in ("provenance.source", "requantized[0].module", "shard_subset", "result") and value == "7":
                continue
            if value is None and name in NULLABLE:
                continue
            paths = hostile(world, tmp_path, {i: set_at(base, list(path), value)})
            r = run("verify", "--merge", *paths)
            check_refused(world, r, 3, f'"{name}', str(paths[i]))


def test_missing_and_unknown_keys_are_exit_3(world, tmp_path):
    base = world.part(2)
    for key in ("result", "counts", "provenance", "values_compared", "exit_code", "differences", "window"):
        j = copy.deepcopy(base)
        del j[key]
        r = run("verify", "--merge", *hostile(world, tmp_path, {2: j}))
        check_refused(world, r, 3, f'"{key}" is missing')
    for where in ([], ["counts"], ["provenance"], ["overspan"]):
        j = copy.deepcopy(base)
        node = j
        for k in where:
            node = node[k]
        node["injected"] = 1
        r = run("verify", "--merge", *hostile(world, tmp_path, {2: j}))
        check_refused(world, r, 3, "injected\" is not a key")


# --- numbers out of range, written as text ---------------------------------------------------------

@pytest.mark.parametrize("key,text", [
    ("values_compared", "-1"), ("values_compared", "18446744073709551616"), ("values_compared", "1e999"),
    ("mismatches", "-9223372036854775808"), ("max_abs_error", "NaN"), ("max_abs_error", "Infinity"),
    ("max_abs_error", "-1e999"), ("max_abs_error", '"nan"'), ("max_abs_error", "-0.5"), ("seconds", "1e400"),
    ("exit_code", "18446744073709551615"), ("size_change_percent", "1e309"), ("shard_subset", '"0/18446744073709551615"'),
    ("shard_subset", '"18446744073709551614/18446744073709551615"'), ("shard_subset", '"0/100001"'),
    ("shard_subset", '"3/3"'), ("shard_subset", '"0/0"'), ("shard_subset", '"01/3"'), ("shard_subset", '"1"'),
    ("shard_subset", '"-1/3"'), ("shard_subset", '" 1/3"'),
])
def test_numbers_out_of_range_are_exit_3(world, tmp_path, key, text):
    j = world.part(1)
    j[key] = "@@value@@"
    raw = json.dumps(j).replace('"@@value@@"', text).encode()
    r = run("verify", "--merge", *hostile(world, tmp_path, raw={1: raw}))
    check_refused(world, r, 3)


def test_a_huge_n_lists_a_bounded_number_of_missing_parts(world, tmp_path):
    j = set_at(world.part(0), ["shard_subset"], "7/100000")
    r = run("verify", "--merge", *hostile(world, tmp_path, {0: j})[:1])
    check_refused(world, r, 2, "99999 of 100000 parts missing: 0/100000, 1/100000", "and 99989 more")
    assert len(r.err) < 1000


def test_counts_that_overflow_when_added_are_exit_3(world, tmp_path):
    big = 2**64 - 1
    edits = {i: set_at(world.part(i), ["counts", "zero_groups"], big) for i in (0, 2)}
    r = run("verify", "--merge", *hostile(world, tmp_path, edits))
    check_refused(world, r, 3, "counts.zero_groups", "2^64")
    edits = {i: set_at(world.part(i), ["values_compared"], big) for i in (0, 1)}
    r = run("verify", "--merge", *hostile(world, tmp_path, edits))
    check_refused(world, r, 3, "values_compared", "2^64")


# --- parts that contradict themselves --------------------------------------------------------------

def contradictions(part: dict) -> dict[str, dict]:
    def edit(**changes):
        j = copy.deepcopy(part)
        for k, v in changes.items():
            j[k] = v
        return j

    cases = {
        "ok with mismatches": edit(mismatches=4, max_abs_error=0.5),
        "ok with differences": edit(differences=["a difference"]),
        "ok with an error": edit(error="boom", error_kind="usage"),
        "ok exit 1": edit(exit_code=1),
        "mismatch exit 0": edit(result="mismatch", differences=["a difference"]),
        "mismatch of nothing": edit(result="mismatch", exit_code=1),
        "error exit 0": edit(result="error", error="boom", error_kind="I/O error"),
        "error without message": edit(result="error", error_kind="I/O error", exit_code=4),
        "error of the wrong code": edit(result="error", error="boom", error_kind="invalid input", exit_code=2),
        "refused": edit(result="refused", exit_code=1),
        "more mismatches than values": edit(result="mismatch", exit_code=1, mismatches=part["values_compared"] + 1,
                                            max_abs_error=1.0, differences=["x"]),
        "mismatches without an error": edit(result="mismatch", exit_code=1, mismatches=2, differences=["x"]),
        "error without mismatches": edit(result="mismatch", exit_code=1, max_abs_error="inf", differences=["x"]),
        "merged part": edit(merged_parts=3),
        "a module listed twice": edit(requantized=part["requantized"] * 2),
    }
    overspan = copy.deepcopy(part["overspan"])
    overspan["requantized_marlin_zeroed_blocks"] += 1
    cases["zeroed blocks that do not add up"] = edit(overspan=overspan)
    overspan = copy.deepcopy(part["overspan"])
    overspan["lossy"] = not overspan["lossy"]
    cases["lossy that does not match"] = edit(overspan=overspan)
    cases["over the differences cap"] = edit(result="mismatch", exit_code=1, differences=[f"d{k}" for k in range(202)])
    return cases


def test_self_contradictory_parts_are_exit_3(world, tmp_path):
    index = world.lossy
    for what, j in contradictions(world.part(index)).items():
        r = run("verify", "--merge", *hostile(world, tmp_path, {index: j}))
        assert r.code == 3, (what, r.err)
        check_refused(world, r, 3, f"p{index}.json")


def test_a_requantized_module_in_two_parts_is_exit_3(world, tmp_path):
    rows = {i: world.part(i).get("requantized", []) for i in range(3)}
    donor = next(i for i in rows if rows[i])
    other = next(i for i in range(3) if i != donor)
    j = world.part(other)
    j["requantized"] = j.get("requantized", []) + rows[donor]
    j["overspan"]["lossy"] = True
    j["overspan"]["requantized_marlin_zeroed_blocks"] = sum(r["marlin_zeroed_blocks"] for r in j["requantized"])
    r = run("verify", "--merge", *hostile(world, tmp_path, {other: j}))
    check_refused(world, r, 3, "is also listed by")


# --- files that are not parts -----------------------------------------------------------------------

def test_files_that_are_not_reports(world, tmp_path):
    nul = b"\0"
    cases = {
        "empty": b"",
        "garbage": bytes(range(256)) * 4,
        "not utf-8": b'{"command": "verify\xff"}',
        "bom": b"\xef\xbb\xbf" + world.parts[0].read_bytes(),
        "nul": world.parts[0].read_bytes() + nul,
        "deep": b"[" * 100000 + b"]" * 100000,
        "array": b"[]",
        "duplicate key": b'{"command": "verify", "command": "verify"}',
        "convert report": json.dumps(dict(world.part(0), command="convert")).encode(),
        "too many values": b'{"pad": [' + b"0," * 1_200_000 + b"0]}",
        "too large": b" " * (33 << 20),
    }
    for what, data in cases.items():
        r = run("verify", "--merge", *hostile(world, tmp_path, raw={0: data}))
        check_refused(world, r, 3)
        assert "p0.json" in r.err, (what, r.err)


def test_special_files_do_not_hang(world, tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    r = run("verify", "--merge", world.parts[0], fifo, world.parts[2])
    check_refused(world, r, 3, "not a regular file")
    r = run("verify", "--merge", world.parts[0], "/dev/zero", world.parts[2])
    check_refused(world, r, 3, "not a regular file")
    r = run("verify", "--merge", world.parts[0], tmp_path, world.parts[2])
    check_refused(world, r, 2, "is a directory")
    r = run("verify", "--merge", world.parts[0], tmp_path / "absent.json", world.parts[2])
    check_refused(world, r, 2, "no such file")


def test_the_same_part_twice_is_exit_2(world, tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(world.parts[1])
    hard = tmp_path / "hard.json"
    os.link(world.parts[1], hard)
    copy_ = tmp_path / "copy.json"
    shutil.copy(world.parts[1], copy_)
    for second in (world.parts[1], link, hard, Path(os.path.relpath(world.parts[1])), copy_):
        r = run("verify", "--merge", *world.parts, second)
        check_refused(world, r, 2)
        assert "given twice" in r.err or "same file" in r.err, r.err


# --- sets that are not one whole ---------------------------------------------------------------------

def test_missing_parts_are_exit_2(world):
    r = run("verify", "--merge", world.parts[0], world.parts[2])
    check_refused(world, r, 2, "1 of 3 parts missing: 1/3")


def test_parts_of_other_conversions_are_exit_2(world, tmp_path):
    # Another DST of the same SRC, verified in parts too.
    other = tmp_path / "other-dst"
    assert run("convert", world.src, other, "--overspan", "requantize").code == 0
    p = tmp_path / "other-1.json"
    assert run("verify", world.src, other, "--shards", "1/3", "--report", p).code == 0
    r = run("verify", "--merge", world.parts[0], p, world.parts[2])
    check_refused(world, r, 2, "provenance.target")
    # Another split, another window, another mx2nv, SRC changed between parts.
    for path, value, piece in ((["shard_subset"], "1/4", "splits the shards"), (["window"], "e4m3", "window"),
                               (["provenance", "tool_version"], "0.0.9", "mx2nv 0.0.9"),
                               (["counts", "modules"], 19, "counts.modules"),
                               (["source_tensor_bytes"], 1, "source_tensor_bytes"),
                               (["overspan", "choice"], "bf16", "")):
        j = set_at(world.part(1), path, value)
        if path == ["overspan", "choice"]:  # no requantized rows under bf16: whole on its own
            j.pop("requantized", None)
            j["overspan"].update(lossy=False, requantized_marlin_zeroed_blocks=0)
        if path == ["source_tensor_bytes"]:  # the size change follows the sizes: whole on its own
            j["size_change_percent"] = round(100 * (j["target_tensor_bytes"] - value) / value, 4)
        r = run("verify", "--merge", *hostile(world, tmp_path, {1: j}))
        check_refused(world, r, 2, piece)


# --- errors and mismatches in parts --------------------------------------------------------------------

def test_a_failed_part_makes_the_whole_an_error(world, tmp_path):
    # A real failed part: verify --shards whose SRC config is broken. Its error
    # report still names its part, so it merges (into an error).
    broken = tmp_path / "src"
    shutil.copytree(world.src, broken)
    (broken / "config.json").write_text("{")
    failed = tmp_path / "failed.json"
    r = run("verify", broken, world.dst, "--shards", "1/3", "--report", failed)
    assert r.code == 3
    report = json.loads(failed.read_text())
    assert report["shard_subset"] == "1/3" and report["result"] == "error"
    # The same paths as the others, as a failed part on the real SRC would have.
    report["provenance"] = world.part(0)["provenance"]
    failed.write_text(json.dumps(report))
    r = run("verify", "--merge", world.parts[0], failed, world.parts[2], "--report", tmp_path / "m.json")
    assert r.code == 3, r.err
    assert "merged 3 parts: ERROR" in r.out and "ok" not in r.out.split(":", 1)[1]
    assert "a part failed: invalid input" in r.err
    assert json.loads((tmp_path / "m.json").read_text())["result"] == "error"


def test_a_mismatch_anywhere_is_a_mismatch_and_its_text_is_escaped(world, tmp_path):
    j = world.part(2)
    j.update(result="mismatch", exit_code=1, mismatches=1, max_abs_error=0.5,
             differences=["\x1b]0;pwned\x07 tensor \u009b31m\u202eevil\u2066 row 0"])
    r = run("verify", "--merge", *hostile(world, tmp_path, {2: j}), "--report", tmp_path / "m.json")
    assert r.code == 1, r.err
    assert "MISMATCH" in r.out
    for raw in ("\x1b", "\x07", "\u009b", "\u202e", "\u2066"):
        assert raw not in r.out + r.err
    assert "\\x1b]0;pwned\\x07 tensor \\u009b31m\\u202eevil\\u2066 row 0" in r.err
    report = (tmp_path / "m.json").read_text()
    assert "\u009b" not in report and "\\u009b" in report
    assert json.loads(report)["differences"] == j["differences"]


# --- where the report may go ---------------------------------------------------------------------------

def test_the_report_never_goes_into_src_dst_or_over_a_part(world, tmp_path):
    before = world.state()
    into_src = tmp_path / "into-src"
    into_src.symlink_to(world.src)
    link_to_part = tmp_path / "link-to-part.json"
    link_to_part.symlink_to(world.parts[2])
    targets = [world.src / "config.json", world.dst / "config.json", world.src / "new.json",
               world.dst / ".mx2nv-report.json", world.dst / "model.safetensors.index.json", into_src / "config.json",
               world.src, world.parts[0], link_to_part]
    for target in targets:
        r = run("verify", "--merge", *world.parts, "--report", target)
        check_refused(world, r, 2)
        assert world.state() == before, target
    # Relative to a working directory inside SRC.
    r = run("verify", "--merge", *world.parts, "--report", "config.json", cwd=world.src)
    check_refused(world, r, 2, "inside")
    assert world.state() == before


def test_a_failed_merge_writes_its_error_report_only_where_it_may(world, tmp_path):
    before = world.state()
    # Parts missing: the report names the error, outside SRC and DST.
    report = tmp_path / "failed.json"
    r = run("verify", "--merge", world.parts[0], world.parts[1], "--report", report)
    assert r.code == 2
    written = json.loads(report.read_text())
    assert written["result"] == "error" and written["exit_code"] == 2
    assert written["provenance"]["source"] == world.whole["provenance"]["source"]
    # ... and never into SRC.
    r = run("verify", "--merge", world.parts[0], world.parts[1], "--report", world.src / "config.json")
    assert r.code == 2 and "no report written" in r.err
    # A malformed part: SRC is not known from every part, so nothing is written anywhere.
    paths = hostile(world, tmp_path, raw={1: b"{"})
    r = run("verify", "--merge", *paths, "--report", world.src / "config.json")
    assert r.code == 3 and "no report written" in r.err
    r = run("verify", "--merge", *paths, "--report", tmp_path / "nowhere.json")
    assert r.code == 3 and not (tmp_path / "nowhere.json").exists()
    assert world.state() == before


def test_a_non_utf8_src_is_protected_too(tmp_path):
    src, dst = Path(os.fsdecode(bytes(tmp_path) + b"/src\xff\x1b")), tmp_path / "dst"
    assert run("generate", src, "--shards", "2", "--layers", "1", "--experts", "2", "--hidden", "64",
               "--intermediate", "64").code == 0
    assert run("convert", src, dst).code == 0
    parts = [tmp_path / f"p{i}.json" for i in range(2)]
    for i, p in enumerate(parts):
        assert run("verify", src, dst, "--shards", f"{i}/2", "--report", p).code == 0
    assert "\\xff\\u001b" in parts[0].read_text()  # \xNN in the JSON string, then JSON's own escape
    before = tree(src)
    r = run("verify", "--merge", *parts, "--report", src / "config.json")
    check_refused(None, r, 2, "inside")
    assert tree(src) == before
    r = run("verify", "--merge", *parts)
    assert r.code == 0 and "\x1b" not in r.out + r.err


def test_options_the_merge_cannot_use_are_exit_2(world, tmp_path):
    for extra in (["--html", tmp_path / "x.html"], ["--window", "e4m3"], ["--threads", "2"], ["--progress", "json"],
                  ["--shards", "0/3"], [world.src, world.dst]):
        r = run("verify", *extra, "--merge", *world.parts)
        check_refused(world, r, 2)
    assert not (tmp_path / "x.html").exists()
    r = run("verify", "--merge")
    check_refused(world, r, 2)


# --- where SRC and DST resolved when verified -----------------------------------------------------

def test_parts_record_where_src_and_dst_resolved_and_the_merge_protects_that_too(tmp_path):
    """verify --shards given SRC through a symlink; the link re-pointed before
    the merge. The merge's report must still stay out of the real SRC."""
    src, dst, elsewhere = tmp_path / "src", tmp_path / "dst", tmp_path / "elsewhere"
    assert run("generate", src, "--shards", "2", "--layers", "1", "--experts", "2", "--hidden", "64",
               "--intermediate", "64").code == 0
    assert run("convert", src, dst).code == 0
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(src)
    parts = [tmp_path / f"p{i}.json" for i in range(2)]
    for i, p in enumerate(parts):
        assert run("verify", link, dst, "--shards", f"{i}/2", "--report", p).code == 0
        j = json.loads(p.read_text())
        assert j["provenance"]["source"] == str(link)
        assert j["resolved"] == {"source": str(src), "target": str(dst)}
    before = tree(src)
    link.unlink()
    link.symlink_to(elsewhere)
    for target in (src / "config.json", src / "new.json", f"/proc/self/root{src}/config.json"):
        r = run("verify", "--merge", *parts, "--report", target)
        check_refused(None, r, 2, "inside")
        assert tree(src) == before
    # A failed merge's error report is kept out of it the same way.
    r = run("verify", "--merge", parts[0], "--report", src / "config.json")
    assert r.code == 2 and "no report written" in r.err
    assert tree(src) == before


def test_a_part_without_where_it_resolved_or_a_whole_report_with_it_is_exit_3(world, tmp_path):
    j = world.part(1)
    del j["resolved"]
    check_refused(world, run("verify", "--merge", *hostile(world, tmp_path, {1: j})), 3, '"resolved" is missing')
    j = world.part(1)
    j["resolved"]["source"] = "relative/src"
    check_refused(world, run("verify", "--merge", *hostile(world, tmp_path, {1: j})), 3, "resolved.source")
    whole = json.loads((world.root / "whole.json").read_text())
    whole["resolved"] = world.part(0)["resolved"]
    (tmp_path / "whole.json").write_text(json.dumps(whole))
    check_refused(world, run("verify", "--merge", tmp_path / "whole.json"), 3, "resolved")


def test_the_merges_report_path_is_judged_after_resolution(world, tmp_path):
    before = world.state()
    os.link(world.src / "config.json", tmp_path / "hard-link")
    fd = os.open(world.dst / "config.json", os.O_WRONLY | os.O_APPEND)
    try:
        for target in (f"/proc/self/root{world.src}/config.json", f"/proc/self/root{world.dst}/new.json",
                       tmp_path / "hard-link", f"/dev/fd/{fd}", f"/proc/self/root{world.parts[0]}"):
            argv = [os.fsencode(str(MX2NV)), b"verify", b"--merge", *[os.fsencode(str(p)) for p in world.parts],
                    b"--report", os.fsencode(str(target))]
            r = subprocess.run(argv, pass_fds=(fd,), capture_output=True, timeout=60)
            assert r.returncode == 2, (target, r.stderr)
            assert b"internal error" not in r.stderr
    finally:
        os.close(fd)
    assert world.state() == before
