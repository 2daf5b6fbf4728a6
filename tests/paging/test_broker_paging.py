"""Single-node paging in the pure broker (node/broker/paging.py), with a tiny in-memory limit and a fake storage.

`FakeStorage` plays the runtime: it appends every Persist's records to per-stream lists (offset = index), reports
the offsets of paged-out records (`on_tail_offsets`) and answers `PageIn` effects (`on_paged_in`) until the broker
asks for nothing more. Restarts rebuild a fresh Broker from the stored records the way node/runtime/store.py does
for a long stream: definitions as records, the queue's live messages as one MessageIndexRecord.
"""

from __future__ import annotations

from array import array
from typing import Any

from node.amqp import methods as m
from node.broker.broker import Broker, BrokerConfig
from node.broker.effects import PageIn, Persist
from node.broker.records import (
    DEFINITIONS_STREAM,
    MessageIndexRecord,
    MessageRecord,
    MessageRemovedRecord,
    Record,
    TailMessageRecord,
    queue_stream,
)
from tests.broker.harness import Client, deliveries, of_type

LIMIT = 8
STREAM = queue_stream("/", "q")


class FakeStorage:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.streams: dict[str, list[Record]] = {}
        self.delivered: list[tuple[int, bool, bytes]] = []  # (delivery tag, redelivered, body)
        self.page_ins = 0
        self.max_ready_seen = 0

    def run(self, effects: list[Any]) -> list[Any]:
        """Carry out storage effects until quiet; returns every effect seen (deliveries collected too)."""
        seen: list[Any] = []
        todo = list(effects)
        while todo:
            seen.extend(todo)
            follow: list[Any] = []
            offsets: list[tuple[str, int, int]] = []
            for effect in todo:
                if isinstance(effect, Persist):
                    for record in effect.records:
                        log = self.streams.setdefault(record.stream, [])
                        log.append(record)
                        if type(record) is TailMessageRecord:
                            offsets.append((record.stream, record.msg_id, len(log) - 1))
                    follow += self.broker.on_persisted(effect.token)
                elif isinstance(effect, PageIn):
                    self.page_ins += 1
                    assert len(effect.offsets) <= LIMIT
                    records = [self.streams[effect.stream][o] for o in effect.offsets]
                    follow += self.broker.on_paged_in(effect.vhost, effect.queue, effect.request_id, records)
            for d in deliveries(todo):
                self.delivered.append((d.method.delivery_tag, d.method.redelivered, d.body))
            if offsets:
                follow += self.broker.on_tail_offsets(offsets)
            self._note_ready()
            todo = follow
        return seen

    def _note_ready(self) -> None:
        queue = self.broker.vhosts["/"].queues.get("q")
        if queue is not None:
            self.max_ready_seen = max(self.max_ready_seen, queue.machine.ready_count)

    def restart_records(self) -> list[Record]:
        """What the store hands to Broker.recover for a long queue stream: live messages as an index."""
        records = list(self.streams.get(DEFINITIONS_STREAM, []))
        live: dict[int, int] = {}
        for offset, record in enumerate(self.streams.get(STREAM, [])):
            if isinstance(record, MessageRecord) and record.properties.get("delivery_mode") == 2:
                live[record.msg_id] = offset  # (a transient record was spilled: never recovered)
            elif isinstance(record, MessageRemovedRecord):
                live.pop(record.msg_id, None)
        ids = sorted(live)
        records.append(MessageIndexRecord("/", "q", array("q", ids), array("q", [live[i] for i in ids])))
        return records


def _client(broker: Broker) -> Client:
    client = Client(broker)
    client.open(1)
    return client


def _publish_many(storage: FakeStorage, client: Client, count: int, first: int = 0) -> None:
    for n in range(first, first + count):
        storage.run(client.publish("", "q", f"m{n}".encode(), delivery_mode=2))


def test_publish_past_the_limit_consume_in_order_ack_and_restart() -> None:
    broker = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage = FakeStorage(broker)
    client = _client(broker)
    storage.run(client.call(m.ConfirmSelect()))
    storage.run(client.declare("q", durable=True))
    _publish_many(storage, client, 50)
    queue = broker.vhosts["/"].queues["q"]
    assert queue.machine.ready_count == LIMIT, "only the limit is in memory"
    assert queue.tail is not None and queue.machine.paged_count == 42
    assert len(queue.persisted_ids) == LIMIT
    ok = of_type(storage.run(client.declare("q", durable=True, passive=True)), m.QueueDeclareOk)
    assert ok[0].message_count == 50

    storage.run(client.call(m.BasicQos(prefetch_count=3)))
    storage.run(client.consume("q", "c"))
    tags_acked: set[int] = set()
    while len(tags_acked) < 30:  # ack 30 one by one: the tail pages in as the machine drains
        tag = min(t for t, _r, _b in storage.delivered if t not in tags_acked)
        storage.run(client.ack(tag))
        tags_acked.add(tag)
    assert [b for _t, _r, b in storage.delivered[:30]] == [f"m{n}".encode() for n in range(30)]
    assert not any(r for _t, r, _b in storage.delivered), "paged messages come back unflagged"
    assert storage.page_ins > 0
    assert storage.max_ready_seen <= LIMIT

    restarted = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage2 = FakeStorage(restarted)
    storage2.streams = storage.streams
    storage2.run(restarted.recover(storage.restart_records()))
    client2 = _client(restarted)
    ok = of_type(storage2.run(client2.declare("q", durable=True, passive=True)), m.QueueDeclareOk)
    assert ok[0].message_count == 20, "the 3 unacked come back too"
    storage2.run(client2.consume("q", "c", no_ack=True))
    assert [b for _t, _r, b in storage2.delivered] == [f"m{n}".encode() for n in range(30, 50)]
    assert all(r for _t, r, _b in storage2.delivered), "recovered messages are flagged redelivered"
    assert storage2.max_ready_seen <= LIMIT


def test_new_publishes_while_a_tail_exists_keep_their_order_with_transient_ones() -> None:
    broker = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage = FakeStorage(broker)
    client = _client(broker)
    storage.run(client.declare("q", durable=True))
    expected: list[bytes] = []
    for n in range(40):
        body = f"m{n}".encode()
        storage.run(client.publish("", "q", body, delivery_mode=1 if n % 5 == 0 else 2))
        expected.append(body)
    storage.run(client.consume("q", "c", no_ack=True))
    assert [b for _t, _r, b in storage.delivered] == expected
    queue = broker.vhosts["/"].queues["q"]
    assert queue.tail is None and not broker.paging
    assert not queue.persisted_ids


def test_purge_and_delete_remove_the_tail_on_disk() -> None:
    broker = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage = FakeStorage(broker)
    client = _client(broker)
    storage.run(client.declare("q", durable=True))
    _publish_many(storage, client, 30)
    ok = of_type(storage.run(client.call(m.QueuePurge(queue="q"))), m.QueuePurgeOk)
    assert ok[0].message_count == 30
    assert storage.restart_records()[-1].msg_ids.tolist() == []  # type: ignore[union-attr]
    _publish_many(storage, client, 30)
    ok2 = of_type(storage.run(client.call(m.QueueDelete(queue="q"))), m.QueueDeleteOk)
    assert ok2[0].message_count == 30
    assert storage.restart_records()[-1].msg_ids.tolist() == []  # type: ignore[union-attr]


def test_a_transient_queue_spills_past_the_limit_and_nothing_comes_back_at_restart() -> None:
    broker = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage = FakeStorage(broker)
    client = _client(broker)
    storage.run(client.declare("q", durable=True))  # transient messages in a durable queue
    storage.run(client.declare("t", auto_delete=True))  # and any message in a non-durable one
    for n in range(30):
        storage.run(client.publish("", "q", b"q%d" % n, delivery_mode=1))
        storage.run(client.publish("", "t", b"t%d" % n, delivery_mode=2 if n % 2 else 1))
    for name in ("q", "t"):
        queue = broker.vhosts["/"].queues[name]
        assert queue.machine.ready_count == LIMIT and queue.tail is not None and queue.machine.paged_count == 30 - LIMIT
    assert len([r for r in storage.streams[STREAM] if isinstance(r, TailMessageRecord)]) == 30 - LIMIT
    assert len(storage.streams[queue_stream("/", "t")]) == 30 - LIMIT

    records = storage.restart_records()
    assert records[-1].msg_ids.tolist() == []  # type: ignore[union-attr]
    restarted = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    restarted.recover([*records[:-1], *storage.streams[STREAM]])  # record by record: the broker drops them too
    assert restarted.vhosts["/"].queues["q"].machine.ready_count == 0
    assert restarted.vhosts["/"].queues["q"].tail is None and "t" not in restarted.vhosts["/"].queues

    seen = storage.run(client.consume("t", "c", no_ack=True))
    assert [b for _t, _r, b in storage.delivered] == [b"t%d" % n for n in range(30)]
    assert [d.properties.delivery_mode for d in deliveries(seen)] == [2 if n % 2 else 1 for n in range(30)]
    t_log = storage.streams[queue_stream("/", "t")]
    spilled = {r.msg_id for r in t_log if isinstance(r, TailMessageRecord)}
    assert spilled == {r.msg_id for r in t_log if isinstance(r, MessageRemovedRecord)}, "paged in: removed"
    storage.run(client.call(m.BasicCancel(consumer_tag="c")))  # auto-delete: the queue and its tail go
    assert "t" not in broker.vhosts["/"].queues and not [s for s in broker.paging if s.endswith(":t")]


def test_queues_with_limits_or_ttl_do_not_page() -> None:
    broker = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage = FakeStorage(broker)
    client = _client(broker)
    storage.run(client.declare("q", durable=True, arguments={"x-message-ttl": 60_000}))
    _publish_many(storage, client, 20)
    queue = broker.vhosts["/"].queues["q"]
    assert queue.tail is None and queue.machine.ready_count == 20


def test_messages_with_a_ttl_wait_in_memory_in_their_place_and_expire() -> None:
    broker = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage = FakeStorage(broker)
    client = _client(broker)
    storage.run(client.declare("q", durable=True))
    storage.run(client.declare("t"))
    for name in ("q", "t"):
        for n in range(20):
            expiration = "1000" if n % 4 == 3 else None
            storage.run(client.publish("", name, b"%s%d" % (name.encode(), n), delivery_mode=2, expiration=expiration))
    assert broker.vhosts["/"].queues["q"].machine.paged_held_count == 3  # ids 11, 15, 19
    records = [r for r in storage.streams[STREAM] if isinstance(r, MessageRecord)]
    assert len(records) == 20, "persistent messages of a durable queue are written, held ones too"
    assert queue_stream("/", "t") in storage.streams  # spilled, but nothing recoverable:
    assert not [r for r in storage.streams[queue_stream("/", "t")]
                if isinstance(r, MessageRecord) and r.properties.get("delivery_mode") == 2]
    client.now_ms = 5000  # the held messages (and ids 3 and 7 in memory) expire before delivery
    storage.run(client.consume("q", "c", no_ack=True))
    storage.run(client.consume("t", "d", no_ack=True))
    expected = [n for n in range(20) if n % 4 != 3]
    assert [b for _t, _r, b in storage.delivered] == [b"q%d" % n for n in expected] + [b"t%d" % n for n in expected]
    queue = broker.vhosts["/"].queues["q"]
    assert queue.tail is None and not queue.persisted_ids
    assert storage.restart_records()[-1].msg_ids.tolist() == []  # type: ignore[union-attr]
