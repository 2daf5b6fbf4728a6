"""Store.persist's per-message path (runs of MessageRecords / MessageRemovedRecords appended with
`NodeLog.append_run`) against the record-by-record path: same log contents, same bookkeeping, same compactions."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.log import NodeLog
from node.broker.records import MessageRecord, MessageRemovedRecord, Record, encode_record, encode_removed_run
from node.runtime.store import CompactionPolicy, Store

POLICY = CompactionPolicy(queue_records_min=5, interval_s=0)  # compactions happen inside short sequences


class FixedClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _record(kind: str, queue: str, msg_id: int) -> Record:
    if kind == "msg":
        return MessageRecord("/", queue, msg_id, "", queue, {"delivery_mode": 2}, b"body-%d" % msg_id)
    return MessageRemovedRecord("/", queue, msg_id)


batches = st.lists(
    st.lists(st.tuples(st.sampled_from(["msg", "removed"]), st.sampled_from(["a", "b"]), st.integers(0, 12)),
             max_size=12),
    min_size=1, max_size=8)


def _state(store: Store) -> dict[str, Any]:
    books = {stream: (book.last_offset, book.records_since_snapshot, book.bytes_since_snapshot,
                      sorted(book.live_messages), book.truncated_through, book.last_snapshot_s)
             for stream, book in store.books.items()}
    return {"books": books, "candidates": sorted(store.candidates), "jobs": len(store.jobs),
            "tokens": list(store.pending_tokens)}


def _contents(store: Store) -> dict[str, list[tuple[int, bytes]]]:
    store.log.commit()
    for job in store.jobs:
        job()
    out = {}
    for stream in store.log.streams():
        snapshot, entries = store.log.read(stream)
        out[stream] = [(-1, snapshot or b""), *entries]
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_runs_match_the_record_by_record_path(batch_specs: list[list[tuple[str, str, int]]]) -> None:
    with tempfile.TemporaryDirectory() as fast_dir, tempfile.TemporaryDirectory() as slow_dir:
        fast = Store(NodeLog.open(Path(fast_dir)), POLICY, FixedClock())
        slow = Store(NodeLog.open(Path(slow_dir)), POLICY, FixedClock())
        slow_persist = slow._persist_records
        for token, spec in enumerate(batch_specs, 1):
            records = [_record(kind, queue, msg_id) for kind, queue, msg_id in spec]
            fast.persist(token, records)
            slow_persist(records)  # what persist did before the per-message path, record by record
            slow.pending_tokens.append(token)
            assert _state(fast) == _state(slow)
        assert _contents(fast) == _contents(slow)
        fast.log.close()
        slow.log.close()


def test_a_removal_run_that_drains_the_stream_plans_the_compaction_at_that_record(tmp_path: Path) -> None:
    store = Store(NodeLog.open(tmp_path), POLICY, FixedClock())
    store.persist(1, [_record("msg", "a", i) for i in range(3)])
    store.persist(2, [_record("removed", "a", i) for i in (0, 1, 2, 7, 8)])  # drained at the third
    book = store.books["queue:/:a"]
    assert book.truncated_through == 5  # offsets 0-2 messages, 3-5 removals: the snapshot covers through 5
    assert (book.last_offset, book.records_since_snapshot) == (7, 2)
    assert len(store.jobs) == 1
    store.log.close()


def test_encode_removed_run_is_encode_record_of_each() -> None:
    ids = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32, 2**40]
    for vhost, queue in itertools.product(["/", "v"], ["q", "a" * 200]):
        assert encode_removed_run(vhost, queue, ids) == [
            encode_record(MessageRemovedRecord(vhost, queue, i)) for i in ids]
