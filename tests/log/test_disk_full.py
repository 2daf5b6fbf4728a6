"""Disk full: ENOSPC raises DiskFullError, never corrupts a file, and reopening recovers to the last good record.

One test fills a real tiny tmpfs (needs root and mount; skipped otherwise); the others inject failing writes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import subprocess
from collections.abc import Iterator

import pytest

from cluster.log import DiskFullError, LogBrokenError, LogConfig, NodeLog
from cluster.log import segment as segment_module
from cluster.log import wal as wal_module

CONFIG = LogConfig(segment_size_bytes_max=16 * 1024, index_interval_bytes=512, wal_size_bytes_max=64 * 1024,
                   append_buffer_bytes_max=32 * 1024)


def payload(stream: str, offset: int) -> bytes:
    return f"{stream}/{offset}/".encode() + b"." * (offset % 300)


def assert_contiguous_and_intact(log: NodeLog, stream: str, acked_through: int) -> int:
    state, iterator = log.read(stream)
    assert state is None
    last = -1
    for offset, body in iterator:
        assert offset == last + 1
        assert body == payload(stream, offset)
        last = offset
    assert last >= acked_through
    return last


@pytest.fixture
def tiny_tmpfs(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=384k", "tmpfs", str(mount_point)],
                            capture_output=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {result.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_filling_a_real_tmpfs(tiny_tmpfs: pathlib.Path) -> None:
    ballast = tiny_tmpfs / "ballast"
    ballast.write_bytes(b"\0" * 64 * 1024)
    log = NodeLog.open(tiny_tmpfs / "log", CONFIG)
    acked = {"a": -1, "b": -1}
    with pytest.raises(DiskFullError):
        for _ in range(100_000):
            for stream in acked:
                log.append(stream, payload(stream, log.end_offset(stream)))
            log.commit()
            acked = {stream: log.end_offset(stream) - 1 for stream in acked}
    ballast.unlink()  # the operator frees space; the log is reopened (it may be broken by a segment failure)
    with contextlib.suppress(DiskFullError, LogBrokenError):
        log.close()
    reopened = NodeLog.open(tiny_tmpfs / "log", CONFIG)
    for stream, through in acked.items():
        assert through > 50
        assert_contiguous_and_intact(reopened, stream, through)
    reopened.close()


def failing_pwrite_all(fail_after_calls: int) -> tuple[list[int], object]:
    calls = [0]
    real = segment_module.pwrite_all

    def fake(fd: int, data: bytes, position: int) -> None:
        calls[0] += 1
        if calls[0] > fail_after_calls:
            os.pwrite(fd, data[: len(data) // 2], position)  # a partial write, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, position)

    return calls, fake


def test_wal_write_failure_is_retryable(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = NodeLog.open(tmp_path, CONFIG)
    for _ in range(10):
        log.append("q", payload("q", log.end_offset("q")))
    log.commit()
    _, fake = failing_pwrite_all(0)
    monkeypatch.setattr(wal_module, "pwrite_all", fake)
    for _ in range(5):
        log.append("q", payload("q", log.end_offset("q")))
    with pytest.raises(DiskFullError):
        log.commit()
    monkeypatch.undo()  # space is back
    log.append("q", payload("q", log.end_offset("q")))
    log.commit()
    assert assert_contiguous_and_intact(log, "q", 15) == 15
    assert assert_contiguous_and_intact(NodeLog.open(tmp_path, CONFIG), "q", 15) == 15


def test_segment_write_failure_breaks_the_log_until_reopened(tmp_path: pathlib.Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    log = NodeLog.open(tmp_path, CONFIG)
    for _ in range(30):
        log.append("q", payload("q", log.end_offset("q")))
    log.commit()
    _, fake = failing_pwrite_all(0)
    monkeypatch.setattr(segment_module, "pwrite_all", fake)
    for _ in range(5):
        log.append("q", payload("q", log.end_offset("q")))
    with pytest.raises(DiskFullError):
        log.commit()
    with pytest.raises(LogBrokenError):
        log.append("q", b"refused")
    monkeypatch.undo()
    reopened = NodeLog.open(tmp_path, CONFIG)  # the WAL holds the failed batch: nothing corrupt, nothing lost
    assert assert_contiguous_and_intact(reopened, "q", 29) == 34
    reopened.close()


def test_overflow_flush_failure_is_reported_by_the_next_commit(tmp_path: pathlib.Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    log = NodeLog.open(tmp_path, CONFIG)
    _, fake = failing_pwrite_all(0)
    monkeypatch.setattr(wal_module, "pwrite_all", fake)
    for _ in range(200):  # far beyond the append buffer: append itself must not raise yet
        log.append("q", payload("q", log.end_offset("q")))
    with pytest.raises(DiskFullError):
        log.commit()
    monkeypatch.undo()
    log.commit()
    assert assert_contiguous_and_intact(log, "q", 199) == 199
    log.close()
