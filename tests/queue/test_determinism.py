"""Determinism and snapshot fidelity: same commands => same effects, and restore(snapshot) changes nothing.

Unlike the model test this covers every feature, single active consumer included, and ids that cbor would
mangle (tuples) via the encode/decode hooks.
"""

from __future__ import annotations

from typing import Any

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

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
    Recover,
    Return,
    Settle,
)

OWNERS = [("conn", 1), ("conn", 2), ("conn", 3), "get"]
msg_ids = st.lists(st.integers(1, 30).map(MsgId), max_size=3)
owners = st.sampled_from(OWNERS)
times = st.integers(0, 200)


class Payload:
    """An opaque broker-side payload that is not cbor-able by itself."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Payload) and other.body == self.body

    def __hash__(self) -> int:
        return hash(self.body)


messages = st.builds(
    QueuedMessage,
    payload=st.binary(max_size=4).map(Payload),
    size_bytes=st.integers(0, 30),
    persistent=st.booleans(),
    priority=st.integers(0, 4),
    ttl_ms=st.none() | st.integers(0, 100),
)

commands: st.SearchStrategy[QueueCommand] = st.one_of(
    st.builds(
        Enqueue, messages, times, st.none() | st.sampled_from(["p", "q"]), st.none() | st.integers(0, 5)
    ),
    st.builds(
        Attach,
        owners,
        times,
        st.integers(0, 3),
        st.none() | st.integers(0, 3),
        st.integers(0, 2),
        st.booleans(),
    ),
    st.builds(Detach, owners, times),
    st.builds(AddCredit, owners, st.integers(0, 3)),
    st.builds(Settle, owners, msg_ids),
    st.builds(Return, owners, msg_ids, times),
    st.builds(Discard, owners, msg_ids, times),
    st.builds(Get, owners, st.booleans(), times),
    st.builds(Expire, times),
    st.just(Purge()),
    st.builds(Recover, st.integers(31, 40).map(MsgId), messages, st.integers(0, 3), st.none() | times),
)

all_args = st.builds(
    QueueArgs,
    message_ttl_ms=st.none() | st.integers(0, 80),
    max_length=st.none() | st.integers(0, 5),
    max_length_bytes=st.none() | st.integers(0, 50),
    overflow=st.sampled_from(["drop-head", "reject-publish", "reject-publish-dlx"]),
    dead_letter_exchange=st.none() | st.just(""),
    max_priority=st.none() | st.integers(0, 4),
    single_active_consumer=st.booleans(),
    delivery_limit=st.none() | st.integers(0, 2),
)


def unique_recover_ids(script: list[QueueCommand]) -> list[QueueCommand]:
    """Recovering an id that is already in the queue is a caller error; give each Recover its own id."""
    return [
        Recover(MsgId(1000 + index), c.message, c.delivery_count, c.expiry_ms)
        if isinstance(c, Recover)
        else c
        for index, c in enumerate(script)
    ]


def encode_payload(payload: Payload) -> bytes:
    return payload.body


def encode_id(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def decode_id(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@settings(max_examples=150, deadline=None)
@given(args=all_args, script=st.lists(commands, max_size=60))
def test_same_commands_give_same_effects(args: QueueArgs, script: list[QueueCommand]) -> None:
    first, second = Queue("q", args), Queue("q", args)
    for command in unique_recover_ids(script):
        assert first.apply(command) == second.apply(command)
    assert first.snapshot(encode_payload, encode_id) == second.snapshot(encode_payload, encode_id)


def restore_and_replay(args: QueueArgs, before: list[QueueCommand],
                       after: list[QueueCommand]) -> tuple[Queue, Queue]:
    """Run `before` on a queue, restore a second one from its snapshot's wire form (asserting the snapshots are
    equal), then run `after` on both asserting equal effects; returns (original, restored)."""
    original = Queue("q", args)
    script = unique_recover_ids(before + after)
    before, after = script[: len(before)], script[len(before) :]
    for command in before:
        original.apply(command)
    wire = cbor2.dumps(original.snapshot(encode_payload, encode_id))
    restored = Queue.restore(cbor2.loads(wire), Payload, decode_id)
    assert restored.snapshot(encode_payload, encode_id) == original.snapshot(encode_payload, encode_id)
    for command in after:
        assert restored.apply(command) == original.apply(command)
    return original, restored


@settings(max_examples=150, deadline=None)
@given(args=all_args, before=st.lists(commands, max_size=40), after=st.lists(commands, max_size=40))
def test_restored_snapshot_behaves_identically(
    args: QueueArgs, before: list[QueueCommand], after: list[QueueCommand]
) -> None:
    original, restored = restore_and_replay(args, before, after)
    assert restored.ready_count == original.ready_count
    assert restored.unacked_count == original.unacked_count
    assert restored.next_expiry_ms() == original.next_expiry_ms()
    assert restored.active_consumer == original.active_consumer


def test_snapshot_is_plain_cbor_primitives() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=10, single_active_consumer=True, dead_letter_exchange="dlx"))
    queue.apply(Enqueue(QueuedMessage(b"x", 1, True, 0, None), 0, "pub", 1))
    queue.apply(Attach("c", 0, prefetch=1))
    queue.apply(Enqueue(QueuedMessage(b"y", 1, True, 0, 5), 0))

    def check(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                assert isinstance(key, str)
                check(item)
        elif isinstance(value, list):
            for item in value:
                check(item)
        else:
            assert value is None or isinstance(value, bool | int | str | bytes)

    snapshot = queue.snapshot()
    check(snapshot)
    assert Queue.restore(cbor2.loads(cbor2.dumps(snapshot))).snapshot() == snapshot
