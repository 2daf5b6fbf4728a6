"""`LiveIds`: a set of message ids stored as a bitmap, for the store's per-stream compaction bookkeeping.

Why: the store remembers which messages of each queue stream are live, only to know when the stream is drained.
A Python set costs ~60 bytes an id (10 million live messages: ~600 MB). Message ids of a queue are dense (one
counter per queue), so one bit each over the live range [base, base + 8 * len(bits)) is enough: 10 million live
ids take 1.25 MB. The range's low end moves up as the oldest ids are removed (leading zero bytes are cut off,
amortised O(1)); an id below the base (a counter restarted after a restart or a re-declare) widens the range.
The cost is proportional to the id range, not the count: one old message left unacked while 80 million newer ones
pass keeps a 10 MB bitmap, still far below a set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class LiveIds:
    """The subset of set[int] the store needs: add, discard, clear, len, bool, in, iter, == another set."""

    __slots__ = ("_base", "_bits", "_count")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._base = 0
        self._bits = bytearray()
        self._count = 0
        for msg_id in ids:
            self.add(msg_id)

    def add(self, msg_id: int) -> None:
        if self._count == 0:
            self._base = msg_id & ~7
            self._bits = bytearray()
        elif msg_id < self._base:
            new_base = msg_id & ~7
            self._bits[:0] = bytes((self._base - new_base) >> 3)
            self._base = new_base
        index = msg_id - self._base
        byte = index >> 3
        bits = self._bits
        if byte >= len(bits):
            bits.extend(bytes(byte + 1 - len(bits)))
        mask = 1 << (index & 7)
        if not bits[byte] & mask:
            bits[byte] |= mask
            self._count += 1

    def discard(self, msg_id: int) -> None:
        index = msg_id - self._base
        bits = self._bits
        byte = index >> 3
        if index < 0 or byte >= len(bits):
            return
        mask = 1 << (index & 7)
        if not bits[byte] & mask:
            return
        bits[byte] &= ~mask
        self._count -= 1
        if self._count == 0:
            self._bits = bytearray()
        elif byte == 0 and not bits[0]:
            first = 1
            while not bits[first]:
                first += 1
            del bits[:first]
            self._base += first << 3

    def clear(self) -> None:
        self._bits = bytearray()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, msg_id: object) -> bool:
        if not isinstance(msg_id, int):
            return False
        index = msg_id - self._base
        return 0 <= index < len(self._bits) * 8 and bool(self._bits[index >> 3] & (1 << (index & 7)))

    def __iter__(self) -> Iterator[int]:
        base = self._base
        for byte, value in enumerate(self._bits):
            if value:
                for bit in range(8):
                    if value & (1 << bit):
                        yield base + (byte << 3) + bit

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LiveIds):
            return set(self) == set(other)
        if isinstance(other, (set, frozenset)):
            return len(other) == self._count and all(i in self for i in other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def size_bytes(self) -> int:
        return len(self._bits)
