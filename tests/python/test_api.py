"""The typed API end to end, against the same library as the command line."""

from __future__ import annotations

import dataclasses
import json
import resource
import signal
import subprocess
import threading
from pathlib import Path

import pytest

import mx2nv
from conftest import K3_MODULE, fake_hf_cache, generate, no_temporaries


def test_version_matches_the_command(mx2nv_command: str) -> None:
    out = subprocess.run([mx2nv_command, "--version"], check=True, capture_output=True, text=True).stdout
    assert out.strip() == f"mx2nv {mx2nv.__version__}"


def test_convert_verify_inspect_the_demo(tmp_path: Path, demo_src: Path) -> None:
    dst = tmp_path / "nvfp4"
    report = mx2nv.convert(demo_src, dst, threads=2, report=tmp_path / "convert.json")
    assert isinstance(report, mx2nv.Report) and report.ok and report.command == "convert"
    assert (dst / "model.safetensors.index.json").is_file()
    assert report.counts.shards == 4 and report.counts.modules == 2 * 8 * 3
    assert report.target_tensor_bytes > report.source_tensor_bytes > 0
    assert report.provenance.source == str(demo_src.resolve()) and report.provenance.revision is None
    # The dataclass is the JSON report, field for field.
    assert report.to_dict() == json.loads((tmp_path / "convert.json").read_text())

    checked = mx2nv.verify(demo_src, dst, threads=2)
    assert checked.ok and checked.mismatches == 0 and checked.values_compared > 0
    assert checked.max_abs_error == 0

    plan = mx2nv.inspect(demo_src)
    assert isinstance(plan, mx2nv.Inspection) and plan.result == "ok"
    assert len(plan.modules) == report.counts.modules
    assert set(plan.outcomes) == {"marlin", "e4m3"}
    assert plan.target_tensor_bytes == report.target_tensor_bytes
    assert all(m.span <= 14 for m in plan.modules)


def test_copy_modes(tmp_path: Path, demo_src: Path) -> None:
    copied = mx2nv.convert(demo_src, tmp_path / "copied", copy="copy")
    assert copied.copy is not None and copied.copy.mode == "copy"
    assert copied.copy.copied_bytes > 0 and copied.copy.shared_bytes == 0
    auto = mx2nv.convert(demo_src, tmp_path / "auto")
    assert auto.copy is not None and auto.copy.mode == "auto"
    assert mx2nv.verify(demo_src, tmp_path / "copied").ok and mx2nv.verify(demo_src, tmp_path / "auto").ok
    with pytest.raises(mx2nv.UsageError):
        mx2nv.convert(demo_src, tmp_path / "x", copy="hardlink")


def test_report_fields_are_the_cli_report_fields(tmp_path: Path, demo_src: Path, mx2nv_command: str) -> None:
    cli_report = tmp_path / "cli.json"
    subprocess.run([mx2nv_command, "convert", str(demo_src), str(tmp_path / "cli"), "--report", str(cli_report)],
                   check=True, capture_output=True)
    api = mx2nv.convert(demo_src, tmp_path / "api").to_dict()
    cli = json.loads(cli_report.read_text())
    for volatile in ("seconds",):
        api.pop(volatile), cli.pop(volatile)
    api["provenance"].pop("target"), cli["provenance"].pop("target")
    assert api == cli
    inspected = subprocess.run([mx2nv_command, "inspect", str(demo_src), "--json"], check=True, capture_output=True,
                               text=True).stdout
    cli_inspection = json.loads(inspected)
    api_inspection = mx2nv.inspect(demo_src).to_dict()
    cli_inspection.pop("seconds"), api_inspection.pop("seconds")
    assert api_inspection == cli_inspection


def test_refused_carries_the_report_and_writes_nothing(tmp_path: Path) -> None:
    src = generate(tmp_path / "src", "--layers", "1", "--experts", "2", "--set-span", f"{K3_MODULE}=16")
    dst = tmp_path / "dst"
    with pytest.raises(mx2nv.RefusedError) as caught:
        mx2nv.convert(src, dst)
    e = caught.value
    assert e.exit_code == 1 and K3_MODULE in e.message
    assert e.report is not None and e.report.result == "refused"
    assert [o.module for o in e.report.over_span] == [K3_MODULE]
    assert e.report.over_span[0].span == 16 and e.report.over_span[0].limit == 14
    assert not dst.exists() or not any(dst.iterdir())
    # inspect reports the refusal without raising; e4m3 takes it.
    plan = mx2nv.inspect(src)
    assert plan.result == "refused" and plan.outcomes["e4m3"].result == "ok"
    assert mx2nv.convert(src, dst, window="e4m3").counts.marlin_zeroed_groups > 0
    # verify without window= takes the window DST records (e4m3); under marlin the groups it zeroes differ.
    assert mx2nv.verify(src, dst).window == "e4m3"
    with pytest.raises(mx2nv.MismatchError):
        mx2nv.verify(src, dst, window="marlin")
    with pytest.raises(mx2nv.UsageError):
        mx2nv.verify(src, dst, window="")


def test_overspan_choices(tmp_path: Path) -> None:
    """overspan= is --overspan: bf16 keeps the refused module's layer exact in
    BF16 (verify passes), requantize is lossy and says so, plan records it."""
    src = generate(tmp_path / "src", "--layers", "1", "--experts", "2", "--set-span", f"{K3_MODULE}=16")
    bf16 = mx2nv.convert(src, tmp_path / "bf16", overspan="bf16")
    assert bf16.ok and bf16.overspan["choice"] == "bf16" and not bf16.overspan["lossy"]
    assert K3_MODULE in bf16.overspan["bf16_layers"][0]["why"]
    assert mx2nv.verify(src, tmp_path / "bf16").ok
    lossy = mx2nv.convert(src, tmp_path / "rq", overspan="requantize")
    assert lossy.overspan["choice"] == "requantize" and lossy.overspan["lossy"] and lossy.requantized
    # In ModelOpt's layout, by ModelOpt's quantizer: the same modules, another
    # second-level scale (a multiplier), verified.
    mo = mx2nv.convert(src, tmp_path / "rq-mo", overspan="requantize", format="modelopt")
    assert mo.overspan["lossy"] and [r["module"] for r in mo.requantized] == [r["module"] for r in lossy.requantized]
    assert all(m["global_scale"] != r["global_scale"] for m, r in zip(mo.requantized, lossy.requantized))
    assert mx2nv.verify(src, tmp_path / "rq-mo").ok
    planned = mx2nv.plan(src, tmp_path / "planned", overspan="bf16")
    assert planned.plan is not None and json.loads(planned.plan.read_text())["overspan"] == "bf16"
    with pytest.raises(mx2nv.UsageError):
        mx2nv.convert(src, tmp_path / "x", overspan="round")


def test_format_modelopt(tmp_path: Path) -> None:
    """format= is --format: ModelOpt's W4A16_NVFP4 layout, verified; plan
    records it and a step follows it; names come from mx2nv.FORMATS."""
    assert mx2nv.FORMATS == ("compressed-tensors", "modelopt")
    src = generate(tmp_path / "src", "--layers", "1", "--experts", "2")
    dst = tmp_path / "mo"
    report = mx2nv.convert(src, dst, format="modelopt")
    assert report.ok and (dst / "hf_quant_config.json").is_file()
    assert json.loads((dst / "config.json").read_text())["quantization_config"]["quant_method"] == "modelopt"
    assert mx2nv.verify(src, dst).ok
    planned = mx2nv.plan(src, tmp_path / "planned", format="modelopt")
    assert planned.plan is not None and json.loads(planned.plan.read_text())["output_format"] == "modelopt"
    with pytest.raises(mx2nv.UsageError):
        mx2nv.convert(src, tmp_path / "x", format="ModelOpt")
    # --overspan requantize in ModelOpt's layout: ModelOpt's own quantizer for
    # the refused modules (none here: the output is the exact one).
    lossy = mx2nv.convert(src, tmp_path / "y", format="modelopt", overspan="requantize")
    assert lossy.ok and mx2nv.verify(src, tmp_path / "y").ok


def test_usage_errors(tmp_path: Path, demo_src: Path, demo_dst: Path) -> None:
    with pytest.raises(mx2nv.UsageError) as caught:  # DST not empty
        mx2nv.convert(demo_src, demo_dst)
    assert caught.value.exit_code == 2 and isinstance(caught.value, ValueError)
    assert caught.value.report is not None and caught.value.report.result == "error"
    assert caught.value.report.error == caught.value.message
    with pytest.raises(mx2nv.UsageError):
        mx2nv.convert(demo_src, demo_src / "inside")
    with pytest.raises(mx2nv.UsageError):
        mx2nv.convert(demo_src, tmp_path / "x", window="fp8")
    with pytest.raises(mx2nv.UsageError):
        mx2nv.verify(demo_src, demo_dst, threads=0)


def test_invalid_input(tmp_path: Path) -> None:
    src = generate(tmp_path / "src", "--layers", "1", "--experts", "2", "--nan-scale", K3_MODULE)
    with pytest.raises(mx2nv.InvalidInputError) as caught:
        mx2nv.convert(src, tmp_path / "dst")
    assert caught.value.exit_code == 3 and "NaN" in caught.value.message
    with pytest.raises(mx2nv.InvalidInputError):
        mx2nv.inspect(src)
    (tmp_path / "empty").mkdir()
    with pytest.raises(mx2nv.Mx2nvError) as missing:
        mx2nv.inspect(tmp_path / "empty")
    assert missing.value.exit_code in (3, 4)


def test_io_error_is_an_oserror(tmp_path: Path, demo_src: Path) -> None:
    # A file size limit makes every write past 64 KiB fail with EFBIG.
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))
    try:
        with pytest.raises(mx2nv.MxIOError) as caught:
            mx2nv.convert(demo_src, tmp_path / "dst", threads=1)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert caught.value.exit_code == 4 and isinstance(caught.value, OSError)
    assert no_temporaries(tmp_path / "dst") if (tmp_path / "dst").exists() else True


def test_verify_mismatch(tmp_path: Path, demo_src: Path, demo_dst: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(demo_dst, broken)
    shard = sorted(broken.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x11  # a packed or pass-through byte near the end
    shard.write_bytes(bytes(data))
    with pytest.raises(mx2nv.MismatchError) as caught:
        mx2nv.verify(demo_src, broken)
    e = caught.value
    assert isinstance(e, mx2nv.RefusedError) and e.exit_code == 1
    assert e.report is not None and e.report.result == "mismatch" and e.report.differences


def test_progress_callback(tmp_path: Path, demo_src: Path) -> None:
    updates: list[mx2nv.Progress] = []
    mx2nv.convert(demo_src, tmp_path / "dst", threads=2, progress=updates.append)
    phases = [u.phase for u in updates]
    assert phases[0] == "plan" and phases[-1] == "done"
    assert [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p] == ["plan", "shards", "finalize", "done"]
    shards = [u for u in updates if u.phase == "shards"]
    assert shards[-1].bytes_done == shards[-1].bytes_total > 0
    assert shards[-1].units_done == shards[-1].units_total == 4 and shards[-1].unit == "shards"
    assert [u.bytes_done for u in shards] == sorted(u.bytes_done for u in shards)

    checks: list[mx2nv.Progress] = []
    mx2nv.verify(demo_src, tmp_path / "dst", progress=checks.append)
    last = [u for u in checks if u.phase == "shards"][-1]
    assert last.unit == "modules" and last.units_done == last.units_total == 48
    assert last.bytes_done == last.bytes_total


def test_progress_true_uses_tqdm(tmp_path: Path, demo_src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    mx2nv.convert(demo_src, tmp_path / "dst", progress=True)
    err = capsys.readouterr().err
    assert "convert" in err and "B/s" in err  # tqdm's bar, labelled with the phase


def test_a_failing_callback_stops_the_run_cleanly(tmp_path: Path, demo_src: Path) -> None:
    class Stop(Exception):
        pass

    def callback(p: mx2nv.Progress) -> None:
        if p.phase == "shards":
            raise Stop

    # Big enough (8 shards, ~100 MB) that the run is still going when the
    # callback's exception reaches the library.
    src = generate(tmp_path / "src", "--layers", "2", "--experts", "16", "--hidden", "2048", "--intermediate",
                   "1024", "--shards", "8")
    dst = tmp_path / "dst"
    with pytest.raises(Stop):
        mx2nv.convert(src, dst, threads=1, copy="copy", progress=callback)
    assert not (dst / "model.safetensors.index.json").exists() and no_temporaries(dst)
    # The stop request does not outlive the run: the next command works, and
    # resume finishes the interrupted conversion.
    assert mx2nv.convert(src, dst, resume=True).ok
    assert mx2nv.verify(src, dst).ok


def test_gil_is_released(tmp_path: Path, demo_src: Path) -> None:
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1

    t = threading.Thread(target=count)
    t.start()
    try:
        mx2nv.verify(demo_src, mx2nv.convert(demo_src, tmp_path / "dst", threads=1).provenance.target or "")
    finally:
        done.set()
        t.join()
    assert ticks > 1000  # Python ran while the library worked


def test_convert_hub_from_a_local_cache(tmp_path: Path, demo_src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    commit = "0123456789abcdef0123456789abcdef01234567"
    cache = tmp_path / "hub"
    fake_hf_cache(cache, "acme/moe-mxfp4", demo_src, commit)
    report = mx2nv.convert_hub("acme/moe-mxfp4", revision="main", dst=tmp_path / "dst", cache_dir=cache,
                               local_files_only=True, threads=2)
    assert report.ok and report.provenance.revision == commit
    assert f"snapshots/{commit}" in report.provenance.source
    assert mx2nv.verify(demo_src, tmp_path / "dst").ok
    # A snapshot path works as `src` directly, and records its revision too.
    snapshot = mx2nv.resolve_hub_snapshot("acme/moe-mxfp4", cache_dir=cache, local_files_only=True)
    assert mx2nv.inspect(snapshot).provenance.revision == commit
    with pytest.raises(mx2nv.Mx2nvError):
        mx2nv.convert_hub("acme/not-cached", dst=tmp_path / "d2", cache_dir=cache, local_files_only=True)


def test_html_from_the_api(tmp_path: Path, demo_src: Path) -> None:
    page = tmp_path / "report.html"
    mx2nv.convert(demo_src, tmp_path / "dst", html=page)
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and 'class="heatmap"' in text
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text


def test_results_are_frozen_dataclasses(demo_src: Path) -> None:
    plan = mx2nv.inspect(demo_src)
    assert dataclasses.is_dataclass(plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.result = "x"  # type: ignore[misc]


def test_inspection_fields_are_the_cli_json_fields(demo_src: Path, mx2nv_command: str) -> None:
    cli = json.loads(subprocess.run([mx2nv_command, "inspect", str(demo_src), "--json"], check=True,
                                    capture_output=True, text=True).stdout)
    plan = mx2nv.inspect(demo_src)
    assert plan.moe_dims is not None and plan.moe_dims.experts == 8 and plan.tp_table
    mine = plan.to_dict()
    assert mine.pop("seconds") >= 0 and cli.pop("seconds") >= 0
    assert mine == cli
