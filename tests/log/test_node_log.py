"""NodeLog behaviour through its public API: append/commit/read, reopen, snapshots, truncation, deletion."""

from __future__ import annotations

import pathlib
import shutil
import threading

import pytest

from cluster.log import LogConfig, NodeLog

SMALL = LogConfig(segment_size_bytes_max=1024, index_interval_bytes=128, wal_size_bytes_max=8192,
                  append_buffer_bytes_max=2048)


def records(log: NodeLog, stream: str) -> tuple[bytes | None, list[tuple[int, bytes]]]:
    state, iterator = log.read(stream)
    return state, list(iterator)


def test_append_returns_consecutive_offsets_per_stream(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path)
    assert [log.append("a", b"1"), log.append("a", b"2"), log.append("b", b"x")] == [0, 1, 0]
    assert log.streams() == ["a", "b"]
    log.close()


def test_records_read_back_before_and_after_commit_and_reopen(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    payloads = [f"message-{i}".encode() * (i % 7 + 1) for i in range(300)]
    for payload in payloads:
        log.append("q", payload)
    assert records(log, "q") == (None, list(enumerate(payloads)))
    log.commit()
    assert records(log, "q") == (None, list(enumerate(payloads)))
    assert log.read_at("q", 123) == payloads[123]
    log.close()
    reopened = NodeLog.open(tmp_path, SMALL)
    assert records(reopened, "q") == (None, list(enumerate(payloads)))
    assert reopened.read_at("q", 299) == payloads[299]
    assert reopened.append("q", b"next") == 300
    reopened.close()


def test_uncommitted_records_survive_a_crash_only_if_written(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    log.append("q", b"a")
    log.commit()
    log.append("q", b"b")  # never committed nor written: lost on a crash
    # Simulate a crash: drop the object without close().
    reopened = NodeLog.open(tmp_path, SMALL)
    assert records(reopened, "q") == (None, [(0, b"a")])
    reopened.close()


def test_recovery_from_wal_only_when_segments_are_lost(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, LogConfig(wal_size_bytes_max=1 << 30))
    for i in range(50):
        log.append(f"s{i % 5}", f"{i}".encode())
    log.commit()
    # Crash, and the segment files' unsynced contents vanish (power loss): the WAL alone rebuilds them.
    for segment in (tmp_path / "streams").glob("*/*.log"):
        segment.write_bytes(b"")
    reopened = NodeLog.open(tmp_path)
    for s in range(5):
        assert records(reopened, f"s{s}")[1] == [(k, f"{s + 5 * k}".encode()) for k in range(10)]
    reopened.close()


def test_snapshot_hides_older_records_and_deletes_segments(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    for i in range(200):
        log.append("q", b"x" * 50 + str(i).encode())
    log.commit()
    stream_dir = next((tmp_path / "streams").iterdir())
    assert len(list(stream_dir.glob("*.log"))) > 5
    log.write_snapshot("q", 150, b"state-150")
    state, rest = records(log, "q")
    assert state == b"state-150"
    assert [o for o, _ in rest] == list(range(151, 200))
    bases = sorted(int(p.stem) for p in stream_dir.glob("*.log"))
    assert bases[0] <= 151 < bases[1]  # only segments holding records after the snapshot remain
    with pytest.raises(KeyError):
        log.read_at("q", 10)
    log.close()
    reopened = NodeLog.open(tmp_path, SMALL)
    state, rest = records(reopened, "q")
    assert state == b"state-150" and [o for o, _ in rest] == list(range(151, 200))
    reopened.close()


def test_idle_stream_fully_snapshotted_keeps_no_segments(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    for _i in range(100):
        log.append("q", b"y" * 40)
    log.commit()
    log.write_snapshot("q", 99, b"empty")
    log.close()
    assert list(tmp_path.glob("streams/*/*.log")) == []
    assert sum(p.stat().st_size for p in tmp_path.glob("wal/*")) == 0
    reopened = NodeLog.open(tmp_path, SMALL)
    assert records(reopened, "q") == (b"empty", [])
    assert reopened.append("q", b"z") == 100
    reopened.close()


def test_truncate_after_then_reappend_is_durable(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    for i in range(40):
        log.append("raft", f"term1-{i}".encode())
    log.commit()
    log.truncate_after("raft", 24)
    assert log.append("raft", b"term2-25") == 25
    log.commit()
    expected = [(i, f"term1-{i}".encode()) for i in range(25)] + [(25, b"term2-25")]
    assert records(log, "raft")[1] == expected
    # Crash without checkpoint: recovery replays appends, the truncation, then the new append.
    reopened = NodeLog.open(tmp_path, SMALL)
    assert records(reopened, "raft")[1] == expected
    reopened.close()


def test_truncate_of_uncommitted_records(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    for i in range(10):
        log.append("r", bytes([i]))
    log.truncate_after("r", 3)
    log.append("r", b"new")
    assert records(log, "r")[1] == [(0, b"\x00"), (1, b"\x01"), (2, b"\x02"), (3, b"\x03"), (4, b"new")]
    log.commit()
    assert records(NodeLog.open(tmp_path, SMALL), "r")[1][-1] == (4, b"new")


def _gone_and_kept(directory: pathlib.Path) -> NodeLog:
    """A log with 30 committed records in each of the streams "gone" and "kept"."""
    log = NodeLog.open(directory, SMALL)
    for _i in range(30):
        log.append("gone", b"old")
        log.append("kept", b"k")
    log.commit()
    return log


def test_delete_stream_is_durable_and_name_reusable(tmp_path: pathlib.Path) -> None:
    log = _gone_and_kept(tmp_path)
    log.delete_stream("gone")
    assert log.streams() == ["kept"]
    assert log.append("gone", b"new") == 0
    log.commit()
    reopened = NodeLog.open(tmp_path, SMALL)
    assert records(reopened, "gone")[1] == [(0, b"new")]
    assert len(records(reopened, "kept")[1]) == 30
    reopened.close()


def test_a_deleted_streams_files_left_by_a_crash_go_at_replay(tmp_path: pathlib.Path) -> None:
    log = _gone_and_kept(tmp_path)
    streams = tmp_path / "streams"
    saved = tmp_path / "saved"
    shutil.copytree(streams, saved)
    log.delete_stream("gone")  # a DELETE frame in the WAL, no checkpoint
    shutil.rmtree(streams)
    shutil.copytree(saved, streams)  # as if the process died after the frame's fsync, before the files went
    log._handles.close_all()
    reopened = NodeLog.open(tmp_path, SMALL)
    assert reopened.streams() == ["kept"] and records(reopened, "gone")[1] == []
    assert len(records(reopened, "kept")[1]) == 30
    assert len(list(streams.iterdir())) == 1  # the deleted stream's directory is gone
    reopened.close()


def test_a_name_used_again_after_delete_survives_a_crash_with_its_snapshot(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    for _i in range(10):
        log.append("s", b"old")
    log.commit()
    log.delete_stream("s")
    for i in range(4):
        log.append("s", bytes([i]))
    log.commit()
    log.write_snapshot("s", 1, b"state")  # a snapshot after the DELETE frame, before any checkpoint
    log.append("s", b"after")
    log.commit()
    log._handles.close_all()  # kill -9
    reopened = NodeLog.open(tmp_path, SMALL)
    assert records(reopened, "s") == (b"state", [(2, b"\x02"), (3, b"\x03"), (4, b"after")])
    reopened.close()


def test_time_index_finds_first_offset_at_or_after_a_timestamp(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    for i in range(500):
        log.append("t", b"p" * 20, timestamp_ms=1000 + 10 * i)
    log.commit()
    assert log.offset_for_time("t", 0) == 0
    assert log.offset_for_time("t", 1000 + 10 * 321) == 321
    assert log.offset_for_time("t", 1000 + 10 * 321 - 5) == 321
    assert log.offset_for_time("t", 10**9) is None
    log.close()
    assert NodeLog.open(tmp_path, SMALL).offset_for_time("t", 1000 + 10 * 400) == 400


def test_wal_is_bounded_by_checkpoints(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    for i in range(2000):
        log.append(f"s{i % 3}", b"w" * 30)
        if i % 10 == 0:
            log.commit()
        assert sum(p.stat().st_size for p in tmp_path.glob("wal/*")) < SMALL.wal_size_bytes_max * 2
    log.close()


def test_append_buffer_overflow_writes_without_commit(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    for _ in range(200):
        log.append("q", b"o" * 100)
    assert sum(p.stat().st_size for p in tmp_path.glob("wal/*")) > 0
    assert len(records(log, "q")[1]) == 200
    log.close()


def test_commit_in_a_thread_concurrent_with_appends(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    stop = threading.Event()
    committed: list[int] = []

    def committer() -> None:
        while not stop.is_set():
            before = log.end_offset("q")
            log.commit()
            committed.append(before)

    thread = threading.Thread(target=committer)
    thread.start()
    for i in range(3000):
        assert log.append("q", i.to_bytes(4, "big")) == i
        if i % 7 == 0:  # random reads race with the committer's writes, rolls and checkpoints
            assert log.read_at("q", i // 2) == (i // 2).to_bytes(4, "big")
    stop.set()
    thread.join()
    durable = max(committed)
    reopened = NodeLog.open(tmp_path, SMALL)  # crash view: no close() on the first object
    got = records(reopened, "q")[1]
    assert len(got) >= durable
    assert got == [(i, i.to_bytes(4, "big")) for i in range(len(got))]
    reopened.close()


def test_read_spans_disk_and_memory(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, SMALL)
    for i in range(100):
        log.append("r", str(i).encode())
    log.commit()
    for i in range(100, 110):
        log.append("r", str(i).encode())
    state, records = log.read("r")
    assert state is None and list(records) == [(i, str(i).encode()) for i in range(110)]
    log.write_snapshot("r", 97, b"s")
    assert log.snapshot_offset("r") == 97
    state, records = log.read("r")
    assert state == b"s" and list(records) == [(i, str(i).encode()) for i in range(98, 110)]
    log.close()


def test_replayed_truncation_overrides_stale_segment_contents(tmp_path: pathlib.Path) -> None:
    """Power loss after commit: the segment still holds pre-truncation records; the WAL's TRUNCATE fixes it."""
    config = LogConfig(wal_size_bytes_max=1 << 30)
    log = NodeLog.open(tmp_path, config)
    for i in range(10):
        log.append("raft", f"old-{i}".encode())
    log.commit()
    segment = next(tmp_path.glob("streams/*/*.log"))
    stale = segment.read_bytes()
    log.truncate_after("raft", 4)
    log.append("raft", b"new-5")
    log.append("raft", b"new-6")
    log.commit()
    log._handles.close_all()  # crash: no checkpoint
    segment.write_bytes(stale)  # the truncation and rewrite never reached the disk
    reopened = NodeLog.open(tmp_path, config)
    expected = [(i, f"old-{i}".encode()) for i in range(5)] + [(5, b"new-5"), (6, b"new-6")]
    assert list(reopened.read("raft")[1]) == expected
    reopened.close()


def test_recovery_point_walk_then_torn_tail_after_it(tmp_path: pathlib.Path) -> None:
    config = LogConfig(index_interval_bytes=64, wal_size_bytes_max=1 << 30)
    log = NodeLog.open(tmp_path, config)
    for i in range(300):
        log.append("q", f"r{i}".encode() * 5, timestamp_ms=i)
    log.close()  # checkpoint: the recovery point covers all 300
    log = NodeLog.open(tmp_path, config)
    for i in range(300, 320):
        log.append("q", f"r{i}".encode() * 5, timestamp_ms=i)
    log.commit()
    log._handles.close_all()  # crash: no checkpoint
    segment = next(tmp_path.glob("streams/*/*.log"))
    with segment.open("ab") as handle:
        handle.write(b"\x01\x02torn")
    reopened = NodeLog.open(tmp_path, config)
    assert list(reopened.read("q")[1]) == [(i, f"r{i}".encode() * 5) for i in range(320)]
    assert reopened.read_at("q", 150) == b"r150" * 5
    assert reopened.offset_for_time("q", 250) == 250
    assert reopened.append("q", b"next") == 320
    reopened.close()


def test_read_at_records_larger_than_the_read_chunk(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, LogConfig(segment_size_bytes_max=1 << 20, index_interval_bytes=4096))
    bodies = [bytes([i]) * (i * 10_000) for i in range(12)]
    for body in bodies:
        log.append("big", body)
    log.close()
    reopened = NodeLog.open(tmp_path)
    for offset in (11, 3, 0, 7):
        assert reopened.read_at("big", offset) == bodies[offset]
    reopened.close()


def test_stream_names_are_validated_up_front(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path)
    with pytest.raises(ValueError):
        log.append("x" * 2000, b"too long a name")
    with pytest.raises(ValueError):
        log.append("", b"empty name")
    assert log.append("queue:/:ünïcode", b"ok") == 0
    log.close()
    assert NodeLog.open(tmp_path).streams() == ["queue:/:ünïcode"]
