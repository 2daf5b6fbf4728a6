"""Publisher-confirm bookkeeping for one channel: how many published messages are settled (acked or nacked).

Brokers confirm with `multiple` acks (everything up to a tag) and with single acks that may arrive out of order.
`ConfirmTracker` keeps `settled_upto` (every tag at or below it is settled) plus the set of single tags settled
above it, so that each call returns exactly how many messages it newly settles, and the window of outstanding
messages (`outstanding`) stays right whatever mix of acks the broker sends.
"""

from __future__ import annotations


class ConfirmTracker:
    """Counts settled publishes on one confirm-mode channel (tags start at 1)."""

    __slots__ = ("_settled_above", "published", "settled_upto")

    def __init__(self) -> None:
        self.published = 0
        self.settled_upto = 0
        self._settled_above: set[int] = set()

    @property
    def outstanding(self) -> int:
        return self.published - self.settled_upto - len(self._settled_above)

    def on_published(self, count: int) -> None:
        self.published += count

    def settle(self, delivery_tag: int, multiple: bool) -> int:
        """Record an ack/nack; returns how many messages it newly settles."""
        if delivery_tag <= self.settled_upto or delivery_tag > self.published:
            return 0
        if multiple:
            already = {tag for tag in self._settled_above if tag <= delivery_tag}
            newly = delivery_tag - self.settled_upto - len(already)
            self._settled_above -= already
            self.settled_upto = delivery_tag
            self._absorb()
            return newly
        if delivery_tag in self._settled_above:
            return 0
        self._settled_above.add(delivery_tag)
        self._absorb()
        return 1

    def _absorb(self) -> None:
        while self.settled_upto + 1 in self._settled_above:
            self.settled_upto += 1
            self._settled_above.remove(self.settled_upto)
