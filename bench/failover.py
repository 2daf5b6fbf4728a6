"""`raftmq bench failover`: how long a quorum queue stops confirming when its leader's node is killed (kill -9).

What it measures: a 3-node raftmq cluster on loopback (started here, in a temporary directory) with one quorum
queue. Each run finds the queue's Raft leader (from the nodes' "cluster: queue <group>: leader <node>" log lines),
connects a publisher with confirms to a surviving node, publishes one message at a time, kills the leader's process
with SIGKILL and records:
- `first_confirm_ms`: from the kill to the first confirm of a message *published after* the kill (the publish in
  flight at the kill must first get its own confirm, so this is the gap a client sees);
- `longest_gap_ms`: the longest time between two consecutive confirms around the kill.
Every run starts a fresh cluster (no restart between runs). Prints one line per run and the
median/max; `--json` writes them to a file. For raftmq each run also gives the failover's timeline from the
survivors' logs (ms after the kill, at the logs' 1 ms resolution): `refused` (the first survivor whose Raft transport
saw the dead node refuse connections and let the groups it led elect at once), `campaign` (the first survivor that
lost its leader: it campaigns) and `leader` (the first survivor that knows the new leader).
`--pause-ms MS` adds, for raftmq, as many runs of a paused leader: SIGSTOP of the leader's process for MS ms
(keep it below the nodes' `node_down_after_ms`, 5 s by default), then SIGCONT. A paused node refuses nothing, so
the ordinary election timeout applies (the figure is the first confirm after the stop), and no survivor may take
it for dead: a run fails if a survivor logged it refusing connections or down. `--publisher last` puts the
publisher on the last survivor by name instead of the first (which becomes the new leader after a kill). Needs nothing but the raftmq sources (it runs `python -m node.cli node`)
and pika. Independent of the broker's code (import-linter: bench imports no node/cluster modules).
`--broker rabbitmq` (or `both`) does the same to Debian's RabbitMQ: a private 3-node cluster per run
(`bench.brokers.rabbitmq_cluster`), the leader from rabbitmqctl once the queue has 3 members, and SIGKILL of that
node's process group; the same publisher and the same figures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pika

from bench.brokers import BrokerStartError, rabbitmq_cluster
from bench.quorum import PlacementError, wait_placement
from deploy.portshard import owned

REPO_ROOT = Path(__file__).resolve().parents[1]
PORT_LINE = re.compile(rb"listening on port (\d+)")
LEADER_LINE = re.compile(rb"cluster: queue (\S+): leader (\S+)")
LOG_TIME = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", re.MULTILINE)
DEAD_LINE = re.compile(rb"raft: (\S+) refuses connections|cluster: node (\S+) (?:refuses connections|unreachable)")
PORT_OFFSETS = (0, 10_000, 20_000, 21_000, 22_000)  # AMQP, management, Raft, metadata, mirror fetch
QUEUE = "bench-failover"
GROUP = "q/%2F/bench-failover"  # the leader log line names the queue as queue_group_id("/", QUEUE) (docs/cluster.md)
START_TIMEOUT_S = 60.0
CONFIRM_TIMEOUT_S = 60.0
RAFTMQ = "raftmq"
RABBITMQ = "rabbitmq"


def _binds(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_amqp_ports(n: int) -> list[int]:
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randrange(3000, 10000)  # +22000 stays below the ephemeral range
        taken = {p + offset for p in ports for offset in PORT_OFFSETS}  # no node's port is another's derived one
        if all(port + offset not in taken and owned(port + offset) and _binds(port + offset) for offset in PORT_OFFSETS):
            ports.append(port)
    return ports


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


@dataclass
class BenchNode:
    name: str
    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None

    def log(self) -> bytes:
        try:
            return (self.workdir / "node.log").read_bytes()
        except OSError:
            return b""

    def leader(self) -> str | None:
        found = [m for m in LEADER_LINE.findall(self.log()) if m[0].decode() == GROUP]
        return None if not found or found[-1][1] == b"None" else found[-1][1].decode()


@dataclass
class BenchCluster:
    root: Path
    size: int = 3
    nodes: list[BenchNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        ports = _free_amqp_ports(self.size)
        self.nodes = [BenchNode(f"n{i + 1}", p, self.root / f"n{i + 1}") for i, p in enumerate(ports)]

    def spawn(self, node: BenchNode) -> int:
        """Start the node's process; returns its log's size before (to find this start's lines)."""
        node.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
        env.update({
            "RAFTMQ_NODE_NAME": node.name,
            "RAFTMQ_CLUSTER_NODES": ",".join(f"{n.name}=127.0.0.1:{n.port}" for n in self.nodes),
            "RAFTMQ_CLUSTER_SECRET": "bench-failover-secret-0123456789",
            "RAFTMQ_DATA_DIR": str(node.workdir / "data"),
            "RAFTMQ_LISTEN_ADDRESS": "127.0.0.1",
        })
        offset = len(node.log())
        with (node.workdir / "node.log").open("ab") as log_file:
            node.process = subprocess.Popen([sys.executable, "-m", "node.cli", "node"], cwd=REPO_ROOT, env=env,
                                            stdout=log_file, stderr=log_file)
        return offset

    def wait_ready(self, node: BenchNode, offset: int) -> None:
        def ready() -> bool:
            if node.process is None or node.process.poll() is not None:
                raise RuntimeError(f"{node.name} exited:\n{node.log()[-2000:].decode(errors='replace')}")
            return bool(PORT_LINE.search(node.log()[offset:]))

        _wait(ready, START_TIMEOUT_S, f"{node.name} to listen")

    def start(self) -> None:
        offsets = [self.spawn(n) for n in self.nodes]
        for node, offset in zip(self.nodes, offsets, strict=True):
            self.wait_ready(node, offset)

    def signal(self, node: BenchNode, signum: int) -> None:
        if node.process is not None:
            node.process.send_signal(signum)

    def kill(self, node: BenchNode) -> None:
        if node.process is not None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait()
            node.process = None

    def stop(self) -> None:
        for node in self.nodes:
            self.kill(node)

    def agreed_leader(self, nodes: list[BenchNode]) -> str | None:
        seen = {n.leader() for n in nodes}
        return seen.pop() if len(seen) == 1 else None


def _connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=30,
                                                             blocked_connection_timeout=CONFIRM_TIMEOUT_S))


class ConfirmStream(threading.Thread):
    """Publishes one message at a time with confirms; records (publish start, confirm time) per confirm."""

    def __init__(self, port: int, queue: str = QUEUE) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.queue = queue
        self.records: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.nacks = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = _connect(self.port)
            ch = conn.channel()
            ch.confirm_delivery()
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    ch.basic_publish("", self.queue, b"x", pika.BasicProperties(delivery_mode=2))
                except pika.exceptions.NackError:
                    self.nacks += 1
                    continue
                self.records.append((started, time.monotonic()))
            conn.close()
        except BaseException as exc:  # reported by the run
            self.error = exc


@dataclass(frozen=True)
class RunResult:
    killed: str
    publisher_node: str
    first_confirm_ms: float
    longest_gap_ms: float
    nacks: int
    timeline: dict[str, float] = field(default_factory=dict)  # raftmq: stage -> ms after the kill (module header)
    paused: bool = False  # a SIGSTOP (`--pause-ms`) instead of a kill; then nobody took the node for dead


def log_lines_after(log: bytes, wall_s: float) -> Iterator[tuple[float, bytes]]:
    """(wall time in s, line) of every timestamped log line at or after `wall_s`."""
    for line in log.splitlines():
        found = LOG_TIME.match(line)
        if found is None:
            continue
        stamp = time.mktime(time.strptime(found.group(1)[:19].decode(), "%Y-%m-%d %H:%M:%S"))
        stamp += int(found.group(1)[20:]) / 1000
        if stamp >= wall_s - 0.001:
            yield stamp, line


def _timeline(survivors: list[BenchNode], killed: str, killed_wall_s: float) -> dict[str, float]:
    """The failover's stages from the survivors' logs, in ms after the kill (the first survivor to reach each)."""
    firsts: dict[str, float] = {}
    for node in survivors:
        for stamp, line in log_lines_after(node.log(), killed_wall_s):
            stage = None
            if b"raft: " + killed.encode() + b" refuses connections" in line:
                stage = "refused"
            else:
                leader = LEADER_LINE.search(line)
                if leader is not None and leader.group(1).startswith(GROUP.encode()):
                    stage = "campaign" if leader.group(2) == b"None" else "leader"
            if stage is not None and stage not in firsts:
                firsts[stage] = round((stamp - killed_wall_s) * 1000, 1)
    return dict(sorted(firsts.items(), key=lambda item: item[1]))


def _taken_for_dead(survivors: list[BenchNode], node: str, since_wall_s: float) -> list[str]:
    """Log lines of survivors that took `node` for dead (refusing connections, or down) since `since_wall_s`."""
    found = []
    for survivor in survivors:
        for _, line in log_lines_after(survivor.log(), since_wall_s):
            dead = DEAD_LINE.search(line)
            if dead is not None and node.encode() in (dead.group(1), dead.group(2)):
                found.append(f"{survivor.name}: {line.decode(errors='replace')}")
    return found


def _one_run(root: Path, pause_ms: int = 0, publisher_last: bool = False) -> RunResult:
    """A fresh raftmq cluster and queue, one kill of the queue's leader (or, with `pause_ms`, a SIGSTOP of it for
    that long), then everything stopped. The publisher is on the first survivor by name (the one that campaigns
    first after a kill), or with `publisher_last` on the last (its publishes then go to the new leader)."""
    cluster = BenchCluster(root)
    try:
        cluster.start()
        with contextlib.closing(_connect(cluster.nodes[0].port)) as conn:
            conn.channel().queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        _wait(lambda: cluster.agreed_leader(cluster.nodes) is not None, 60, "all nodes to agree on the queue leader")
        leader_name = cluster.agreed_leader(cluster.nodes)
        leader = next(n for n in cluster.nodes if n.name == leader_name)
        survivors = [n for n in cluster.nodes if n is not leader]
        publisher_node = survivors[-1] if publisher_last else survivors[0]
        if pause_ms:
            stream, killed_at = kill_under_publisher(publisher_node.port,
                                                      lambda: cluster.signal(leader, signal.SIGSTOP))
            killed_wall_s = time.time() - (time.monotonic() - killed_at)
            time.sleep(max(0.0, killed_at + pause_ms / 1000 - time.monotonic()))
            cluster.signal(leader, signal.SIGCONT)
            time.sleep(1.0)  # time for a wrong "down" to show in the logs
            dead = _taken_for_dead(survivors, leader.name, killed_wall_s)
            if dead:
                raise RuntimeError(f"a node paused {pause_ms} ms was taken for dead: {dead}")
        else:
            stream, killed_at = kill_under_publisher(publisher_node.port, lambda: cluster.kill(leader))
            killed_wall_s = time.time() - (time.monotonic() - killed_at)
    finally:
        cluster.stop()
    result = result_of(leader.name, publisher_node.name, stream, killed_at)
    return dataclasses.replace(result, timeline=_timeline(survivors, leader.name, killed_wall_s),
                               paused=bool(pause_ms))


def _one_rabbitmq_run() -> RunResult:
    """The same on a fresh private 3-node RabbitMQ cluster (`bench.brokers.rabbitmq_cluster`): the quorum queue's
    leader (from rabbitmqctl, once it has 3 members) is killed with SIGKILL of its node's process group."""
    try:
        with rabbitmq_cluster(3) as cluster:
            with contextlib.closing(_connect(cluster.nodes[0].endpoint.port)) as conn:
                conn.channel().queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
            placement = wait_placement(cluster, QUEUE, replicas_wanted=3)
            publisher_node = next(n for n in cluster.nodes if n.name != placement.leader)
            stream, killed_at = kill_under_publisher(publisher_node.endpoint.port,
                                                      lambda: cluster.kill(placement.leader))
    except (BrokerStartError, PlacementError) as error:
        raise RuntimeError(str(error)) from error
    return result_of(placement.leader, publisher_node.name, stream, killed_at)


def kill_under_publisher(port: int, kill: Callable[[], None], queue: str = QUEUE) -> tuple[ConfirmStream, float]:
    """Publish with confirms on `port` to `queue`; after 20 confirms, `kill()`; return once a message published
    after the kill is confirmed (and 0.2 s more), with the kill's time (also `bench.mirrored`'s failover)."""
    stream = ConfirmStream(port, queue)
    stream.start()
    _wait(lambda: len(stream.records) >= 20 or stream.error is not None, 60, "confirms before the kill")
    killed_at = time.monotonic()
    kill()
    _wait(lambda: any(s >= killed_at for s, _ in stream.records) or stream.error is not None,
          CONFIRM_TIMEOUT_S, "a confirm after the kill")
    time.sleep(0.2)
    stream.stop.set()
    stream.join(CONFIRM_TIMEOUT_S)
    if stream.error is not None:
        raise RuntimeError(f"publisher failed: {stream.error!r}")
    return stream, killed_at


def result_of(killed: str, publisher_node: str, stream: ConfirmStream, killed_at: float) -> RunResult:
    first = min(c for s, c in stream.records if s >= killed_at)
    confirms = [c for _, c in stream.records]
    gaps = [b - a for a, b in itertools.pairwise(confirms) if b >= killed_at]
    return RunResult(killed, publisher_node, (first - killed_at) * 1000, max(gaps, default=0.0) * 1000, stream.nacks)


@contextlib.contextmanager
def _workdir(keep: str | None) -> Iterator[Path]:
    if keep:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
    else:
        with tempfile.TemporaryDirectory(prefix="raftmq-failover-") as tmp:
            yield Path(tmp)


class FailoverError(Exception):
    """A failover run could not be made (a node did not start, no leader, the publisher failed)."""


def run_failover(runs: int, workdir: str | None = None, broker: str = RAFTMQ, pause_ms: int = 0,
                 publisher_last: bool = False) -> list[RunResult]:
    """`runs` kills of `broker`'s ("raftmq" or "rabbitmq") quorum queue leader, each on a fresh cluster, printing
    one line per run; `FailoverError` naming the failed run. Also what `raftmq bench --report issue16` calls.
    `pause_ms` (raftmq only): SIGSTOP the leader for that long instead of killing it (see the module header)."""
    results: list[RunResult] = []
    what = f"paused {pause_ms} ms" if pause_ms else "killed"
    with _workdir(workdir) as root:
        for i in range(runs):
            try:
                name = f"pause{i + 1}" if pause_ms else f"run{i + 1}"
                result = (_one_run(root / name, pause_ms, publisher_last) if broker == RAFTMQ
                          else _one_rabbitmq_run())
            except (RuntimeError, pika.exceptions.AMQPError, OSError) as exc:
                raise FailoverError(f"{broker} run {i + 1}: {exc}") from exc
            results.append(result)
            timeline = ", ".join(f"{stage} +{ms:.0f}" for stage, ms in result.timeline.items())
            print(f"{broker} run {i + 1}: {what} {result.killed} (publisher on {result.publisher_node}): first confirm"
                  f" after {result.first_confirm_ms:.0f} ms, longest confirm gap {result.longest_gap_ms:.0f} ms,"
                  f" {result.nacks} nacks{f' (ms after: {timeline})' if timeline else ''}"
                  f"{'; not taken for dead' if pause_ms else ''}", flush=True)
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raftmq bench failover",
                                     description="kill -9 of a quorum queue's leader: time to the next confirm")
    parser.add_argument("--runs", type=int, default=5, help="kills to measure (default 5)")
    parser.add_argument("--workdir", help="keep the nodes' data and logs here (default: a temporary directory)")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--pause-ms", type=int, default=0,
                        help="raftmq: also --runs runs of SIGSTOP of the leader for this long (below the nodes'"
                        " node_down_after_ms): first confirm after the stop, and nobody may take it for dead")
    parser.add_argument("--publisher", choices=("first", "last"), default="first",
                        help="raftmq: the publisher on the first surviving node by name (default; after a kill it"
                        " becomes the new leader) or on the last (its publishes are forwarded to the new leader)")
    parser.add_argument("--broker", choices=(RAFTMQ, RABBITMQ, "both"), default=RAFTMQ,
                        help="whose quorum queue leader to kill: raftmq (default), rabbitmq (Debian's RabbitMQ,"
                        " a private 3-node cluster per run) or both, raftmq first")
    args = parser.parse_args(argv)
    brokers = [RAFTMQ, RABBITMQ] if args.broker == "both" else [args.broker]
    found: dict[str, list[RunResult]] = {}
    cases = [(broker, 0) for broker in brokers] + ([(RAFTMQ, args.pause_ms)] if args.pause_ms > 0 else [])
    for broker, pause_ms in cases:
        try:
            results = run_failover(args.runs, args.workdir, broker, pause_ms, args.publisher == "last")
        except FailoverError as exc:
            print(f"raftmq bench failover: {exc}", file=sys.stderr)
            return 1
        label = f"{broker}-paused" if pause_ms else broker
        found[label] = results
        firsts = [r.first_confirm_ms for r in results]
        gaps = [r.longest_gap_ms for r in results]
        event = f"a {pause_ms} ms pause" if pause_ms else "kill"
        print(f"{label}: first confirm after {event}: median {statistics.median(firsts):.0f} ms, max {max(firsts):.0f} ms;"
              f" longest gap: median {statistics.median(gaps):.0f} ms, max {max(gaps):.0f} ms (n={len(results)})"
              f"{'; never taken for dead' if pause_ms else ''}")
    if args.json:
        runs = [r.__dict__ for r in found.get(RAFTMQ, [])] if args.broker == RAFTMQ and not args.pause_ms else {
            broker: [r.__dict__ for r in results] for broker, results in found.items()}
        Path(args.json).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
