"""A conversion spread over a Ray cluster: one Ray task per shard.

    import ray, mx2nv.distributed
    ray.init(address="auto")            # or nothing: a local cluster is started
    report = mx2nv.distributed.convert("/shared/model-mxfp4", "/shared/model-nvfp4", progress=True)

The driver plans once (``mx2nv.plan``: refusals happen here, nothing is
written then), each Ray task converts one shard in its worker process through
the library (``mx2nv.convert_shards(plan, shard=I)``, the same code as
``mx2nv convert --plan P --shard I``: a pure function of the source shard and
the plan), and the driver finalizes (``mx2nv.finalize``: every shard record
checked, then companions, config and the index last). The output is
byte-identical to ``mx2nv.convert``.

Retries never corrupt or duplicate work: a task is retried when its worker
dies (Ray's ``max_retries``) or when its shard fails with an I/O error
(``MxIOError``); a retried shard finds its finished record and skips, or
discards a partial output and redoes it from scratch; two attempts on one
shard serialise on the shard's lock. Other errors (invalid input, SRC changed
since the plan) are final and raised on the driver. A driver that is itself
rerun finds the same plan (or the finished DST) and only does what is left.

SRC and DST must be paths every Ray node sees at the same place (shared
storage), since the plan records them. Ray is an optional dependency
(``pip install ray``); nothing else in mx2nv imports it.

``progress``: a callable taking :class:`ShardProgress`, or True for a tqdm bar
(when tqdm is installed). Bytes are aggregated across workers while shards
run: each task reports its shard's progress to a small Ray actor, which the
driver reads a few times a second.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Dict, Optional, Tuple, Union

from . import _api
from ._errors import MxIOError
from ._report import Report

PathLike = Union[str, "os.PathLike[str]"]

_POLL_SECONDS = 0.2


@dataclasses.dataclass(frozen=True)
class ShardProgress:
    """The whole conversion as the driver sees it."""

    shards_done: int
    shards_total: int
    bytes_done: int  # source tensor bytes converted: finished shards, plus the running shards' progress
    bytes_total: int  # source tensor bytes of the checkpoint
    seconds: float  # since the shards started


class ShardIOError(MxIOError):
    """A shard failed with an I/O error in its task; Ray retries it."""


class _ProgressBoard:
    """Per shard: (bytes done, bytes total) as its latest attempt reported."""

    def __init__(self) -> None:
        self.shards: Dict[int, Tuple[int, int]] = {}

    def update(self, shard: int, done: int, total: int) -> None:
        self.shards[shard] = (done, total)

    def snapshot(self) -> Dict[int, Tuple[int, int]]:
        return dict(self.shards)


def _convert_shard(plan: str, index: int, threads: int, copy: str, board: Any) -> Tuple[int, int]:
    """One Ray task: shard ``index`` of ``plan``, in this worker's process.
    Returns the shard and its source tensor bytes."""
    shard_bytes = [0]

    def report_progress(p: Any) -> None:
        if p.unit == "shards" and p.bytes_total:
            shard_bytes[0] = p.bytes_total
            if board is not None:
                board.update.remote(index, p.bytes_done, p.bytes_total)

    try:
        _api.convert_shards(plan, shard=index, threads=threads, copy=copy, progress=report_progress)
    except MxIOError as e:
        raise ShardIOError(str(e)) from None
    return index, shard_bytes[0]


def convert(
    src: PathLike,
    dst: PathLike,
    *,
    window: str = "marlin",
    threads_per_task: int = 1,
    max_retries: int = 3,
    copy: str = "auto",
    progress: Union[bool, Callable[[ShardProgress], Any], None] = None,
    plan_out: Optional[PathLike] = None,
    format: str = "compressed-tensors",
) -> Report:
    """Converts ``src`` into ``dst`` with one Ray task per shard (each asking
    ``threads_per_task`` CPUs), then finalizes on the driver; returns the
    finalize report (``result`` "ok"). Uses the Ray cluster this process is
    connected to (``ray.init()`` first to choose one; a local one is started
    otherwise). Raises what the failing step raises: ``RefusedError`` when the
    window refuses a module (nothing written), ``UsageError``,
    ``InvalidInputError``, ``MxIOError`` (an I/O error that outlived
    ``max_retries``, as ``ShardIOError``), or Ray's own error when a worker
    died more than ``max_retries`` times. ``format`` as ``mx2nv.convert``'s
    (recorded in the plan, which every task follows)."""
    import ray  # optional dependency

    planned = _api.plan(src, dst, window=window, threads=threads_per_task, plan_out=plan_out, format=format)
    if planned.plan is None:  # DST already holds this conversion: answer as convert does
        return _api.convert(src, dst, window=window, threads=threads_per_task, resume=True, copy=copy, format=format)
    plan = os.fspath(planned.plan)
    shards_total = planned.shards
    bytes_total = planned.report.source_tensor_bytes

    if not ray.is_initialized():
        ray.init()
    sink = _progress_sink(progress, shards_total)
    board = ray.remote(num_cpus=0)(_ProgressBoard).remote() if sink is not None else None
    task = ray.remote(num_cpus=threads_per_task, max_retries=max_retries,
                      retry_exceptions=[ShardIOError])(_convert_shard)
    pending = {task.remote(plan, i, threads_per_task, copy, board): i for i in range(shards_total)}
    started = time.monotonic()
    finished: Dict[int, int] = {}  # shard -> its source tensor bytes, once its task returned
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_SECONDS if sink else None)
            for ref in ready:
                pending.pop(ref)
                shard, shard_bytes = ray.get(ref)  # raises the task's final error, if it failed for good
                finished[shard] = shard_bytes
            if sink is not None:
                live = ray.get(board.snapshot.remote()) if pending else {}
                running = sum(done for shard, (done, _) in live.items() if shard not in finished)
                sink(ShardProgress(len(finished), shards_total, min(bytes_total, sum(finished.values()) + running),
                                   bytes_total, time.monotonic() - started))
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if board is not None:
            ray.kill(board)
        if sink is not None:
            sink(None)
    return _api.finalize(plan, threads=threads_per_task, copy=copy)


def _progress_sink(progress: Any, shards_total: int) -> Optional[Callable[[Optional[ShardProgress]], None]]:
    """None when nobody listens; else a function taking updates, then None at the end."""
    if progress is None or progress is False:
        return None
    if progress is True:
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        bar = tqdm(total=None, unit="B", unit_scale=True, desc="mx2nv (ray)")

        def update(p: Optional[ShardProgress]) -> None:
            if p is None:
                bar.close()
                return
            bar.total = p.bytes_total
            bar.set_postfix_str(f"shards {p.shards_done}/{p.shards_total}", refresh=False)
            bar.update(p.bytes_done - bar.n)

        return update
    if not callable(progress):
        from ._errors import UsageError

        raise UsageError(f"progress must be a callable, True or None, got {progress!r}")
    return lambda p: None if p is None else progress(p)
