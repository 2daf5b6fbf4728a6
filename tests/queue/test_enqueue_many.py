"""EnqueueMany (one entry for a run of one publisher's messages) is exactly the same Enqueues applied in turn."""

from __future__ import annotations

import random

import cbor2
import pytest

from cluster.queue import (
    Attach,
    Enqueue,
    EnqueueMany,
    MsgId,
    Proposal,
    ProposalDecodeError,
    Queue,
    QueueArgs,
    QueuedMessage,
    ReplicatedQueue,
    Settle,
    decode_proposal,
    encode_proposal,
)
from cluster.queue.replicated_codec import ENQUEUE_MANY_MAX

PUBLISHER = ("n1", 7, 3, 1)


def _keep(value: object) -> object:
    return value


def _message(n: int) -> QueuedMessage:
    return QueuedMessage(b"m%d" % n, 10 + n % 7, n % 2 == 0, n % 3, None if n % 4 else 50)


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_gives_the_effects_and_state_of_its_enqueues(seed: int) -> None:
    rng = random.Random(seed)
    args = QueueArgs(max_length=rng.choice([None, 5, 12]), overflow=rng.choice(["drop-head", "reject-publish"]),
                     max_priority=rng.choice([None, 3]))
    one_by_one, batched = Queue("q", args), Queue("q", args)
    for queue in (one_by_one, batched):
        queue.apply(Attach("c1", 0, prefetch=3))
    sequence, now_ms = 0, 0
    for _round in range(30):
        now_ms += rng.randrange(0, 40)
        count = rng.randrange(1, 8)
        sequences = []
        for _ in range(count):
            sequence += 1
            sequences.append(sequence - rng.choice([0, 0, 0, 2]))  # some retries (duplicates)
        messages = [_message(rng.randrange(1000)) for _ in sequences]
        expected = []
        for message, seq in zip(messages, sequences, strict=True):
            expected.extend(one_by_one.apply(Enqueue(message, now_ms, PUBLISHER, seq)))
        assert batched.apply(EnqueueMany(PUBLISHER, now_ms, tuple(messages), tuple(sequences))) == expected
        for queue in (one_by_one, batched):
            queue.apply(Settle("c1", tuple(MsgId(i) for i in range(1, sequence + 1))))
    assert batched.snapshot() == one_by_one.snapshot()


def test_a_replicated_batch_round_trips_and_applies_like_single_entries() -> None:
    messages = tuple(_message(n) for n in range(5))
    batch = Proposal("n1", 9, EnqueueMany(PUBLISHER, 100, messages, (4, 5, 6, 7, 8)))
    data = encode_proposal(batch, _keep)
    assert decode_proposal(data, _keep) == batch
    singles = [encode_proposal(Proposal("n1", 10 + i, Enqueue(m, 100, PUBLISHER, 4 + i)), _keep)
               for i, m in enumerate(messages)]
    assert len(data) < sum(len(d) for d in singles)
    a, b = ReplicatedQueue("q"), ReplicatedQueue("q")
    effects_a = a.apply(decode_proposal(data, _keep))
    effects_b = [e for d in singles for e in (b.apply(decode_proposal(d, _keep)) or [])]
    assert effects_a == effects_b
    assert a.apply(decode_proposal(data, _keep)) is None  # a retried batch is skipped as a whole


def test_consecutive_sequences_travel_as_the_first_one() -> None:
    messages = tuple(_message(n) for n in range(50))
    run = encode_proposal(Proposal("n", 1, EnqueueMany(PUBLISHER, 0, messages, tuple(range(3, 53)))), _keep)
    gaps = encode_proposal(Proposal("n", 1, EnqueueMany(PUBLISHER, 0, messages, tuple(range(3, 103, 2)))), _keep)
    assert len(run) < len(gaps)
    decoded = decode_proposal(run, _keep).command
    assert isinstance(decoded, EnqueueMany) and decoded.sequences == tuple(range(3, 53))


def test_malformed_batches_are_refused_both_ways() -> None:
    with pytest.raises(ValueError):
        EnqueueMany(PUBLISHER, 0, (_message(1),), (1, 2))
    with pytest.raises(ValueError):
        EnqueueMany(PUBLISHER, 0, (), ())
    too_many = tuple(_message(1) for _ in range(ENQUEUE_MANY_MAX + 1))
    with pytest.raises(ValueError):
        encode_proposal(Proposal("n", 1, EnqueueMany(PUBLISHER, 0, too_many, tuple(range(len(too_many))))), _keep)
    good = ["n", 1, "enqm", list(PUBLISHER), 0, 5, [[b"x", 1, False, 0, None]]]
    assert isinstance(decode_proposal(cbor2.dumps(good), _keep).command, EnqueueMany)
    for bad in (
        ["n", 1, "enqm", list(PUBLISHER), 0, 5, []],
        ["n", 1, "enqm", list(PUBLISHER), 0, [5, 6], [[b"x", 1, False, 0, None]]],
        ["n", 1, "enqm", list(PUBLISHER), 0, -1, [[b"x", 1, False, 0, None]]],
        ["n", 1, "enqm", list(PUBLISHER), 0, 2**64 - 1, [[b"x", 1, False, 0, None]] * 2],
        ["n", 1, "enqm", list(PUBLISHER), 0, 5, [[b"x", -1, False, 0, None]]],
        ["n", 1, "enqm", list(PUBLISHER), 0, 5],
    ):
        with pytest.raises(ProposalDecodeError):
            decode_proposal(cbor2.dumps(bad), _keep)


def test_publisher_dedup_order_is_unchanged_by_runs_of_one_publisher() -> None:
    queue = Queue("q", publishers_max=2)
    first, second, third = ("n", 1, 1, 1), ("n", 1, 1, 2), ("n", 1, 1, 3)
    queue.apply(EnqueueMany(first, 0, (_message(1), _message(2)), (1, 2)))
    queue.apply(Enqueue(_message(3), 0, second, 1))
    queue.apply(EnqueueMany(("n", 1, 1, 1), 0, (_message(4),), (3,)))  # an equal id, another object: now newest
    queue.apply(Enqueue(_message(5), 0, third, 1))  # evicts the least recently used: `second`
    assert [row[0] for row in queue.snapshot()["publishers"]] == [first, third]
    assert [type(e).__name__ for e in queue.apply(Enqueue(_message(6), 0, first, 3))] == ["Duplicate"]
    assert [type(e).__name__ for e in queue.apply(Enqueue(_message(7), 0, second, 1))] == ["Accepted"]
