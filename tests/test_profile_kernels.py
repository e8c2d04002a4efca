"""benchmarks/profile_kernels.py's kernel-time measure: the median over calls of each call's summed
device time (median_per_call), on stand-in profiler events (no GPU needed)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.profile_kernels import median_per_call  # noqa: E402


def _event(start, us):
    """A stand-in for a profiler device event: time_range.start and time_range.elapsed_us()."""
    return SimpleNamespace(time_range=SimpleNamespace(start=start, elapsed_us=lambda: us))


def test_median_per_call_groups_by_stream_order():
    """Two kernels per call, given out of order: each call's two are summed (10 + 1, 12 + 1, ...)
    and the median of the sums is taken, so one slow call (100 + 1) does not move it the way a
    mean would (the mean of these five calls is 30.0)."""
    durations = [(10, 1), (12, 1), (100, 1), (11, 1), (13, 1)]
    events = []
    for call, (a, b) in enumerate(durations):
        events += [_event(call * 1000 + 500, b), _event(call * 1000, a)]  # second kernel listed first
    events.reverse()
    assert median_per_call(events, len(durations)) == 13.0  # sums 11, 13, 101, 12, 14


def test_median_per_call_raises_on_uneven_calls():
    """Kernels that do not divide evenly into the calls (a call launched an extra kernel) raise
    instead of being split at the wrong places; so do no kernels at all."""
    events = [_event(t, 1.0) for t in range(7)]
    with pytest.raises(RuntimeError, match="7 device events over 3 calls"):
        median_per_call(events, 3)
    with pytest.raises(RuntimeError, match="0 device events"):
        median_per_call([], 3)
