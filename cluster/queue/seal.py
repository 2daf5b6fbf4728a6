"""The seal of a queue's log: the entry after which a replicated queue takes nothing more from that log (pure).

What it is for: a classic queue that an `ha-mode` policy makes mirrored after declare moves from its Raft group to
a mirror log (docs/mirrored_queues.md, "A classic queue becomes mirrored"). Every node's replica applies the Raft
group's committed entries as they come, so the move needs one cut point that every replica agrees on: the `Seal`
entry. A replica that applied it is *sealed*: it refuses every later entry of that log, so a publish (or ack,
attach, ...) committed in Raft after the seal is applied by no replica. Its proposer never sees it applied, keeps
it, and sends it again to the queue's new log once the node switched: it is applied once, there.

How it works: `ReplicatedQueue.apply` records a `Seal` (it is deduplicated like any proposal), sets `sealed` and
returns no effects; while sealed it refuses every proposal (None, not recorded: the same proposal may still be
applied from the new log). `sealed` is in the replica's snapshot, so a Raft snapshot taken after the seal restores
a sealed replica. The state the new log starts from (its seed) is the replica's snapshot with the seal lifted
(`ReplicatedQueue.snapshot(..., sealed=False)`): the new log's records are applied to it. `applicable` is the same
rule for a host that reads a batch of committed entries: how many of them a replica (sealed or not before the
batch) applies, so the host marks only those as applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Seal:
    """The last entry a replica applies from the log it is in (wire kind "seal", no fields)."""


def applicable(sealed: bool, commands: Sequence[Any]) -> int:
    """How many of a batch's `commands`, in log order, a replica applies: none when it is sealed already, else up to
    and including the first `Seal`, else all of them."""
    if sealed:
        return 0
    for i, command in enumerate(commands):
        if type(command) is Seal:
            return i + 1
    return len(commands)
