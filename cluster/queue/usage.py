"""Whether a queue is still used (a mixin of cluster/queue/machine.py): auto-delete and x-expires, decided by the
machine so every backend and every replica applies the same rule.

The rules (RabbitMQ's):
- auto-delete (`QueueArgs.auto_delete`): once the queue had a consumer, the command that takes away its last one
  (`Detach`, or `Cancel` of a consumer still holding unacked messages, which no longer counts) emits
  `QueueUnused`. A queue that never had a consumer is never unused.
- x-expires (`QueueArgs.expires_ms`): a queue without consumers whose last use is `expires_ms` old when an `Expire`
  runs emits `QueueExpired`. A use is a consume (`Attach`), a cancel (`Cancel`, a `Detach` of a consumer), a
  basic.get (`Get`) or a declare (`Declare`), at the command's `now_ms`; a `SetArgs` that changes x-expires
  starts a new period (as a policy change does in RabbitMQ). Publishing is no use.
`next_expiry_ms()` includes the queue's expiry, so the broker knows when to send `Expire`; the broker deletes the
queue on either effect (in a cluster the node that proposed the command does, cluster/queue/replicated.py says
nothing about it: node/broker/replica.py).

What the rules need (whether a consumer was ever attached, the last use) travels in the snapshot under
"had_consumer" and "last_used_ms", written only when auto-delete or x-expires is set (so a snapshot of a queue
without them is byte for byte what it was before the keys); absent, they restore as False and the snapshot's clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import TYPE_CHECKING

from cluster.queue.consumers import Consumer
from cluster.queue.ready import ReadyStore
from cluster.queue.types import (
    Cancel,
    Declare,
    QueueArgs,
    QueueEffect,
    QueueExpired,
    QueueUnused,
)

_Effects = list[QueueEffect]


class QueueUsage:
    """Auto-delete and x-expires of `Queue`; `Queue` holds the attributes."""

    if not TYPE_CHECKING:  # (slots at run time; mypy is told the attributes below, which `Queue` slots)
        __slots__ = ()

    args: QueueArgs
    _consumers: dict[Hashable, Consumer]
    _active: Consumer | None
    _attached_count: int
    _had_consumer: bool
    _last_used_ms: int | None
    _now_ms: int
    _ready: ReadyStore

    # (the machine's helpers these commands use)
    def _advance(self, now_ms: int, out: _Effects) -> int:
        raise NotImplementedError

    def _choose_active(self, out: _Effects) -> None:
        raise NotImplementedError

    def _deliver(self, out: _Effects) -> None:
        raise NotImplementedError

    # --- queries --------------------------------------------------------------------------------------------

    @property
    def had_consumer(self) -> bool:
        """A consumer was attached once (auto-delete applies only then)."""
        return self._had_consumer

    @property
    def last_used_ms(self) -> int | None:
        """The time of the last use (None: none seen)."""
        return self._last_used_ms

    @property
    def unused(self) -> bool:
        """An auto-delete queue that had a consumer and has none now (what `QueueUnused` reported)."""
        return self.args.auto_delete and self._had_consumer and not self._attached_count

    def next_expiry_ms(self) -> int | None:
        """When the broker should next send `Expire` (None: no ready message has an expiry, and no x-expires is
        counting)."""
        due = self._ready.next_expiry_ms()
        if self.args.expires_ms is None:
            return due
        queue_due = self.queue_expiry_ms()
        if queue_due is None:
            return due
        return queue_due if due is None else min(due, queue_due)

    def queue_expiry_ms(self) -> int | None:
        """When the queue expires if nothing uses it (None: no x-expires, or a consumer keeps it)."""
        expires_ms = self.args.expires_ms
        if expires_ms is None or self._attached_count:
            return None
        last_used_ms = self._last_used_ms
        return (self._now_ms if last_used_ms is None else last_used_ms) + expires_ms

    def adopt_declared(self, auto_delete: bool, had_consumer: bool) -> None:
        """A snapshot written before the usage rules (its args lack auto_delete, it has no "had_consumer"): take the
        declare flag and whether an Attach was applied from the broker's records, the same on every replica. A
        snapshot that has them is left as it is."""
        if auto_delete and not self.args.auto_delete:
            self.args = dataclasses.replace(self.args, auto_delete=True)
            self._had_consumer = self._had_consumer or had_consumer

    # --- commands -------------------------------------------------------------------------------------------

    def _cancel(self, command: Cancel, out: _Effects) -> None:
        now_ms = self._advance(command.now_ms, out)
        consumer = self._consumers.get(command.consumer_id)
        if consumer is None or not consumer.attached:
            return
        consumer.attached = False  # (the ring drops it lazily)
        self._attached_count -= 1
        self._used(now_ms)
        if not consumer.unacked:
            del self._consumers[command.consumer_id]
        if consumer is self._active:
            self._choose_active(out)
            self._deliver(out)
        self._lost_consumer(out)

    def _declare(self, command: Declare, out: _Effects) -> None:
        self._used(self._advance(command.now_ms, out))

    # --- the rules (called by the machine's commands) ---------------------------------------------------------

    def _used(self, now_ms: int) -> None:
        last_used_ms = self._last_used_ms
        if last_used_ms is None or now_ms > last_used_ms:
            self._last_used_ms = now_ms

    def _lost_consumer(self, out: _Effects) -> None:
        """An attached consumer left: the last one of an auto-delete queue makes it unused."""
        if self.unused:
            out.append(QueueUnused())

    def _check_expired(self, out: _Effects) -> None:
        """At `Expire`: report the queue expired when its x-expires is due."""
        due = self.queue_expiry_ms()
        if due is not None and due <= self._now_ms:
            out.append(QueueExpired())

    def _expires_changed(self, old: QueueArgs, new: QueueArgs, now_ms: int) -> None:
        """A SetArgs with another x-expires starts a new period."""
        if new.expires_ms != old.expires_ms:
            self._used(now_ms or self._now_ms)
