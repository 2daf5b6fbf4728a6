"""The flat "enqb" layout of EnqueueMany: what encodes decodes, old "enqm" entries still decode to the same command,
batches that do not fit it go as "enqm", and malformed rows are refused with ProposalDecodeError only."""

from __future__ import annotations

import struct

import cbor2
import pytest

from cluster.queue import (
    Attach,
    EnqueueMany,
    Proposal,
    ProposalDecodeError,
    QueuedMessage,
    ReplicatedQueue,
    Settle,
    decode_proposal,
    encode_proposal,
)
from cluster.queue.replicated_codec import ENQUEUE_MANY_MAX, encode_id
from tests.queue.test_enqueue_many import PUBLISHER, _keep


def _kind(data: bytes) -> str:
    kind: str = cbor2.loads(data)[2]
    return kind


def _batch(count: int, persistent: bool = True, priority: int = 0, ttl_ms: int | None = None,
           first_sequence: int = 1) -> EnqueueMany:
    messages = tuple(QueuedMessage(b"body%d" % n, 90 + n, persistent, priority, ttl_ms) for n in range(count))
    return EnqueueMany(PUBLISHER, 1234, messages, tuple(range(first_sequence, first_sequence + count)))


def _old_layout(proposal: Proposal) -> bytes:
    """The bytes the previous commit wrote for an EnqueueMany (kind "enqm", a row per message)."""
    command = proposal.command
    assert isinstance(command, EnqueueMany)
    first = command.sequences[0]
    consecutive = list(command.sequences) == list(range(first, first + len(command.sequences)))
    rows = [[m.payload, m.size_bytes, m.persistent, m.priority, m.ttl_ms] for m in command.messages]
    return cbor2.dumps([proposal.origin, proposal.proposal_id, "enqm", encode_id(command.publisher_id),
                        command.now_ms, first if consecutive else list(command.sequences), rows])


@pytest.mark.parametrize(("persistent", "priority", "ttl_ms"), [(True, 0, None), (False, 9, 0), (True, 255, 10**12)])
def test_a_uniform_batch_goes_flat_and_round_trips(persistent: bool, priority: int, ttl_ms: int | None) -> None:
    proposal = Proposal("n1", 5, _batch(40, persistent, priority, ttl_ms))
    data = encode_proposal(proposal, _keep)
    assert _kind(data) == "enqb"
    assert decode_proposal(data, _keep) == proposal
    assert len(data) < len(_old_layout(proposal))


def test_old_layout_entries_decode_to_the_same_command_and_state() -> None:
    proposals = [Proposal("n1", 1, _batch(30)), Proposal("n1", 2, _batch(20, first_sequence=31))]
    new_replica, old_replica = ReplicatedQueue("q"), ReplicatedQueue("q")
    for replica in (new_replica, old_replica):
        replica.apply(Proposal("n2", 1, Attach(("n2", 1, 1), 0, prefetch=25)))
    for proposal in proposals:
        new = decode_proposal(encode_proposal(proposal, _keep), _keep)
        old = decode_proposal(_old_layout(proposal), _keep)
        assert new == old == proposal
        assert new_replica.apply(new) == old_replica.apply(old)
    settle = Proposal("n2", 2, Settle(("n2", 1, 1), list(range(1, 26))))
    assert new_replica.apply(settle) == old_replica.apply(settle)
    assert new_replica.snapshot(_keep) == old_replica.snapshot(_keep)


def test_batches_that_do_not_fit_go_as_enqm() -> None:
    mixed = EnqueueMany(PUBLISHER, 0, (QueuedMessage(b"a", 1, True), QueuedMessage(b"b", 1, False)), (1, 2))
    mixed_ttl = EnqueueMany(PUBLISHER, 0, (QueuedMessage(b"a", 1, True), QueuedMessage(b"b", 1, True, 0, 5)), (1, 2))
    huge = EnqueueMany(PUBLISHER, 0, (QueuedMessage(b"a", 2**32, True),), (1,))
    for command in (mixed, mixed_ttl, huge):
        data = encode_proposal(Proposal("n", 1, command), _keep)
        assert _kind(data) == "enqm"
        assert decode_proposal(data, _keep).command == command


def test_bad_fields_are_refused_when_encoding() -> None:
    for message in (QueuedMessage(b"a", -1, True), QueuedMessage(b"a", 1, True, 256),
                    QueuedMessage(b"a", 1, 1, 0), QueuedMessage(b"a", True, True)):  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            encode_proposal(Proposal("n", 1, EnqueueMany(PUBLISHER, 0, (message, message), (1, 2))), _keep)


def _flat_row(count: int = 2, **override: object) -> list[object]:
    fields: dict[str, object] = {
        "publisher": list(PUBLISHER), "now_ms": 0, "sequences": 1, "common": [True, 0, None],
        "sizes": struct.pack(f"<{count}I", *range(count)), "payloads": [b"p%d" % n for n in range(count)],
    }
    fields.update(override)
    return ["n", 1, "enqb", *fields.values()]


def test_malformed_flat_rows_are_refused() -> None:
    assert isinstance(decode_proposal(cbor2.dumps(_flat_row()), _keep).command, EnqueueMany)
    too_many = ENQUEUE_MANY_MAX + 1
    for bad in (
        _flat_row(payloads=[]),
        _flat_row(payloads=b"xx"),
        _flat_row(sizes=b"\x00" * 7),
        _flat_row(sizes=[0, 1]),
        _flat_row(common=[1, 0, None]),
        _flat_row(common=[True, 256, None]),
        _flat_row(common=[True, 0, -1]),
        _flat_row(common=[True, 0]),
        _flat_row(sequences=[1]),
        _flat_row(sequences=-1),
        _flat_row(now_ms="0"),
        _flat_row(publisher={"a": 1}),
        _flat_row(too_many, payloads=[b""] * too_many, sizes=b"\x00" * 4 * too_many),
        _flat_row()[:-1],
    ):
        with pytest.raises(ProposalDecodeError):
            decode_proposal(cbor2.dumps(bad), _keep)


def test_a_failing_payload_decoder_is_a_decode_error() -> None:
    data = encode_proposal(Proposal("n", 1, _batch(3)), _keep)

    def refuse(value: object) -> object:
        raise KeyError(value)

    with pytest.raises(ProposalDecodeError):
        decode_proposal(data, refuse)
