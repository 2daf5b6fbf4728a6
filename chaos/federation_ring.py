"""Three-cluster federation scenarios: clusters A, B and C federating one exchange in a ring A -> B -> C -> A,
under faults, and the checker that says whether every message reached the other two clusters and never looped.

How it works: a scenario with a `[federation_ring]` table (`nodes`: the three cluster sizes, `max_hops`,
`ack_mode`, `heartbeat_s`, `prefetch`, `reconnect_delay_s`, `settle_timeout_s`) is run by `run_ring`. It starts
the three clusters (nodes `a-rmqN`, `b-rmqN`, `c-rmqN`, so their cluster names, which the loop check compares,
differ), our fault proxy in front of every node (proxies `fed-<node>`, e.g. `fed-b-rmq1`: only the links of the
next cluster use them, so a toxic on B's proxies partitions B from C and nothing else), and on each cluster X the
direct exchange `chaos-fx`, the quorum queue `ring-x` bound to it with the keys `ring-a`, `ring-b` and `ring-c`,
the upstream `chaos-up` (the previous cluster's proxies, `max-hops`, short heartbeat) and a policy federating
`chaos-fx` from it. It waits until every cluster runs its link and every upstream has the three keys bound to the
link's internal exchange. Then one workload per cluster (chaos/workload.py, one shared history): its publishers
(confirms) publish to `chaos-fx` with the key `ring-x`, its consumers consume `ring-x` there; so a message
published on A reaches `ring-a` locally, `ring-b` through B's link and `ring-c` through C's link (two hops); when
it comes round to A's link it is dropped. The steps target `a`/`b`/`c` (every node of a cluster) or
`<x>.link-node` (the node of cluster x running its link), and any node name (`b.b-rmq2`). After the faults heal,
`settle` waits until every link runs and its upstream queue has been empty for 2 s, then every queue is drained.

The checker (`check_ring`, pure) expects every confirmed message at each of the three clusters, in the history
as one (message, cluster) pair each: a pair never delivered is lost; more deliveries of a pair are duplicates
(a link republishes what it had forwarded but not seen confirmed when its connections broke), counted and
reported per cluster as copies per message. A message delivered at its own origin as a second unflagged
(redelivered = false) copy came back through federation: a loop, which fails the run. Copies of each link that
ran at once are counted from the nodes' logs as in chaos/federation.py: more than one at once fails the run.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chaos.checker import CheckResult, check
from chaos.faultproxy.background import FaultProxyThread
from chaos.federation import COPY_LINE, EXCHANGE, UPSTREAM, _call_any, link_rows_of, running_node
from chaos.history import Ack, Delivery, Publish, Record, acks_of, split
from chaos.nemesis import LocalCluster
from chaos.scenario import Nemesis, Scenario, ScenarioError
from chaos.shovel import (
    QUORUM,
    CopyCount,
    TwoClusters,
    _api,
    _read,
    count_copies,
    parse_settings,
    proxied_uris,
    spawn_cluster,
)
from chaos.workload import Workload
from cluster.federation.link import link_id

SIDES = ("a", "b", "c")


def queue_of(side: str) -> str:
    return f"ring-{side}"


def upstream_of(side: str) -> str:
    """The cluster `side` federates from: A <- C, B <- A, C <- B."""
    return SIDES[(SIDES.index(side) - 1) % len(SIDES)]


@dataclass(frozen=True, slots=True)
class RingSettings:
    nodes: list[int] = field(default_factory=lambda: [3, 3, 3])  # cluster sizes of A, B, C
    max_hops: int = 2
    ack_mode: str = "on-confirm"
    heartbeat_s: int = 4
    prefetch: int = 1000
    reconnect_delay_s: float = 1.0
    settle_timeout_s: float = 180.0

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> RingSettings:
        settings = parse_settings(cls, raw, "federation_ring")
        if len(settings.nodes) != len(SIDES) or not all(isinstance(n, int) and n >= 1 for n in settings.nodes):
            raise ScenarioError(f"[federation_ring] nodes: three cluster sizes, each at least 1 (got {settings.nodes})")
        return settings


@dataclass(frozen=True, slots=True)
class RingCheck:
    result: CheckResult  # over (message, cluster) pairs: payload ids "<id>@<cluster>"
    copies: dict[str, dict[int, int]]  # cluster -> {deliveries of a message there: how many messages}
    looped: tuple[str, ...]  # messages that came back to their origin through federation
    messages: int = 0  # messages published (each expected at the three clusters: three pairs)

    @property
    def valid(self) -> bool:
        return self.result.valid and not self.looped


def side_of_queue(queue: str) -> str:
    return queue.removeprefix("ring-")


def check_ring(publishes: Sequence[Publish], deliveries: Sequence[Delivery], acks: Iterable[Ack] = ()) -> RingCheck:
    """Pure: every publish (its queue names its origin, `ring-x`) expected once at each cluster, judged by the
    chaos checker with republished copies allowed; copies per message per cluster; loops (a second unflagged copy
    at the origin)."""
    expanded = [replace(p, publisher=f"{side_of_queue(p.queue)}.{p.publisher}", payload_id=f"{p.payload_id}@{side}",
                        queue=queue_of(side)) for p in publishes for side in SIDES]
    per_pair = [replace(d, payload_id=f"{d.payload_id}@{side_of_queue(d.queue)}") for d in deliveries]
    pair_acks = [replace(a, payload_id=f"{a.payload_id}@{side_of_queue(a.queue)}") for a in acks]
    result = check(expanded, per_pair, pair_acks, (), copies=True)
    counts = Counter(d.payload_id for d in per_pair)
    copies: dict[str, dict[int, int]] = {}
    for pair, count in counts.items():
        side = pair.rpartition("@")[2]
        histogram = copies.setdefault(side, {})
        histogram[count] = histogram.get(count, 0) + 1
    origin = {p.payload_id: side_of_queue(p.queue) for p in publishes}
    fresh_at_origin = Counter(d.payload_id for d in deliveries
                              if not d.redelivered and origin.get(d.payload_id) == side_of_queue(d.queue))
    looped = tuple(sorted(pid for pid, count in fresh_at_origin.items() if count > 1))
    return RingCheck(result, {side: dict(sorted(h.items())) for side, h in sorted(copies.items())}, looped,
                     len({p.payload_id for p in publishes}))


class RingClusters(TwoClusters):
    """The nemesis's `Cluster` over the three clusters: nodes `a.a-rmq1` ... `c.c-rmqN`, and the ring's targets."""

    def __init__(self, clusters: dict[str, LocalCluster]) -> None:
        super().__init__(clusters["a"], clusters["b"], queue_of("a"))
        self.sides = dict(clusters)
        self.ring_deaths: dict[str, dict[str, list[int]]] = {side: {} for side in SIDES}
        self.link_copies: dict[str, CopyCount] = {}
        self.toxiproxy_url: str | None = None  # the fault proxy's API (set once it runs)

    def _died(self, node: str) -> None:
        side, _, name = node.partition(".")
        self.ring_deaths[side].setdefault(name, []).append(int(time.time() * 1000))

    def leader_of(self, queue: str) -> str | None:
        return None

    def named_targets(self, target: str) -> list[str] | None:
        side, _, kind = target.partition(".")
        if side not in self.sides:
            return None
        if not kind:
            return [f"{side}.{name}" for name in self.sides[side].nodes()]
        if kind == "link-node":
            return [f"{side}.{self.link_node(side) or self.sides[side].nodes()[0]}"]
        return None  # a node name (`b.b-rmq2`): the nemesis finds it among nodes()

    def link_rows(self, side: str) -> list[dict[str, Any]]:
        return link_rows_of(self.sides[side], lambda row: row.get("exchange") == EXCHANGE)

    def link_node(self, side: str) -> str | None:
        return running_node(self.link_rows(side))

    def upstream_rows(self, side: str, path: str) -> list[dict[str, Any]]:
        """Rows of `path` from the first node of cluster `side` that answers."""
        cluster = self.sides[side]
        for name in cluster.nodes():
            rows = _api(cluster, name, "GET", path)
            if isinstance(rows, list):
                return [row for row in rows if isinstance(row, dict)]
        return []

    def backlog(self, upstream: str) -> int | None:
        """Messages (ready + unacked) in the upstream queue of the link that pulls from `upstream`."""
        for row in self.upstream_rows(upstream, "/api/queues"):
            if str(row.get("name", "")).startswith(f"federation: {EXCHANGE} -> "):
                return int(row.get("messages_ready", 0)) + int(row.get("messages_unacknowledged", 0))
        return None

    def bound_keys(self, upstream: str) -> set[str]:
        return {str(row.get("routing_key")) for row in self.upstream_rows(upstream, "/api/bindings")
                if row.get("source") == EXCHANGE
                and str(row.get("destination", "")).startswith(f"federation: {EXCHANGE} -> ")}

    # The settle step of TwoClusters (chaos/shovel.py) over the three links: each running, every upstream queue empty.
    link_label = "links"
    backlog_label = "their upstream queues"

    def link_backlog(self) -> int | None:
        backlogs = [self.backlog(upstream_of(side)) for side in SIDES]
        return None if None in backlogs else sum(b for b in backlogs if b is not None)

    def link_running(self) -> bool:
        return all(self.link_node(side) is not None for side in SIDES)

    def link_states(self) -> list[tuple[Any, ...]]:
        return [(side, self.link_node(side), self.backlog(upstream_of(side))) for side in SIDES]

    def settle_ring(self, timeout_s: float) -> str | None:
        """`settle` (every link running and every upstream queue empty for 2 s); then the copies of each link
        counted."""
        error = self.settle(timeout_s)
        for side in SIDES:
            cluster = self.sides[side]
            logs = {name: _read(Path(cluster.spec(name).log)) for name in cluster.nodes()}
            self.link_copies[side] = count_copies(logs, self.ring_deaths[side], link_id("/", EXCHANGE, UPSTREAM),
                                                  COPY_LINE)
            if self.link_copies[side].most > 1:
                error = error or f"{self.link_copies[side].most} copies of {side}'s link ran at once"
            elif not self.link_copies[side].intervals:
                error = error or f"no `federation link copy started` line in cluster {side}'s logs"
        return error


def _setup(ring: RingClusters, uris: dict[str, list[str]], settings: RingSettings, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    vhost = "%2F"
    for side in SIDES:
        cluster = ring.sides[side]
        queue = queue_of(side)
        _call_any(cluster, "PUT", f"/api/exchanges/{vhost}/{EXCHANGE}", {"type": "direct", "durable": True},
                  deadline)
        _call_any(cluster, "PUT", f"/api/queues/{vhost}/{queue}", {"durable": True, "arguments": QUORUM}, deadline)
        for key in SIDES:
            _call_any(cluster, "POST", f"/api/bindings/{vhost}/e/{EXCHANGE}/q/{queue}",
                      {"routing_key": queue_of(key)}, deadline)
        value = {"uri": uris[upstream_of(side)], "ack-mode": settings.ack_mode, "prefetch-count": settings.prefetch,
                 "reconnect-delay": settings.reconnect_delay_s, "max-hops": settings.max_hops}
        _call_any(cluster, "PUT", f"/api/parameters/federation-upstream/{vhost}/{UPSTREAM}", {"value": value},
                  deadline)
        policy = {"pattern": f"^{EXCHANGE}$", "apply-to": "exchanges",
                  "definition": {"federation-upstream": UPSTREAM}}
        _call_any(cluster, "PUT", f"/api/policies/{vhost}/chaos-federation", policy, deadline)
    wanted = {queue_of(side) for side in SIDES}
    while time.monotonic() < deadline:
        if all(ring.link_node(side) is not None and wanted <= ring.bound_keys(upstream_of(side)) for side in SIDES):
            return
        time.sleep(0.3)
    raise RuntimeError("federation ring not running and bound within "
                       f"{timeout_s} s: {[(side, ring.link_rows(side)) for side in SIDES]}")


@contextmanager
def ring_clusters(settings: RingSettings, seed: int, node_args: tuple[str, ...] = (),
                  data_dir: Path | None = None) -> Iterator[RingClusters]:
    """The three clusters, the fault proxy in front of every node and the ring's links running; everything stopped
    and removed on the way out."""
    import tempfile

    with ExitStack() as stack:
        root = data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="raftmq-chaos-ring-")))
        clusters = {side: spawn_cluster(stack, root / side, size, node_args, prefix=f"{side}-rmq")
                    for side, size in zip(SIDES, settings.nodes, strict=True)}
        proxy = stack.enter_context(FaultProxyThread(seed=seed))
        ring = RingClusters(clusters)
        ring.toxiproxy_url = f"http://127.0.0.1:{proxy.api_port}"
        uris = {side: proxied_uris(ring.toxiproxy_url, cluster, "fed", settings.heartbeat_s)
                for side, cluster in clusters.items()}
        _setup(ring, uris, settings)
        yield ring


@dataclass(frozen=True, slots=True)
class RingOutcome:
    check: RingCheck
    records: list[Record]
    published_all: bool
    drained: bool
    overflowed: bool
    duration_s: float
    error: str | None
    link_copies: dict[str, int]  # cluster -> the most copies of its link that ran at once

    @property
    def valid(self) -> bool:
        return self.check.valid and self.drained and not self.overflowed and self.error is None


def run_ring(scenario: Scenario, ring: RingClusters, settings: RingSettings) -> RingOutcome:
    """One workload per cluster (shared history), the steps `loop` times, heal, settle, drain, check."""
    base = scenario.workload_config(())
    workloads: list[Workload] = []
    first: Workload | None = None
    for side in SIDES:
        cluster = ring.sides[side]
        config = replace(base, urls=tuple(cluster.url(n) for n in cluster.nodes()), queues=(queue_of(side),),
                         publish_exchange=EXCHANGE, queue_arguments=dict(QUORUM), consumer_urls=(),
                         run_id=f"{base.run_id}-{side}")
        workload = Workload(config, first.recorder if first else None)
        first = first or workload
        workloads.append(workload)
    assert first is not None
    recorder = first.recorder
    nemesis = Nemesis(ring, recorder, random.Random(scenario.seed), None, None, ring.toxiproxy_url)
    started = time.monotonic()
    for workload in workloads:
        workload.purge_queues()
    for workload in workloads:
        workload.start(purge=False)
    error: str | None = None
    try:
        for _ in range(scenario.loop):
            for step in scenario.steps:
                nemesis.apply(step)
    except ScenarioError as step_error:
        error = str(step_error)
        recorder.fault("error", "nemesis", error)
    except BaseException:
        for workload in workloads:
            workload.stop()
        raise
    finally:
        nemesis.heal_all()
    for workload in workloads:
        if base.messages_per_publisher == 0:
            workload.stop_publishing()
    published_all = all(w.wait_published(scenario.publish_timeout_s) for w in workloads)
    recorder.fault("settle", "deployment")
    settle_error = ring.settle_ring(settings.settle_timeout_s)
    if settle_error is not None:
        recorder.fault("error", "settle", settle_error)
        error = error or settle_error
    drained = all([w.drain() for w in workloads])
    records = recorder.records()
    publishes, deliveries, _faults = split(records)
    return RingOutcome(check_ring(publishes, deliveries, acks_of(records)), records, published_all, drained,
                       recorder.overflowed, time.monotonic() - started, error,
                       {side: copies.most for side, copies in ring.link_copies.items()})


def ring_report_lines(outcome: RingOutcome) -> list[str]:
    """The ring's own lines under the chaos report: copies per message per cluster, loops, link copies."""
    lines = [f"  ring: {outcome.check.messages} messages published at their origins, each expected at the three "
             "clusters (the counts above are of (message, cluster) pairs); copies per message at each cluster "
             "(deliveries: messages):"]
    for side, histogram in outcome.check.copies.items():
        lines.append(f"    {side}: " + ", ".join(f"{n}: {count}" for n, count in histogram.items()))
    lines.append(f"  looped back to their origin: {len(outcome.check.looped)}"
                 + (f" (first: {', '.join(outcome.check.looped[:5])})" if outcome.check.looped else ""))
    lines.append(f"  most copies of each cluster's link at once: {outcome.link_copies}")
    return lines


def run_ring_scenario(scenario: Scenario, out_dir: Path) -> dict[str, Any]:
    """`raftmq chaos run` of a `[federation_ring]` scenario: run it, write report.txt/.json, history.jsonl and
    timeline.png to `out_dir`, print the report; the JSON report (`valid` decides the exit)."""
    from chaos.history import write_history
    from chaos.report import plot_timeline, report_json, report_text

    assert scenario.federation_ring is not None
    settings = RingSettings.parse(scenario.federation_ring)
    with ring_clusters(settings, scenario.seed, scenario.node_args()) as ring:
        outcome = run_ring(scenario, ring, settings)
    extra = {"published_all": outcome.published_all, "drained": outcome.drained, "overflowed": outcome.overflowed,
             "duration_s": round(outcome.duration_s, 2), "seed": scenario.seed, "error": outcome.error}
    report = report_json(scenario.name, outcome.check.result, outcome.records, extra)
    report["valid"] = outcome.valid
    report["ring"] = {"copies": {side: {str(n): c for n, c in h.items()} for side, h in outcome.check.copies.items()},
                      "looped": list(outcome.check.looped[:100]), "link_copies_most": outcome.link_copies,
                      "cluster_nodes": settings.nodes, "max_hops": settings.max_hops}
    text = report_text(report) + "\n".join(ring_report_lines(outcome)) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    (out_dir / "report.txt").write_text(text)
    write_history(out_dir / "history.jsonl", outcome.records)
    plot_timeline(out_dir / "timeline.png", f"{scenario.name}: {'PASS' if outcome.valid else 'FAIL'}",
                  outcome.records)
    print(text, end="")
    print(f"  report: {out_dir}")
    return report
