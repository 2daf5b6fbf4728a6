"""The machine numbers its dead letters (`DeadLetter.seq`, cluster/queue/dead_letters.py): 1, 2, ... in the order
it emits them, whatever the reason and strategy, the same on every replica, kept in its snapshot; a snapshot
written before the counter existed (by 9951385, bytes kept below) restores and continues from the count the broker
kept beside it (`adopt_dead_letter_seq`)."""

from __future__ import annotations

from typing import Any

from cluster.queue import (
    Attach,
    DeadLetter,
    Discard,
    Enqueue,
    Expire,
    MsgId,
    Proposal,
    Queue,
    QueueArgs,
    QueuedMessage,
    ReplicatedQueue,
    SetArgs,
)
from tests.queue.helpers import identity, msg

DLX = QueueArgs(dead_letter_exchange="dlx")


def _seqs(effects: list[Any] | None) -> list[tuple[MsgId | None, str, int | None, int]]:
    return [(e.msg_id, e.reason, e.held_seq, e.seq) for e in effects or [] if type(e) is DeadLetter]


def test_every_dead_letter_is_numbered_in_the_order_the_machine_emits_them() -> None:
    q = Queue("q", QueueArgs(dead_letter_exchange="dlx", message_ttl_ms=100, max_length=2,
                             overflow="reject-publish-dlx"))
    q.apply(Enqueue(msg("a"), 0))
    q.apply(Enqueue(msg("b"), 50))
    assert _seqs(q.apply(Enqueue(msg("c"), 60))) == [(None, "maxlen", None, 1)]  # refused: no msg id
    assert _seqs(q.apply(Expire(120))) == [(1, "expired", None, 2)]
    q.apply(Attach("c", 120))
    assert _seqs(q.apply(Discard("c", [MsgId(2)], 130))) == [(2, "rejected", None, 3)]
    assert q.dead_letter_seq == 3


def test_held_dead_letters_are_numbered_too_and_keep_their_hold_sequence() -> None:
    args = QueueArgs(dead_letter_exchange="dlx", overflow="reject-publish", dead_letter_strategy="at-least-once")
    q = Queue("q", args, hold_dead_letters=True)
    for body in "abc":
        q.apply(Enqueue(msg(body), 0))
    q.apply(Attach("c", 0))
    assert _seqs(q.apply(Discard("c", [MsgId(3), MsgId(1)], 1))) == [(3, "rejected", 1, 1), (1, "rejected", 2, 2)]
    released = q.apply(SetArgs(DLX))  # the strategy switched off: the held ones go at most once, numbered again
    assert _seqs(released) == [(3, "rejected", None, 3), (1, "rejected", None, 4)]


def test_without_a_dlx_nothing_is_numbered() -> None:
    q = Queue("q")
    q.apply(Enqueue(msg(), 0))
    q.apply(Attach("c", 0))
    q.apply(Discard("c", [MsgId(1)], 1))
    assert q.dead_letter_seq == 0 and "dead_letter_seq" not in q.snapshot()


def test_the_sequence_survives_a_snapshot_so_a_restored_replica_numbers_alike() -> None:
    live = ReplicatedQueue("q", DLX)
    commands = [Enqueue(msg(str(n)), n) for n in range(4)] + [Attach("c", 5)]
    for number, command in enumerate(commands, 1):
        live.apply(Proposal("n1", number, command))
    live.apply(Proposal("n1", 10, Discard("c", [MsgId(1), MsgId(2)], 6)))
    restored = ReplicatedQueue.restore(live.snapshot(identity), identity)
    assert restored.queue.dead_letter_seq == 2
    reject = Proposal("n1", 11, Discard("c", [MsgId(4)], 7))
    assert _seqs(live.apply(reject)) == _seqs(restored.apply(reject)) == [(4, "rejected", None, 3)]


# Written by 9951385 (before the machine numbered its dead letters): a ReplicatedQueue("dl") with a DLX and a
# message TTL of 1000 ms that applied, as proposals "n1" #1-5, Enqueue "a" (100 ms) and "b" (200 ms) from
# publisher "p", Enqueue "c" at 5000 ms (a and b expired: two DeadLetters), Attach "c1" (prefetch 1) and a Discard
# of "c" (a third DeadLetter); the broker kept the count, 3, beside it.
OLD_SNAPSHOT = (
    "a76776657273696f6e016677696e646f771910006b6f726967696e735f6d6178190100676170706c6965640567736b69707065640067"
    "6f726967696e738183626e312081820105657175657565b16776657273696f6e01646e616d6562646c6461726773aa6e6d6573736167"
    "655f74746c5f6d731903e86a6d61785f6c656e677468f6706d61785f6c656e6774685f6279746573f6686f766572666c6f776964726f"
    "702d6865616474646561645f6c65747465725f65786368616e676563646c7877646561645f6c65747465725f726f7574696e675f6b65"
    "79f66c6d61785f7072696f72697479f67673696e676c655f6163746976655f636f6e73756d6572f46e64656c69766572795f6c696d69"
    "74f674646561645f6c65747465725f73747261746567796c61742d6d6f73742d6f6e63656e7075626c6973686572735f6d6178192710"
    "6b6e6578745f6d73675f6964046a6174746163685f73657101666e6f775f6d731913ec6572656164798069636f6e73756d6572738188"
    "62633101f600f401f5806572696e6773818200816263316a6861735f616374697665f466616374697665f66a7075626c697368657273"
    "81826170036974746c5f65706f63680071686f6c645f646561645f6c657474657273f56d68656c645f6c6173745f736571006468656c"
    "6480"
)


def test_a_snapshot_written_before_the_counter_restores_and_continues_from_the_brokers_count() -> None:
    old = ReplicatedQueue.restore(bytes.fromhex(OLD_SNAPSHOT), identity)
    assert old.snapshot(identity) == bytes.fromhex(OLD_SNAPSHOT)  # nothing new to write before it counts
    assert old.queue.dead_letter_seq == 0 and old.queue.ready_count == 0
    old.queue.adopt_dead_letter_seq(3)  # the broker's count, from the slot beside the replica
    old.queue.adopt_dead_letter_seq(1)  # (a smaller one never goes back)
    old.apply(Proposal("n1", 6, Enqueue(QueuedMessage("d", 1, True), 5200, "p", 4)))  # (delivered to c1)
    assert _seqs(old.apply(Proposal("n1", 7, Discard("c1", [MsgId(4)], 5300)))) == [(4, "rejected", None, 4)]
    assert ReplicatedQueue.restore(old.snapshot(identity), identity).queue.dead_letter_seq == 4
