"""Route commands that only a group's leader can carry out: do them here, forward them, hold them, or drop them.

A command (`codec.Command`: a proposal, a membership change or a leadership transfer) may be given to any node.
Once per cycle the node driver calls `route(multi, now_ms, ...)`, which looks at each queued command's group:

- this node leads it: the command goes to the core now (a proposal refused only because a leadership transfer is
  under way is held: the new leader takes it a moment later; any other refusal is dropped and counted). A group's
  proposals of one `route` call go to the core as one batch (`MultiRaft.propose_many`: one round of appends for
  all of them), in order, before any later membership change or transfer of that group;
- another node is the known leader: the command is forwarded to it (one list per leader per cycle, which the
  driver sends as `Forward` frames, at most `frame_commands_max` commands or `frame_bytes_max` bytes each). A
  command forwarded `hops_max` times already (leadership moved while it travelled) is dropped;
- no leader is known, or the group is not hosted here (yet): the command is held until `hold_ms` after it was
  first seen, then dropped.

Delivery is best-effort: a forward can be lost with its connection and a held command can expire. Callers retry
and deduplicate (the queue envelope carries the proposal id). Fresh and held commands together are bounded by
`queued_max`; `offer` refuses beyond it. Held commands are looked at again only when the driver says something
changed (a tick, a leader change, a group added), so a long hold costs nothing per inbound batch.
No I/O here: the caller passes the time and sends the frames.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from cluster.raft.core.multiraft import MultiRaft
from cluster.raft.core.types import ConfChange, GroupId, NodeId, Role
from cluster.raft.runtime.codec import Command, Forward

FORWARD_HOLD_MS = 2000
FORWARD_HOPS_MAX = 2
FRAME_COMMANDS_MAX = 1024
FRAME_BYTES_MAX = 8 * 1024 * 1024
COMMANDS_QUEUED_MAX = 65536


@dataclass
class RoutingStats:
    local: int = 0  # commands handed to a local leader core
    refused: int = 0  # refused by the local leader core (not leader any more, full, invalid change)
    forwarded: int = 0  # commands sent to another node's leader
    received: int = 0  # commands forwarded to us
    expired: int = 0  # held past hold_ms without a leader (or without the group)
    hops_exceeded: int = 0  # forwarded too often already
    refused_full: int = 0  # offer refused: queued_max reached


class CommandRouter:
    def __init__(
        self,
        node_id: NodeId,
        hold_ms: int = FORWARD_HOLD_MS,
        queued_max: int = COMMANDS_QUEUED_MAX,
        hops_max: int = FORWARD_HOPS_MAX,
        frame_commands_max: int = FRAME_COMMANDS_MAX,
        frame_bytes_max: int = FRAME_BYTES_MAX,
    ) -> None:
        self.node_id = node_id
        self.hold_ms = hold_ms
        self.queued_max = queued_max
        self.hops_max = hops_max
        self.frame_commands_max = frame_commands_max
        self.frame_bytes_max = frame_bytes_max
        self.stats = RoutingStats()
        self._fresh: deque[Command] = deque()
        self._held: deque[tuple[float, Command]] = deque()  # (drop at ms, command), in arrival order

    def __len__(self) -> int:
        return len(self._fresh) + len(self._held)

    @property
    def held_count(self) -> int:
        return len(self._held)

    def has_fresh(self) -> bool:
        return bool(self._fresh)

    def offer(self, command: Command) -> bool:
        """Queue a command for the next `route`; False when `queued_max` commands are waiting already."""
        if len(self) >= self.queued_max:
            self.stats.refused_full += 1
            return False
        self._fresh.append(command)
        return True

    def offer_forwarded(self, forward: Forward) -> None:
        for command in forward.commands:
            self.stats.received += 1
            self.offer(command)

    def route(self, multi: MultiRaft, now_ms: float, retry_held: bool) -> list[Forward]:
        """Carry out, forward or hold every fresh command (and the held ones when `retry_held`)."""
        outgoing: dict[NodeId, list[Command]] = {}
        proposals: dict[GroupId, list[tuple[float, Command]]] = {}  # for local leaders, proposed in one batch
        if retry_held:
            held, self._held = self._held, deque()
            for deadline_ms, command in held:
                self._dispatch(multi, command, deadline_ms, now_ms, outgoing, proposals)
        while self._fresh:
            self._dispatch(multi, self._fresh.popleft(), now_ms + self.hold_ms, now_ms, outgoing, proposals)
        for group in list(proposals):
            self._propose_batch(multi, group, proposals, now_ms)
        return [forward for leader in sorted(outgoing) for forward in self._frames(leader, outgoing[leader])]

    def _dispatch(self, multi: MultiRaft, command: Command, deadline_ms: float, now_ms: float,
                  outgoing: dict[NodeId, list[Command]],
                  proposals: dict[GroupId, list[tuple[float, Command]]]) -> None:
        core = multi.groups.get(command.group)
        if core is not None and core.role is Role.LEADER:
            if command.op == "propose":
                proposals.setdefault(command.group, []).append((deadline_ms, command))
                return
            self._propose_batch(multi, command.group, proposals, now_ms)  # earlier proposals go first
            if self._carry_out(multi, command):
                return
            self.stats.refused += 1
            return
        if core is not None and core.lead is not None and core.lead != self.node_id:
            if command.hops >= self.hops_max:
                self.stats.hops_exceeded += 1
            else:
                outgoing.setdefault(core.lead, []).append(replace(command, hops=command.hops + 1))
                self.stats.forwarded += 1
            return
        self._hold(command, deadline_ms, now_ms)

    def _hold(self, command: Command, deadline_ms: float, now_ms: float) -> None:
        if now_ms >= deadline_ms:
            self.stats.expired += 1
        else:
            self._held.append((deadline_ms, command))

    def _propose_batch(self, multi: MultiRaft, group: GroupId,
                       proposals: dict[GroupId, list[tuple[float, Command]]], now_ms: float) -> None:
        """Propose a local leader's queued proposals as one batch (one round of appends, not one per command).
        What the core refuses only because a leadership transfer is under way is held; the rest is refused."""
        batch = proposals.pop(group, None)
        if not batch:
            return
        accepted = multi.propose_many(group, [command.data for _, command in batch])
        self.stats.local += accepted
        transferring = multi.groups[group].lead_transferee is not None
        for deadline_ms, command in batch[accepted:]:
            if transferring:
                self._hold(command, deadline_ms, now_ms)
            else:
                self.stats.refused += 1

    def _carry_out(self, multi: MultiRaft, command: Command) -> bool:
        """Hand a membership change or a transfer to the local leader core; False if the core refused it."""
        if command.op == "conf":
            try:
                change = ConfChange.decode(command.data)
            except (ValueError, UnicodeDecodeError):
                return False
            accepted = multi.propose_conf_change(command.group, change) is not None
        else:
            try:
                target = NodeId(command.data.decode())
            except UnicodeDecodeError:
                return False
            accepted = multi.transfer_leadership(command.group, target)
        if accepted:
            self.stats.local += 1
        return accepted

    def _frames(self, leader: NodeId, commands: list[Command]) -> list[Forward]:
        frames: list[Forward] = []
        chunk: list[Command] = []
        chunk_bytes = 0
        for command in commands:
            size = len(command.data) + len(command.group) + 16
            if chunk and (len(chunk) >= self.frame_commands_max or chunk_bytes + size > self.frame_bytes_max):
                frames.append(Forward(self.node_id, leader, tuple(chunk)))
                chunk, chunk_bytes = [], 0
            chunk.append(command)
            chunk_bytes += size
        if chunk:
            frames.append(Forward(self.node_id, leader, tuple(chunk)))
        return frames
