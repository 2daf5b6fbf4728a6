"""One replicated message's path through the Raft runtime, hop by hop, from the nodes' stage-timing files.

Run the cluster with `RAFTMQ_RAFT_TIMING=<dir>` (cluster/raft/runtime/timing.py): every node then writes the
events of single entries (`propose`, `fwd`, `fwd_recv`, `append`, `durable`, `commit`, `apply`, `applied`, with a
system-wide monotonic timestamp) to `<dir>/<node>.jsonl`. This joins them: a leader's `append` carries the entry's
crc32, which names the proposal on the node that proposed it (`propose`/`fwd`, same crc32); the other events are
matched by (group, index), taking for each node the first event at or above the entry's index. It prints, per hop,
count / p50 / p90 / p99 in ms over the entries the leaders appended in the window (`--skip-s` after the first
one, `--span-s` long; or `--last-s`: the last seconds before the last one), and the stage samples of each node (`frame_queue_to_write`, `inbox_wait`, `fsync`, ...).

    python -m bench.raft_trace /tmp/trace-dir [--skip-s 1] [--span-s 5] [--last-s 4]
"""

from __future__ import annotations

import argparse
import bisect
import json
import pathlib
from collections import defaultdict
from dataclasses import dataclass, field

Event = tuple[float, str, str, int, int]


@dataclass
class NodeTrace:
    name: str
    events: list[Event] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    by_crc: dict[tuple[str, int], float] = field(default_factory=dict)  # (kind, crc) -> first time
    appends: dict[tuple[str, int], float] = field(default_factory=dict)  # (group, index) -> time appended
    leader_appends: list[tuple[float, str, int, int]] = field(default_factory=list)  # (t, group, index, crc)
    series: dict[tuple[str, str], tuple[list[int], list[float]]] = field(default_factory=dict)  # (kind, group)

    def first_at_or_above(self, kind: str, group: str, index: int, after_s: float) -> float | None:
        """The first `kind` event of `group` covering `index` (its index at or above), not before `after_s`."""
        indexes, times = self.series.get((kind, group), ([], []))
        position = bisect.bisect_left(times, after_s)
        for i in range(position, len(times)):
            if indexes[i] >= index:
                return times[i]
        return None


def load(directory: pathlib.Path) -> list[NodeTrace]:
    nodes = []
    for path in sorted(directory.glob("*.jsonl")):
        node = NodeTrace(path.stem)
        for line in path.read_text().splitlines():
            record = json.loads(line)
            for stage, values in record.get("stages", {}).items():
                node.stages[stage].extend(values)
            node.events.extend(tuple(event) for event in record.get("events", []))
        node.events.sort()
        series: dict[tuple[str, str], tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
        for t, kind, group, index, key in node.events:
            if kind in ("propose", "fwd", "fwd_recv"):
                node.by_crc.setdefault((kind, key), t)
            elif kind == "append":
                node.appends.setdefault((group, index), t)
                if key:
                    node.leader_appends.append((t, group, index, key))
            if kind in ("durable", "commit", "apply", "applied"):
                indexes, times = series[(kind, group)]
                indexes.append(index)
                times.append(t)
        node.series = dict(series)
        nodes.append(node)
    return nodes


def percentiles(values: list[float]) -> str:
    if not values:
        return "     -"
    values = sorted(values)

    def at(fraction: float) -> float:
        return values[min(len(values) - 1, int(fraction * len(values)))]

    return f"{len(values):6d} {at(0.5):8.2f} {at(0.9):8.2f} {at(0.99):8.2f}"


def hops(nodes: list[NodeTrace], skip_s: float, span_s: float, last_s: float | None) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    leaders = [node for node in nodes if node.leader_appends]
    first_s = min((node.leader_appends[0][0] for node in leaders), default=0.0)
    if last_s is not None:
        first_s, skip_s, span_s = max(node.leader_appends[-1][0] for node in leaders) - last_s, 0.0, last_s
    for leader in leaders:
        others = [node for node in nodes if node is not leader]
        for t_append, group, index, crc in leader.leader_appends:
            if not first_s + skip_s <= t_append <= first_s + skip_s + span_s:
                continue
            proposer = next((node for node in nodes if ("propose", crc) in node.by_crc), None)
            if proposer is not None and proposer is not leader:
                t_propose = proposer.by_crc[("propose", crc)]
                t_fwd = proposer.by_crc.get(("fwd", crc))
                t_recv = leader.by_crc.get(("fwd_recv", crc))
                if t_fwd is not None and t_recv is not None:
                    out["1 proposer: propose -> forwarded (loop wake, route)"].append(t_fwd - t_propose)
                    out["2 forward -> leader received it (writer task, wire, reader)"].append(t_recv - t_fwd)
                    out["3 leader: received -> appended (loop wake, route, propose, take)"].append(t_append - t_recv)
                out["P proposer: propose -> applied there (the confirm)"].append(
                    (proposer.first_at_or_above("applied", group, index, t_propose) or t_propose) - t_propose)
            t_durable = leader.first_at_or_above("durable", group, index, t_append)
            if t_durable is not None:
                out["4 leader: appended -> own fsync done"].append(t_durable - t_append)
            t_commit = leader.first_at_or_above("commit", group, index, t_append)
            if t_commit is None:
                continue
            out["7 leader: appended -> committed"].append(t_commit - t_append)
            for other in others:
                t_follower = other.appends.get((group, index))
                if t_follower is None:
                    continue
                out["5 leader appended -> follower appended (writer, wire, reader, loop)"].append(
                    t_follower - t_append)
                t_fdurable = other.first_at_or_above("durable", group, index, t_follower)
                if t_fdurable is not None:
                    out["6 follower: appended -> fsync done (wait + fsync + settle)"].append(t_fdurable - t_follower)
                t_apply = other.first_at_or_above("apply", group, index, t_commit)
                t_applied = other.first_at_or_above("applied", group, index, t_commit)
                if t_apply is not None and t_applied is not None:
                    out["8 leader committed -> follower applies (writer, wire, reader, loop)"].append(
                        t_apply - t_commit)
                    out["9 follower: host apply (queue work, deliveries queued)"].append(t_applied - t_apply)
                    if proposer is not None and proposer is not leader and proposer is not other:
                        out["T proposer's propose -> the other follower applied"].append(
                            t_applied - proposer.by_crc[("propose", crc)])
    return {name: [value * 1000 for value in values] for name, values in out.items()}


def wire(nodes: list[NodeTrace]) -> list[float]:
    """Frames: the write that finished with sequence number n to the peer's read of frame n (ms)."""
    written: dict[tuple[str, int], float] = {}
    for node in nodes:
        for t, kind, link, seq, _ in node.events:
            if kind == "wrote":
                written[(link, seq)] = t
    return [(t - written[(link, seq)]) * 1000 for node in nodes for t, kind, link, seq, _ in node.events
            if kind == "read" and (link, seq) in written]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("--skip-s", type=float, default=1.0)
    parser.add_argument("--span-s", type=float, default=1e9)
    parser.add_argument("--last-s", type=float, default=None)
    args = parser.parse_args()
    nodes = load(args.directory)
    print(f"{'hop (ms)':72s} {'count':>6s} {'p50':>8s} {'p90':>8s} {'p99':>8s}")
    for name, values in sorted(hops(nodes, args.skip_s, args.span_s, args.last_s).items()):
        print(f"{name:72s} {percentiles(values)}")
    print(f"{'W frame written (its last byte sent) -> read by the peer':72s} {percentiles(wire(nodes))}")
    for node in nodes:
        print(f"\n{node.name}")
        for stage, values in sorted(node.stages.items()):
            print(f"  {stage:70s} {percentiles(values)}")


if __name__ == "__main__":
    main()
