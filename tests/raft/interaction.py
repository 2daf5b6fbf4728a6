"""Scripted interaction tests in etcd's data-driven style.

A script is a sequence of blocks:

    command arg arg key=value
    ----
    expected output lines

Commands drive real `RaftCore`s over an in-memory network with immediate persistence. Every node's Ready is
processed after each command (persist, queue messages, apply, advance). Output: every delivered message, then a
line for every node whose (role, term, leader, commit) changed. Run with RAFT_REWRITE=1 to regenerate the expected
output, then review the diff.

Commands: add-nodes N [voters=1,2,3] [learners=4] [prevote=false] [checkquorum=false] [msgsize=B] [broken=V]
          [inflight=K]; add-node ID (an empty learner that knows the current membership); campaign ID;
          propose ID DATA; propose-conf ID (add-learner|promote|remove) NODE; transfer-leader ID TARGET;
          tick ID [N] (messages stay queued); tick-all [N] (delivers every tick); deliver-msgs [ID...] (one round, to those destinations or all);
          drop [from=ID] [to=ID]; partition 1 2 / 3 4 5; heal; stabilize; status; log ID; compact ID;
          crash ID; restart ID.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from chaos.sim.trace import describe_message
from cluster.raft.core.raft import BrokenVariant, RaftConfig, RaftCore
from cluster.raft.core.types import (
    ConfChange,
    ConfOp,
    Entry,
    HardState,
    Index,
    Membership,
    Message,
    NodeId,
    PersistedState,
    Snapshot,
    Term,
)

REWRITE = os.environ.get("RAFT_REWRITE") == "1"


def _staggered_timeouts(node_id: str):  # type: ignore[no-untyped-def]
    """Deterministic election timeouts that differ per node (node k waits 3*(k-1) extra ticks): no split votes."""
    extra = 3 * (int(node_id) - 1)

    def rng(low: int, high: int) -> int:
        return min(high - 1, low + extra)

    return rng


@dataclass
class Storage:
    hard_state: HardState
    snapshot: Snapshot
    entries: dict[int, Entry] = field(default_factory=dict)

    def state(self) -> PersistedState:
        out = []
        index = self.snapshot.index + 1
        while index in self.entries:
            out.append(self.entries[index])
            index += 1
        return PersistedState(self.hard_state, self.snapshot, tuple(out))


@dataclass
class Node:
    core: RaftCore | None
    storage: Storage
    applied: list[str] = field(default_factory=list)


class Env:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.config = RaftConfig()
        self.broken: BrokenVariant | None = None
        self.queue: deque[Message] = deque()
        self.blocked: set[tuple[str, str]] = set()
        self.last_status: dict[str, str] = {}
        self.out: list[str] = []

    # --- plumbing ---------------------------------------------------------------------------------------
    def process(self) -> None:
        for _ in range(100):
            busy = False
            for node_id in sorted(self.nodes):
                node = self.nodes[node_id]
                if node.core is not None and node.core.has_ready():
                    busy = True
                    self._process_one(node)
            if not busy:
                return

    def _process_one(self, node: Node) -> None:
        assert node.core is not None
        ready = node.core.ready()
        storage = node.storage
        if ready.snapshot is not None:
            storage.snapshot = ready.snapshot
            storage.entries = {}
            node.applied = [f"<snapshot {ready.snapshot.index}>"]
        for entry in ready.entries:
            for index in [i for i in storage.entries if i >= entry.index]:
                del storage.entries[index]
            break
        for entry in ready.entries:
            storage.entries[entry.index] = entry
        if ready.hard_state is not None:
            storage.hard_state = ready.hard_state
        self.queue.extend(ready.messages)
        node.applied.extend(entry.data.decode() for entry in ready.committed_entries if entry.data)
        node.core.advance(ready)

    def status_line(self, node_id: str) -> str:
        core = self.nodes[node_id].core
        if core is None:
            return "down"
        quiesced = " quiesced" if core.quiesced else ""
        return (f"{core.role.value} term={core.term} lead={core.lead} commit={core.log.committed} "
                f"last={core.log.last_index()}{quiesced}")

    def report_changes(self) -> None:
        for node_id in sorted(self.nodes):
            line = self.status_line(node_id)
            if self.last_status.get(node_id) != line:
                self.last_status[node_id] = line
                self.out.append(f"{node_id}: {line}")

    def deliver_round(self, only: set[str] | None) -> int:
        pending = list(self.queue)
        self.queue.clear()
        delivered = 0
        for message in pending:
            if only is not None and message.dst not in only:
                self.queue.append(message)
                continue
            target = self.nodes.get(message.dst)
            if (message.src, message.dst) in self.blocked or target is None or target.core is None:
                self.out.append(f"dropped {describe_message(message)}")
                continue
            self.out.append(describe_message(message))
            target.core.step(message)
            delivered += 1
        self.process()
        return delivered

    def new_core(self, node_id: str, membership: Membership | None, persisted: PersistedState | None) -> RaftCore:
        return RaftCore(NodeId(node_id), self.config, _staggered_timeouts(node_id), membership, persisted, self.broken)

    # --- commands ---------------------------------------------------------------------------------------
    def run(self, command: str) -> list[str]:
        self.out = []
        words = command.split()
        name, args = words[0], words[1:]
        kwargs = dict(arg.split("=", 1) for arg in args if "=" in arg)
        positional = [arg for arg in args if "=" not in arg]
        getattr(self, "cmd_" + name.replace("-", "_"))(positional, kwargs)
        self.process()
        if name not in ("status", "log"):
            self.report_changes()
        return [line.rstrip() for line in self.out]

    def cmd_add_nodes(self, args: list[str], kw: dict[str, str]) -> None:
        count = int(args[0])
        ids = [str(i) for i in range(1, count + 1)]
        voters = kw.get("voters", ",".join(ids)).split(",")
        learners = [x for x in kw.get("learners", "").split(",") if x]
        self.config = RaftConfig(
            pre_vote=kw.get("prevote", "true") == "true",
            check_quorum=kw.get("checkquorum", "true") == "true",
            msg_size_bytes_max=int(kw.get("msgsize", 65536)),
            inflight_msgs_max=int(kw.get("inflight", 64)),
            quiesce=kw.get("quiesce", "false") == "true",
        )
        self.broken = BrokenVariant(kw["broken"]) if "broken" in kw else None
        membership = Membership(frozenset(NodeId(v) for v in voters), frozenset(NodeId(v) for v in learners))
        for node_id in ids:
            snapshot = Snapshot(Index(0), Term(0), membership)
            storage = Storage(HardState(Term(0), None, Index(0)), snapshot)
            self.nodes[node_id] = Node(self.new_core(node_id, membership, None), storage)

    def cmd_add_node(self, args: list[str], kw: dict[str, str]) -> None:
        node_id = args[0]
        known = next(n.core for n in self.nodes.values() if n.core is not None)
        members = known.membership
        membership = Membership(members.voters, members.learners | {NodeId(node_id)})
        snapshot = Snapshot(Index(0), Term(0), membership)
        storage = Storage(HardState(Term(0), None, Index(0)), snapshot)
        self.nodes[node_id] = Node(self.new_core(node_id, membership, None), storage)

    def _core(self, node_id: str) -> RaftCore:
        core = self.nodes[node_id].core
        assert core is not None, f"node {node_id} is down"
        return core

    def cmd_campaign(self, args: list[str], kw: dict[str, str]) -> None:
        self._core(args[0]).campaign()

    def cmd_propose(self, args: list[str], kw: dict[str, str]) -> None:
        index = self._core(args[0]).propose(args[1].encode())
        self.out.append(f"propose -> {index}")

    def cmd_propose_conf(self, args: list[str], kw: dict[str, str]) -> None:
        change = ConfChange(ConfOp(args[1]), NodeId(args[2]))
        index = self._core(args[0]).propose_conf_change(change)
        self.out.append(f"propose-conf -> {index}")

    def cmd_transfer_leader(self, args: list[str], kw: dict[str, str]) -> None:
        started = self._core(args[0]).transfer_leadership(NodeId(args[1]))
        self.out.append(f"transfer -> {started}")

    def cmd_tick(self, args: list[str], kw: dict[str, str]) -> None:
        for _ in range(int(args[1]) if len(args) > 1 else 1):
            self._core(args[0]).tick()
            self.process()

    def cmd_tick_all(self, args: list[str], kw: dict[str, str]) -> None:
        """Advance time: every tick, tick every node then deliver until quiet (heartbeat lines are elided)."""
        for _ in range(int(args[0]) if args else 1):
            for node_id in sorted(self.nodes):
                core = self.nodes[node_id].core
                if core is not None:
                    core.tick()
            self.process()
            mark = len(self.out)
            self.cmd_stabilize([], {})
            self.out[mark:] = [line for line in self.out[mark:] if " Heartbeat" not in line]

    def cmd_deliver_msgs(self, args: list[str], kw: dict[str, str]) -> None:
        self.deliver_round(set(args) if args else None)

    def cmd_drop(self, args: list[str], kw: dict[str, str]) -> None:
        kept: deque[Message] = deque()
        for message in self.queue:
            if kw.get("from", message.src) == message.src and kw.get("to", message.dst) == message.dst:
                self.out.append(f"dropped {describe_message(message)}")
            else:
                kept.append(message)
        self.queue = kept

    def cmd_partition(self, args: list[str], kw: dict[str, str]) -> None:
        sides = [side.split() for side in " ".join(args).split("/")]
        self.blocked = {(a, b) for side in sides for other in sides if other is not side for a in side for b in other}

    def cmd_heal(self, args: list[str], kw: dict[str, str]) -> None:
        self.blocked = set()

    def cmd_stabilize(self, args: list[str], kw: dict[str, str]) -> None:
        for _ in range(200):
            self.process()
            if not self.queue:
                return
            self.deliver_round(None)
        raise AssertionError("stabilize did not converge")

    def cmd_status(self, args: list[str], kw: dict[str, str]) -> None:
        for node_id in sorted(self.nodes):
            self.out.append(f"{node_id}: {self.status_line(node_id)}")

    def cmd_log(self, args: list[str], kw: dict[str, str]) -> None:
        core = self._core(args[0])
        log = core.log
        entries = log.slice(log.first_index(), log.last_index()) if log.last_index() >= log.first_index() else ()
        parts = [f"{e.index}/{e.term}" + (f":{e.data.decode()}" if e.data else "") for e in entries]
        self.out.append(f"snapshot={log.snapshot.index}/{log.snapshot.term} " + " ".join(parts))
        self.out.append(f"applied: {' '.join(self.nodes[args[0]].applied)}")

    def cmd_compact(self, args: list[str], kw: dict[str, str]) -> None:
        node = self.nodes[args[0]]
        snapshot = self._core(args[0]).compact(b"")
        node.storage.snapshot = snapshot
        node.storage.entries = {i: e for i, e in node.storage.entries.items() if i > snapshot.index}
        self.out.append(f"compacted through {snapshot.index}")

    def cmd_set_log(self, args: list[str], kw: dict[str, str]) -> None:
        """Give node `args[0]` a log whose entries have the given terms (figure 7 style), and term `term=`."""
        node = self.nodes[args[0]]
        entries = {i: Entry(Term(int(t)), Index(i), f"{i}.{t}".encode()) for i, t in enumerate(args[1:], start=1)}
        node.storage.entries = entries
        node.storage.hard_state = HardState(Term(int(kw["term"])), None, Index(0))
        node.core = self.new_core(args[0], None, node.storage.state())

    def cmd_crash(self, args: list[str], kw: dict[str, str]) -> None:
        self.nodes[args[0]].core = None
        self.queue = deque(m for m in self.queue if m.dst != args[0])

    def cmd_restart(self, args: list[str], kw: dict[str, str]) -> None:
        node = self.nodes[args[0]]
        node.core = self.new_core(args[0], None, node.storage.state())
        node.applied = []


def parse_script(text: str) -> list[tuple[str, list[str]]]:
    blocks: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            i += 1
            continue
        command = line
        assert lines[i + 1].strip() == "----", f"line {i + 2}: expected ---- after {command!r}"
        i += 2
        expected: list[str] = []
        while i < len(lines) and lines[i].strip() != "":
            expected.append(lines[i].rstrip())
            i += 1
        blocks.append((command, expected))
    return blocks


def render(blocks: list[tuple[str, list[str]]], comments: dict[int, list[str]]) -> str:
    out: list[str] = []
    for position, (command, output) in enumerate(blocks):
        out.extend(comments.get(position, []))
        out.append(command)
        out.append("----")
        out.extend(output if output else ["ok"])
        out.append("")
    return "\n".join(out)


def leading_comments(text: str) -> dict[int, list[str]]:
    """Comment lines preceding each block, so that a rewrite keeps them."""
    comments: dict[int, list[str]] = {}
    pending: list[str] = []
    position = 0
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("#"):
            pending.append(line)
            i += 1
        elif not line:
            i += 1
        else:
            comments[position] = pending
            pending = []
            position += 1
            i += 2
            while i < len(lines) and lines[i].strip() != "":
                i += 1
    return comments


def run_script(path: Path) -> None:
    text = path.read_text()
    blocks = parse_script(text)
    env = Env()
    actual = [(command, env.run(command) or ["ok"]) for command, _ in blocks]
    if REWRITE:
        path.write_text(render(actual, leading_comments(text)))
        return
    for (command, expected), (_, got) in zip(blocks, actual, strict=True):
        assert got == expected, f"{path.name}: {command}\nexpected:\n" + "\n".join(expected) + "\ngot:\n" + "\n".join(got)
