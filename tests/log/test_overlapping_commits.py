"""NodeLog commits whose WAL fsyncs overlap: a commit called while another one's fsync runs writes its batch and
fsyncs it at once, on a descriptor of its own (a writeback error is reported once per open file description); a
checkpoint, a snapshot and close wait until no fsync runs. The kernel's fdatasync is held open with an event."""

from __future__ import annotations

import os
import pathlib
import shutil
import threading
from collections.abc import Iterator

import pytest

from cluster.log import LogConfig, NodeLog

WAIT_S = 30  # a bound for a hang, not a timing


class HeldSyncs:
    """os.fdatasync for the WAL: the first call blocks until `release`; every call's descriptor is recorded."""

    def __init__(self) -> None:
        self.first_entered = threading.Event()
        self.release = threading.Event()
        self.descriptors: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self._lock:
            first = not self.descriptors
            self.descriptors.append(fd)
        if first:
            self.first_entered.set()
            assert self.release.wait(WAIT_S)
        os.fsync(fd)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldSyncs]:
    syncs = HeldSyncs()
    monkeypatch.setattr(os, "fdatasync", syncs)  # (the WAL is the only user of fdatasync here)
    yield syncs
    syncs.release.set()


def _in_thread(target: object) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread


def test_a_commit_fsyncs_its_batch_while_an_earlier_fsync_runs(tmp_path: pathlib.Path, held: HeldSyncs) -> None:
    log = NodeLog.open(tmp_path)
    log.append("q", b"first")
    first = _in_thread(log.commit)
    assert held.first_entered.wait(WAIT_S)
    log.append("q", b"second")
    log.commit()  # returns while the first commit's fsync is still held
    assert first.is_alive()
    assert len(held.descriptors) == 2 and held.descriptors[0] != held.descriptors[1]
    snapshot = tmp_path.parent / "copy"
    # What the second commit vouches for is on disk: a copy of the directory now (a crash) recovers both records.
    shutil.copytree(tmp_path, snapshot)
    held.release.set()
    first.join(WAIT_S)
    assert not first.is_alive()
    recovered = NodeLog.open(snapshot)
    assert list(recovered.read("q")[1]) == [(0, b"first"), (1, b"second")]
    recovered.close()
    log.close()


def test_checkpoint_snapshot_and_close_wait_for_a_running_fsync(tmp_path: pathlib.Path, held: HeldSyncs) -> None:
    log = NodeLog.open(tmp_path, LogConfig(wal_size_bytes_max=1 << 20))
    log.append("q", b"a")
    first = _in_thread(log.commit)
    assert held.first_entered.wait(WAIT_S)
    waiters = [_in_thread(log.checkpoint), _in_thread(lambda: log.write_snapshot("q", 0, b"state"))]
    for waiter in waiters:
        waiter.join(0.2)
        assert waiter.is_alive(), "replaced or touched the WAL file under a running fsync"
    held.release.set()
    for thread in (first, *waiters):
        thread.join(WAIT_S)
        assert not thread.is_alive()
    log.append("q", b"b")
    log.close()
    reopened = NodeLog.open(tmp_path)
    assert reopened.read("q")[0] == b"state"
    assert list(reopened.read("q")[1]) == [(1, b"b")]
    reopened.close()
