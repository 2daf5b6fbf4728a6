"""hot_path_gc: young collections wait longer and startup objects are frozen while serving; restored after."""

from __future__ import annotations

import gc

import pytest

from node.runtime.hot_path_gc import GC_YOUNG_THRESHOLD, hot_path_gc


def test_gc_settings_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    with hot_path_gc():
        assert gc.get_threshold()[0] >= GC_YOUNG_THRESHOLD
        assert gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_restored_when_the_node_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), hot_path_gc():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_cyclic_garbage_is_still_collected() -> None:
    with hot_path_gc():
        gc.collect()
        class Node:
            pass
        first = Node()
        first.other = Node()  # type: ignore[attr-defined]
        first.other.other = first  # type: ignore[attr-defined]
        del first
        assert gc.collect() >= 2
