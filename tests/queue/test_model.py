"""Stateful property test: the queue machine against the naive reference model, effect for effect.

Every step applies one command to both and compares the full effect lists, then the observable state. A rule
also swaps the machine for one restored from a cbor round trip of its snapshot, so restore is checked to give
identical future behaviour.
"""

from __future__ import annotations

from typing import Any

import cbor2
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from cluster.queue import (
    AddCredit,
    Attach,
    Detach,
    Discard,
    Enqueue,
    Expire,
    Get,
    MsgId,
    Purge,
    Queue,
    QueueArgs,
    QueueCommand,
    QueuedMessage,
    Return,
    Settle,
)
from tests.queue.reference_model import Model

CONSUMERS = ("c1", "c2", "c3")
HOLDERS = ("g1", "g2")
OWNERS = CONSUMERS + HOLDERS

queue_args = st.builds(
    QueueArgs,
    message_ttl_ms=st.none() | st.integers(0, 50),
    max_length=st.none() | st.integers(0, 6),
    max_length_bytes=st.none() | st.integers(0, 60),
    overflow=st.sampled_from(["drop-head", "reject-publish", "reject-publish-dlx"]),
    dead_letter_exchange=st.none() | st.just("dlx"),
    max_priority=st.none() | st.integers(0, 3),
    delivery_limit=st.none() | st.integers(0, 3),
)


class QueueVersusModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = Queue("q")
        self.model = Model(QueueArgs())
        self.now_ms = 0
        self.bodies = 0

    @initialize(args=queue_args, publishers_max=st.integers(1, 3))
    def setup(self, args: QueueArgs, publishers_max: int) -> None:
        self.queue = Queue("q", args, publishers_max=publishers_max)
        self.model = Model(args, publishers_max=publishers_max)

    def run(self, command: QueueCommand) -> None:
        expected = self.model.apply(command)
        actual = self.queue.apply(command)
        assert actual == expected, f"{command}\n machine: {actual}\n model:   {expected}"

    def picked_ids(self, owner: str, picks: list[int]) -> list[MsgId]:
        held = [m.msg_id for m in self.model.unacked.get(owner, [])]
        ids = [held[p % len(held)] if held and p >= 0 else 10_000 for p in picks]
        return [MsgId(i) for i in dict.fromkeys(ids)]

    @rule(
        size_bytes=st.integers(0, 20),
        priority=st.integers(-1, 5),
        ttl_ms=st.none() | st.integers(0, 60),
        publisher=st.none() | st.sampled_from(["p1", "p2", "p3", "p4"]),
        sequence=st.integers(0, 8),
        dt=st.integers(0, 10),
    )
    def enqueue(
        self,
        size_bytes: int,
        priority: int,
        ttl_ms: int | None,
        publisher: str | None,
        sequence: int,
        dt: int,
    ) -> None:
        self.now_ms += dt
        self.bodies += 1
        message = QueuedMessage(f"b{self.bodies}".encode(), size_bytes, False, priority, ttl_ms)
        self.run(Enqueue(message, self.now_ms, publisher, sequence if publisher else None))

    @rule(
        cid=st.sampled_from(CONSUMERS),
        prefetch=st.integers(0, 3),
        credit=st.none() | st.integers(0, 3),
        priority=st.integers(0, 1),
        no_ack=st.booleans(),
    )
    def attach(self, cid: str, prefetch: int, credit: int | None, priority: int, no_ack: bool) -> None:
        self.run(Attach(cid, self.now_ms, prefetch, credit, priority, no_ack))

    @rule(owner=st.sampled_from(OWNERS))
    def detach(self, owner: str) -> None:
        self.run(Detach(owner, self.now_ms))

    @rule(cid=st.sampled_from(CONSUMERS), credit=st.integers(0, 3))
    def add_credit(self, cid: str, credit: int) -> None:
        self.run(AddCredit(cid, credit))

    @rule(owner=st.sampled_from(OWNERS), picks=st.lists(st.integers(-1, 5), max_size=3))
    def settle(self, owner: str, picks: list[int]) -> None:
        self.run(Settle(owner, self.picked_ids(owner, picks)))

    @rule(
        owner=st.sampled_from(OWNERS), picks=st.lists(st.integers(-1, 5), max_size=3), dt=st.integers(0, 10)
    )
    def return_(self, owner: str, picks: list[int], dt: int) -> None:
        self.now_ms += dt
        self.run(Return(owner, self.picked_ids(owner, picks), self.now_ms))

    @rule(owner=st.sampled_from(OWNERS), picks=st.lists(st.integers(-1, 5), max_size=3))
    def discard(self, owner: str, picks: list[int]) -> None:
        self.run(Discard(owner, self.picked_ids(owner, picks), self.now_ms))

    @rule(holder=st.sampled_from(HOLDERS), no_ack=st.booleans())
    def get(self, holder: str, no_ack: bool) -> None:
        self.run(Get(holder, no_ack, self.now_ms))

    @rule(dt=st.integers(0, 40))
    def expire(self, dt: int) -> None:
        self.now_ms += dt
        self.run(Expire(self.now_ms))

    @rule()
    def purge(self) -> None:
        self.run(Purge())

    @rule()
    def snapshot_round_trip(self) -> None:
        encoded: dict[str, Any] = cbor2.loads(cbor2.dumps(self.queue.snapshot()))
        self.queue = Queue.restore(encoded)

    @invariant()
    def observable_state_matches(self) -> None:
        queue, model = self.queue, self.model
        assert queue.ready_msg_ids() == model.ready_ids()
        assert queue.ready_count == len(model.ready)
        assert queue.ready_bytes == sum(m.message.size_bytes for m in model.ready)
        assert queue.unacked_count == model.unacked_count()
        assert queue.consumer_count == len(model.consumers)
        assert queue.next_expiry_ms() == model.next_expiry_ms()
        for owner in OWNERS:
            assert queue.unacked_msg_ids(owner) == sorted(m.msg_id for m in model.unacked.get(owner, []))


QueueVersusModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestQueueVersusModel = QueueVersusModel.TestCase
