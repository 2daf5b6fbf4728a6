"""Where queues live: pure placement, leader rebalancing and member replacement plans.

What it is for: the node that declares a queue asks `place_queue` for its leader and members before it proposes
`DeclareQueue`; `raftmq ctl rebalance` asks `rebalance_plan` which leaders to move (then `SetQueueLeader` and the
queue group's leadership transfer); the runtime's member-replacement timer asks `replacement_plan` which member of
which quorum queue to swap for which node (then the queue group's membership change and `AddQueueMember` /
`RemoveQueueMember`). Nothing here changes state: each function reads a `MetadataState` and returns a decision.

How it works:
- Load is counted from the state: a node's *member count* is the number of queues listing it as a member, its
  *leader count* the number of queues it leads. Only nodes whose state is "up" are chosen.
- Every choice is deterministic: candidates are ordered by (count, node name), so all nodes computing the same plan
  from the same state agree, and tests can state exact answers.
- `rebalance_plan` moves a leader only to one of that queue's own up members and only when it narrows the gap by
  at least two (source count - target count >= 2), picking the most loaded source first; each such move lowers the
  sum of squared leader counts, so the loop ends, and it ends when no single move could help (balanced within one
  wherever membership allows). A queue whose leader is down is first given its least loaded up member. Queues are
  grouped by (leader, up members), so each step looks at a handful of groups, not at every queue.
- `evacuation_plan` is for a node that leaves (ctl leave/forget without force): every queue it is a member of gets
  an up non-member in its place, or just loses it when there is no candidate and other members remain.
- `replacement_plan` replaces at most one member per queue per call (a Raft group changes membership one step at a
  time; call again after the change committed), only for queues that still have a live majority (otherwise the
  membership change could not commit), and only with an up node that is not already a member.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping

from cluster.metadata.model import MetadataState, QueueRecord

STRATEGIES = ("client-local", "balanced")
SINGLE_MEMBER_TYPES = ("classic",)

QueueKey = tuple[str, str]
Move = tuple[str, str, str]  # (vhost, name, new leader)
Replacement = tuple[str, str, str, str]  # (vhost, name, old member, new member)


class PlacementError(ValueError):
    """No placement is possible (no node is up, or an unknown strategy)."""


def up_nodes(state: MetadataState) -> list[str]:
    return sorted(name for name, node in state.nodes.items() if node.state == "up")


def member_counts(queues: Iterable[QueueRecord]) -> Counter[str]:
    return Counter(m for q in queues for m in q.members)


def leader_counts(queues: Iterable[QueueRecord]) -> Counter[str]:
    return Counter(q.leader for q in queues)


def _least_loaded(candidates: Iterable[str], *counts: Mapping[str, int]) -> str:
    return min(candidates, key=lambda n: (*(c.get(n, 0) for c in counts), n))


# ---------------------------------------------------------------------------------------------------- placement


def place_queue(state: MetadataState, vhost: str, name: str, queue_type: str, local_node: str, group_size: int,
                strategy: str = "client-local") -> tuple[str, tuple[str, ...]]:
    """(leader, members) for a new queue; an existing queue keeps its placement (a redeclare changes nothing).

    Members are up nodes only, `group_size` capped by how many are up (at least 1); classic queues have one member,
    the leader. The leader is `local_node` for "client-local" when it is up, else the up node leading the fewest
    queues. The other members are the up nodes that are members of the fewest queues. Leader first."""
    existing = state.queues.get((vhost, name))
    if existing is not None:
        return existing.leader, existing.members
    if strategy not in STRATEGIES:
        raise PlacementError(f"unknown placement strategy {strategy!r} (expected one of {STRATEGIES})")
    up = up_nodes(state)
    if not up:
        raise PlacementError(f"no node is up to place queue {name!r} in vhost {vhost}")
    queues = list(state.queues.values())
    members_of, leaders_of = member_counts(queues), leader_counts(queues)
    if strategy == "client-local" and local_node in up:
        leader = local_node
    else:
        leader = _least_loaded(up, leaders_of)
    size = 1 if queue_type in SINGLE_MEMBER_TYPES else max(1, min(group_size, len(up)))
    others = sorted((n for n in up if n != leader), key=lambda n: (members_of.get(n, 0), n))[:size - 1]
    return leader, (leader, *sorted(others))


# ---------------------------------------------------------------------------------------------------- rebalance


def rebalance_plan(state: MetadataState) -> list[Move]:
    """Leader moves that spread leaders evenly over each queue's up members; only queues whose leader changes
    are listed, each once, in (vhost, name) order. Empty when already balanced."""
    up = set(up_nodes(state))
    leaders = {key: q.leader for key, q in state.queues.items()}
    choices = {key: tuple(sorted(m for m in q.members if m in up)) for key, q in state.queues.items()}
    counts: Counter[str] = Counter({n: 0 for n in up})
    counts.update(leader for leader in leaders.values() if leader in up)
    for key in sorted(leaders):
        if leaders[key] not in up and choices[key]:
            leaders[key] = _least_loaded(choices[key], counts)
            counts[leaders[key]] += 1
    led = _led_by_member_set(leaders, choices, up)
    for _ in range(len(leaders) + 1):  # a bound; each move lowers sum(count^2) by >= 2, so it ends sooner
        move = _best_move(led, counts)
        if move is None:
            break
        source, members, target = move
        key = led[source][members].pop(0)
        bisect.insort(led[target].setdefault(members, []), key)
        counts[source] -= 1
        counts[target] += 1
        leaders[key] = target
    return [(key[0], key[1], leaders[key]) for key in sorted(leaders) if leaders[key] != state.queues[key].leader]


LedIndex = dict[str, dict[tuple[str, ...], list[QueueKey]]]  # leader -> its queues' up members -> sorted keys


def _led_by_member_set(leaders: Mapping[QueueKey, str], choices: Mapping[QueueKey, tuple[str, ...]],
                       up: set[str]) -> LedIndex:
    """Queues grouped by leader and by their up members: all queues of one group have the same best target, so a
    move is chosen per group, not per queue (rebalancing thousands of queues stays fast)."""
    led: LedIndex = {n: {} for n in up}
    for key in sorted(leaders):
        if leaders[key] in up:
            led[leaders[key]].setdefault(choices[key], []).append(key)
    return led


def _best_move(led: LedIndex, counts: Mapping[str, int]) -> tuple[str, tuple[str, ...], str] | None:
    """From the most loaded source that has one: (source, member set, target) where target is the member set's
    least loaded other member and narrows the gap by >= 2 (the largest gap, then the smallest queue key)."""
    for source in sorted(led, key=lambda n: (-counts[n], n)):
        best: tuple[tuple[int, QueueKey], tuple[str, ...], str] | None = None
        for members, keys in led[source].items():
            targets = [m for m in members if m != source]
            if not keys or not targets:
                continue
            target = _least_loaded(targets, counts)
            gap = counts[source] - counts[target]
            rank = (-gap, keys[0])
            if gap >= 2 and (best is None or rank < best[0]):
                best = (rank, members, target)
        if best is not None:
            return source, best[1], best[2]
    return None


# ---------------------------------------------------------------------------------------------------- replacement


def replacement_plan(state: MetadataState, down_since_ms: Mapping[str, int], now_ms: int,
                     replace_after_ms: int) -> list[Replacement]:
    """For each quorum queue with a member down for at least `replace_after_ms`: (vhost, name, old, new), `new`
    being the up non-member that is a member of the fewest queues (counting this plan's earlier picks). At most
    one per queue; queues without a live majority of members, or with no candidate, are left alone."""
    gone = {n for n, since in down_since_ms.items() if now_ms - since >= replace_after_ms}
    up = [n for n in up_nodes(state) if n not in down_since_ms]
    counts = member_counts(state.queues.values())
    plan: list[Replacement] = []
    for key in sorted(state.queues):
        q = state.queues[key]
        if q.type != "quorum":
            continue
        dead = sorted(m for m in q.members if m in gone)
        live = sum(1 for m in q.members if m in up)
        candidates = [n for n in up if n not in q.members]
        if not dead or not candidates or live * 2 <= len(q.members):
            continue
        new = _least_loaded(candidates, counts)
        counts[new] += 1
        counts[dead[0]] -= 1
        plan.append((q.vhost, q.name, dead[0], new))
    return plan


def evacuation_plan(state: MetadataState, node: str) -> list[Replacement]:
    """Move every queue off `node` (before `RemoveNode(node)` without force): (vhost, name, node, new) with `new`
    the up non-member that is a member of the fewest queues, or "" (shrink only) when there is none and other
    members remain. A queue whose only member is `node`, with no other up node, cannot move and is left out (so
    `RemoveNode` still refuses). Every node leaving is assumed still reachable; one entry per queue."""
    up = [n for n in up_nodes(state) if n != node]
    counts = member_counts(state.queues.values())
    plan: list[Replacement] = []
    for key in sorted(state.queues):
        q = state.queues[key]
        if node not in q.members:
            continue
        candidates = [n for n in up if n not in q.members]
        if candidates:
            new = _least_loaded(candidates, counts)
            counts[new] += 1
            plan.append((q.vhost, q.name, node, new))
        elif len(q.members) > 1:
            plan.append((q.vhost, q.name, node, ""))
    return plan
