"""The garbage collector's settings while a node serves (`hot_path_gc`, used by `run_node`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

GC_YOUNG_THRESHOLD = 50_000  # net container allocations between young collections (CPython's default: 700)


@contextmanager
def hot_path_gc() -> Iterator[None]:
    """Fewer cyclic collections while the node serves. Per-message objects die by reference counting, yet each
    allocation counts toward the young generation's threshold, so with CPython's default (700) a workload (a) run
    spent ~10% of its CPU in the collector, with full collections of up to 70 ms (a p99 stall). Everything alive
    when serving starts (modules, the recovered state) is frozen out of the scans, and young collections wait for
    GC_YOUNG_THRESHOLD net allocations (cyclic garbage still gets collected: it counts toward that threshold).
    Restored on the way out (tests run nodes inside their own process)."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(threshold[0], GC_YOUNG_THRESHOLD), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
