"""The machine's batch paths change nothing: an EnqueueMany equals its Enqueues in turn (effects, order, state),
across every feature (limits, TTLs, priorities, credit, no-ack, single active consumer, held dead letters), and a
consumer alone in its ring taking a run of messages is the round-robin it replaces.

Snapshots are compared after every command, so internal state the batch path skips (the ready store, the rings,
the publisher LRU) must come out exactly as the one-message-at-a-time path leaves it.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.queue import (
    AddCredit,
    Attach,
    Detach,
    Enqueue,
    EnqueueMany,
    MsgId,
    Queue,
    QueueArgs,
    QueueCommand,
    QueuedMessage,
    Return,
    Settle,
)
from tests.queue.test_determinism import (
    Payload,
    all_args,
    commands,
    encode_id,
    encode_payload,
    times,
    unique_recover_ids,
)

plain_messages = st.builds(
    QueuedMessage,
    payload=st.binary(max_size=3).map(Payload),
    size_bytes=st.integers(0, 30),
    persistent=st.booleans(),
    priority=st.integers(0, 4),
    ttl_ms=st.integers(0, 100).map(lambda n: n if n < 10 else None),  # mostly none: the batch path's case
)
batches = st.builds(
    lambda publisher, now_ms, pairs: EnqueueMany(publisher, now_ms, [m for m, _ in pairs], [s for _, s in pairs]),
    st.sampled_from(["p", "q", "r", None]),
    times,
    st.lists(st.tuples(plain_messages, st.integers(0, 12)), min_size=1, max_size=12),
)
plain_args = st.builds(
    QueueArgs,
    max_priority=st.none() | st.integers(0, 4),
    single_active_consumer=st.booleans(),
    dead_letter_exchange=st.none() | st.just(""),
    delivery_limit=st.none() | st.integers(0, 2),
)


def _one_by_one(command: EnqueueMany) -> list[Enqueue]:
    return [Enqueue(message, command.now_ms, command.publisher_id, sequence)
            for message, sequence in zip(command.messages, command.sequences, strict=True)]


def _run_both(args: QueueArgs, script: list[QueueCommand], publishers_max: int = 10_000) -> None:
    batched = Queue("q", args, publishers_max)
    single = Queue("q", args, publishers_max)
    for command in unique_recover_ids(script):
        if isinstance(command, EnqueueMany):
            expected = [effect for enqueue in _one_by_one(command) for effect in single.apply(enqueue)]
        else:
            expected = single.apply(command)
        assert batched.apply(command) == expected
        assert batched.snapshot(encode_payload, encode_id) == single.snapshot(encode_payload, encode_id)


@settings(max_examples=200, deadline=None)
@given(args=all_args, script=st.lists(batches | commands, max_size=50))
def test_batches_equal_their_enqueues_with_every_feature(args: QueueArgs, script: list[QueueCommand]) -> None:
    _run_both(args, script)


@settings(max_examples=200, deadline=None)
@given(args=plain_args, script=st.lists(batches | batches | commands, max_size=50))
def test_batches_equal_their_enqueues_on_the_fast_path(args: QueueArgs, script: list[QueueCommand]) -> None:
    """No limits and no queue TTL (the batch path's conditions), so most batches take it."""
    _run_both(args, script, publishers_max=2)


def test_a_lone_consumer_takes_a_run_and_round_robin_resumes_with_two() -> None:
    queue = Queue("q")
    messages = [QueuedMessage(b"m", 1, False)] * 6
    queue.apply(EnqueueMany("p", 0, messages, list(range(1, 7))))
    deliveries = [e for e in queue.apply(Attach("a", 0, prefetch=4)) if type(e).__name__ == "Deliver"]
    assert [(d.consumer_id, d.msg_id) for d in deliveries] == [("a", 1), ("a", 2), ("a", 3), ("a", 4)]
    effects = queue.apply(Attach("b", 0, prefetch=4))
    assert [(e.consumer_id, e.msg_id) for e in effects] == [("b", 5), ("b", 6)]
    effects = queue.apply(EnqueueMany("p", 1, messages, list(range(7, 13))))
    delivered = [(e.consumer_id, e.msg_id) for e in effects if type(e).__name__ == "Deliver"]
    assert delivered == [("b", 7), ("b", 8)]  # "a" is full
    effects = queue.apply(Settle("a", [1, 2, 3, 4]))
    assert [(e.consumer_id, e.msg_id) for e in effects] == [("a", 9), ("a", 10), ("a", 11), ("a", 12)]


def _random_script(rng: random.Random, steps: int) -> list[QueueCommand]:
    """Mostly batches from three publishers (some retried), consumers coming and going, acks, requeues, credit."""
    script: list[QueueCommand] = []
    next_sequence = {"p": 1, "q": 1, "r": 1}
    next_msg_id_guess = 1
    for step in range(steps):
        roll = rng.random()
        if roll < 0.55:
            publisher = rng.choice(["p", "q", "r"])
            count = rng.randrange(1, 20)
            first = next_sequence[publisher] - rng.choice([0, 0, 0, 3])
            next_sequence[publisher] = first + count
            messages = [QueuedMessage(Payload(b"%d" % step), rng.randrange(5), rng.random() < 0.5,
                                      rng.randrange(3), 5 if rng.random() < 0.03 else None) for _ in range(count)]
            script.append(EnqueueMany(publisher, step, messages, list(range(first, first + count))))
            next_msg_id_guess += count
        elif roll < 0.65:
            script.append(Attach(rng.choice(["a", "b", "c"]), step, prefetch=rng.choice([0, 1, 5, 30]),
                                 credit=rng.choice([None, None, 4]), priority=rng.choice([0, 0, 1]),
                                 no_ack=rng.random() < 0.2))
        elif roll < 0.70:
            script.append(Detach(rng.choice(["a", "b", "c"]), step))
        elif roll < 0.90:
            low = max(1, next_msg_id_guess - 40)
            ids = [MsgId(i) for i in range(low, next_msg_id_guess) if rng.random() < 0.7]
            script.append(Settle(rng.choice(["a", "b", "c"]), ids))
        elif roll < 0.95:
            low = max(1, next_msg_id_guess - 40)
            script.append(Return(rng.choice(["a", "b", "c"]), [MsgId(rng.randrange(low, low + 40))], step))
        else:
            script.append(AddCredit(rng.choice(["a", "b", "c"]), rng.randrange(1, 6)))
    return script


@pytest.mark.parametrize("seed", range(24))
def test_long_random_runs_of_batches(seed: int) -> None:
    rng = random.Random(seed)
    args = QueueArgs(max_priority=rng.choice([None, 2]), single_active_consumer=seed % 4 == 3,
                     message_ttl_ms=50 if seed % 6 == 5 else None, max_length=30 if seed % 8 == 7 else None)
    _run_both(args, _random_script(rng, 150), publishers_max=2)
