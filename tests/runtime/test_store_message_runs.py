"""Store.persist's per-message path (runs of MessageRecords appended with `NodeLog.append_run`, a run of removals
as one `MessagesRemovedRecord`) against the record-by-record path: the same live messages, the same recovery."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import cbor2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.log import NodeLog
from node.broker.records import (
    MessageRecord,
    MessageRemovedRecord,
    MessagesRemovedRecord,
    Record,
    encode_record,
    encode_removed_many,
    encode_removed_run,
    from_cbor,
)
from node.runtime.store import Store
from node.runtime.store_compaction import CompactionPolicy

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


def _live(store: Store) -> dict[str, list[int]]:
    return {stream: sorted(book.live_messages) for stream, book in store.books.items() if book.live_messages}


def _recovered_live(directory: Path) -> dict[str, list[tuple[int, bytes]]]:
    """What a restart gives back: per queue, the live messages (id, body) in order."""
    store = Store.open(directory)
    live: dict[str, dict[int, bytes]] = {}
    for record in store.recover():
        if type(record) is MessageRecord:
            live.setdefault(record.queue, {})[record.msg_id] = record.body
        elif type(record) is MessageRemovedRecord:
            live.get(record.queue, {}).pop(record.msg_id, None)
    store.log.close()
    return {queue: sorted(messages.items()) for queue, messages in live.items() if messages}


def _close(store: Store) -> None:
    store.log.commit()
    for job in store.jobs:
        job()
    store.log.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_runs_match_the_record_by_record_path(batch_specs: list[list[tuple[str, str, int]]]) -> None:
    with tempfile.TemporaryDirectory() as fast_dir, tempfile.TemporaryDirectory() as slow_dir:
        fast = Store(NodeLog.open(Path(fast_dir)), POLICY, FixedClock())
        slow = Store(NodeLog.open(Path(slow_dir)), POLICY, FixedClock())
        for token, spec in enumerate(batch_specs, 1):
            records = [_record(kind, queue, msg_id) for kind, queue, msg_id in spec]
            fast.persist(token, records)
            slow._persist_records(records)  # what persist did before the per-message path, record by record
            slow.pending_tokens.append(token)
            assert _live(fast) == _live(slow)
            assert fast.pending_tokens == slow.pending_tokens
        _close(fast)
        _close(slow)
        assert _recovered_live(Path(fast_dir)) == _recovered_live(Path(slow_dir))


def test_a_run_of_removals_is_one_record_counted_as_its_removals(tmp_path: Path) -> None:
    store = Store(NodeLog.open(tmp_path), POLICY, FixedClock())
    store.persist(1, [_record("msg", "a", i) for i in range(3)])
    store.persist(2, [_record("removed", "a", i) for i in (0, 1, 2, 7, 8)])  # drains the stream
    book = store.books["queue:/:a"]
    assert book.truncated_through == 3  # offsets 0-2 the messages, 3 the removals: the snapshot covers them all
    assert (book.last_offset, book.records_since_snapshot, len(book.live_messages)) == (3, 0, 0)
    assert len(store.jobs) == 1
    payload = store.log.read_at("queue:/:a", 3)
    assert from_cbor(cbor2.loads(payload)) == MessagesRemovedRecord("/", "a", (0, 1, 2, 7, 8))
    store.log.close()


def test_encode_removed_run_is_encode_record_of_each() -> None:
    for ids in ([0, 1, 23, 24, 255, 256, 65535, 65536, 2**32, 2**40], [70_000, 70_001, 2**32 - 1]):
        for vhost, queue in itertools.product(["/", "v"], ["q", "a" * 200]):
            assert encode_removed_run(vhost, queue, ids) == [
                encode_record(MessageRemovedRecord(vhost, queue, i)) for i in ids]
            many = MessagesRemovedRecord(vhost, queue, tuple(ids))
            assert encode_removed_many(vhost, queue, ids) == encode_record(many) == cbor2.dumps(many.to_cbor())
            assert from_cbor(cbor2.loads(encode_record(many))) == many
            assert many.expand() == [MessageRemovedRecord(vhost, queue, i) for i in ids]


