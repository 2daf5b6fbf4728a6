"""Pure format helpers, and torn/corrupt tails cut at every byte of the last record (in memory and on disk)."""

from __future__ import annotations

import pathlib
import shutil

from hypothesis import given
from hypothesis import strategies as st

from cluster.log import LogConfig, NodeLog
from cluster.log import format as fmt


def test_record_roundtrip_and_scan() -> None:
    data = b"".join(fmt.encode_record(o, 1000 + o, bytes([o]) * o) for o in range(10))
    scanned = list(fmt.scan_records(data))
    assert [(r.offset, r.timestamp_ms, r.payload) for r in scanned] == [
        (o, 1000 + o, bytes([o]) * o) for o in range(10)]
    assert scanned[-1].position + scanned[-1].size_bytes == len(data)


@given(st.lists(st.binary(max_size=64), min_size=1, max_size=5), st.data())
def test_any_truncation_or_bit_flip_in_last_record_drops_only_it(payloads: list[bytes], data: st.DataObject) -> None:
    encoded = [fmt.encode_record(o, 0, p) for o, p in enumerate(payloads)]
    good = b"".join(encoded[:-1])
    last = encoded[-1]
    cut = data.draw(st.integers(0, len(last) - 1))
    assert len(list(fmt.scan_records(good + last[:cut]))) == len(payloads) - 1
    flip = data.draw(st.integers(0, len(last) - 1))
    corrupt = bytearray(last)
    corrupt[flip] ^= 0x40
    assert len(list(fmt.scan_records(good + bytes(corrupt)))) == len(payloads) - 1


def test_out_of_order_offsets_count_as_corruption() -> None:
    data = fmt.encode_record(5, 0, b"a") + fmt.encode_record(5, 0, b"b")
    assert [r.payload for r in fmt.scan_records(data)] == [b"a"]


def test_wal_frame_roundtrip_and_torn_tail_at_every_byte() -> None:
    frames = [fmt.encode_wal_frame(fmt.WalKind.APPEND, f"s{i}", i, 7, b"body" * i) for i in range(4)]
    frames.append(fmt.encode_wal_frame(fmt.WalKind.TRUNCATE, "s1", 0, 0, b""))
    data = b"".join(frames)
    decoded = list(fmt.scan_wal(data))
    assert [(f.kind, f.stream, f.offset, f.payload) for f in decoded][:2] == [
        (fmt.WalKind.APPEND, "s0", 0, b""), (fmt.WalKind.APPEND, "s1", 1, b"body")]
    assert decoded[-1].kind == fmt.WalKind.TRUNCATE
    prefix = len(data) - len(frames[-1])
    for cut in range(prefix, len(data)):
        assert len(list(fmt.scan_wal(data[:cut]))) == 4
        flipped = bytearray(data)
        flipped[cut] ^= 0x01
        assert len(list(fmt.scan_wal(bytes(flipped)))) == 4


def test_garbage_lengths_are_rejected_without_huge_reads() -> None:
    garbage = b"\xff" * 64
    assert list(fmt.scan_records(garbage)) == []
    assert list(fmt.scan_wal(garbage)) == []


def test_index_math() -> None:
    entries = [(10, 400), (20, 800), (35, 1300)]
    index = fmt.SparseIndex()
    for (relative, position), timestamp in zip(entries, (100, 200, 200), strict=True):
        index.add(relative, position, timestamp)
    assert index.floor_position(5) == 0
    assert index.floor_position(20) == 800
    assert index.floor_position(34) == 800
    assert index.floor_position(99) == 1300
    assert index.position_for_time(50) == 0
    assert index.position_for_time(150) == 400  # everything before entry 1 is <= 200, before entry 0 <= 100
    assert index.position_for_time(250) == 1300
    again = fmt.SparseIndex.decode_files(*index.encode_files(), 2000)
    assert again is not None and list(again.positions) == [400, 800, 1300]
    assert fmt.SparseIndex.decode_files(*index.encode_files(), 1000) is None
    index.truncate_at_position(800)
    assert list(index.relative_offsets) == [10]
    assert fmt.segment_for_offset([0, 100, 200], 150) == 1
    assert fmt.segment_for_offset([10], 5) == -1
    raw = b"".join(fmt.encode_index_entry(r, p) for r, p in entries)
    assert fmt.decode_index(raw, 2000) == entries
    assert fmt.decode_index(raw, 1000) is None  # points past the end of the segment
    assert fmt.decode_index(raw[:-1], 2000) is None
    assert fmt.segment_file_name(42, ".log") == "00000000000000000042.log"


def test_snapshot_roundtrip_and_corruption() -> None:
    blob = fmt.encode_snapshot(77, b"state")
    assert fmt.decode_snapshot(blob) == (77, b"state")
    assert fmt.decode_snapshot(blob[:-1]) is None
    assert fmt.decode_snapshot(blob[:-1] + b"X") is None


CONFIG = LogConfig(segment_size_bytes_max=1 << 20, index_interval_bytes=64, wal_size_bytes_max=1 << 30)


def _write_committed(directory: pathlib.Path, count: int) -> None:
    log = NodeLog.open(directory, CONFIG)
    for i in range(count):
        log.append("q", f"payload-{i}".encode() * 3)
    log.close()


def test_segment_torn_or_corrupt_at_every_byte_of_last_record(tmp_path: pathlib.Path) -> None:
    """With the WAL gone, a damaged last record is dropped and the file cut back; all earlier records remain.

    (Damage inside the fsynced prefix named by the recovery point is bit rot, not a torn write: open trusts that
    prefix, and reads still verify every record's CRC.)"""
    _write_committed(tmp_path / "template", 5)
    template_segment = next((tmp_path / "template").glob("streams/*/*.log")).read_bytes()
    last_size = len(fmt.encode_record(4, 0, b"payload-4" * 3))
    start = len(template_segment) - last_size
    for position in range(start, len(template_segment)):
        for damage in ("cut", "flip"):
            directory = tmp_path / f"{damage}-{position}"
            shutil.copytree(tmp_path / "template", directory)
            segment = next(directory.glob("streams/*/*.log"))
            data = bytearray(template_segment)
            if damage == "cut":
                data = data[:position]
            else:
                data[position] ^= 0xFF
            segment.write_bytes(bytes(data) + (b"" if damage == "flip" else b"\x00" * 3))
            (directory / "recovery-point").unlink()  # the damage is in bytes written after the last checkpoint
            log = NodeLog.open(directory, CONFIG)
            _, iterator = log.read("q")
            assert [o for o, _ in iterator] == [0, 1, 2, 3]
            assert segment.stat().st_size == start
            assert log.append("q", b"after") == 4
            log.close()
            assert list(NodeLog.open(directory, CONFIG).read("q")[1])[-1] == (4, b"after")


def test_wal_torn_at_every_byte_of_last_frame(tmp_path: pathlib.Path) -> None:
    """Segments lost (power loss before their fsync), WAL torn: recovery keeps every complete WAL frame."""
    log = NodeLog.open(tmp_path / "template", CONFIG)
    for i in range(4):
        log.append("q", f"p{i}".encode())
    log.commit()
    wal_file = next((tmp_path / "template").glob("wal/*.wal"))
    wal_bytes = wal_file.read_bytes()
    last_size = len(fmt.encode_wal_frame(fmt.WalKind.APPEND, "q", 3, 0, b"p3"))
    for cut in range(len(wal_bytes) - last_size, len(wal_bytes)):
        directory = tmp_path / f"cut-{cut}"
        (directory / "wal").mkdir(parents=True)
        (directory / "wal" / wal_file.name).write_bytes(wal_bytes[:cut] + b"\xab" * (cut % 5))
        recovered = NodeLog.open(directory, CONFIG)
        assert list(recovered.read("q")[1]) == [(0, b"p0"), (1, b"p1"), (2, b"p2")]
        recovered.close()
