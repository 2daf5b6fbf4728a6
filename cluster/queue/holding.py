"""The dead-letter holding area of a queue with at-least-once dead lettering (RabbitMQ 3.10 quorum queues).

A message the queue dead-letters while `QueueArgs.holds_dead_letters` is on does not leave the machine: it moves
here, out of the ready and unacked sets, and the `DeadLetter` effect carries its hold sequence. The queue's
leader republishes it to the DLX targets (publisher dedup with the hold sequence, so re-sends after a leader
change are recognised) and, once every target accepted it, proposes `SettleDeadLettered`, which removes it.

Hold sequences count 1, 2, ... in hold order; they are a function of the log, so every replica assigns the same
ones. Held messages count against the queue's length limits (as in RabbitMQ, where reject-publish is required for
at-least-once: a pile of unsettled dead letters stops publishes, not the other way round). The insertion order of
`held` is the hold order, which is what re-sending walks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from cluster.queue.ready import Entry
from cluster.queue.types import DeadLetterReason, MsgId

DEAD_LETTER_HELD_MAX: Final = 100_000  # held messages past which the queue refuses publishes ("dead_letter_held")


class HeldLetter:
    """One held message: its hold sequence, why it was dead-lettered, and the machine's entry (GONE state)."""

    __slots__ = ("entry", "reason", "seq")

    def __init__(self, seq: int, reason: DeadLetterReason, entry: Entry) -> None:
        self.seq = seq
        self.reason = reason
        self.entry = entry


class DeadLetterHolding:
    """Held messages by msg id, in hold order, with a hold-sequence index; counts and bytes kept up to date."""

    __slots__ = ("_by_seq", "held", "last_seq", "size_bytes")

    def __init__(self) -> None:
        self.held: dict[MsgId, HeldLetter] = {}
        self._by_seq: dict[int, MsgId] = {}
        self.last_seq = 0
        self.size_bytes = 0

    @property
    def count(self) -> int:
        return len(self.held)

    def hold(self, entry: Entry, reason: DeadLetterReason) -> int:
        """Keep `entry` until settled; returns its hold sequence."""
        self.last_seq += 1
        self._add(HeldLetter(self.last_seq, reason, entry))
        return self.last_seq

    def _add(self, letter: HeldLetter) -> None:
        msg_id = letter.entry.msg_id
        self.held[msg_id] = letter
        self._by_seq[letter.seq] = msg_id
        self.size_bytes += letter.entry.message.size_bytes

    def settle(self, msg_ids: Iterable[MsgId]) -> int:
        """Remove these held messages (unknown ids ignored); returns how many left."""
        settled = 0
        for msg_id in msg_ids:
            letter = self.held.pop(msg_id, None)
            if letter is not None:
                del self._by_seq[letter.seq]
                self.size_bytes -= letter.entry.message.size_bytes
                settled += 1
        return settled

    def release_all(self) -> list[HeldLetter]:
        """Empty the holding area (the strategy was switched off); the letters in hold order."""
        letters = list(self.held.values())
        self.held.clear()
        self._by_seq.clear()
        self.size_bytes = 0
        return letters

    def msg_id_of(self, seq: int) -> MsgId | None:
        return self._by_seq.get(seq)

    def __iter__(self) -> Iterator[HeldLetter]:
        return iter(self.held.values())

    def restore(self, last_seq: int, letters: Iterable[HeldLetter]) -> None:
        self.last_seq = last_seq
        for letter in letters:
            if letter.seq > last_seq or letter.entry.msg_id in self.held or letter.seq in self._by_seq:
                raise ValueError("inconsistent dead-letter holding area")
            self._add(letter)
