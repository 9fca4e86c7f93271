"""Progress updates from the library, and the ways to show them."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union


@dataclass(frozen=True)
class Progress:
    """One update. ``phase``: plan, shards, finalize, done. Bytes are source
    tensor bytes (convert) or bytes read on both sides (verify); units are
    shards (convert) or modules (verify). Totals are 0 while unknown."""

    command: str
    phase: str
    bytes_done: int
    bytes_total: int
    units_done: int
    units_total: int
    unit: str
    seconds: float

    @property
    def fraction(self) -> Optional[float]:
        return self.bytes_done / self.bytes_total if self.bytes_total else None


ProgressCallback = Callable[[Progress], Any]
ProgressArg = Union[None, bool, ProgressCallback]


class _TqdmBar:
    """``progress=True`` with tqdm installed: one bar, re-labelled per phase."""

    def __init__(self, tqdm: Any) -> None:
        self._tqdm = tqdm
        self._bar: Any = None
        self._phase = ""

    def __call__(self, p: Progress) -> None:
        if p.phase == "done":
            self.close()
            return
        if self._bar is None:
            self._bar = self._tqdm(total=None, unit="B", unit_scale=True, unit_divisor=1000, leave=False)
        if p.phase != self._phase:
            self._phase = p.phase
            self._bar.reset(total=p.bytes_total or None)
            self._bar.set_description(f"{p.command} {p.phase}", refresh=False)
        self._bar.n = p.bytes_done
        if p.units_total:
            self._bar.set_postfix_str(f"{p.units_done}/{p.units_total} {p.unit}", refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class _StderrLine:
    """``progress=True`` without tqdm: the CLI's live line, in Python."""

    def __init__(self) -> None:
        self._open = False
        self._phase = ""
        self._phase_start = 0.0

    def __call__(self, p: Progress) -> None:
        if p.phase != self._phase:
            self._phase, self._phase_start = p.phase, p.seconds
        if p.phase == "done":
            self.close()
            return
        line = f"{p.command} {p.phase:<8}"
        if p.bytes_total:
            elapsed = p.seconds - self._phase_start
            rate = p.bytes_done / elapsed if elapsed > 0 else 0.0
            line += f" {p.bytes_done / 1e9:.2f}/{p.bytes_total / 1e9:.2f} GB {100 * p.bytes_done / p.bytes_total:3.0f}%"
            line += f"  {rate / 1e9:.2f} GB/s"
            if rate > 0:
                line += f"  ETA {int((p.bytes_total - p.bytes_done) / rate)} s"
        if p.units_total:
            line += f"  {p.units_done}/{p.units_total} {p.unit}"
        sys.stderr.write("\r" + line + "\x1b[K")
        sys.stderr.flush()
        self._open = True

    def close(self) -> None:
        if self._open:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._open = False


class ProgressSink:
    """Adapts the library's updates (plain dicts) to ``Progress`` objects."""

    def __init__(self, sink: Callable[[Progress], Any]) -> None:
        self._sink = sink

    def __call__(self, update: Mapping[str, Any]) -> None:
        self._sink(Progress(**update))

    def close(self) -> None:
        """Ends a bar or line left open by a run that failed before "done"."""
        close = getattr(self._sink, "close", None)
        if isinstance(self._sink, (_TqdmBar, _StderrLine)) and close is not None:
            close()


def make_progress(progress: ProgressArg) -> Optional[ProgressSink]:
    if progress is None or progress is False:
        return None
    if progress is True:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return ProgressSink(_StderrLine())
        return ProgressSink(_TqdmBar(tqdm))
    if callable(progress):
        return ProgressSink(progress)
    raise TypeError(f"progress must be None, a bool or a callable, not {type(progress).__name__}")
