"""Wire and disk encoding of Raft messages, batches and storage records as cbor2 (plain data only).

Every message is a flat list `[tag, field, ...]` in dataclass field order, except `Append`, whose entries are
flattened into its own list: `[APPEND_FLAT_TAG, src, dst, term, prev_index, prev_term, commit, term_0, index_0,
kind_0, data_0, term_1, ...]` (no nested list per entry; entry payloads travel as raw cbor byte strings, decoded
straight into `Entry.data`). The older nested layout (`[4, ..., [[term, index, data, kind], ...], commit]`) still
decodes. Snapshots are `[index, term, voters, learners, data]`. Each message class has its field names and types
computed once at import (no `dataclasses.fields` per message). Decoding checks every field's exact type (`type(v)
is int`, so a bool is never an int) and raises `CodecError` only; nothing received is ever evaluated as code
(cbor2 decodes to plain lists, ints, strings and bytes here). Forwarded commands (`Forward`, a map frame) are the
second frame kind; `decode_frame` tells the kinds apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Final

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
    make_entry,
)

MESSAGE_TYPES: tuple[type[Any], ...] = (
    PreVote, PreVoteResp, Vote, VoteResp, Append, AppendResp, Heartbeat, HeartbeatResp, InstallSnapshot, TimeoutNow,
)
TAG_OF = {cls: tag for tag, cls in enumerate(MESSAGE_TYPES)}
APPEND_TAG: Final = TAG_OF[Append]  # the nested layout (decoded, no longer encoded)
APPEND_FLAT_TAG: Final = len(MESSAGE_TYPES)  # the flat layout `encode` writes
APPEND_HEAD: Final = 7  # tag + src, dst, term, prev_index, prev_term, commit
FIELD_TYPES = {"src": str, "dst": str, "term": int, "last_index": int, "last_term": int, "reject": bool,
               "transfer": bool, "prev_index": int, "prev_term": int, "commit": int, "index": int,
               "hint_index": int, "hint_term": int, "quiesce": bool,
               "commit_term": int}
ENTRY_KINDS: Final = tuple(EntryKind(value) for value in range(len(EntryKind)))  # EntryKind by value, no call
assert all(kind.value == value for value, kind in enumerate(ENTRY_KINDS))


class CodecError(ValueError):
    """Bytes that do not decode to a well-formed batch or record."""


def _expect(value: Any, kind: type[Any]) -> Any:
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise CodecError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def _entry_kind(value: Any) -> EntryKind:
    if type(value) is not int or not 0 <= value < len(ENTRY_KINDS):
        raise CodecError(f"bad entry kind {value!r:.40}")
    return ENTRY_KINDS[value]


def entry_to_plain(entry: Entry) -> list[Any]:
    return [entry.term, entry.index, entry.data, entry.kind.value]


def entry_from_plain(plain: Any) -> Entry:
    if type(plain) is not list or len(plain) != 4:
        raise CodecError("an entry is a list [term, index, data, kind]")
    term, index, data, kind = plain
    if (type(term), type(index), type(data)) != (int, int, bytes):  # a tuple test: no narrowing of the NewTypes
        raise CodecError("bad entry field types")
    return make_entry(term, index, data, _entry_kind(kind))


_FLAT_ENTRY_TYPES: Final = (int, int, int, bytes)


def entries_to_flat(entries: tuple[Entry, ...] | list[Entry], out: list[Any]) -> list[Any]:
    """Append `term, index, kind, data` of every entry to `out` (no list per entry)."""
    for entry in entries:
        out += (entry.term, entry.index, entry.kind.value, entry.data)
    return out


def entries_from_flat(flat: list[Any], start: int) -> tuple[Entry, ...]:
    """The entries `entries_to_flat` wrote into `flat` from `start` on; CodecError for anything malformed."""
    if (len(flat) - start) % 4:
        raise CodecError("flat entries: length is not a multiple of 4")
    kinds = ENTRY_KINDS
    entries: list[Entry] = []
    append = entries.append
    for position in range(start, len(flat), 4):
        term, index, kind, data = flat[position : position + 4]
        if (type(term), type(index), type(kind), type(data)) != _FLAT_ENTRY_TYPES or not 0 <= kind < len(kinds):
            raise CodecError("bad entry fields")
        append(make_entry(term, index, data, kinds[kind]))
    return tuple(entries)


def snapshot_to_plain(snapshot: Snapshot) -> list[Any]:
    members = snapshot.membership
    return [snapshot.index, snapshot.term, sorted(members.voters), sorted(members.learners), snapshot.data]


def snapshot_from_plain(plain: Any) -> Snapshot:
    if type(plain) is not list or len(plain) != 5:
        raise CodecError("a snapshot is a list [index, term, voters, learners, data]")
    index, term, voters, learners, data = plain
    membership = Membership(frozenset(NodeId(_expect(v, str)) for v in _expect(voters, list)),
                            frozenset(NodeId(_expect(v, str)) for v in _expect(learners, list)))
    return Snapshot(Index(_expect(index, int)), Term(_expect(term, int)), membership, _expect(data, bytes))


# --- messages: per-class layouts computed once ------------------------------------------------------------------

_FIELD_NAMES: Final = {cls: tuple(field.name for field in dataclasses.fields(cls)) for cls in MESSAGE_TYPES}
_GETTERS: Final = {cls: attrgetter(*names) for cls, names in _FIELD_NAMES.items()}
_SCALAR_TYPES: Final = {cls: tuple(FIELD_TYPES.get(name) for name in names) for cls, names in _FIELD_NAMES.items()}
_APPEND_HEAD_GETTER: Final = attrgetter("src", "dst", "term", "prev_index", "prev_term", "commit")
_APPEND_HEAD_TYPES: Final = (str, str, int, int, int, int)


def message_to_plain(message: Message) -> list[Any]:
    cls = type(message)
    if isinstance(message, Append):
        return entries_to_flat(message.entries, [APPEND_FLAT_TAG, *_APPEND_HEAD_GETTER(message)])
    plain: list[Any] = [TAG_OF[cls], *_GETTERS[cls](message)]
    if cls is InstallSnapshot:
        plain[-1] = snapshot_to_plain(plain[-1])
    return plain


def _check_scalars(values: list[Any], kinds: tuple[type[Any] | None, ...], name: str) -> None:
    for value, kind in zip(values, kinds, strict=True):
        if kind is not None and type(value) is not kind:
            raise CodecError(f"{name}: expected {kind.__name__}, got {type(value).__name__}")


def message_from_plain(plain: Any) -> Message:
    if type(plain) is not list or not plain:
        raise CodecError("a message is a non-empty list")
    tag = plain[0]
    if type(tag) is not int or not 0 <= tag <= APPEND_FLAT_TAG:
        raise CodecError("unknown message tag")
    if tag == APPEND_FLAT_TAG:
        if len(plain) < APPEND_HEAD:
            raise CodecError("Append: too few fields")
        head = plain[1:APPEND_HEAD]
        _check_scalars(head, _APPEND_HEAD_TYPES, "Append")
        src, dst, term, prev_index, prev_term, commit = head
        return Append(src, dst, term, prev_index, prev_term, entries_from_flat(plain, APPEND_HEAD), commit)
    cls = MESSAGE_TYPES[tag]
    values = plain[1:]
    kinds = _SCALAR_TYPES[cls]
    if len(values) != len(kinds):
        raise CodecError(f"{cls.__name__}: wrong field count")
    _check_scalars(values, kinds, cls.__name__)
    if cls is Append:  # the nested layout
        values[5] = tuple(entry_from_plain(item) for item in _expect(values[5], list))
    elif cls is InstallSnapshot:
        values[3] = snapshot_from_plain(values[3])
    message: Message = cls(*values)
    return message


def encode_batch(batch: NodeBatch) -> bytes:
    messages = [[group, message_to_plain(message)] for group, message in batch.messages]
    return cbor2.dumps([batch.src, batch.dst, batch.incarnation, messages])


def _batch_from_plain(plain: Any) -> NodeBatch:
    if type(plain) is not list or len(plain) != 4:
        raise CodecError("a batch is a list [src, dst, incarnation, messages]")
    src, dst, incarnation, messages = plain
    if (type(src), type(dst), type(incarnation), type(messages)) != (str, str, int, list):
        raise CodecError("bad batch header")
    decoded: list[tuple[GroupId, Message]] = []
    for item in messages:
        if type(item) is not list or len(item) != 2:
            raise CodecError("a batch item is [group, message]")
        group, message = item
        if type(group) is not str:
            raise CodecError("a batch item's group is a str")
        decoded.append((GroupId(group), message_from_plain(message)))
    return NodeBatch(src, dst, incarnation, tuple(decoded))


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
