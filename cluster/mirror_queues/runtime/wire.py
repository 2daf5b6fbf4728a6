"""The messages mirrored-queue processes exchange, and their cbor encoding.

The replica protocol is the core's four messages (`FetchRequest`/`FetchResponse`, `EpochEndRequest`/
`EpochEndResponse`, cluster/mirror_queues/core/types.py). Around them, until the broker backend carries them, the
control messages of the real-process harness: `LeaderAndIsr` (the controller tells a replica the committed leader,
epoch and ISR, as Kafka's LeaderAndIsr request), `AlterIsr` (a leader's shrink/expand request; the controller
answers with `LeaderAndIsr`), `Hello` (a replica started: its log end, whether it may have lost acknowledged
writes, and the incarnation id of this start, so a repeated hello is told apart from a restart),
`Publish`/`PublishResult` (a client's message and its confirm or nack), `Status`/`StatusReply` (a replica's role,
epoch, LEO, HW, ISR and log, for the checker and `raftmq`-style listings).

Encoding: cbor `[type name, field values in declaration order...]`; records as `[offset, epoch, msg]`, sets as
sorted lists, a snapshot as `[offset, epoch, data]` or null. `decode` refuses unknown types and wrong arities
with `WireError` (the transport closes the link).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import cbor2

from cluster.mirror_queues.core.types import (
    EpochEndRequest,
    EpochEndResponse,
    FetchRequest,
    FetchResponse,
    Record,
    Snapshot,
)


class WireError(ValueError):
    """A frame that is not a message of this protocol."""


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    leader: str  # "" = no leader (unavailable)
    epoch: int
    isr: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AlterIsr:
    leader: str
    epoch: int
    isr: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Hello:
    replica: str
    unclean: bool  # restarted from files whose unflushed tail a crash may have lost
    last_epoch: int
    leo: int
    incarnation: int = 0  # one id per process start (node.py: its start time in ns): equal = the same start


@dataclass(frozen=True, slots=True)
class Publish:
    msg: str


@dataclass(frozen=True, slots=True)
class PublishResult:
    msg: str
    ok: bool
    offset: int = -1
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Status:
    with_log: bool = False


@dataclass(frozen=True, slots=True)
class StatusReply:
    replica: str
    role: str
    epoch: int
    leo: int
    hw: int
    isr: tuple[str, ...]
    log: tuple[Record, ...] = ()


@dataclass(frozen=True, slots=True)
class Routed:
    """Inside the broker (node/runtime/cluster/mirror_groups.py): one node's transport carries every mirrored
    queue's messages, each wrapped with its queue group id; `payload` is the inner message's encoding."""

    group: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Forward:
    """A queue command proposed on a node that does not lead the mirrored queue, sent (Routed) to its leader."""

    data: bytes


Control = LeaderAndIsr | AlterIsr | Hello | Publish | PublishResult | Status | StatusReply | Routed | Forward
WireMessage = FetchRequest | FetchResponse | EpochEndRequest | EpochEndResponse | Control

_TYPES: dict[str, type] = {t.__name__: t for t in (FetchRequest, FetchResponse, EpochEndRequest, EpochEndResponse,
                                                  LeaderAndIsr, AlterIsr, Hello, Publish, PublishResult, Status,
                                                  StatusReply, Routed, Forward)}
_RECORD_FIELDS = {"records", "log"}


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return [value.offset, value.epoch, value.msg]
    if isinstance(value, Snapshot):
        return [value.offset, value.epoch, value.data]
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def encode(message: WireMessage) -> bytes:
    values = [_plain(getattr(message, f.name)) for f in dataclasses.fields(message)]
    return cbor2.dumps([type(message).__name__, *values])


def decode(data: bytes) -> WireMessage:
    try:
        name, *values = cbor2.loads(data)
    except (cbor2.CBORDecodeError, ValueError, TypeError) as error:
        raise WireError(f"undecodable frame: {error}") from None
    cls = _TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise WireError(f"unknown message type {name!r}")
    fields = dataclasses.fields(cls)
    if len(values) != len(fields):
        raise WireError(f"{name}: {len(values)} fields, expected {len(fields)}")
    kwargs: dict[str, Any] = {}
    try:
        for f, value in zip(fields, values, strict=True):
            if f.name in _RECORD_FIELDS:
                value = tuple(Record(int(o), int(e), str(m)) for o, e, m in value)
            elif f.name == "snapshot" and value is not None:
                o, e, d = value
                value = Snapshot(int(o), int(e), str(d))
            elif isinstance(value, list):
                value = tuple(value)
            kwargs[f.name] = value
    except (TypeError, ValueError) as error:
        raise WireError(f"{name}: bad field: {error}") from None
    message: WireMessage = cls(**kwargs)
    return message
