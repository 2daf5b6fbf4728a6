"""Wire and disk encoding of Raft messages, batches and storage records as cbor2 (plain data only).

Every message is a list `[tag, field, ...]` in dataclass field order; entries are `[term, index, data, kind]`;
snapshots `[index, term, voters, learners, data]`. Decoding checks every field's type and raises `CodecError`;
nothing received is ever evaluated as code (cbor2 decodes to plain lists, ints, strings and bytes here).
Forwarded commands (`Forward`, a map frame) are the second frame kind; `decode_frame` tells the kinds apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import cbor2

from cluster.raft.core.multiraft import NodeBatch
from cluster.raft.core.types import (
    Append,
    AppendResp,
    Entry,
    EntryKind,
    GroupId,
    HardState,
    Heartbeat,
    HeartbeatResp,
    Index,
    InstallSnapshot,
    Membership,
    Message,
    NodeId,
    PreVote,
    PreVoteResp,
    Snapshot,
    Term,
    TimeoutNow,
    Vote,
    VoteResp,
)

MESSAGE_TYPES: tuple[type[Any], ...] = (
    PreVote, PreVoteResp, Vote, VoteResp, Append, AppendResp, Heartbeat, HeartbeatResp, InstallSnapshot, TimeoutNow,
)
TAG_OF = {cls: tag for tag, cls in enumerate(MESSAGE_TYPES)}
FIELD_TYPES = {"src": str, "dst": str, "term": int, "last_index": int, "last_term": int, "reject": bool,
               "transfer": bool, "prev_index": int, "prev_term": int, "commit": int, "index": int,
               "hint_index": int, "hint_term": int, "quiesce": bool,
               "commit_term": int}


class CodecError(ValueError):
    """Bytes that do not decode to a well-formed batch or record."""


def _expect(value: Any, kind: type[Any]) -> Any:
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise CodecError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def entry_to_plain(entry: Entry) -> list[Any]:
    return [entry.term, entry.index, entry.data, entry.kind.value]


def entry_from_plain(plain: Any) -> Entry:
    term, index, data, kind = _expect(plain, list)
    try:
        entry_kind = EntryKind(_expect(kind, int))
    except ValueError as error:
        raise CodecError(str(error)) from error
    return Entry(Term(_expect(term, int)), Index(_expect(index, int)), _expect(data, bytes), entry_kind)


def snapshot_to_plain(snapshot: Snapshot) -> list[Any]:
    members = snapshot.membership
    return [snapshot.index, snapshot.term, sorted(members.voters), sorted(members.learners), snapshot.data]


def snapshot_from_plain(plain: Any) -> Snapshot:
    index, term, voters, learners, data = _expect(plain, list)
    membership = Membership(frozenset(NodeId(_expect(v, str)) for v in _expect(voters, list)),
                            frozenset(NodeId(_expect(v, str)) for v in _expect(learners, list)))
    return Snapshot(Index(_expect(index, int)), Term(_expect(term, int)), membership, _expect(data, bytes))


def message_to_plain(message: Message) -> list[Any]:
    plain: list[Any] = [TAG_OF[type(message)]]
    for field in dataclasses.fields(message):
        value = getattr(message, field.name)
        if field.name == "entries":
            value = [entry_to_plain(entry) for entry in value]
        elif field.name == "snapshot":
            value = snapshot_to_plain(value)
        plain.append(value)
    return plain


def message_from_plain(plain: Any) -> Message:
    _expect(plain, list)
    if not plain or not isinstance(plain[0], int) or not 0 <= plain[0] < len(MESSAGE_TYPES):
        raise CodecError("unknown message tag")
    cls = MESSAGE_TYPES[plain[0]]
    fields = dataclasses.fields(cls)
    if len(plain) != len(fields) + 1:
        raise CodecError(f"{cls.__name__}: wrong field count")
    values: list[Any] = []
    for field, value in zip(fields, plain[1:], strict=True):
        if field.name == "entries":
            values.append(tuple(entry_from_plain(item) for item in _expect(value, list)))
        elif field.name == "snapshot":
            values.append(snapshot_from_plain(value))
        else:
            values.append(_expect(value, FIELD_TYPES[field.name]))
    message: Message = cls(*values)
    return message


def encode_batch(batch: NodeBatch) -> bytes:
    messages = [[group, message_to_plain(message)] for group, message in batch.messages]
    return cbor2.dumps([batch.src, batch.dst, batch.incarnation, messages])


def decode_batch(data: bytes) -> NodeBatch:
    try:
        plain = cbor2.loads(data)
    except (cbor2.CBORDecodeError, ValueError, TypeError) as error:
        raise CodecError(str(error)) from error
    return _batch_from_plain(plain)


def _batch_from_plain(plain: Any) -> NodeBatch:
    try:
        src, dst, incarnation, messages = _expect(plain, list)
    except (ValueError, TypeError) as error:
        raise CodecError(str(error)) from error
    decoded = tuple((GroupId(_expect(group, str)), message_from_plain(message))
                    for group, message in (_expect(item, list) for item in _expect(messages, list)))
    return NodeBatch(NodeId(_expect(src, str)), NodeId(_expect(dst, str)), _expect(incarnation, int), decoded)


def encode_hard_state(hard_state: HardState) -> list[Any]:
    return [hard_state.term, hard_state.vote, hard_state.commit]


def decode_hard_state(plain: Any) -> HardState:
    term, vote, commit = _expect(plain, list)
    return HardState(Term(_expect(term, int)), None if vote is None else NodeId(_expect(vote, str)),
                     Index(_expect(commit, int)))


# --- forwarded commands: the second frame kind ------------------------------------------------------------------
#
# A raft batch is a cbor *list* (above). Every other frame kind is a cbor *map* with a "k" (kind) key, so the two
# never collide and a kind this version does not know can be recognised and ignored (`decode_frame` gives None).
# A follower or learner forwards commands for a group to the leader it knows as {"k": "fwd", "src", "dst",
# "cmds": [[op, group, data, hops], ...]}. A peer of an older version cannot decode a map and closes the connection
# (the dialer reconnects); forwarding to such a peer does not work, nothing else breaks.

FORWARD_OPS = ("propose", "conf", "transfer")


@dataclass(frozen=True, slots=True)
class Command:
    """Something only a group's leader can do: propose `data`, a conf change (`ConfChange.encode()`), or a
    leadership transfer (the target node id, utf-8). `hops` counts how often it was forwarded already."""

    op: str
    group: GroupId
    data: bytes
    hops: int = 0


@dataclass(frozen=True, slots=True)
class Forward:
    src: NodeId
    dst: NodeId
    commands: tuple[Command, ...]


def encode_forward(forward: Forward) -> bytes:
    commands = [[c.op, c.group, c.data, c.hops] for c in forward.commands]
    return cbor2.dumps({"k": "fwd", "src": forward.src, "dst": forward.dst, "cmds": commands})


def _command_from_plain(plain: Any) -> Command:
    op, group, data, hops = _expect(plain, list)
    if op not in FORWARD_OPS:
        raise CodecError(f"unknown forwarded op {op!r}")
    return Command(op, GroupId(_expect(group, str)), _expect(data, bytes), _expect(hops, int))


def decode_frame(data: bytes) -> NodeBatch | Forward | None:
    """A raft batch, a forward, or None for a frame kind this version does not know (the caller ignores it)."""
    try:
        plain = cbor2.loads(data)
    except (cbor2.CBORDecodeError, ValueError, TypeError) as error:
        raise CodecError(str(error)) from error
    if isinstance(plain, list):
        return _batch_from_plain(plain)
    if not isinstance(plain, dict):
        raise CodecError(f"frame of type {type(plain).__name__}")
    if plain.get("k") != "fwd":
        return None
    try:
        commands = tuple(_command_from_plain(item) for item in _expect(plain["cmds"], list))
        return Forward(NodeId(_expect(plain["src"], str)), NodeId(_expect(plain["dst"], str)), commands)
    except (KeyError, ValueError, TypeError) as error:
        raise CodecError(str(error)) from error
