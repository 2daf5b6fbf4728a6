"""RabbitMQ classic-queue features: TTL, dead lettering, length limits, priorities, SAC, delivery limit, dedup."""

from __future__ import annotations

from cluster.queue import (
    Accepted,
    ActiveConsumerChanged,
    Attach,
    DeadLetter,
    Deliver,
    Detach,
    Discard,
    Dropped,
    Duplicate,
    Enqueue,
    Expire,
    Get,
    GetEmpty,
    MsgId,
    Queue,
    QueueArgs,
    Recover,
    Rejected,
    Return,
    Settle,
)
from tests.queue.helpers import bodies, delivered, msg

DLX = QueueArgs(dead_letter_exchange="dlx")


# --- TTL ---------------------------------------------------------------------------------------------------------


def test_queue_ttl_expires_ready_messages_at_now() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=100, dead_letter_exchange="dlx"))
    queue.apply(Enqueue(msg("a"), 1000))
    queue.apply(Enqueue(msg("b"), 1050))
    assert queue.next_expiry_ms() == 1100
    assert queue.apply(Expire(1099)) == []
    (dead,) = queue.apply(Expire(1100))
    assert isinstance(dead, DeadLetter)
    assert (dead.reason, dead.msg_id, dead.message.payload) == ("expired", 1, b"a")
    assert queue.next_expiry_ms() == 1150
    assert queue.ready_count == 1


def test_per_message_ttl_min_of_both_and_expiry_not_only_at_head() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=1000))
    queue.apply(Enqueue(msg("long"), 0))
    queue.apply(Enqueue(msg("short", ttl_ms=10), 0))
    queue.apply(Enqueue(msg("longer", ttl_ms=5000), 0))
    assert queue.next_expiry_ms() == 10
    assert queue.apply(Expire(10)) == [Dropped(MsgId(2), "expired")]
    assert queue.ready_msg_ids() == [1, 3]
    assert queue.apply(Expire(1000)) == [Dropped(MsgId(1), "expired"), Dropped(MsgId(3), "expired")]
    assert queue.next_expiry_ms() is None


def test_expired_messages_are_never_delivered_even_without_expire() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=50))
    queue.apply(Enqueue(msg("old"), 0))
    queue.apply(Enqueue(msg("new"), 40))
    effects = queue.apply(Attach("c", 60))
    assert effects[0] == Dropped(MsgId(1), "expired")
    assert bodies(effects) == [b"new"]


def test_ttl_zero_goes_to_a_waiting_consumer_else_expires() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=0))
    assert queue.apply(Enqueue(msg("lost"), 5))[1:] == [Dropped(MsgId(1), "expired")]
    queue.apply(Attach("c", 5))
    assert bodies(queue.apply(Enqueue(msg("taken"), 6))) == [b"taken"]


def test_unacked_do_not_expire_and_returned_keep_original_expiry() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=100))
    queue.apply(Enqueue(msg("a"), 0))
    queue.apply(Get("g", no_ack=False, now_ms=10))
    assert queue.apply(Expire(500)) == []
    assert queue.apply(Return("g", [MsgId(1)], 600)) == [Dropped(MsgId(1), "expired")]
    assert queue.ready_count == 0


def test_time_never_goes_back() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=100))
    queue.apply(Expire(1000))
    queue.apply(Enqueue(msg("a"), 10))  # stale clock: enqueue time is clamped to 1000
    assert queue.next_expiry_ms() == 1100


# --- dead lettering and discard ----------------------------------------------------------------------------------


def test_discard_dead_letters_with_reason_rejected() -> None:
    queue = Queue("q", DLX)
    queue.apply(Enqueue(msg("a"), 0))
    queue.apply(Attach("c", 0))
    (dead,) = queue.apply(Discard("c", [MsgId(1)], 0))
    assert isinstance(dead, DeadLetter)
    assert (dead.reason, dead.delivery_count) == ("rejected", 0)
    assert queue.unacked_count == 0


def test_discard_without_dlx_drops() -> None:
    queue = Queue("q")
    queue.apply(Enqueue(msg("a"), 0))
    queue.apply(Attach("c", 0))
    assert queue.apply(Discard("c", [MsgId(1)], 0)) == [Dropped(MsgId(1), "rejected")]


def test_default_exchange_is_a_valid_dlx() -> None:
    queue = Queue("q", QueueArgs(dead_letter_exchange="", dead_letter_routing_key="other"))
    queue.apply(Enqueue(msg("a"), 0))
    queue.apply(Attach("c", 0))
    (dead,) = queue.apply(Discard("c", [MsgId(1)], 0))
    assert isinstance(dead, DeadLetter)


# --- length limits -----------------------------------------------------------------------------------------------


def test_max_length_drop_head_dead_letters_oldest() -> None:
    queue = Queue("q", QueueArgs(max_length=2, dead_letter_exchange="dlx"))
    for body in ("a", "b"):
        queue.apply(Enqueue(msg(body), 0))
    effects = queue.apply(Enqueue(msg("c"), 0))
    assert isinstance(effects[0], Accepted)
    assert isinstance(effects[1], DeadLetter)
    assert (effects[1].reason, effects[1].msg_id) == ("maxlen", 1)
    assert queue.ready_msg_ids() == [2, 3]


def test_max_length_counts_ready_only_and_consumers_drain_first() -> None:
    queue = Queue("q", QueueArgs(max_length=0))
    queue.apply(Attach("c", 0, prefetch=1))
    first = queue.apply(Enqueue(msg("a"), 0))
    assert bodies(first) == [b"a"]
    assert queue.apply(Enqueue(msg("b"), 0))[1:] == [Dropped(MsgId(2), "maxlen")]


def test_max_length_bytes_drop_head() -> None:
    queue = Queue("q", QueueArgs(max_length_bytes=25))
    queue.apply(Enqueue(msg("a", size_bytes=10), 0))
    queue.apply(Enqueue(msg("b", size_bytes=10), 0))
    effects = queue.apply(Enqueue(msg("c", size_bytes=10), 0))
    assert effects[1:] == [Dropped(MsgId(1), "maxlen")]
    assert queue.ready_bytes == 20


def test_reject_publish_refuses_without_enqueue() -> None:
    queue = Queue("q", QueueArgs(max_length=1, overflow="reject-publish", dead_letter_exchange="dlx"))
    queue.apply(Enqueue(msg("a"), 0, "p", 1))
    assert queue.apply(Enqueue(msg("b"), 0, "p", 2)) == [Rejected("p", 2, "maxlen")]
    assert queue.ready_msg_ids() == [1]
    # A rejected sequence is not remembered: the retry is evaluated again once there is room.
    queue.apply(Get("g", no_ack=True, now_ms=0))
    assert isinstance(queue.apply(Enqueue(msg("b"), 0, "p", 2))[0], Accepted)


def test_reject_publish_bytes() -> None:
    queue = Queue("q", QueueArgs(max_length_bytes=15, overflow="reject-publish"))
    queue.apply(Enqueue(msg("a", size_bytes=10), 0))
    assert queue.apply(Enqueue(msg("b", size_bytes=10), 0)) == [Rejected(None, None, "maxlen")]
    assert isinstance(queue.apply(Enqueue(msg("c", size_bytes=5), 0))[0], Accepted)


def test_reject_publish_dlx_rejects_and_dead_letters() -> None:
    queue = Queue("q", QueueArgs(max_length=0, overflow="reject-publish-dlx", dead_letter_exchange="dlx"))
    rejected, dead = queue.apply(Enqueue(msg("a"), 0, "p", 7))
    assert rejected == Rejected("p", 7, "maxlen")
    assert isinstance(dead, DeadLetter)
    assert (dead.reason, dead.msg_id, dead.delivery_count) == ("maxlen", None, 0)


# --- priorities --------------------------------------------------------------------------------------------------


def test_message_priorities_higher_first_fifo_within_and_capped() -> None:
    queue = Queue("q", QueueArgs(max_priority=5))
    for body, priority in (("low1", 0), ("hi1", 9), ("mid", 3), ("hi2", 5), ("low2", 0), ("neg", -1)):
        queue.apply(Enqueue(msg(body, priority=priority), 0))
    assert bodies(queue.apply(Attach("c", 0))) == [b"hi1", b"hi2", b"mid", b"low1", b"low2", b"neg"]


def test_priorities_ignored_without_max_priority() -> None:
    queue = Queue("q")
    queue.apply(Enqueue(msg("a", priority=0), 0))
    queue.apply(Enqueue(msg("b", priority=9), 0))
    assert bodies(queue.apply(Attach("c", 0))) == [b"a", b"b"]


def test_returned_high_priority_goes_before_ready_low() -> None:
    queue = Queue("q", QueueArgs(max_priority=2))
    queue.apply(Enqueue(msg("hi", priority=2), 0))
    queue.apply(Get("g", no_ack=False, now_ms=0))
    queue.apply(Enqueue(msg("lo", priority=0), 0))
    queue.apply(Return("g", [MsgId(1)], 0))
    assert queue.ready_msg_ids() == [1, 2]


# --- consumer priorities -----------------------------------------------------------------------------------------


def test_higher_priority_consumer_served_while_it_has_capacity() -> None:
    queue = Queue("q")
    queue.apply(Attach("low", 0))
    queue.apply(Attach("high", 0, prefetch=2, priority=10))
    out = []
    for i in range(4):
        out += delivered(queue.apply(Enqueue(msg(f"m{i}"), 0)))
    assert out == [("high", 1), ("high", 2), ("low", 3), ("low", 4)]
    queue.apply(Settle("high", [MsgId(1)]))
    assert delivered(queue.apply(Enqueue(msg("x"), 0))) == [("high", 5)]


# --- single active consumer --------------------------------------------------------------------------------------


def test_single_active_consumer_takeover_by_priority_then_age() -> None:
    queue = Queue("q", QueueArgs(single_active_consumer=True))
    assert queue.apply(Attach("first", 0)) == [ActiveConsumerChanged("first")]
    queue.apply(Attach("second", 0))
    queue.apply(Attach("third", 0, priority=1))
    queue.apply(Attach("fourth", 0))
    for i in range(3):
        assert delivered(queue.apply(Enqueue(msg(f"m{i}"), 0))) == [("first", i + 1)]
    effects = queue.apply(Detach("first", 0))
    assert effects[0] == ActiveConsumerChanged("third")
    assert [(e.consumer_id, e.msg_id, e.redelivered) for e in effects if isinstance(e, Deliver)] == [
        ("third", 1, True),
        ("third", 2, True),
        ("third", 3, True),
    ]
    assert queue.apply(Detach("third", 0))[0] == ActiveConsumerChanged("second")
    assert queue.active_consumer == "second"
    queue.apply(Detach("second", 0))
    assert queue.apply(Detach("fourth", 0))[0] == ActiveConsumerChanged(None)
    assert queue.active_consumer is None


# --- delivery limit ----------------------------------------------------------------------------------------------


def test_delivery_limit_dead_letters_poison_message() -> None:
    queue = Queue("q", QueueArgs(delivery_limit=2, dead_letter_exchange="dlx"))
    queue.apply(Enqueue(msg("poison"), 0))
    queue.apply(Attach("c", 0, prefetch=1))
    counts = []
    for _ in range(2):
        effects = queue.apply(Return("c", [MsgId(1)], 0))
        counts += [e.delivery_count for e in effects if isinstance(e, Deliver)]
    assert counts == [1, 2]
    (dead,) = queue.apply(Return("c", [MsgId(1)], 0))
    assert isinstance(dead, DeadLetter)
    assert (dead.reason, dead.delivery_count) == ("delivery_limit", 3)


def test_delivery_limit_counts_detach_and_drops_without_dlx() -> None:
    queue = Queue("q", QueueArgs(delivery_limit=0))
    queue.apply(Enqueue(msg("a"), 0))
    queue.apply(Attach("c", 0))
    assert queue.apply(Detach("c", 0)) == [Dropped(MsgId(1), "delivery_limit")]


# --- publisher dedup ---------------------------------------------------------------------------------------------


def test_duplicate_sequence_is_not_enqueued_twice() -> None:
    queue = Queue("q")
    assert queue.apply(Enqueue(msg("a"), 0, "p1", 1)) == [Accepted("p1", 1, MsgId(1))]
    assert queue.apply(Enqueue(msg("a"), 0, "p1", 1)) == [Duplicate("p1", 1)]
    assert queue.apply(Enqueue(msg("b"), 0, "p2", 1)) == [Accepted("p2", 1, MsgId(2))]
    assert queue.apply(Enqueue(msg("c"), 0, "p1", 5)) == [Accepted("p1", 5, MsgId(3))]
    assert queue.apply(Enqueue(msg("old"), 0, "p1", 4)) == [Duplicate("p1", 4)]
    assert queue.ready_count == 3


def test_dedup_tracks_bounded_publishers_evicting_least_recent() -> None:
    queue = Queue("q", publishers_max=2)
    queue.apply(Enqueue(msg(), 0, "a", 1))
    queue.apply(Enqueue(msg(), 0, "b", 1))
    queue.apply(Enqueue(msg(), 0, "a", 2))  # a is now the most recent
    queue.apply(Enqueue(msg(), 0, "c", 1))  # evicts b
    assert queue.apply(Enqueue(msg(), 0, "a", 2)) == [Duplicate("a", 2)]
    assert isinstance(queue.apply(Enqueue(msg(), 0, "b", 1))[0], Accepted)


# --- recover -----------------------------------------------------------------------------------------------------


def test_recover_rebuilds_ready_redelivered_in_order() -> None:
    queue = Queue("q")
    queue.apply(Recover(MsgId(7), msg("b"), 2))
    queue.apply(Recover(MsgId(3), msg("a"), 0))
    assert queue.apply(Enqueue(msg("new"), 0)) == [Accepted(None, None, MsgId(8))]
    effects = queue.apply(Attach("c", 0))
    assert [(e.msg_id, e.redelivered, e.delivery_count) for e in effects if isinstance(e, Deliver)] == [
        (3, True, 0),
        (7, True, 2),
        (8, False, 0),
    ]


def test_recover_with_past_expiry_expires() -> None:
    queue = Queue("q")
    queue.apply(Expire(100))
    assert queue.apply(Recover(MsgId(1), msg("a"), 0, expiry_ms=50)) == [Dropped(MsgId(1), "expired")]
    assert queue.apply(Get("g", True, 100)) == [GetEmpty("g")]


def test_queue_ttl_compact_messages_expire_in_order_across_levels() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=100, max_priority=2))
    queue.apply(Enqueue(msg("lo", priority=0), 0))  # 1: expires 100 (compact)
    queue.apply(Enqueue(msg("hi", priority=2), 5))  # 2: expires 105 (compact)
    queue.apply(Enqueue(msg("short", priority=0, ttl_ms=20), 10))  # 3: expires 30 (heap)
    queue.apply(Enqueue(msg("long", priority=2, ttl_ms=500), 10))  # 4: queue TTL wins, expires 110
    assert queue.next_expiry_ms() == 30
    assert queue.apply(Expire(30)) == [Dropped(MsgId(3), "expired")]
    assert queue.next_expiry_ms() == 100
    assert queue.apply(Expire(200)) == [
        Dropped(MsgId(1), "expired"),
        Dropped(MsgId(2), "expired"),
        Dropped(MsgId(4), "expired"),
    ]
    assert queue.next_expiry_ms() is None
    assert queue.ready_count == 0


def test_queue_ttl_compact_message_keeps_expiry_through_return_and_restore() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=100))
    queue.apply(Enqueue(msg("a"), 0))
    queue.apply(Enqueue(msg("b"), 50))
    queue.apply(Get("g", no_ack=False, now_ms=60))
    queue.apply(Return("g", [MsgId(1)], 70))
    restored = Queue.restore(queue.snapshot())
    for machine in (queue, restored):
        assert machine.next_expiry_ms() == 100
        assert machine.apply(Expire(100)) == [Dropped(MsgId(1), "expired")]
        assert machine.next_expiry_ms() == 150
