"""The controller's record of a mirrored queue (leader, epoch, ISR, ELR) and its election rules, as pure functions.

It stands in for the metadata group, which records leader, epoch and ISR changes as Kafka's controller does: a
leader is elected from the recorded ISR only (live members, in replica order), then from the eligible leader
replicas if `Settings.eligible_leader_replicas` (KIP-966), and from any live replica only if
`promote_on_failure == "always"` (an unclean election). A replica that reports itself up to a queue without a
leader is taken first among the eligible (the others are live only as far as the reporter knows). With ELR, a member that restarted after possibly losing
acknowledged writes (`unclean`) leaves the ISR and ELR until it catches up again; when only such members remain,
the controller waits until every ISR, ELR and unclean member is back and picks the one with the largest (last epoch, LEO), as
KIP-966's unclean recovery does (`log_ends` is what the live replicas report). Every election bumps the epoch; the new ISR is the new
leader and the live members of the old one (a dead replica is fenced out of it, except the last member, which
stays recorded when nobody can lead). An ISR change is accepted only from the current leader in its epoch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from cluster.mirror_queues.core.types import IsrChanged, Settings


@dataclass(frozen=True, slots=True)
class PartitionState:
    replicas: tuple[str, ...]
    leader: str | None
    epoch: int
    isr: frozenset[str]
    elr: frozenset[str] = frozenset()
    unclean: frozenset[str] = frozenset()  # restarted after a crash that may have lost acknowledged writes
    unclean_elections: int = 0


def initial(replicas: tuple[str, ...]) -> PartitionState:
    return PartitionState(replicas, replicas[0], 0, frozenset(replicas))


def _with_isr(state: PartitionState, isr: frozenset[str], settings: Settings) -> PartitionState:
    """KIP-966: members dropped while the ISR is below `min_insync` keep every committed record (the HW does not
    move then), so they stay eligible; once the ISR is large enough again the ELR is cleared."""
    if not settings.eligible_leader_replicas:
        return replace(state, isr=isr, elr=frozenset())
    if len(isr) >= settings.min_insync:
        return replace(state, isr=isr, elr=frozenset())
    return replace(state, isr=isr, elr=(state.elr | (state.isr - isr)) - isr)


def alter_isr(state: PartitionState, change: IsrChanged, settings: Settings) -> PartitionState:
    if change.leader != state.leader or change.epoch != state.epoch:
        return state
    rejoined = change.isr - state.isr  # caught up with the leader: whole again
    return _with_isr(replace(state, unclean=state.unclean - rejoined), change.isr, settings)


LogEnds = Mapping[str, tuple[int, int]]


def _elect(state: PartitionState, live: frozenset[str], settings: Settings, log_ends: LogEnds,
           prefer: str | None = None) -> PartitionState:
    if settings.eligible_leader_replicas:
        usable = live - state.unclean
        clean = [r for r in state.replicas if r in state.isr and r in usable]
        clean = clean or [r for r in state.replicas if r in state.elr and r in usable]
        members = state.isr | state.elr | state.unclean
        if not clean and members and members <= live:
            clean = [max(sorted(members), key=lambda r: log_ends.get(r, (-1, 0)))]
    else:
        clean = [r for r in state.replicas if r in state.isr and r in live]
    if clean:
        leader = prefer if prefer in clean else clean[0]
        elected = replace(state, leader=leader, epoch=state.epoch + 1, unclean=state.unclean - {leader})
        return _with_isr(elected, frozenset({leader}) | (state.isr & live), settings)
    if settings.promote_on_failure == "always":
        unclean = [r for r in state.replicas if r in live]
        if unclean:
            return replace(state, leader=unclean[0], epoch=state.epoch + 1, isr=frozenset({unclean[0]}),
                           elr=frozenset(), unclean_elections=state.unclean_elections + 1)
    return replace(state, leader=None)


def broker_down(state: PartitionState, node: str, live: frozenset[str], settings: Settings,
                log_ends: LogEnds) -> PartitionState:
    """`live` excludes `node`. Only the leader's failure needs an election here; a follower that stops fetching
    leaves the ISR through the leader's lag check."""
    if node != state.leader:
        return state
    return _elect(state, live, settings, log_ends)


def broker_up(state: PartitionState, node: str, live: frozenset[str], unclean: bool, settings: Settings,
              log_ends: LogEnds) -> PartitionState:
    """`live` includes `node`; `unclean`: it may have lost acknowledged writes (a crash with unsynced flush). With
    ELR such a member leaves the ISR and ELR until it has caught up with a leader again."""
    if settings.eligible_leader_replicas and unclean and node in state.isr | state.elr:
        state = replace(state, isr=state.isr - {node}, elr=state.elr - {node}, unclean=state.unclean | {node})
    if state.leader is None:  # `node` is surely live (it is the one that reports): first among the eligible
        return _elect(state, live, settings, log_ends, prefer=node)
    return state


def transfer(state: PartitionState, to: str, live: frozenset[str]) -> PartitionState:
    """A controlled leadership move (a leader's orderly shutdown, or a rebalance) to a live ISR member; the old
    leader stays in the ISR. Refused (state unchanged) otherwise."""
    if to == state.leader or to not in state.isr or to not in live:
        return state
    return replace(state, leader=to, epoch=state.epoch + 1, isr=state.isr & live)
