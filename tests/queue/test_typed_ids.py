"""Typed ids (cluster/queue/ids.py): each kind round-trips through the id codec as the array the string-tagged tuple
it replaced was written as, and queue log entries and a replica snapshot written by the code before the types
(commit aa64da8, bytes kept below) decode to typed ids."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest

from cluster.queue import (
    Accepted,
    Attach,
    Deliver,
    Enqueue,
    EnqueueMany,
    Get,
    QueuedMessage,
    ReplicatedQueue,
    Settle,
    decode_proposal,
    encode_proposal,
)
from cluster.queue.ids import (
    AtMostOnceDeadLetterPublisher,
    ChannelPublisherId,
    ConsumerId,
    DeadLetterPublisher,
    GetterId,
)
from cluster.queue.replicated_codec import decode_id, encode_id


def _keep(value: Any) -> Any:
    return value


TYPED = [
    (ConsumerId("n1", 4, 9), ["n1", 4, 9]),
    (GetterId("n1", 4, 10), ["get", "n1", 4, 10]),
    (ChannelPublisherId("n1", 4, 12, 1), ["n1", 4, 12, 1]),
    (DeadLetterPublisher("/", "src", None), ["dlx-alo", "/", "src"]),
    (DeadLetterPublisher("/", "src", 5), ["dlx-alo", "/", "src", 5]),
    (AtMostOnceDeadLetterPublisher("/", "src"), ["dlx", "/", "src"]),
]


@pytest.mark.parametrize(("typed", "wire"), TYPED)
def test_typed_id_round_trips_as_the_old_tuple(typed: Any, wire: list[Any]) -> None:
    assert encode_id(typed) == wire
    back = decode_id(cbor2.loads(cbor2.dumps(encode_id(typed))))
    assert back == typed and type(back) is type(typed)


def test_nodes_named_like_tags_stay_nodes_and_other_ids_stay_tuples() -> None:
    assert type(decode_id(["get", 1, 2])) is ConsumerId  # a node named "get"
    assert type(decode_id(["dlx", 1, 2, 3])) is ChannelPublisherId  # a node named "dlx"
    assert type(decode_id(["get", "n", 1, 2])) is GetterId
    for other in (["a", "b"], ["a", "b", "c"], [1, 2, 3], ["dlx-alo", "/", "q", "x"], [["n", 1], 2]):
        back = decode_id(other)
        assert type(back) is tuple
    assert decode_id(7) == 7 and decode_id("x") == "x" and decode_id(None) is None


# Entries and a ReplicatedQueue snapshot as the code at aa64da8 wrote them (payloads kept as they are), with the
# string-tagged tuple ids of then: Enqueue from ("dlx-alo", "/", "src") seq 3, from ("dlx-alo", "/", "src", 5)
# seq 1, from ("dlx", "/", "src") seq 2; EnqueueMany from ("n2", 4, 12, 1); Attach ("n2", 4, 9); Get
# ("get", "n2", 4, 10); Settle ("n2", 4, 9) of msg 1. The snapshot is of a replica that applied the seven.
OLD_ENTRIES = [
    "87626e310763656e7185616101f500f61903e88367646c782d616c6f612f6373726303",
    "87626e310863656e7185616201f500f61903e88467646c782d616c6f612f637372630501",
    "87626e310963656e7185616301f500f61903e88363646c78612f6373726302",
    "89626e320a64656e716284626e32040c011903e80183f500f64801000000010000008261646165",
    "89626e320b6361747483626e3204091903e805f600f4",
    "86626e320c636765748463676574626e32040af41903e8",
    "85626e320d66736574746c6583626e3204098101",
]
OLD_SNAPSHOT = (
    "a76776657273696f6e016677696e646f771910006b6f726967696e735f6d6178190100676170706c6965640767736b697070"
    "656400676f726967696e738283626e31208182070383626e322081820a04657175657565b16776657273696f6e01646e616d"
    "6561716461726773aa6e6d6573736167655f74746c5f6d73f66a6d61785f6c656e677468f6706d61785f6c656e6774685f62"
    "79746573f6686f766572666c6f776964726f702d6865616474646561645f6c65747465725f65786368616e6765f677646561"
    "645f6c65747465725f726f7574696e675f6b6579f66c6d61785f7072696f72697479f67673696e676c655f6163746976655f"
    "636f6e73756d6572f46e64656c69766572795f6c696d6974f674646561645f6c65747465725f73747261746567796c61742d"
    "6d6f73742d6f6e63656e7075626c6973686572735f6d61781927106b6e6578745f6d73675f6964066a6174746163685f7365"
    "7101666e6f775f6d731903e86572656164798069636f6e73756d657273818883626e32040905f600f401f5848902616201f5"
    "00f600f6f48903616301f500f600f6f48904616401f500f600f6f48905616501f500f600f6f46572696e6773818200818362"
    "6e3204096a6861735f616374697665f466616374697665f66a7075626c69736865727384828367646c782d616c6f612f6373"
    "726303828467646c782d616c6f612f637372630501828363646c78612f63737263028284626e32040c01026974746c5f6570"
    "6f63680071686f6c645f646561645f6c657474657273f56d68656c645f6c6173745f736571006468656c6480"
)

EXPECTED_IDS = [
    DeadLetterPublisher("/", "src", None),
    DeadLetterPublisher("/", "src", 5),
    AtMostOnceDeadLetterPublisher("/", "src"),
    ChannelPublisherId("n2", 4, 12, 1),
    ConsumerId("n2", 4, 9),
    GetterId("n2", 4, 10),
    ConsumerId("n2", 4, 9),
]


def _party(command: Any) -> Any:
    return command.publisher_id if isinstance(command, Enqueue | EnqueueMany) else command.consumer_id


def test_entries_written_before_typed_ids_decode_to_them() -> None:
    proposals = [decode_proposal(bytes.fromhex(entry), _keep) for entry in OLD_ENTRIES]
    assert [type(p.command) for p in proposals] == [Enqueue, Enqueue, Enqueue, EnqueueMany, Attach, Get, Settle]
    parties = [_party(p.command) for p in proposals]
    assert parties == EXPECTED_IDS
    assert [type(party) for party in parties] == [type(i) for i in EXPECTED_IDS]
    # written again with the typed ids, they are the same bytes
    assert [encode_proposal(p, _keep).hex() for p in proposals] == OLD_ENTRIES


def test_snapshot_written_before_typed_ids_restores_typed_parties() -> None:
    old = ReplicatedQueue.restore(bytes.fromhex(OLD_SNAPSHOT), _keep)
    fresh = ReplicatedQueue("q")
    for entry in OLD_ENTRIES:
        fresh.apply(decode_proposal(bytes.fromhex(entry), _keep))
    assert old.snapshot(_keep) == fresh.snapshot(_keep) == bytes.fromhex(OLD_SNAPSHOT)
    # the consumer attached by the old entry is known by its typed id: a new message goes to it
    effects = old.queue.apply(Enqueue(QueuedMessage("f", 1, True), 2000, DeadLetterPublisher("/", "src", None), 4))
    assert effects[0] == Accepted(DeadLetterPublisher("/", "src", None), 4, effects[0].msg_id)
    delivered = [e for e in effects if type(e) is Deliver]
    assert delivered and type(delivered[0].consumer_id) is ConsumerId
    # the dedup high-water of the old at-least-once publisher survived: its sequence 3 again is a duplicate
    again = old.queue.apply(Enqueue(QueuedMessage("a", 1, True), 2000, DeadLetterPublisher("/", "src", None), 3))
    assert type(again[0]).__name__ == "Duplicate"
