"""Under the memory alarm, a pageable queue's messages already in memory go to disk (node/broker/paging.py).

Pure broker with `FakeStorage` (tests/paging/test_broker_paging.py): fill a durable queue past the limit with
persistent and transient messages, some delivered and requeued (flagged redelivered); set the memory alarm: the
machine shrinks to the floor and the newest messages join the front of the tail. Clearing the alarm, everything
comes back in publish order with the right flags. A restart (the store's real fold of the queue stream, and the
test's dict fold) brings back only the persistent ones, once each, in order.
"""

from __future__ import annotations

from node.amqp import methods as m
from node.broker.broker import Broker, BrokerConfig
from node.broker.paging import alarm_floor
from node.broker.records import (
    DEFINITIONS_STREAM,
    MessageIndexRecord,
    MessageRemovedRecord,
    Record,
    TailMessageRecord,
)
from node.runtime.paging_io import QueueStreamFold
from tests.broker.harness import of_type
from tests.paging.test_broker_paging import LIMIT, STREAM, FakeStorage, _client

COUNT = 30
REQUEUED = 3  # the first messages, delivered once then requeued by a channel close


def _mode(n: int) -> int:
    return 1 if n % 3 == 1 else 2


def _filled() -> tuple[Broker, FakeStorage, list[bytes]]:
    broker = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage = FakeStorage(broker)
    client = _client(broker)
    storage.run(client.declare("q", durable=True))
    bodies = [f"m{n}".encode() for n in range(COUNT)]
    for n, body in enumerate(bodies):
        storage.run(client.publish("", "q", body, delivery_mode=_mode(n)))
    storage.run(client.open(2))
    storage.run(client.call(m.BasicQos(prefetch_count=REQUEUED), channel=2))
    storage.run(client.consume("q", "c2", channel=2))
    assert [b for _t, _r, b in storage.delivered] == bodies[:REQUEUED]
    storage.run(client.close_channel(2))  # requeued: redelivered from now on
    storage.delivered.clear()
    return broker, storage, bodies


def _real_fold_records(storage: FakeStorage) -> list[Record]:
    """What node/runtime's store hands to Broker.recover for the queue stream (its own fold, in log order)."""
    fold = QueueStreamFold()
    for offset, record in enumerate(storage.streams[STREAM]):
        fold.add(offset, record)
    return [*storage.streams.get(DEFINITIONS_STREAM, []), *fold.records()]


def test_the_alarm_spills_the_newest_messages_and_order_and_flags_survive() -> None:
    broker, storage, bodies = _filled()
    queue = broker.vhosts["/"].queues["q"]
    assert queue.machine.ready_count == LIMIT and queue.tail is not None and queue.machine.paged_count == COUNT - LIMIT

    storage.run(broker.set_alarm("memory", True))
    floor = alarm_floor(LIMIT)
    assert queue.machine.ready_count == floor and queue.machine.ready_msg_ids() == [1]
    assert queue.tail is not None and queue.machine.paged_count == COUNT - floor
    log = storage.streams[STREAM]
    respilled = [r.msg_id for r in log if isinstance(r, TailMessageRecord) and r.msg_id <= LIMIT]
    assert respilled == list(range(floor + 1, LIMIT + 1)), "written again in msg id order"
    assert not [r for r in log if isinstance(r, MessageRemovedRecord)], "one record a message: the copy moves it"
    storage.run(broker.tick(1_000))
    assert queue.machine.ready_count == floor, "no page-in above the floor while the alarm is on"
    client = _client(broker)
    ok = of_type(storage.run(client.declare("q", durable=True, passive=True)), m.QueueDeclareOk)
    assert ok[0].message_count == COUNT

    storage.run(broker.set_alarm("memory", False))
    assert queue.machine.ready_count == LIMIT, "page-in resumes"
    storage.run(client.consume("q", "c", no_ack=True))
    assert [b for _t, _r, b in storage.delivered] == bodies
    assert [r for _t, r, _b in storage.delivered] == [n < REQUEUED for n in range(COUNT)]
    assert queue.tail is None and not broker.paging
    assert _real_fold_records(storage)[-1].msg_ids.tolist() == [], "every copy is dead once consumed"  # type: ignore[union-attr]


def test_consumers_still_get_every_message_while_the_alarm_stays_on() -> None:
    broker, storage, bodies = _filled()
    storage.run(broker.set_alarm("memory", True))
    client = _client(broker)
    storage.run(client.consume("q", "c", no_ack=True))
    assert [b for _t, _r, b in storage.delivered] == bodies
    assert storage.max_ready_seen <= LIMIT


def test_a_restart_under_the_alarm_brings_back_the_persistent_messages_once_in_order() -> None:
    broker, storage, bodies = _filled()
    storage.run(broker.set_alarm("memory", True))
    persistent = [body for n, body in enumerate(bodies) if _mode(n) == 2]
    for records in (_real_fold_records(storage), storage.restart_records()):
        index = records[-1]
        assert isinstance(index, MessageIndexRecord)
        assert sorted(index.msg_ids.tolist()) == [n + 1 for n in range(COUNT) if _mode(n) == 2]
        restarted = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
        storage2 = FakeStorage(restarted)
        storage2.streams = storage.streams
        storage2.run(restarted.recover(records))
        client2 = _client(restarted)
        storage2.run(client2.consume("q", "c", no_ack=True))
        assert [b for _t, _r, b in storage2.delivered] == persistent
        assert all(r for _t, r, _b in storage2.delivered), "recovered messages are flagged redelivered"


def test_an_unsorted_recovered_index_is_put_in_msg_id_order() -> None:
    broker, storage, _bodies = _filled()
    storage.run(broker.set_alarm("memory", True))
    index = _real_fold_records(storage)[-1]
    assert isinstance(index, MessageIndexRecord)
    ids = index.msg_ids.tolist()
    assert ids != sorted(ids), "the store's fold lists re-spilled copies after newer messages"
    restarted = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    restarted.recover(_real_fold_records(storage))
    tail = restarted.vhosts["/"].queues["q"].tail
    assert tail is not None and list(tail.msg_ids) == sorted(ids)


def test_the_spill_stops_at_a_message_with_a_per_message_ttl() -> None:
    broker = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage = FakeStorage(broker)
    client = _client(broker)
    storage.run(client.declare("q", durable=True))
    for n in range(LIMIT - 1):
        storage.run(client.publish("", "q", b"m%d" % n, delivery_mode=2, expiration="60000" if n == 3 else None))
    storage.run(broker.set_alarm("memory", True))
    queue = broker.vhosts["/"].queues["q"]
    assert queue.machine.ready_msg_ids() == [1, 2, 3, 4], "ids 5..7 spilled; 4 has a TTL and stays"
    storage.run(broker.set_alarm("memory", False))
    storage.run(client.consume("q", "c", no_ack=True))
    assert [b for _t, _r, b in storage.delivered] == [b"m%d" % n for n in range(LIMIT - 1)]


def test_purge_under_the_alarm_removes_the_spilled_messages_on_disk_too() -> None:
    broker, storage, _bodies = _filled()
    storage.run(broker.set_alarm("memory", True))
    client = _client(broker)
    ok = of_type(storage.run(client.call(m.QueuePurge(queue="q"))), m.QueuePurgeOk)
    assert ok[0].message_count == COUNT
    assert _real_fold_records(storage)[-1].msg_ids.tolist() == []  # type: ignore[union-attr]
    assert storage.restart_records()[-1].msg_ids.tolist() == []  # type: ignore[union-attr]
    assert broker.vhosts["/"].queues["q"].tail is None and not broker.paging
