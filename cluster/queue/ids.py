"""Typed ids of the parties a replicated queue's log names: consumers, getters, publishers, dead-letter senders.

The queue machine treats consumer and publisher ids as opaque hashables. A cluster node names its own parties by
node and boot, and a source queue's dead-letter republishing by the queue; each kind is a type of its own here, so
code asks `type(cid) is GetterId` instead of reading a string tag out of a tuple:

| type | what it names | wire form (`to_wire` / `from_wire`) |
|---|---|---|
| `ConsumerId(node, boot, n)` | a consumer (or a channel's basic.get holder) of node `node`'s boot `boot` | `[node, boot, n]` |
| `GetterId(node, boot, n)` | one basic.get of a Raft queue | `["get", node, boot, n]` |
| `ChannelPublisherId(node, boot, conn, channel)` | a publishing channel | `[node, boot, conn, channel]` |
| `DeadLetterPublisher(vhost, queue, held_seq)` | at-least-once dead letters of a source queue; `held_seq` set for a copy sent alone | `["dlx-alo", vhost, queue]` or `["dlx-alo", vhost, queue, held_seq]` |
| `AtMostOnceDeadLetterPublisher(vhost, queue)` | at-most-once dead letters of a source queue | `["dlx", vhost, queue]` |

The wire forms are exactly the tuples these types replace (cbor writes a tuple as an array), so queue logs and
snapshots written before the types existed decode to them (tests/queue/test_typed_ids.py). `from_wire` checks the
element types as well as the tag (a node named "get" or "dlx" is still a node): any other array comes back as a
plain tuple, as ids of tests and the simulator may be.

They are NamedTuples rather than dataclasses: ids are dict keys on the delivery and confirm paths, and a tuple's
hash and equality run in C. Like tuples, two kinds with equal fields compare equal; the only kinds of one shape
are `ConsumerId` and `GetterId`, whose `n` come from one counter per boot (`BrokerState.new_consumer_id`,
`new_getter_id`), so they never hold equal values.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple


class ConsumerId(NamedTuple):
    node: str
    boot: int
    n: int


class GetterId(NamedTuple):
    node: str
    boot: int
    n: int


class ChannelPublisherId(NamedTuple):
    node: str
    boot: int
    conn: int
    channel: int


class DeadLetterPublisher(NamedTuple):
    """A source queue's at-least-once dead letters: with `held_seq` None the sequence of each republish is its hold
    sequence; a copy sent again alone (node/broker/replica_dead_letters.py) names its hold sequence here instead,
    with sequence 1."""

    vhost: str
    queue: str
    held_seq: int | None


class AtMostOnceDeadLetterPublisher(NamedTuple):
    vhost: str
    queue: str


GETTER_TAG: Final = "get"
DEAD_LETTER_TAG: Final = "dlx-alo"
AT_MOST_ONCE_DEAD_LETTER_TAG: Final = "dlx"

_new: Final = tuple.__new__  # a NamedTuple from a tuple without its Python-level __new__ (ids decoded per entry)


def to_wire(value: Any) -> list[Any] | None:
    """The cbor array of a typed id; None for any other value (the caller encodes it as it is)."""
    kind = type(value)
    if kind is ConsumerId or kind is ChannelPublisherId:
        return list(value)
    if kind is GetterId:
        return [GETTER_TAG, value.node, value.boot, value.n]
    if kind is DeadLetterPublisher:
        if value.held_seq is None:
            return [DEAD_LETTER_TAG, value.vhost, value.queue]
        return [DEAD_LETTER_TAG, value.vhost, value.queue, value.held_seq]
    if kind is AtMostOnceDeadLetterPublisher:
        return [AT_MOST_ONCE_DEAD_LETTER_TAG, value.vhost, value.queue]
    return None


def from_wire(items: tuple[Any, ...]) -> tuple[Any, ...]:
    """A flat id array (as a tuple, its parts already checked to be str/int/bytes/bool/None) to its typed id, or
    the tuple itself when it is none of the forms above."""
    size = len(items)
    if size == 3:
        first, second, third = items
        kind_1 = type(second)
        if kind_1 is int:
            if type(first) is str and type(third) is int:
                return _new(ConsumerId, items)
        elif kind_1 is str and type(third) is str:
            if first == DEAD_LETTER_TAG:
                return DeadLetterPublisher(second, third, None)
            if first == AT_MOST_ONCE_DEAD_LETTER_TAG:
                return AtMostOnceDeadLetterPublisher(second, third)
    elif size == 4:
        first, second, third, fourth = items
        if type(first) is str and type(fourth) is int:
            if type(second) is int and type(third) is int:
                return _new(ChannelPublisherId, items)
            if type(second) is str:
                if first == GETTER_TAG and type(third) is int:
                    return _new(GetterId, items[1:])
                if first == DEAD_LETTER_TAG and type(third) is str:
                    return DeadLetterPublisher(second, third, fourth)
    return items
