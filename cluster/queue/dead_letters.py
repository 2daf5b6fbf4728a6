"""Lost messages of `Queue` (a mixin of cluster/queue/machine.py): dead-lettering, the holding area and length
limits.

A lost message (expired, rejected, over the delivery limit or dropped from the head, "maxlen") becomes a
`DeadLetter` when a DLX is configured, else `Dropped`; under at-least-once dead lettering on a machine made with
`hold_dead_letters=True` it is held (cluster/queue/holding.py) until `SettleDeadLettered`, and a SetArgs that turns
the strategy off releases the held ones at-most-once. Held dead letters count against the length limits.

Every `DeadLetter` is numbered by `_dead_letter_seq` (1, 2, ...; `DeadLetter.seq`), the sequence of its copy under
the source queue's at-most-once dead-letter publisher id: the machine owns the counter and its snapshot keeps it,
so every replica numbers alike and a leader change re-sends a copy under the same sequence (a Duplicate at the
target, never a second copy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster.queue.holding import DeadLetterHolding
from cluster.queue.ready import GONE, STATE_MASK, Entry, ReadyStore
from cluster.queue.types import (
    DeadLetter,
    DeadLetterReason,
    Dropped,
    MsgId,
    QueueArgs,
    QueuedMessage,
    QueueEffect,
    SettleDeadLettered,
)

_Effects = list[QueueEffect]


class DeadLettering:
    """How `Queue` loses messages; `Queue` holds the attributes."""

    if not TYPE_CHECKING:  # (slots at run time; mypy is told the attributes below, which `Queue` slots)
        __slots__ = ()

    args: QueueArgs
    hold_dead_letters: bool
    _ready: ReadyStore
    _held: DeadLetterHolding
    _dead_letter_seq: int

    def _dead_letter(self, message: QueuedMessage, reason: DeadLetterReason, delivery_count: int,
                     msg_id: MsgId | None, held_seq: int | None = None) -> DeadLetter:
        """A `DeadLetter` effect with the next dead-letter sequence."""
        self._dead_letter_seq = seq = self._dead_letter_seq + 1
        return DeadLetter(message, reason, delivery_count, msg_id, held_seq, seq)

    @property
    def dead_letter_seq(self) -> int:
        """The sequence of the latest `DeadLetter` (0: none yet)."""
        return self._dead_letter_seq

    def adopt_dead_letter_seq(self, seq: int) -> None:
        """A snapshot written before the machine numbered its dead letters: continue from the count the broker kept
        beside it (`QueueState.dead_letter_seq` then, the same on every replica); a larger own count stays."""
        self._dead_letter_seq = max(self._dead_letter_seq, seq)

    def _lose(self, entry: Entry, reason: DeadLetterReason, out: _Effects) -> None:
        entry.flags = (entry.flags & ~STATE_MASK) | GONE
        if self.hold_dead_letters and self.args.holds_dead_letters:
            held_seq = self._held.hold(entry, reason)
            out.append(self._dead_letter(entry.message, reason, entry.delivery_count, entry.msg_id, held_seq))
        elif self.args.dead_letter_exchange is not None:
            out.append(self._dead_letter(entry.message, reason, entry.delivery_count, entry.msg_id))
        else:
            out.append(Dropped(entry.msg_id, reason))

    def _release_held(self, out: _Effects) -> None:
        for letter in self._held.release_all():
            entry = letter.entry
            if self.args.dead_letter_exchange is not None:
                out.append(self._dead_letter(entry.message, letter.reason, entry.delivery_count, entry.msg_id))
            else:
                out.append(Dropped(entry.msg_id, letter.reason))

    def _settle_dead_lettered(self, command: SettleDeadLettered, out: _Effects) -> None:
        self._held.settle(command.msg_ids)

    def _would_overflow(self, size_bytes: int) -> bool:
        """Held dead letters count too (they are only ever held under reject-publish)."""
        held = self._held
        max_length = self.args.max_length
        if max_length is not None and self._ready.count + held.count + 1 > max_length:
            return True
        max_bytes = self.args.max_length_bytes
        return max_bytes is not None and self._ready.size_bytes + held.size_bytes + size_bytes > max_bytes

    def _drop_heads_over_limit(self, out: _Effects) -> None:
        ready = self._ready
        max_length = self.args.max_length
        max_bytes = self.args.max_length_bytes
        while ready.count and (
            (max_length is not None and ready.count > max_length)
            or (max_bytes is not None and ready.size_bytes > max_bytes)
        ):
            entry = ready.pop_head()
            assert entry is not None
            self._lose(entry, "maxlen", out)
