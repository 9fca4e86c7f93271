"""The Python API's output paths and plan steps treated as hostile, like the
command line's (issue 20, part A): report and HTML paths are checked before
any work against the SRC and DST a call uses (a plan step's come from the
plan), the plan itself is never replaced, selections never wrap, and a
finished DST is left alone."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

import mx2nv
from conftest import generate

MAX = 2**64 - 1


def tree(root: Path) -> dict:
    if not root.exists():
        return {}
    return {p.relative_to(root): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "<dir>")
            for p in root.rglob("*")}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return generate(tmp_path / "src", "--shards", "4", "--layers", "2", "--experts", "2", "--hidden", "64",
                    "--intermediate", "64")


def test_plan_step_reports_are_checked_against_the_plans_src_and_dst(tmp_path: Path, src: Path) -> None:
    before = tree(src)
    dst = tmp_path / "dst"
    planned = mx2nv.plan(src, dst)
    state = tree(dst)
    os.symlink(src / "config.json", tmp_path / "link.json")
    targets = [src / "config.json", src / "new.json", dst / "config.json", dst / ".mx2nv" / "plan.json",
               dst / "new.json", tmp_path / "link.json"]
    for target in targets:
        for call in (lambda t: mx2nv.convert_shards(planned.plan, shards="0/1", report=t),
                     lambda t: mx2nv.convert_shards(planned.plan, shard=2, src=src, dst=dst, report=t),
                     lambda t: mx2nv.finalize(planned.plan, report=t),
                     lambda t: mx2nv.finalize(planned.plan, html=t)):
            with pytest.raises(mx2nv.UsageError) as refused:
                call(target)
            assert refused.value.exit_code == 2 and "internal error" not in refused.value.message
            assert tree(dst) == state and tree(src) == before
    mx2nv.convert_shards(planned.plan, shards="0/1", report=tmp_path / "step.json")
    assert json.loads((tmp_path / "step.json").read_text())["result"] == "ok"
    final = mx2nv.finalize(planned.plan, report=tmp_path / "final.json", html=tmp_path / "final.html")
    assert final.ok and (tmp_path / "final.html").read_text().startswith("<!DOCTYPE html>")
    finished = tree(dst)
    # The plan is gone with DST's state: DST is still known, and SRC is recognised.
    for target in targets[:3] + targets[4:]:
        with pytest.raises(mx2nv.UsageError):
            mx2nv.finalize(planned.plan, report=target)
    assert tree(dst) == finished and tree(src) == before


def test_the_plan_and_every_other_call_keep_their_outputs_out(tmp_path: Path, src: Path) -> None:
    before = tree(src)
    plan = tmp_path / "plan.json"
    planned = mx2nv.plan(src, tmp_path / "dst", plan_out=plan)
    text = plan.read_bytes()
    with pytest.raises(mx2nv.UsageError):
        mx2nv.convert_shards(planned.plan, shard=0, report=plan)
    with pytest.raises(mx2nv.UsageError):
        mx2nv.finalize(planned.plan, html=plan)
    with pytest.raises(mx2nv.UsageError):
        mx2nv.finalize(planned.plan, report=tmp_path / "same", html=tmp_path / "same")
    assert plan.read_bytes() == text and not (tmp_path / "dst").exists()
    for call in (lambda: mx2nv.convert(src, tmp_path / "x", report=src / "config.json"),
                 lambda: mx2nv.convert(src, tmp_path / "x", html=tmp_path / "x" / "page.html"),
                 lambda: mx2nv.inspect(src, html=src / "page.html"),
                 lambda: mx2nv.plan(src, tmp_path / "x", plan_out=src / "plan.json")):
        with pytest.raises(mx2nv.UsageError):
            call()
    assert not (tmp_path / "x").exists()
    mx2nv.convert(src, tmp_path / "ref")
    ref = tree(tmp_path / "ref")
    for call in (lambda: mx2nv.verify(src, tmp_path / "ref", report=tmp_path / "ref" / "config.json"),
                 lambda: mx2nv.verify(src, tmp_path / "ref", html=src / "v.html")):
        with pytest.raises(mx2nv.UsageError):
            call()
    assert tree(tmp_path / "ref") == ref and tree(src) == before
    # A damaged plan: its SRC is unknown, so no report is written.
    (tmp_path / "half.json").write_bytes(text[: len(text) // 2])
    with pytest.raises(mx2nv.InvalidInputError):
        mx2nv.convert_shards(tmp_path / "half.json", shard=0, report=tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("i,n", [(0, MAX), (1, MAX), (MAX - 1, MAX), (3, 2**63), (2, 2**32 + 1)])
def test_selections_near_two_to_the_64_never_wrap(tmp_path: Path, src: Path, i: int, n: int) -> None:
    plan = tmp_path / "plan.json"
    mx2nv.plan(src, tmp_path / "planned", plan_out=plan)
    dst = tmp_path / "dst"
    report = mx2nv.convert_shards(plan, shards=f"{i}/{n}", src=src, dst=dst)
    expected = {f"model-{s + 1:05}-of-00004.safetensors" for s in range(i, 4, n)}
    assert report.counts.shards == len(expected)
    assert ({p.name for p in dst.glob("*.safetensors")} if dst.exists() else set()) == expected


def test_retries_after_the_end_leave_the_finished_dst_alone(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "dst"
    planned = mx2nv.plan(src, dst)
    mx2nv.convert_shards(planned.plan, shards="0/1")
    mx2nv.finalize(planned.plan)
    finished = tree(dst)
    assert mx2nv.convert_shards(planned.plan, shards="0/1").already_complete
    assert mx2nv.convert_shards(planned.plan, shard=3, src=src, dst=dst).already_complete
    assert mx2nv.finalize(planned.plan).already_complete
    assert tree(dst) == finished
    other = tmp_path / "other"
    shutil.copytree(src, other)
    os.utime(other / "model-00001-of-00004.safetensors", ns=(1, 1))
    with pytest.raises(mx2nv.UsageError):
        mx2nv.finalize(planned.plan, src=other)
    assert tree(dst) == finished
