"""`raftmq bench mirrored`: issue 17's side-by-side table of mirrored and quorum queues, raftmq and RabbitMQ.

One run measures four replicated queues on 3-node clusters on loopback and prints one table (Markdown) with the
run's load average:
- "raftmq mirrored": a classic queue under the policy ha-mode exactly 3, ha-min-insync 2 (docs/mirrored_queues.md);
- "raftmq quorum": x-queue-type=quorum (3 Raft replicas);
- "RabbitMQ mirrored": RabbitMQ 3.10's classic mirrored queue, ha-mode exactly 3, ha-sync-mode automatic;
- "RabbitMQ quorum": x-queue-type=quorum.
Columns: confirmed/s, delivered/s and end-to-end p50/p99 of workload (b)'s flow (`bench.quorum`, "b" layout:
persistent 100 B messages, 1 publisher on one follower, 1 consumer on the other), then failover: kill -9 of the
queue leader's node to the first confirm of a message published after it (`bench.failover`'s publisher, one
message at a time, on a surviving node).
Per broker one cluster is started (`bench.brokers`): the mirrored flow, the quorum flow, then the mirrored queue's
failover on it (the kill ends that cluster). The quorum queues' failover is `bench.failover.run_failover` (its own
fresh cluster per run). Placement: a mirrored queue's leader and in-sync replicas come from raftmq's management API
(`mirror.leader`, `mirror.isr`) and, for RabbitMQ, from `rabbitmqctl eval` (the master's and synchronised
mirrors' nodes: list_queues shows their pids without node names); the flow and
the kill start only when all 3 replicas are in sync. The parsers and the table are pure (unit-tested).
`--failover-only --runs N` measures only the mirrored queues' failover, N kills per broker on a fresh cluster each
(`--base-port`, `--keep-logs DIR` for raftmq), with the node that led the metadata group at the kill and the
failover's stages from the survivors' logs (`failover_timeline`; more with RAFTMQ_MIRROR_TRACE=1 on the nodes, as
the runner passes its environment on).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import datetime
import json
import os
import re
import signal
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.brokers import (
    BrokerStartError,
    RabbitCluster,
    RaftmqCluster,
    rabbitmq_available,
    rabbitmq_cluster,
    rabbitmq_version,
    raftmq_cluster,
)
from bench.clusters import RAFTMQ_PORT_OFFSETS, ClusterNode, Placement, QueueCluster
from bench.quorum import run_quorum_workload, wait_placement
from bench.workloads import Measurement, RunSettings

MIRROR_PREFIX = "bench-m"  # every mirrored queue of the bench: the policies' pattern matches it
MIRROR_PATTERN = f"^{MIRROR_PREFIX}"
RAFTMQ_POLICY: dict[str, object] = {"ha-mode": "exactly", "ha-params": 3, "ha-min-insync": 2}
RABBIT_POLICY: dict[str, object] = {"ha-mode": "exactly", "ha-params": 3, "ha-sync-mode": "automatic"}
FAILOVER_QUEUE = f"{MIRROR_PREFIX}-failover"
POLICY_TIMEOUT_S = 60.0
ROWS = ("raftmq mirrored", "raftmq quorum", "RabbitMQ mirrored", "RabbitMQ quorum")
NODE_NAME = re.compile(r"([A-Za-z0-9_\-]+@[A-Za-z0-9_\-]+)")


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: a flow measurement (or None) and the failover runs' first-confirm times."""

    name: str
    flow: Measurement | None
    failover_ms: tuple[float, ...] = ()
    error: str | None = None
    timeline: str = ""  # the failover's stages from the survivors' logs (raftmq mirrored)


# --- placement parsers (pure) -------------------------------------------------------------------------------


def raftmq_mirror_placement(queue_json: str) -> Placement | None:
    """/api/queues/<vhost>/<name> of a raftmq mirrored queue -> leader and ISR (as the members); None while the
    queue, its mirror record or its leader is unknown."""
    try:
        row = json.loads(queue_json)
    except ValueError:
        return None
    mirror = row.get("mirror") if isinstance(row, dict) else None
    if not isinstance(mirror, dict):
        return None
    leader, isr = mirror.get("leader"), mirror.get("isr")
    if not isinstance(leader, str) or not leader or not isinstance(isr, list):
        return None
    return Placement(leader, tuple(str(node) for node in isr))


def rabbit_mirror_query(queue: str, vhost: str = "/") -> str:
    """An Erlang expression for `rabbitmqctl eval`: the classic queue's master node and synchronised mirror nodes
    (`{Master, [Synced...]}`, or `none`). list_queues shows pids without their node names, hence eval."""
    def binary(text: str) -> str:
        return "<<\"" + text.replace("\\", "\\\\").replace("\"", "\\\"") + "\">>"

    return (f"case rabbit_amqqueue:lookup(rabbit_misc:r({binary(vhost)}, queue, {binary(queue)})) of {{ok, Q}} ->"
            " {node(amqqueue:get_pid(Q)), [node(P) || P <- amqqueue:get_sync_slave_pids(Q)]}; _ -> none end.")


def rabbit_mirror_placement(eval_output: str) -> Placement | None:
    """`rabbitmqctl eval` of `rabbit_mirror_query` -> the master node (leader) and the master plus its synchronised
    mirrors (members); None while the queue is unknown."""
    nodes = NODE_NAME.findall(eval_output)
    if not eval_output.lstrip().startswith("{") or not nodes:
        return None
    return Placement(nodes[0], tuple(nodes))


TIMELINE_STAGES = (  # (stage, what a survivor's log line holds; {killed} and {queue} are filled in)
    ("refused", rb"cluster: mirrored queues: node {killed} refuses connections"),
    ("down", rb"cluster: node {killed} .*down$"),
    ("reported", rb"cluster: mirrored queue \S*/{queue}: reporting {killed} down"),
    ("metadata leader", rb"cluster: mirror trace: metadata leader (?!{killed}\b|-)\S+"),
    ("committed", rb"cluster: mirror trace: \S*/{queue}: MirrorReplicaDown committed"),
)


def failover_timeline(lines: dict[str, list[tuple[float, bytes]]], killed: str, queue: str,
                      killed_wall_s: float) -> str:
    """From the survivors' (wall time, log line) after the kill, the first survivor to reach each stage, in ms
    after the kill: "refused" (the mirrored queues' fast path saw the killed node refuse connections), "down" (the
    node liveness declared it down), "reported" (a survivor reported it down to the metadata group), with
    RAFTMQ_MIRROR_TRACE=1 on the nodes also "metadata leader" (a survivor saw a new metadata leader) and
    "committed" (the report's outcome came back), and "new leader X" (a survivor learnt the committed record)."""
    firsts: dict[str, float] = {}
    leader: tuple[float, str] | None = None
    patterns = [(stage, re.compile(pattern.replace(b"{killed}", re.escape(killed.encode()))
                                   .replace(b"{queue}", re.escape(queue.encode()))))
                for stage, pattern in TIMELINE_STAGES]
    leader_line = re.compile(rb"cluster: mirrored queue \S*/" + re.escape(queue.encode()) + rb": leader (\S+), epoch")
    for stamps in lines.values():
        for stamp, line in stamps:
            line = line.rstrip()
            for stage, pattern in patterns:
                if pattern.search(line) and (stage not in firsts or stamp < firsts[stage]):
                    firsts[stage] = stamp
            found = leader_line.search(line)
            if found and found.group(1).decode() not in ("-", killed) and (leader is None or stamp < leader[0]):
                leader = (stamp, found.group(1).decode())
    parts = [f"{stage} +{(stamp - killed_wall_s) * 1000:.0f} ms"
             for stage, stamp in sorted(firsts.items(), key=lambda item: item[1])]
    if leader is not None:
        parts.append(f"new leader {leader[1]} +{(leader[0] - killed_wall_s) * 1000:.0f} ms")
    return ", ".join(parts)


def metadata_leader_of(nodes_json: str, nodes: Sequence[ClusterNode]) -> str | None:
    """/api/nodes of a raftmq node -> the name of the node whose metadata address ("host:port", the AMQP port +
    the metadata offset) the answering node's metadata status names as leader; None if unknown."""
    try:
        rows = json.loads(nodes_json)
    except ValueError:
        return None
    for row in rows if isinstance(rows, list) else []:
        metadata = row.get("metadata") if isinstance(row, dict) else None
        leader = metadata.get("leader") if isinstance(metadata, dict) else None
        if isinstance(leader, str):
            port = leader.rpartition(":")[2]
            for node in nodes:
                if port == str(node.endpoint.port + RAFTMQ_PORT_OFFSETS[2]):
                    return node.name
    return None


# --- the clusters as QueueClusters for mirrored queues -------------------------------------------------------


def _http(port: int, method: str, path: str, body: object = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except OSError as error:
        return 0, str(error)


def management_port(node: ClusterNode) -> int:
    return node.endpoint.port + RAFTMQ_PORT_OFFSETS[0]


class RaftmqMirrored:
    """A raftmq cluster seen through its mirrored queues' management rows (leader and ISR)."""

    def __init__(self, cluster: RaftmqCluster) -> None:
        self.cluster = cluster

    @property
    def nodes(self) -> tuple[ClusterNode, ...]:
        return self.cluster.nodes

    def placement(self, queue: str) -> Placement | None:
        for node in self.nodes:  # the first node that answers (one may be dead after the kill)
            status, text = _http(management_port(node), "GET", f"/api/queues/%2F/{queue}")
            if status == 200:
                return raftmq_mirror_placement(text)
        return None

    def set_policy(self) -> None:
        body = {"pattern": MIRROR_PATTERN, "apply-to": "queues", "definition": RAFTMQ_POLICY}
        status, text = _http(management_port(self.nodes[0]), "PUT", "/api/policies/%2F/bench-ha", body)
        if status not in (200, 201, 204):
            raise BrokerStartError(f"raftmq refused the ha policy ({status}): {text[:300]}")
        _wait_until(lambda: all(_http(management_port(node), "GET", "/api/policies/%2F/bench-ha")[0] == 200
                                for node in self.nodes), "the ha policy on every raftmq node")

    def kill(self, node: str) -> None:
        os.kill(self.cluster.pids()[node], signal.SIGKILL)

    def metadata_leader(self) -> str | None:
        """The node whose metadata port is the metadata group's leader, as the first node that answers says."""
        for node in self.nodes:
            status, text = _http(management_port(node), "GET", "/api/nodes")
            if status == 200:
                return metadata_leader_of(text, self.nodes)
        return None

    def timeline(self, killed: str, killed_wall_s: float) -> str:
        """When the first survivor logged the killed node down and the queue's new leader (ms after the kill)."""
        from bench.failover import log_lines_after

        logs = {node.name: _read_bytes(self.cluster.workdir / f"{node.name}.log") for node in self.nodes
                if node.name != killed}
        return failover_timeline({name: list(log_lines_after(log, killed_wall_s)) for name, log in logs.items()},
                                 killed, FAILOVER_QUEUE, killed_wall_s)


class RabbitMirrored:
    """A RabbitMQ cluster seen through its classic mirrored queues' master and synchronised mirrors."""

    def __init__(self, cluster: RabbitCluster) -> None:
        self.cluster = cluster

    @property
    def nodes(self) -> tuple[ClusterNode, ...]:
        return self.cluster.nodes

    def placement(self, queue: str) -> Placement | None:
        found = self.cluster.ctl("eval", rabbit_mirror_query(queue), timeout_s=30.0)
        return rabbit_mirror_placement(found.stdout) if found.returncode == 0 else None

    def set_policy(self) -> None:
        set_policy = self.cluster.ctl("set_policy", "--apply-to", "queues", "bench-ha", MIRROR_PATTERN,
                                      json.dumps(RABBIT_POLICY))
        if set_policy.returncode != 0:
            raise BrokerStartError(f"rabbitmqctl set_policy: {set_policy.stderr.strip()[-300:]}")

    def kill(self, node: str) -> None:
        self.cluster.kill(node)

    def metadata_leader(self) -> str | None:
        return None  # (RabbitMQ has none)

    def timeline(self, killed: str, killed_wall_s: float) -> str:
        return ""  # (RabbitMQ's logs are not read)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = POLICY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise BrokerStartError(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(0.3)


# --- one broker ---------------------------------------------------------------------------------------------


def _flow(broker: str, cluster: QueueCluster, settings: RunSettings, arguments: dict[str, str | int | bool],
          prefix: str) -> Measurement:
    [measurement] = run_quorum_workload(broker, cluster, settings, labels=("b",), arguments=arguments,
                                        queue_prefix=prefix)
    return measurement


def mirrored_failover(cluster: RaftmqMirrored | RabbitMirrored) -> tuple[float, str]:
    """kill -9 of the mirrored queue's leader node under a publisher on a survivor: ms to the first new confirm,
    and (raftmq) the failover's stages from the survivors' logs."""
    import pika

    from bench import failover

    with contextlib.closing(pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", cluster.nodes[0].endpoint.port))) as connection:
        connection.channel().queue_declare(FAILOVER_QUEUE, durable=True)
    placement = wait_placement(cluster, FAILOVER_QUEUE, replicas_wanted=3)
    publisher = next(node for node in cluster.nodes if node.name != placement.leader)
    metadata_leader = cluster.metadata_leader()
    where = "" if metadata_leader is None else f", metadata leader {metadata_leader}"
    print(f"  failover: kill -9 of {placement.leader} (leader), publisher on {publisher.name}{where}", flush=True)
    stream, killed_at = failover.kill_under_publisher(publisher.endpoint.port,
                                                      lambda: cluster.kill(placement.leader), FAILOVER_QUEUE)
    killed_wall_s = time.time() - (time.monotonic() - killed_at)
    first_ms = failover.result_of(placement.leader, publisher.name, stream, killed_at).first_confirm_ms
    timeline = cluster.timeline(placement.leader, killed_wall_s)
    if metadata_leader is not None:
        killed_too = " (killed too)" if metadata_leader == placement.leader else ""
        timeline = f"metadata leader {metadata_leader}{killed_too}; {timeline}"
    return first_ms, timeline


def measure_broker(
    broker: str, start: Callable[[], contextlib.AbstractContextManager[RaftmqMirrored | RabbitMirrored]],
    settings: RunSettings, quorum_failover_runs: int,
) -> list[Row]:
    """The mirrored and quorum rows of one broker: one cluster for both flows and the mirrored failover, then
    `bench.failover` for the quorum queue's failover."""
    mirrored_name, quorum_name = f"{broker_title(broker)} mirrored", f"{broker_title(broker)} quorum"
    mirrored: Row = Row(mirrored_name, None, error="not measured")
    quorum_flow: Measurement | None = None
    try:
        print(f"[{broker}] starting a 3-node cluster ...", flush=True)
        with start() as cluster:
            cluster.set_policy()
            flow = _label(_flow(broker, cluster, settings, {}, MIRROR_PREFIX), "mirrored")
            _print_flow(flow)
            quorum_flow = _label(_flow(broker, _QuorumView(cluster), settings, {"x-queue-type": "quorum"},
                                       "bench-b"), "quorum")
            _print_flow(quorum_flow)
            try:
                first_ms, timeline = mirrored_failover(cluster)
                print(f"  mirrored failover: first confirm {first_ms:.0f} ms after the kill"
                      f"{f' (survivors logged: {timeline})' if timeline else ''}", flush=True)
                mirrored = Row(mirrored_name, flow, (first_ms,), timeline=timeline)
            except Exception as error:  # the flow figures stay
                mirrored = Row(mirrored_name, flow, error=f"failover: {error!r}"[:300])
    except BrokerStartError as error:
        return [Row(mirrored_name, None, error=str(error)[:300]), Row(quorum_name, None, error=str(error)[:300])]
    quorum = Row(quorum_name, quorum_flow)
    if quorum_failover_runs:
        from bench import failover

        print(f"[{broker}] quorum failover: {quorum_failover_runs} run(s), a fresh cluster each ...", flush=True)
        try:
            runs = failover.run_failover(quorum_failover_runs, broker=broker)
            quorum = dataclasses.replace(quorum, failover_ms=tuple(run.first_confirm_ms for run in runs))
        except Exception as error:
            quorum = dataclasses.replace(quorum, error=f"failover: {error!r}"[:300])
    return [mirrored, quorum]


def failover_only(broker: str, runs: int, base_port: int | None, keep_logs: Path | None = None) -> Row:
    """`--failover-only`: `runs` kills of the mirrored queue's leader, each on a fresh 3-node cluster (no flows);
    raftmq's node logs are copied to `keep_logs`/run<N>/ if given."""
    name = f"{broker_title(broker)} mirrored"
    times: list[float] = []
    timelines: list[str] = []
    for run in range(1, runs + 1):
        print(f"[{broker}] failover run {run}/{runs}: starting a 3-node cluster ...", flush=True)
        try:
            start = (_raftmq(base_port) if broker == "raftmq" else _rabbitmq())
            with start as cluster:
                cluster.set_policy()
                first_ms, timeline = mirrored_failover(cluster)
                if keep_logs is not None and isinstance(cluster, RaftmqMirrored):
                    time.sleep(0.5)  # (the survivors' last lines)
                    kept = keep_logs / f"run{run}"
                    kept.mkdir(parents=True, exist_ok=True)
                    for log in cluster.cluster.workdir.glob("*.log"):
                        (kept / log.name).write_bytes(log.read_bytes())
        except Exception as error:
            return Row(name, None, tuple(times), error=f"failover run {run}: {error!r}"[:300],
                       timeline=" | ".join(timelines))
        print(f"  run {run}: first confirm {first_ms:.0f} ms after the kill"
              f"{f' (survivors logged: {timeline})' if timeline else ''}", flush=True)
        times.append(first_ms)
        if timeline:
            timelines.append(f"run {run}: {timeline}")
    return Row(name, None, tuple(times), timeline="\n  ".join(["", *timelines]) if timelines else "")


class _QuorumView:
    """The broker's own placement (Raft leader and members) for the quorum flow on the same cluster."""

    def __init__(self, cluster: RaftmqMirrored | RabbitMirrored) -> None:
        self._cluster = cluster.cluster

    @property
    def nodes(self) -> tuple[ClusterNode, ...]:
        return self._cluster.nodes

    def placement(self, queue: str) -> Placement | None:
        return self._cluster.placement(queue)


def _label(measurement: Measurement, kind: str) -> Measurement:
    return dataclasses.replace(measurement, label=f"{kind}/b", workload=kind)


def _print_flow(m: Measurement) -> None:
    if m.error:
        print(f"  {m.broker} {m.label}: ERROR {m.error[:300]}", flush=True)
        return
    print(f"  {m.broker} {m.label}: confirmed {m.confirmed_msgs_per_s:,.0f}/s, delivered {m.delivered_msgs_per_s:,.0f}/s,"
          f" e2e p50 {_ms(m.latency_p50_ms)} / p99 {_ms(m.latency_p99_ms)} ms ({m.note})", flush=True)


def broker_title(broker: str) -> str:
    return "RabbitMQ" if broker == "rabbitmq" else broker


@contextlib.contextmanager
def _raftmq(base_port: int | None = None) -> Iterator[RaftmqMirrored]:
    with raftmq_cluster(3, base_port=base_port) as cluster:
        yield RaftmqMirrored(cluster)


@contextlib.contextmanager
def _rabbitmq() -> Iterator[RabbitMirrored]:
    with rabbitmq_cluster(3) as cluster:
        yield RabbitMirrored(cluster)


# --- the table (pure) ---------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(rows: Sequence[Row], load_start: float, load_end: float, started_at: str,
                 rabbit_version: str | None, settings: RunSettings) -> str:
    lines = [
        f"raftmq bench mirrored, {started_at}: 3-node clusters on loopback, RabbitMQ {rabbit_version or '?'};"
        f" flow {settings.duration_s:g} s after {settings.warmup_s:g} s warm-up; load average (1 min)"
        f" {load_start:.1f} at start, {load_end:.1f} at end",
        "",
        "| queue | confirmed/s | delivered/s | e2e p50 ms | e2e p99 ms | failover ms (kill -9 of leader -> first"
        " confirm) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        flow = row.flow
        if flow is None or flow.error:
            figures = ["-", "-", "-", "-"]
        else:
            figures = [f"{flow.confirmed_msgs_per_s:,.0f}", f"{flow.delivered_msgs_per_s:,.0f}",
                       _ms(flow.latency_p50_ms), _ms(flow.latency_p99_ms)]
        failover = ", ".join(f"{ms:.0f}" for ms in row.failover_ms) or "-"
        if len(row.failover_ms) > 1:
            failover += f" (median {statistics.median(row.failover_ms):.0f})"
        lines.append(f"| {row.name} | " + " | ".join(figures) + f" | {failover} |")
    stages = [f"- {row.name} failover, survivors' logs: {row.timeline}" for row in rows if row.timeline]
    if stages:
        lines += ["", *stages]
    errors = [f"- {row.name}: {row.error}" for row in rows if row.error] + [
        f"- {row.name}: flow {row.flow.error[:300]}" for row in rows if row.flow is not None and row.flow.error]
    if errors:
        lines += ["", "errors:", *errors]
    return "\n".join(lines)


# --- CLI ----------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="raftmq bench mirrored",
        description="Issue 17: raftmq mirrored (exactly 3, min-insync 2) and quorum queues side by side with RabbitMQ"
        " 3.10's classic mirrored (exactly 3, ha-sync-mode automatic) and quorum queues: confirmed/s, delivered/s,"
        " e2e p50/p99, failover after kill -9 of the leader's node.")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per flow (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each flow (default 1)")
    parser.add_argument("--quorum-failover-runs", type=int, default=1,
                        help="kills of a quorum queue's leader per broker, a fresh cluster each (default 1; 0: skip)")
    parser.add_argument("--rabbitmq", action=argparse.BooleanOptionalAction, default=True, help="measure RabbitMQ")
    parser.add_argument("--output", help="also write the table (Markdown) to this file")
    parser.add_argument("--failover-only", action="store_true",
                        help="only the mirrored queues' failover: --runs kills of the leader, a fresh cluster each"
                        " (no flows, no quorum queues)")
    parser.add_argument("--runs", type=int, default=5, help="--failover-only: kills per broker (default 5)")
    parser.add_argument("--base-port", type=int, help="raftmq: node i on this port + i (default: a free run)")
    parser.add_argument("--keep-logs", help="--failover-only: copy raftmq's node logs to this directory (run<N>/)")
    args = parser.parse_args(argv)
    if args.quorum_failover_runs < 0 or args.runs < 1:
        parser.error("--quorum-failover-runs must not be negative, --runs must be positive")
    if args.failover_only:
        return _failover_only_main(args)
    settings = RunSettings(duration_s=args.duration, warmup_s=args.warmup, new_queue_trials=0)
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_start = os.getloadavg()[0]
    rows = measure_broker("raftmq", _raftmq, settings, args.quorum_failover_runs)
    if args.rabbitmq and rabbitmq_available():
        rows += measure_broker("rabbitmq", _rabbitmq, settings, args.quorum_failover_runs)
    elif args.rabbitmq:
        rows += [Row(name, None, error="RabbitMQ is not installed") for name in ROWS[2:]]
    text = format_table(rows, load_start, os.getloadavg()[0], started_at, rabbitmq_version(), settings)
    print()
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 1 if any(row.error or (row.flow is not None and row.flow.error) for row in rows) else 0


def _failover_only_main(args: argparse.Namespace) -> int:
    load_start = os.getloadavg()[0]
    keep = Path(args.keep_logs) if args.keep_logs else None
    rows = [failover_only("raftmq", args.runs, args.base_port, keep)]
    if args.rabbitmq and rabbitmq_available():
        rows.append(failover_only("rabbitmq", args.runs, None))
    lines = [f"raftmq bench mirrored --failover-only: kill -9 of the mirrored queue's leader -> first confirm of a"
             f" message published after it, {args.runs} run(s) per broker, a fresh 3-node cluster each; load"
             f" average (1 min) {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end", ""]
    for row in rows:
        figures = ", ".join(f"{ms:.0f}" for ms in row.failover_ms) or "-"
        if row.failover_ms:
            figures += (f" ms (median {statistics.median(row.failover_ms):.0f}, max {max(row.failover_ms):.0f})")
        lines.append(f"- {row.name}: {figures}")
        if row.timeline:
            lines.append(f"  survivors' logs:{row.timeline}")
        if row.error:
            lines.append(f"  error: {row.error}")
    text = "\n".join(lines)
    print()
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 1 if any(row.error for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
