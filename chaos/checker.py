"""The queue checker: classify every message of a run's history (pure functions, no I/O).

Vocabulary from rabbitmq/jepsen's queue checker (REFERENCE.md §5), per payload id:
- ok: confirmed and delivered at least once;
- lost: confirmed but never delivered — must be empty;
- unexpected: delivered but never published — must be empty;
- recovered: not confirmed (nacked, or the outcome unknown because the connection died) yet delivered;
- unconfirmed_absent: not confirmed and never delivered (allowed: the broker never promised it);
- duplicated: delivered more than once (allowed for at-least-once delivery; counted).
At-least-once (the acks in the history): a payload delivered again must carry redelivered=True (an
"unflagged redelivery" is a violation: the broker forgot it had handed the message out); a payload delivered again
after a consumer acked it is counted (redelivered_after_ack: the ack was lost with a node, allowed); and once the
acking consumer's connection closed cleanly (a "closed" marker: close-ok came back, so the broker took every ack
sent before it on that connection, and the nemesis no longer acts then), a later delivery is a violation
(redelivered_after_settled_ack). A consumer's "connection-lost" marker ends a connection: an ack sent before it is
settled by no later close (that close is of another connection; the ack may have died with the first one).
Order: a queue is FIFO and a publisher's channel sends in sequence order, so the first-time deliveries
(redelivered=False) that one consumer receives from one publisher on one queue must have increasing sequence
numbers. Redeliveries are exempt (a requeue legitimately moves a message back). Each break is an OrderViolation.
A run is valid when nothing is lost or unexpected, no redelivery is unflagged, and no settled ack is undone.
With `copies` (a shovel between the publishers' and the consumers' brokers), a payload may reach the consumers'
queue more than once as separate messages (the shovel republishes what it had published but not yet seen
confirmed when its link broke), each first delivered with redelivered=False, possibly after an earlier copy was
acked: unflagged redeliveries and deliveries after a settled ack are then counted as duplicates, not violations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from chaos.history import CLOSED, CONNECTION_LOST, Ack, Delivery, Fault, Outcome, Publish

_OUTCOME_RANK: dict[Outcome, int] = {"unknown": 0, "nacked": 1, "confirmed": 2}


@dataclass(frozen=True, slots=True)
class OrderViolation:
    publisher: str
    queue: str
    consumer: str
    previous_sequence: int
    sequence: int
    payload_id: str


@dataclass(frozen=True, slots=True)
class CheckResult:
    attempted: int
    confirmed: int
    nacked: int
    unknown: int
    deliveries: int
    ok: int
    lost: tuple[str, ...]
    unexpected: tuple[str, ...]
    recovered: tuple[str, ...]
    unconfirmed_absent: tuple[str, ...]
    duplicated: tuple[tuple[str, int], ...]
    order_violations: tuple[OrderViolation, ...]
    unflagged_redeliveries: tuple[tuple[str, str], ...] = ()  # (payload id, consumer): again, redelivered=False
    redelivered_after_ack: tuple[str, ...] = ()  # delivered again after an ack of it was sent (ack lost: allowed)
    redelivered_after_settled_ack: tuple[str, ...] = ()  # ... after the acking connection closed cleanly
    copies: bool = False  # republished copies are expected (a shovel): the two checks above only count

    @property
    def valid(self) -> bool:
        if self.copies:
            return not self.lost and not self.unexpected
        return (not self.lost and not self.unexpected and not self.unflagged_redeliveries
                and not self.redelivered_after_settled_ack)

    def summary(self) -> dict[str, Any]:
        """Counts only (the JSON report's headline)."""
        return {
            "valid": self.valid, "attempted": self.attempted, "confirmed": self.confirmed,
            "nacked": self.nacked, "unknown": self.unknown, "deliveries": self.deliveries, "ok": self.ok,
            "lost": len(self.lost), "unexpected": len(self.unexpected), "recovered": len(self.recovered),
            "unconfirmed_absent": len(self.unconfirmed_absent), "duplicated": len(self.duplicated),
            "duplicate_deliveries": sum(count - 1 for _, count in self.duplicated),
            "order_violations": len(self.order_violations),
            "unflagged_redeliveries": len(self.unflagged_redeliveries),
            "redelivered_after_ack": len(self.redelivered_after_ack),
            "redelivered_after_settled_ack": len(self.redelivered_after_settled_ack),
            "copies_expected": self.copies,
        }


def strongest_outcomes(publishes: Iterable[Publish]) -> dict[str, Publish]:
    """One publish per payload id; when a payload was attempted twice the strongest outcome wins."""
    best: dict[str, Publish] = {}
    for publish in publishes:
        seen = best.get(publish.payload_id)
        if seen is None or _OUTCOME_RANK[publish.outcome] > _OUTCOME_RANK[seen.outcome]:
            best[publish.payload_id] = publish
    return best


def order_violations(publishes: dict[str, Publish], deliveries: Sequence[Delivery]) -> list[OrderViolation]:
    """First-time deliveries per (consumer, publisher, queue), in the order received, must rise in sequence."""
    last_sequence: dict[tuple[str, str, str], int] = {}
    violations: list[OrderViolation] = []
    for delivery in deliveries:
        publish = publishes.get(delivery.payload_id)
        if delivery.redelivered or publish is None or publish.queue != delivery.queue:
            continue
        key = (delivery.consumer, publish.publisher, delivery.queue)
        previous = last_sequence.get(key)
        if previous is not None and publish.sequence <= previous:
            violations.append(OrderViolation(publish.publisher, delivery.queue, delivery.consumer, previous,
                                             publish.sequence, delivery.payload_id))
        else:
            last_sequence[key] = publish.sequence
    return violations


def unflagged_redeliveries(deliveries: Sequence[Delivery]) -> list[tuple[str, str]]:
    """Deliveries of a payload handed out before that do not say redelivered."""
    seen: set[str] = set()
    found = []
    for delivery in deliveries:
        if delivery.payload_id in seen and not delivery.redelivered:
            found.append((delivery.payload_id, delivery.consumer))
        seen.add(delivery.payload_id)
    return found


def connection_ends(faults: Iterable[Fault]) -> dict[str, list[tuple[float, bool]]]:
    """Per consumer, the ends of its connections in time order: (at_ms, True for a clean close, False for a lost
    connection)."""
    ends: dict[str, list[tuple[float, bool]]] = {}
    for fault in faults:
        if fault.kind in (CLOSED, CONNECTION_LOST):
            ends.setdefault(fault.target, []).append((fault.at_ms, fault.kind == CLOSED))
    for consumer_ends in ends.values():
        consumer_ends.sort(key=lambda end: (end[0], end[1]))  # a loss at the same ms as a close counts first
    return ends


def settled_at_ms(ack: Ack, ends: dict[str, list[tuple[float, bool]]]) -> float | None:
    """When the ack was settled: the end of its connection (the first end of its consumer's connections at or
    after the ack) if that was a clean close; None if the connection was lost (or never closed)."""
    for at_ms, clean in ends.get(ack.consumer, ()):
        if at_ms >= ack.at_ms:
            return at_ms if clean else None
    return None


def redelivered_after_ack(deliveries: Sequence[Delivery], acks: Iterable[Ack],
                          faults: Iterable[Fault]) -> tuple[list[str], list[str]]:
    """Payloads delivered again after an ack of them was sent, and those after that ack was settled (the clean
    close of the connection it was sent on came after the ack and before the delivery)."""
    ends = connection_ends(faults)
    acked_ms: dict[str, float] = {}
    settled_ms: dict[str, float] = {}
    for ack in acks:
        acked_ms[ack.payload_id] = min(ack.at_ms, acked_ms.get(ack.payload_id, ack.at_ms))
        settle = settled_at_ms(ack, ends)
        if settle is not None:
            settled_ms[ack.payload_id] = min(settle, settled_ms.get(ack.payload_id, settle))
    after_ack, after_settled = set(), set()
    for delivery in deliveries:
        if delivery.received_ms > acked_ms.get(delivery.payload_id, float("inf")):
            after_ack.add(delivery.payload_id)
        if delivery.received_ms > settled_ms.get(delivery.payload_id, float("inf")):
            after_settled.add(delivery.payload_id)
    return sorted(after_ack), sorted(after_settled)


def check(publishes: Iterable[Publish], deliveries: Sequence[Delivery], acks: Iterable[Ack] = (),
          faults: Iterable[Fault] = (), copies: bool = False) -> CheckResult:
    """Classify every payload id of the history. `deliveries` must be in the order they were received; `acks` and
    `faults` (for the consumers' "closed" and "connection-lost" markers) are optional; `copies`: republished copies
    are expected (see the module header)."""
    published = strongest_outcomes(publishes)
    delivered = Counter(delivery.payload_id for delivery in deliveries)
    outcomes = Counter(publish.outcome for publish in published.values())
    lost, recovered, absent = [], [], []
    ok = 0
    for payload_id, publish in published.items():
        seen = delivered.get(payload_id, 0) > 0
        if publish.outcome == "confirmed":
            if seen:
                ok += 1
            else:
                lost.append(payload_id)
        elif seen:
            recovered.append(payload_id)
        else:
            absent.append(payload_id)
    unexpected = sorted(payload_id for payload_id in delivered if payload_id not in published)
    duplicated = sorted((payload_id, count) for payload_id, count in delivered.items() if count > 1)
    after_ack, after_settled = redelivered_after_ack(deliveries, acks, faults)
    return CheckResult(
        attempted=len(published), confirmed=outcomes["confirmed"], nacked=outcomes["nacked"],
        unknown=outcomes["unknown"], deliveries=len(deliveries), ok=ok, lost=tuple(sorted(lost)),
        unexpected=tuple(unexpected), recovered=tuple(sorted(recovered)), unconfirmed_absent=tuple(sorted(absent)),
        duplicated=tuple(duplicated), order_violations=tuple(order_violations(published, deliveries)),
        unflagged_redeliveries=tuple(unflagged_redeliveries(deliveries)),
        redelivered_after_ack=tuple(after_ack), redelivered_after_settled_ack=tuple(after_settled), copies=copies,
    )
