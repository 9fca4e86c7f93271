"""mx2nv.plan / convert_shards / finalize: `mx2nv plan`, `convert --plan P
--shard I | --shards I/N` and `--finalize` in process, against the command
line's bytes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import mx2nv
from conftest import K3_MODULE, generate, no_temporaries


def files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def five_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("plan") / "src", "--shards", "5", "--layers", "3", "--experts", "2",
                    "--hidden", "64", "--intermediate", "64")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, five_shards: Path) -> Path:
    dst = tmp_path_factory.mktemp("plan-ref") / "dst"
    mx2nv.convert(five_shards, dst)
    return dst


def test_shards_in_any_order_then_finalize_give_convert_bytes(tmp_path: Path, five_shards: Path,
                                                             reference: Path) -> None:
    dst = tmp_path / "dst"
    planned = mx2nv.plan(five_shards, dst)
    assert planned.report.command == "plan" and planned.report.ok
    assert planned.plan == dst / ".mx2nv" / "plan.json" and planned.plan.is_file() and planned.shards == 5
    updates = []
    for i in (3, 0, 4):
        r = mx2nv.convert_shards(planned.plan, shard=i, progress=updates.append)
        assert r.ok and r.counts.shards == 1
    assert {u.unit for u in updates} == {"shards"}
    assert updates[-1].phase == "done" and updates[-1].bytes_done == updates[-1].bytes_total > 0
    # Finalize refuses while shards 1 and 2 are missing, naming them.
    with pytest.raises(mx2nv.UsageError) as missing:
        mx2nv.finalize(planned.plan)
    assert "--shard 1" in missing.value.message and "--shard 2" in missing.value.message
    assert missing.value.exit_code == 2 and missing.value.report.result == "error"
    assert not (dst / "model.safetensors.index.json").exists()
    r = mx2nv.convert_shards(planned.plan, shards="1/3")  # shards 1 and 4 (4 is done: skipped)
    assert r.ok and r.counts.resumed_shards == 1
    mx2nv.convert_shards(planned.plan, shard=2)
    mx2nv.convert_shards(planned.plan, shard=2)  # again: its record matches, nothing changes
    final = mx2nv.finalize(planned.plan)
    assert final.ok and final.command == "convert"
    assert files(dst) == files(reference) and no_temporaries(dst)
    # Every step again: already complete.
    again = mx2nv.plan(five_shards, dst)
    assert again.plan is None and again.report.ok  # DST holds this conversion: nothing to plan
    assert mx2nv.finalize(planned.plan, src=five_shards, dst=dst).already_complete
    assert files(dst) == files(reference)


def test_the_command_line_continues_what_the_api_started(tmp_path: Path, five_shards: Path, reference: Path,
                                                         mx2nv_command: str) -> None:
    dst = tmp_path / "dst"
    planned = mx2nv.plan(five_shards, dst)
    mx2nv.convert_shards(planned.plan, shards="0/2")
    subprocess.run([mx2nv_command, "convert", "--plan", str(planned.plan), "--shards", "1/2"], check=True,
                   capture_output=True)
    subprocess.run([mx2nv_command, "convert", "--plan", str(planned.plan), "--finalize"], check=True,
                   capture_output=True)
    assert files(dst) == files(reference)


def test_plan_errors(tmp_path: Path, five_shards: Path) -> None:
    refusing = generate(tmp_path / "refusing", "--layers", "1", "--experts", "2", "--set-span", f"{K3_MODULE}=20")
    with pytest.raises(mx2nv.RefusedError) as refused:
        mx2nv.plan(refusing, tmp_path / "nothing")
    assert refused.value.report.over_span[0].module == K3_MODULE
    assert not (tmp_path / "nothing").exists() or not any((tmp_path / "nothing").iterdir())
    with pytest.raises(mx2nv.UsageError):
        mx2nv.convert_shards(tmp_path / "no-plan.json", shard=0)
    planned = mx2nv.plan(five_shards, tmp_path / "dst")
    with pytest.raises(mx2nv.UsageError):
        mx2nv.convert_shards(planned.plan, shard=5)  # the plan has shards 0 to 4
    with pytest.raises(mx2nv.UsageError):
        mx2nv.convert_shards(planned.plan, shard=0, shards="0/2")
    with pytest.raises(mx2nv.UsageError):
        mx2nv.convert_shards(planned.plan, shards="2/2")
    # A damaged plan is invalid input.
    text = planned.plan.read_text()
    planned.plan.write_text(text.replace('"window"', '"windoww"', 1))
    with pytest.raises(mx2nv.InvalidInputError):
        mx2nv.convert_shards(planned.plan, shard=0)


def test_the_stub_types_the_plan_steps() -> None:
    stub = (Path(mx2nv.__file__).parent / "_core.pyi").read_text()
    for name in ("plan", "convert_shards", "finalize", "convert", "verify", "inspect"):
        assert f"def {name}(" in stub
