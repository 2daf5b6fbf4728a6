"""Fast recovery and reading: the chunked scanners, the saved active-segment index, WAL replay that skips by header.

The scanners are checked against the pure reference (``format.scan_records``) at every chunk size; recovery after
an unclean stop must give exactly the index and records a full rescan gives, whatever state the saved index, the
recovery point or the segment tail is in.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tracemalloc
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.log import LogConfig, NodeLog, scan
from cluster.log import format as fmt
from cluster.log.node_log import RECOVERY_POINT_FILE
from cluster.log.segment import SAVED_INDEX_FILE, Segment

CONFIG = LogConfig(index_interval_bytes=64, wal_size_bytes_max=1 << 30)


def payload_for(i: int) -> bytes:
    return f"r{i}:".encode() * (i % 5 + 1)


def crash(log: NodeLog) -> None:
    """Leave the log as a kill -9 would: written files stay as they are, nothing is closed or checkpointed."""
    log._handles.close_all()
    if log._wal is not None:
        log._wal.close()


def fill(directory: pathlib.Path, first: int, end: int, stream: str = "q", close: bool = False) -> None:
    log = NodeLog.open(directory, CONFIG)
    for i in range(first, end):
        log.append(stream, payload_for(i), timestamp_ms=i)
    log.commit()
    log.close() if close else crash(log)


def active_index(log: NodeLog, stream: str = "q") -> tuple[list[int], list[int], list[int], int, int]:
    segment = log._files[stream].segments[-1]
    index = segment.index
    return (list(index.relative_offsets), list(index.positions), list(index.max_timestamps_before),
            segment.next_offset, segment.size_bytes)


def reference_open(directory: pathlib.Path, scratch: pathlib.Path) -> NodeLog:
    """The same log opened with no recovery point at all: every active segment rescanned with CRCs."""
    shutil.copytree(directory, scratch)
    (scratch / RECOVERY_POINT_FILE).unlink(missing_ok=True)
    return NodeLog.open(scratch, CONFIG)


def check_against_reference(directory: pathlib.Path, tmp_path: pathlib.Path, count: int) -> None:
    reference = reference_open(directory, tmp_path / "reference")
    log = NodeLog.open(directory, CONFIG)
    assert active_index(log) == active_index(reference)
    assert list(log.read("q")[1]) == [(i, payload_for(i)) for i in range(count)]
    for offset in (0, count // 3, count - 1):
        assert log.read_at("q", offset) == payload_for(offset)
    assert log.offset_for_time("q", count // 2) == count // 2
    assert log.append("q", b"next") == count
    log.close()
    reference.close()


# --- the scanners against the pure reference --------------------------------------------------------------------


def write_segment(path: pathlib.Path, payloads: list[bytes], tail: bytes = b"") -> bytes:
    data = b"".join(fmt.encode_record(10 + i, 100 + i, p) for i, p in enumerate(payloads)) + tail
    path.write_bytes(data)
    return data


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=30), st.integers(1, 700), st.binary(max_size=40), st.data())
def test_scanners_match_the_reference_at_any_chunk_size(tmp_path_factory: pytest.TempPathFactory,
                                                        payloads: list[bytes], chunk_bytes: int, tail: bytes,
                                                        data: st.DataObject) -> None:
    path = tmp_path_factory.mktemp("scan") / "segment.log"
    contents = write_segment(path, payloads, tail)
    expected = [r for r in fmt.scan_records(contents) if r.offset >= 10]
    first = data.draw(st.integers(0, 45))
    end = data.draw(st.integers(first, 45))
    got = list(scan.iter_payloads(path, 0, first, end, chunk_bytes))
    assert got == [(r.offset, r.payload) for r in expected if first <= r.offset < end]
    segment = Segment.at(path.parent, 10)
    end_position, last = scan.index_records(path, segment, 0, None, 9, True, 64, chunk_bytes)
    assert end_position == (expected[-1].position + expected[-1].size_bytes if expected else 0)
    assert last == (expected[-1].offset if expected else 9)
    reference = Segment.at(path.parent, 10)
    for record in expected:
        if record.position > 0 and record.position - reference.last_indexed_position >= 64:
            reference.index.add(record.offset - 10, record.position, reference.max_timestamp_ms)
            reference.last_indexed_position = record.position
        reference.max_timestamp_ms = max(reference.max_timestamp_ms, record.timestamp_ms)
    assert list(segment.index.positions) == list(reference.index.positions)
    assert list(segment.index.max_timestamps_before) == list(reference.index.max_timestamps_before)
    assert segment.max_timestamp_ms == reference.max_timestamp_ms


def test_scanners_stop_at_a_corrupt_record_in_the_middle(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "segment.log"
    contents = bytearray(write_segment(path, [bytes([i]) * 50 for i in range(10)]))
    record_size = fmt.RECORD_HEADER.size + 50
    contents[4 * record_size + 30] ^= 0xFF  # a payload byte of offset 14
    path.write_bytes(bytes(contents))
    assert [o for o, _ in scan.iter_payloads(path, 0, 0, 100, 64)] == [10, 11, 12, 13]
    segment = Segment.at(tmp_path, 10)
    assert scan.index_records(path, segment, 0, None, 9, True, 64, 64) == (4 * record_size, 13)
    # Without the CRC check (a trusted, fsynced prefix) the headers still chain: used only below a recovery point.
    assert scan.index_records(path, Segment.at(tmp_path, 10), 0, None, 9, False, 64) == (10 * record_size, 19)
    # A stop position is never crossed.
    assert scan.index_records(path, Segment.at(tmp_path, 10), 0, 2 * record_size + 5, 9, False, 64) == (
        2 * record_size, 11)


def test_a_garbage_length_ends_the_scan_without_reading_on(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "segment.log"
    garbage = fmt.RECORD_HEADER.pack(0, 2**32 - 1, 99, 0)
    write_segment(path, [b"a", b"b"], garbage + b"\0" * 100)
    assert [o for o, _ in scan.iter_payloads(path, 0, 0, 100)] == [10, 11]


def test_wal_scan_skips_applied_frames_and_decodes_the_rest(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "0.wal"
    frames = [fmt.encode_wal_frame(fmt.WalKind.APPEND, "a", o, 0, b"x" * o) for o in range(5)]
    frames.append(fmt.encode_wal_frame(fmt.WalKind.TRUNCATE, "a", 2, 0, b""))
    frames.append(fmt.encode_wal_frame(fmt.WalKind.APPEND, "b", 0, 0, b"y"))
    corrupt = bytearray(frames[3])
    corrupt[-1] ^= 0xFF  # a payload byte of a frame already applied: never checked, never needed
    frames[3] = bytes(corrupt)
    path.write_bytes(b"".join(frames) + frames[0][:10])  # and a torn tail
    applied_below = {"a": 4}
    got = [(f.kind, f.stream, f.offset) for f in scan.iter_wal_needed(path, applied_below, chunk_bytes=16)]
    # The first frame of a stream is always decoded (its name is learned from a checked frame).
    assert got == [(1, "a", 0), (1, "a", 4), (2, "a", 2), (1, "b", 0)]


# --- the saved index of the active segment -----------------------------------------------------------------------


def test_open_after_a_crash_matches_a_full_rescan(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "log"
    fill(directory, 0, 400, close=True)  # checkpoint: recovery point + saved index of 400 records
    assert (next(directory.glob("streams/*")) / SAVED_INDEX_FILE).exists()
    fill(directory, 400, 450)  # written after the checkpoint: a tail that open checks with CRCs
    check_against_reference(directory, tmp_path, 450)


def test_open_reads_only_the_tail_after_the_saved_index(tmp_path: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The synced prefix is not read at all: headers are walked from the last saved entry, CRCs from the sync."""
    directory = tmp_path / "log"
    fill(directory, 0, 400, close=True)
    synced_size = next(directory.glob("streams/*/*.log")).stat().st_size
    fill(directory, 400, 450)
    walks: list[tuple[int, int | None, bool]] = []
    real_index_records = scan.index_records

    def spy(path: pathlib.Path, segment: scan.IndexedSegment, start_position: int, stop_position: int | None,
            previous_offset: int, verify_crc: bool, index_interval_bytes: int) -> tuple[int, int]:
        walks.append((start_position, stop_position, verify_crc))
        return real_index_records(path, segment, start_position, stop_position, previous_offset, verify_crc,
                                  index_interval_bytes)

    monkeypatch.setattr(scan, "index_records", spy)
    log = NodeLog.open(directory, CONFIG)
    monkeypatch.undo()
    assert len(walks) == 2
    (header_start, header_stop, header_crc), tail = walks
    assert synced_size - CONFIG.index_interval_bytes - 64 < header_start < synced_size  # 64: a record, at most
    assert (header_stop, header_crc) == (synced_size, False)
    assert tail == (synced_size, None, True)
    assert list(log.read("q")[1]) == [(i, payload_for(i)) for i in range(450)]
    log.close()


def test_a_damaged_or_stale_saved_index_falls_back_to_walking_headers(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "log"
    fill(directory, 0, 400, close=True)
    saved = next(directory.glob("streams/*")) / SAVED_INDEX_FILE
    good = saved.read_bytes()
    damaged = bytearray(good)
    damaged[5] ^= 0x10
    for case, contents in enumerate((bytes(damaged), good[:-16], b"", None)):
        scratch = tmp_path / f"case-{case}"
        shutil.copytree(directory, scratch)
        damaged_file = scratch / saved.relative_to(directory)
        if contents is None:
            damaged_file.unlink()
        else:
            damaged_file.write_bytes(contents)
        check_against_reference(scratch, tmp_path / f"reference-{case}", 400)


def test_the_saved_index_is_rewritten_after_it_was_found_unusable(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "log"
    fill(directory, 0, 400, close=True)
    saved = next(directory.glob("streams/*")) / SAVED_INDEX_FILE
    good = saved.read_bytes()
    saved.write_bytes(b"\0" * len(good))
    NodeLog.open(directory, CONFIG).close()
    assert saved.read_bytes() == good
    points = fmt.decode_recovery_point((directory / RECOVERY_POINT_FILE).read_bytes())
    assert [p.index_entries for p in points.values()] == [len(good) // fmt.SAVED_INDEX_ENTRY_BYTES]


def test_a_version_1_recovery_point_is_still_used(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "log"
    fill(directory, 0, 300, close=True)
    points = fmt.decode_recovery_point((directory / RECOVERY_POINT_FILE).read_bytes())
    body = b"".join(fmt.RECOVERY_POINT_ENTRY_V1.pack(name.encode(), p.active_base, p.synced_size_bytes)
                    for name, p in points.items())
    (directory / RECOVERY_POINT_FILE).write_bytes(
        fmt.RECOVERY_POINT_HEADER.pack(fmt.RECOVERY_POINT_MAGIC_V1, zlib.crc32(body), len(points)) + body)
    assert fmt.decode_recovery_point((directory / RECOVERY_POINT_FILE).read_bytes()) == {
        name: fmt.RecoveryPoint(p.active_base, p.synced_size_bytes) for name, p in points.items()}
    fill(directory, 300, 330)
    check_against_reference(directory, tmp_path, 330)


def test_truncation_after_the_checkpoint_is_recovered_exactly(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "log"
    fill(directory, 0, 400, close=True)
    log = NodeLog.open(directory, CONFIG)
    log.truncate_after("q", 199)
    for i in range(200, 260):
        log.append("q", payload_for(i), timestamp_ms=i)
    log.commit()
    crash(log)
    check_against_reference(directory, tmp_path, 260)


def test_segment_writes_lost_after_the_checkpoint_come_back_from_the_wal(tmp_path: pathlib.Path) -> None:
    """Power loss: the segment tail written after the checkpoint is gone; the fsynced WAL has it all."""
    directory = tmp_path / "log"
    fill(directory, 0, 400, close=True)
    segment = next(directory.glob("streams/*/*.log"))
    synced_size = segment.stat().st_size
    fill(directory, 400, 500)
    with segment.open("r+b") as handle:
        handle.truncate(synced_size + 37)  # and a torn record at the cut
    check_against_reference(directory, tmp_path, 500)


# --- reading is streamed ------------------------------------------------------------------------------------------


def test_reading_a_large_stream_holds_about_one_chunk(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, LogConfig(segment_size_bytes_max=8 << 20))
    body = b"z" * 1000
    for _ in range(20_000):  # 20 MB over three segments
        log.append("big", body)
    log.close()
    log = NodeLog.open(tmp_path)
    tracemalloc.start()
    try:
        count = sum(1 for _ in log.read("big")[1])
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    log.close()
    assert count == 20_000
    assert peak_bytes < 4 * scan.READ_CHUNK_BYTES


# --- read_many ---------------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(-5, 700), max_size=80))
def test_read_many_agrees_with_read_at(tmp_path_factory: pytest.TempPathFactory, wanted: list[int]) -> None:
    directory = tmp_path_factory.mktemp("many")
    config = LogConfig(segment_size_bytes_max=2048, index_interval_bytes=128)
    log = NodeLog.open(directory, config)
    for i in range(600):
        log.append("q", payload_for(i) * (1 + i % 50))
        if i == 400:
            log.commit()
    log.write_snapshot("q", 99, b"state")  # 0..99 are behind the snapshot; 401.. are still in the append buffer
    expected = {}
    for offset in wanted:
        with contextlib.suppress(KeyError):
            expected[offset] = log.read_at("q", offset)
    assert log.read_many("q", wanted) == expected
    assert set(expected) == {o for o in wanted if 99 < o < 600}
    assert log.read_many("absent", wanted) == {}
    log.close()


def test_read_many_spans_segments_and_gaps(tmp_path: pathlib.Path) -> None:
    log = NodeLog.open(tmp_path, LogConfig(segment_size_bytes_max=64 * 1024, index_interval_bytes=256))
    for i in range(20_000):
        log.append("q", payload_for(i) * 4)
    log.close()
    log = NodeLog.open(tmp_path)
    wanted = [*range(0, 20_000, 3), 19_999, 10, 10]
    assert log.read_many("q", wanted) == {o: payload_for(o) * 4 for o in wanted}
    log.close()


# --- sealed segment indexes decode without a loop per entry -----------------------------------------------------


@given(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 5000), st.integers(-(2**40), 2**40)), max_size=60),
       st.integers(0, 400_000), st.data())
def test_sealed_index_files_decode_as_the_reference(steps: list[tuple[int, int, int]], file_size: int,
                                                    data: st.DataObject) -> None:
    index = fmt.SparseIndex()
    relative, position = 0, 0
    for relative_step, position_step, timestamp in steps:
        relative, position = relative + relative_step, position + position_step
        index.add(relative, position, timestamp)
    index_bytes, time_bytes = index.encode_files()
    if data.draw(st.booleans()) and index_bytes:  # damage one byte of either file
        which = data.draw(st.sampled_from(["index", "time"]))
        target = bytearray(index_bytes if which == "index" else time_bytes)
        target[data.draw(st.integers(0, len(target) - 1))] ^= data.draw(st.integers(1, 255))
        index_bytes, time_bytes = (bytes(target), time_bytes) if which == "index" else (index_bytes, bytes(target))
    decoded = fmt.SparseIndex.decode_files(index_bytes, time_bytes, file_size)
    entries = fmt.decode_index(index_bytes, file_size)  # the reference: one Python step per entry
    times = fmt.decode_time_index(time_bytes)
    if entries is None or len(times) != len(entries) or any(r != t for (r, _), (_, t) in zip(entries, times, strict=True)):
        assert decoded is None
        return
    assert decoded is not None
    assert list(zip(decoded.relative_offsets, decoded.positions, strict=True)) == entries
    assert list(decoded.max_timestamps_before) == [t for t, _ in times]
