"""NodeLog.append_run: a run of one stream's payloads, the same offsets and contents as append one by one."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.log import LogConfig, NodeLog


def test_append_run_matches_append(tmp_path: Path) -> None:
    one = NodeLog.open(tmp_path / "one", LogConfig())
    run = NodeLog.open(tmp_path / "run", LogConfig())
    payloads = [b"1", b"", b"3" * 300]
    expected = [one.append("a", payload) for payload in payloads]
    assert run.append_run("a", payloads) == expected[0] == 0
    assert run.append("a", b"4") == 3
    assert run.append_run("b", [b"x"]) == 0
    assert run.append_run("a", [b"5", b"6"]) == 4
    assert run.read_at("a", 5) == b"6"  # readable before any commit
    run.commit()
    run.close()
    reopened = NodeLog.open(tmp_path / "run", LogConfig())
    assert list(reopened.read("a")[1]) == [(0, b"1"), (1, b""), (2, b"3" * 300), (3, b"4"), (4, b"5"), (5, b"6")]
    assert list(reopened.read("b")[1]) == [(0, b"x")]
    reopened.close()
    one.close()


def test_append_run_overflowing_the_buffer_writes_out(tmp_path: Path) -> None:
    log = NodeLog.open(tmp_path, LogConfig(append_buffer_bytes_max=1024))
    assert log.append_run("s", [bytes(100)] * 50) == 0
    assert log.read_at("s", 49) == bytes(100)
    log.commit()
    log.close()


def test_append_run_bad_stream_queues_nothing(tmp_path: Path) -> None:
    log = NodeLog.open(tmp_path, LogConfig())
    with pytest.raises(ValueError):
        log.append_run("", [b"1"])
    assert log.append_run("ok", [b"2"]) == 0
    log.commit()
    log.close()
