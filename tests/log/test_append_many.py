"""NodeLog.append_many: the same offsets and contents as append one by one, in one lock round."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.log import LogConfig, NodeLog


def test_append_many_matches_append(tmp_path: Path) -> None:
    one = NodeLog.open(tmp_path / "one", LogConfig())
    many = NodeLog.open(tmp_path / "many", LogConfig())
    batch = [("a", b"1"), ("b", b"2"), ("a", b"3"), ("a", b"4"), ("c", b""), ("b", b"6")]
    expected = [one.append(stream, payload) for stream, payload in batch]
    assert many.append_many(batch) == expected == [0, 0, 1, 2, 0, 1]
    assert many.append_many([("a", b"7")]) == [3]
    many.commit()
    many.close()
    reopened = NodeLog.open(tmp_path / "many", LogConfig())
    assert list(reopened.read("a")[1]) == [(0, b"1"), (1, b"3"), (2, b"4"), (3, b"7")]
    assert list(reopened.read("b")[1]) == [(0, b"2"), (1, b"6")]
    assert reopened.read_at("c", 0) == b""
    reopened.close()
    one.close()


def test_append_many_overflowing_the_buffer_writes_out(tmp_path: Path) -> None:
    log = NodeLog.open(tmp_path, LogConfig(append_buffer_bytes_max=1024))
    offsets = log.append_many([("s", bytes(100))] * 50)
    assert offsets == list(range(50))
    assert log.read_at("s", 49) == bytes(100)  # written out by the overflow, readable before any commit
    log.commit()
    log.close()


def test_append_many_bad_stream_keeps_what_came_before(tmp_path: Path) -> None:
    log = NodeLog.open(tmp_path, LogConfig())
    with pytest.raises(ValueError):
        log.append_many([("s", b"a"), ("", b"b")])
    assert log.append("s", b"c") == 1
    log.commit()
    assert list(log.read("s")[1]) == [(0, b"a"), (1, b"c")]
    log.close()
