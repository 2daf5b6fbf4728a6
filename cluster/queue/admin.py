"""Queue administration (a mixin of cluster/queue/machine.py): `Purge` and `SetArgs` (policies).

- Purge removes every ready message and a paging machine's tail (`Purged` with the count, then `PagedDropped`:
  cluster/queue/paging.py); `Purge(transient_only=True)` only the ready non-persistent ones, keeping the rest in
  order (and the tail), with no effect (replicated mode: a classic queue's restart).
- SetArgs (policies) replaces the arguments at its point of the log, keeping max_priority,
  single_active_consumer and auto_delete as declared. A new x-message-ttl applies to messages enqueued from then
  on; messages already in keep the expiry they got (as RabbitMQ, which stamps the expiry at enqueue). New length
  limits apply at once: under drop-head the heads over the limit are dead-lettered/dropped ("maxlen"); under
  reject-publish(-dlx) nothing already in the queue is removed, publishes are refused until it is under the limit
  (as RabbitMQ). A new x-expires starts a new period (cluster/queue/usage.py). Whether a tail may start follows
  the new arguments (cluster/queue/paging.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import TYPE_CHECKING

from cluster.queue.consumers import Consumer
from cluster.queue.holding import DeadLetterHolding
from cluster.queue.ready import IN_EXPIRY_HEAP, ReadyStore
from cluster.queue.types import Purge, Purged, QueueArgs, QueueEffect, SetArgs

_Effects = list[QueueEffect]


class QueueAdmin:
    """Purge and SetArgs of `Queue`; `Queue` holds the attributes."""

    if not TYPE_CHECKING:  # (slots at run time; mypy is told the attributes below, which `Queue` slots)
        __slots__ = ()

    args: QueueArgs
    hold_dead_letters: bool
    _ready: ReadyStore
    _consumers: dict[Hashable, Consumer]
    _held: DeadLetterHolding
    _has_limits: bool
    _next_msg_id: int
    _ttl_epoch_msg_id: int

    # (the machine's and its mixins' helpers these commands use)
    def _expires_changed(self, old: QueueArgs, new: QueueArgs, now_ms: int) -> None:
        raise NotImplementedError

    def _release_held(self, out: _Effects) -> None:
        raise NotImplementedError

    def _drop_heads_over_limit(self, out: _Effects) -> None:
        raise NotImplementedError

    def _purge_tail(self, out: _Effects) -> int:
        raise NotImplementedError

    def _set_page_out_at(self) -> None:
        raise NotImplementedError

    def _purge(self, command: Purge, out: _Effects) -> None:
        if not command.transient_only:
            dropped: _Effects = []  # (the tail's PagedDropped follows Purged)
            count = self._ready.clear() + self._purge_tail(dropped)
            out.append(Purged(count))
            out.extend(dropped)
            return
        old = self._ready  # kept in order as returned entries of a fresh store, as `_rebuild_ready` does
        self._ready = ReadyStore(self.args.max_priority, old.queue_ttl_ms)
        for entry in old.iter_in_order():
            entry.flags &= ~IN_EXPIRY_HEAP
            if entry.message.persistent:
                self._ready.push_returned(entry)

    def _set_args(self, command: SetArgs, out: _Effects) -> None:
        old = self.args
        new = dataclasses.replace(command.args, max_priority=old.max_priority,
                                  single_active_consumer=old.single_active_consumer, auto_delete=old.auto_delete)
        self.args = new
        self._expires_changed(old, new, command.now_ms)
        self._has_limits = new.max_length is not None or new.max_length_bytes is not None
        self._set_page_out_at()
        if new.message_ttl_ms != old.message_ttl_ms:
            self._rebuild_ready(new.message_ttl_ms)
        if self._held.count and not (self.hold_dead_letters and new.holds_dead_letters):
            self._release_held(out)
        if self._has_limits and new.overflow == "drop-head":
            self._drop_heads_over_limit(out)

    def _rebuild_ready(self, queue_ttl_ms: int | None) -> None:
        """A new message TTL: existing ready messages keep their expiry, as returned entries of a fresh store (the
        compact form assumes the current TTL); later messages are compact again."""
        old = self._ready
        self._ready = ReadyStore(self.args.max_priority, queue_ttl_ms)
        for consumer in self._consumers.values():
            for entry in consumer.unacked.values():
                entry.flags &= ~IN_EXPIRY_HEAP  # the old store's heap is gone: pushed afresh when returned
        for entry in old.iter_in_order():
            entry.flags &= ~IN_EXPIRY_HEAP
            self._ready.push_returned(entry)
        self._ttl_epoch_msg_id = self._next_msg_id
