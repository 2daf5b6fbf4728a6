"""The machine's usage rules (cluster/queue/usage.py): auto-delete (`QueueUnused`) and x-expires (`QueueExpired`),
the `Cancel` and `Declare` commands, their wire forms (bytes kept below), and entries and a replica snapshot
written before them (by f82a566, bytes kept below) decoding and restoring to the same behaviour."""

from __future__ import annotations

from typing import Any

from cluster.queue import (
    ActiveConsumerChanged,
    Attach,
    Cancel,
    Declare,
    Deliver,
    Detach,
    Enqueue,
    Expire,
    Get,
    Proposal,
    Queue,
    QueueArgs,
    QueuedMessage,
    QueueExpired,
    QueueUnused,
    ReplicatedQueue,
    SetArgs,
    Settle,
    decode_proposal,
    encode_proposal,
)
from cluster.queue.ids import ConsumerId

AUTO = QueueArgs(auto_delete=True)


def _msg(body: str = "m") -> QueuedMessage:
    return QueuedMessage(body, 1, False)


def _unused(effects: list[Any]) -> bool:
    return any(type(e) is QueueUnused for e in effects)


def _expired(effects: list[Any]) -> bool:
    return any(type(e) is QueueExpired for e in effects)


# --- auto-delete --------------------------------------------------------------------------------------------


def test_an_auto_delete_queue_that_never_had_a_consumer_is_never_unused() -> None:
    q = Queue("q", AUTO)
    for command in (Declare(1), Enqueue(_msg(), 2), Get("g", False, 3), Detach("g", 4), Detach("nobody", 5),
                    Cancel("nobody", 6), Expire(10_000)):
        assert not _unused(q.apply(command))
    assert not q.unused and not q.had_consumer


def test_the_last_consumer_leaving_makes_it_unused_once() -> None:
    q = Queue("q", AUTO)
    q.apply(Attach("a", 1, credit=10))
    q.apply(Attach("b", 1, credit=10))
    assert not _unused(q.apply(Detach("a", 2)))
    assert _unused(q.apply(Detach("b", 3)))
    assert q.unused
    assert not _unused(q.apply(Detach("b", 4)))  # (already gone: no second report)


def test_without_auto_delete_nothing_is_reported() -> None:
    q = Queue("q")
    q.apply(Attach("a", 1, credit=10))
    assert not _unused(q.apply(Detach("a", 2)))
    assert not q.unused


def test_a_cancelled_consumer_with_unacked_messages_no_longer_counts() -> None:
    q = Queue("q", AUTO)
    q.apply(Attach("a", 1, credit=10))
    delivered = [e for e in q.apply(Enqueue(_msg("x"), 2)) if type(e) is Deliver]
    assert [d.consumer_id for d in delivered] == ["a"]
    effects = q.apply(Cancel("a", 3))
    assert _unused(effects) and q.consumer_count == 0
    assert q.unacked_msg_ids("a") == [delivered[0].msg_id]  # kept until settled
    assert not [e for e in q.apply(Enqueue(_msg("y"), 4)) if type(e) is Deliver]  # no more deliveries
    q.apply(Settle("a", (delivered[0].msg_id,)))
    assert q.unacked_count == 0 and q.ready_count == 1
    assert not _unused(q.apply(Detach("a", 5)))  # (its channel closing later: nothing more to report)


def test_cancel_then_detach_returns_the_unacked() -> None:
    q = Queue("q")
    q.apply(Attach("a", 1, credit=10))
    msg_id = next(e.msg_id for e in q.apply(Enqueue(_msg(), 2)) if type(e) is Deliver)
    q.apply(Cancel("a", 3))
    q.apply(Detach("a", 4))
    assert q.ready_msg_ids() == [msg_id] and q.unacked_count == 0


def test_cancel_of_the_single_active_consumer_hands_over() -> None:
    q = Queue("q", QueueArgs(single_active_consumer=True))
    q.apply(Attach("a", 1, credit=10))
    q.apply(Attach("b", 1, credit=10))
    q.apply(Enqueue(_msg(), 2))
    effects = q.apply(Cancel("a", 3))
    assert ActiveConsumerChanged("b") in effects
    assert [e.consumer_id for e in q.apply(Enqueue(_msg(), 4)) if type(e) is Deliver] == ["b"]


def test_auto_delete_is_kept_as_declared_through_set_args() -> None:
    q = Queue("q", AUTO)
    q.apply(SetArgs(QueueArgs(max_length=5), 1))
    assert q.args.auto_delete and q.args.max_length == 5
    q.apply(Attach("a", 2))
    assert _unused(q.apply(Detach("a", 3)))


# --- x-expires ----------------------------------------------------------------------------------------------


def test_x_expires_counts_from_the_last_use() -> None:
    q = Queue("q", QueueArgs(expires_ms=500))
    q.apply(Declare(1000))
    assert q.next_expiry_ms() == 1500
    q.apply(Enqueue(_msg(), 1100))  # publishing is no use
    assert q.next_expiry_ms() == 1500
    assert not _expired(q.apply(Expire(1499)))
    q.apply(Get("g", True, 1600))  # a basic.get is
    assert q.next_expiry_ms() == 2100
    q.apply(Declare(1800))  # and a declare
    assert q.next_expiry_ms() == 2300
    q.apply(Declare(1700))  # (time never goes back: the machine's clock is 1800)
    assert q.next_expiry_ms() == 2300
    assert not _expired(q.apply(Expire(2299)))
    assert _expired(q.apply(Expire(2300)))


def test_a_consumer_keeps_the_queue_and_its_leaving_starts_the_period() -> None:
    q = Queue("q", QueueArgs(expires_ms=500))
    q.apply(Declare(0))
    q.apply(Attach("a", 100))
    assert q.next_expiry_ms() is None
    assert not _expired(q.apply(Expire(10_000)))
    q.apply(Detach("a", 10_000))
    assert q.next_expiry_ms() == 10_500
    q.apply(Attach("b", 10_100))
    q.apply(Cancel("b", 10_200))  # a cancel is a use too
    assert q.next_expiry_ms() == 10_700
    assert _expired(q.apply(Expire(10_700)))


def test_next_expiry_is_the_earlier_of_message_ttl_and_x_expires() -> None:
    q = Queue("q", QueueArgs(expires_ms=1000, message_ttl_ms=100))
    q.apply(Declare(0))
    q.apply(Enqueue(_msg(), 50))
    assert q.next_expiry_ms() == 150
    q.apply(Expire(150))
    assert q.next_expiry_ms() == 1000


def test_a_policy_giving_x_expires_starts_a_new_period() -> None:
    q = Queue("q")
    q.apply(Declare(0))
    q.apply(Expire(10_000))
    assert q.next_expiry_ms() is None
    q.apply(SetArgs(QueueArgs(expires_ms=500), 20_000))
    assert q.next_expiry_ms() == 20_500
    q.apply(SetArgs(QueueArgs(expires_ms=500), 30_000))  # the same x-expires again: no new period
    assert q.next_expiry_ms() == 20_500
    q.apply(SetArgs(QueueArgs(), 40_000))
    assert q.next_expiry_ms() is None and not _expired(q.apply(Expire(50_000)))


def test_usage_survives_a_snapshot() -> None:
    q = Queue("q", QueueArgs(auto_delete=True, expires_ms=500))
    q.apply(Attach("a", 100))
    q.apply(Attach("b", 100))
    q.apply(Detach("a", 300))
    back = Queue.restore(q.snapshot())
    assert back.had_consumer and back.last_used_ms == 300 and back.args == q.args
    assert _unused(back.apply(Detach("b", 400)))
    assert back.next_expiry_ms() == 900


def test_a_queue_without_the_rules_snapshots_without_their_keys() -> None:
    q = Queue("q")
    q.apply(Attach("a", 100))
    snapshot = q.snapshot()
    assert "had_consumer" not in snapshot and "last_used_ms" not in snapshot
    assert "auto_delete" not in snapshot["args"] and "expires_ms" not in snapshot["args"]


# --- the wire, and what was written before ------------------------------------------------------------------


def _keep(value: Any) -> Any:
    return value


CID = ConsumerId("n1", 4, 9)
NEW_ENTRIES = [  # proposal "n1" #5 of each; pinned so a change of the wire form is seen
    (Cancel(CID, 1300), "85626e31056663616e63656c83626e310409190514"),
    (Declare(1400), "84626e3105646465636c190578"),
    (SetArgs(QueueArgs(auto_delete=True, expires_ms=500), 1500),
     "85626e310564617267748cf6f6f66964726f702d68656164f6f6f6f4f66c61742d6d6f73742d6f6e6365f51901f41905dc"),
    (SetArgs(QueueArgs(expires_ms=500)),
     "84626e310564617267738cf6f6f66964726f702d68656164f6f6f6f4f66c61742d6d6f73742d6f6e6365f41901f4"),
]


def test_new_commands_have_a_fixed_wire_form() -> None:
    for command, data in NEW_ENTRIES:
        assert encode_proposal(Proposal("n1", 5, command), _keep).hex() == data
        assert decode_proposal(bytes.fromhex(data), _keep).command == command


# Written by f82a566 (before the usage rules): an auto-delete queue's replica: Attach of CID (credit 10), an
# Enqueue delivered to it, the Attach with credit 0 that was then a cancel with unacked messages, and a SetArgs of
# ten fields; the snapshot is of a ReplicatedQueue("ad") that applied the four.
OLD_ENTRIES = [
    "89626e31016361747483626e3104091903e8050a00f4",
    "87626e310263656e7185616101f500f619044cf6f6",
    "89626e31036361747483626e3104091904b0050000f4",
    "84626e310464617267738af603f66964726f702d68656164f6f6f6f4f66c61742d6d6f73742d6f6e6365",
]
OLD_SNAPSHOT = (
    "a76776657273696f6e016677696e646f771910006b6f726967696e735f6d6178190100676170706c6965640467736b697070656400"
    "676f726967696e738183626e312081820104657175657565b16776657273696f6e01646e616d656261646461726773aa6e6d657373"
    "6167655f74746c5f6d73f66a6d61785f6c656e67746803706d61785f6c656e6774685f6279746573f6686f766572666c6f776964"
    "726f702d6865616474646561645f6c65747465725f65786368616e6765f677646561645f6c65747465725f726f7574696e675f6b"
    "6579f66c6d61785f7072696f72697479f67673696e676c655f6163746976655f636f6e73756d6572f46e64656c69766572795f6c"
    "696d6974f674646561645f6c65747465725f73747261746567796c61742d6d6f73742d6f6e63656e7075626c6973686572735f6d"
    "61781927106b6e6578745f6d73675f6964026a6174746163685f73657101666e6f775f6d731904b06572656164798069636f6e73"
    "756d657273818883626e310409050000f401f5818901616101f500f600f6f46572696e6773806a6861735f616374697665f46661"
    "6374697665f66a7075626c697368657273806974746c5f65706f63680071686f6c645f646561645f6c657474657273f56d68656c"
    "645f6c6173745f736571006468656c6480"
)


def test_entries_written_before_the_usage_rules_decode_and_apply() -> None:
    proposals = [decode_proposal(bytes.fromhex(entry), _keep) for entry in OLD_ENTRIES]
    assert [encode_proposal(p, _keep).hex() for p in proposals] == OLD_ENTRIES  # the same bytes written again
    replica = ReplicatedQueue("ad", AUTO)  # (the broker builds it with the declared flag)
    effects = [replica.apply(p) for p in proposals]
    assert replica.queue.args.auto_delete  # kept through the old ten-field SetArgs
    assert replica.queue.consumer_count == 1  # the old cancel form (an Attach with credit 0) still counts
    assert not any(_unused(e or []) for e in effects)
    assert _unused(replica.queue.apply(Detach(CID, 1300)))


def test_a_snapshot_written_before_the_usage_rules_restores() -> None:
    old = ReplicatedQueue.restore(bytes.fromhex(OLD_SNAPSHOT), _keep)
    assert old.snapshot(_keep) == bytes.fromhex(OLD_SNAPSHOT)  # nothing new to write for a queue without them
    assert not old.queue.args.auto_delete and not old.queue.had_consumer
    old.queue.adopt_declared(True, True)  # the broker's records: declared auto-delete, an Attach was applied
    assert old.queue.had_consumer and old.queue.args.auto_delete
    assert _unused(old.queue.apply(Detach(CID, 1300)))
