"""The history of one chaos run: what the workload tried, what it saw, and what the nemesis did.

How it works: four frozen record types — `Publish` (one publish attempt and its confirm outcome), `Delivery` (one
message received by a consumer), `Ack` (the consumer sent basic.ack for it) and `Fault` (one nemesis action, or a
workload phase marker such as "drain", "closed" when a consumer's connection closed cleanly, or "connection-lost" when a
consumer's connection failed) — written as JSON lines
(one object per line with a "type" field) so a run can be checked, reported and replayed offline. Times are
milliseconds since the start of the run (`*_ms`), from the workload's monotonic clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

Outcome = Literal["confirmed", "nacked", "unknown"]
OUTCOMES: tuple[Outcome, ...] = ("confirmed", "nacked", "unknown")


@dataclass(frozen=True, slots=True)
class Publish:
    """One publish attempt: `outcome` is the broker's confirm (ack), nack, or unknown (connection lost first)."""

    publisher: str
    sequence: int
    payload_id: str
    queue: str
    outcome: Outcome
    sent_ms: float
    settled_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to a consumer (before its ack), with the broker's redelivered flag."""

    payload_id: str
    consumer: str
    queue: str
    redelivered: bool
    received_ms: float


@dataclass(frozen=True, slots=True)
class Ack:
    """A consumer sent basic.ack for a delivery (written to its socket; AMQP does not confirm acks)."""

    payload_id: str
    consumer: str
    queue: str
    at_ms: float


@dataclass(frozen=True, slots=True)
class Fault:
    """One nemesis action (kill, pause, partition, toxic...) or a phase marker such as "drain"."""

    kind: str
    target: str
    at_ms: float
    detail: str = ""


CLOSED = "closed"  # Fault.kind: the consumer (target) closed its connection and close-ok came back
CONNECTION_LOST = "connection-lost"  # Fault.kind: the consumer's (target's) connection failed; it reconnects

Record = Publish | Delivery | Ack | Fault
_TYPES: dict[str, type[Publish] | type[Delivery] | type[Ack] | type[Fault]] = {
    "publish": Publish, "deliver": Delivery, "ack": Ack, "fault": Fault,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def to_json_line(record: Record) -> str:
    body: dict[str, Any] = {"type": _NAMES[type(record)], **asdict(record)}
    return json.dumps(body, separators=(",", ":"))


def from_json_line(line: str) -> Record:
    raw = json.loads(line)
    cls = _TYPES[raw.pop("type")]
    return cls(**raw)


def write_history(path: Path, records: Iterable[Record]) -> None:
    with path.open("w") as out:
        for record in records:
            out.write(to_json_line(record) + "\n")


def read_history(path: Path) -> Iterator[Record]:
    with path.open() as lines:
        for line in lines:
            if line.strip():
                yield from_json_line(line)


def split(records: Iterable[Record]) -> tuple[list[Publish], list[Delivery], list[Fault]]:
    """Publishes, deliveries and faults, each in history order (acks: `acks_of`)."""
    publishes: list[Publish] = []
    deliveries: list[Delivery] = []
    faults: list[Fault] = []
    for record in records:
        if isinstance(record, Publish):
            publishes.append(record)
        elif isinstance(record, Delivery):
            deliveries.append(record)
        elif isinstance(record, Fault):
            faults.append(record)
    return publishes, deliveries, faults


def acks_of(records: Iterable[Record]) -> list[Ack]:
    return [record for record in records if isinstance(record, Ack)]
