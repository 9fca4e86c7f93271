"""mx2nv.distributed on a local Ray cluster (ray.init with 2 CPUs): one task
per shard running the library in its worker, finalize on the driver; the
output is byte-identical to a one-process convert, also when a Ray worker is
killed in the middle of a shard."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is in tests/python/requirements.txt; this venv lacks it")

import mx2nv  # noqa: E402
import mx2nv.distributed  # noqa: E402
from conftest import generate, no_temporaries  # noqa: E402


def files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_one_task_per_shard_gives_the_single_process_bytes(cluster, tmp_path: Path) -> None:
    src = generate(tmp_path / "src", "--shards", "6", "--layers", "3", "--experts", "2", "--hidden", "64",
                   "--intermediate", "64")
    reference = mx2nv.convert(src, tmp_path / "ref")
    seen = []
    report = mx2nv.distributed.convert(src, tmp_path / "dst", progress=seen.append)
    assert report.ok and report.command == "convert" and report.counts.shards == 6
    assert report.counts.modules == reference.counts.modules
    assert files(tmp_path / "dst") == files(tmp_path / "ref")
    # Progress aggregated on the driver: monotone, ending with every shard and byte.
    assert seen, "no progress reported"
    done = [p.shards_done for p in seen]
    assert done == sorted(done) and done[-1] == 6 and all(p.shards_total == 6 for p in seen)
    assert [p.bytes_done for p in seen] == sorted(p.bytes_done for p in seen)
    assert seen[-1].bytes_done == seen[-1].bytes_total == reference.source_tensor_bytes > 0
    # A rerun driver finds the finished DST and changes nothing.
    again = mx2nv.distributed.convert(src, tmp_path / "dst")
    assert again.ok and again.already_complete
    assert files(tmp_path / "dst") == files(tmp_path / "ref")


def test_a_refused_window_raises_before_any_task(cluster, tmp_path: Path) -> None:
    module = "language_model.model.layers.0.block_sparse_moe.experts.0.w1"
    src = generate(tmp_path / "src", "--shards", "2", "--layers", "1", "--experts", "2", "--hidden", "64",
                   "--intermediate", "64", "--set-span", f"{module}=20")
    with pytest.raises(mx2nv.RefusedError) as refused:
        mx2nv.distributed.convert(src, tmp_path / "dst")
    assert refused.value.report is not None and refused.value.report.over_span[0].module == module
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").iterdir())


def _busy_ray_workers(task_name: str) -> list:
    """PIDs of Ray worker processes executing `task_name` right now: Ray
    titles a busy worker "ray::<task name>" (read from /proc: faster than
    spawning pgrep, so a short shard is still caught)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                title = f.read(256)
        except OSError:
            continue
        if title.startswith(f"ray::{task_name}".encode()):
            pids.append(int(entry.name))
    return pids


def _shard_being_written(dst: Path) -> bool:
    try:
        return any(e.name.startswith(".mx2nv-tmp.") for e in os.scandir(dst))
    except OSError:
        return False


def test_a_worker_killed_mid_shard_is_retried(cluster, tmp_path: Path) -> None:
    # Two shards of 48 MiB: a task is still writing its shard when the killer looks.
    src = generate(tmp_path / "src", "--shards", "2", "--layers", "2", "--experts", "16", "--hidden", "2048",
                   "--intermediate", "1024")
    mx2nv.convert(src, tmp_path / "ref")
    dst = tmp_path / "dst"
    killed = []

    def kill_a_worker_mid_shard() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            # Mid-shard: a task is running and a shard's temporary output exists.
            busy = _busy_ray_workers("_convert_shard")
            if busy and _shard_being_written(dst):
                os.kill(busy[0], signal.SIGKILL)
                killed.append(busy[0])
                return

    killer = threading.Thread(target=kill_a_worker_mid_shard)
    killer.start()
    report = mx2nv.distributed.convert(src, dst, max_retries=3, copy="copy")
    killer.join()
    assert killed, "no worker was caught mid-shard"
    assert report.ok
    assert files(dst) == files(tmp_path / "ref")
    assert no_temporaries(dst)
    assert mx2nv.verify(src, dst).ok
