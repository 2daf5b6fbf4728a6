"""Federation scenarios: an upstream cluster, a downstream cluster and an exchange federation link between them,
under faults.

How it works: a scenario with a `[federation]` table (`upstream_nodes`, `downstream_nodes`, `ack_mode`,
`heartbeat_s`, `prefetch`, `reconnect_delay_s`, `settle_timeout_s`) gets `federation_environment`, built as the
shovel one (chaos/shovel.py, whose `TwoClusters` and copy count it reuses): the two clusters (nodes `up.rmqN` and
`down.rmqN`), our fault proxy (chaos/faultproxy) in front of every upstream node (proxies `fed-up-<node>`), and on
both the direct exchange `chaos-fx`. On the downstream the workload queue (a quorum queue) is bound to it with its
own name as routing key, the upstream `chaos-up` lists the proxies (short heartbeat, so a cut link is noticed), and
a policy federates `chaos-fx` from it; the environment is handed over once a downstream node runs the link and
the binding has reached the upstream (from then on everything published to `chaos-fx` upstream with that key is
routed to the link's durable upstream queue). The workload's publishers (confirms) publish to `chaos-fx` on the
upstream nodes (`publish_exchange`), its consumers and the drain use the downstream nodes. Targets: `link-node`
(the downstream node the downstream nodes name as running the link), `upstream`, `downstream`,
`downstream-leader` (the workload queue's leader). A partition between the clusters is a `timeout` toxic on every
upstream proxy, both ways. `settle` waits until the link's upstream queue has been empty (ready and unacked) for
2 s while the link runs: with `on-confirm` the link acks upstream only what the downstream confirmed, so everything
confirmed upstream is then downstream. The checker counts copies (a link republishes what it had forwarded but not
seen confirmed when its connections broke) as duplicates; `count_copies` over the downstream nodes' logs
(`federation link copy started|stopped`, cluster/federation/manager.py) fails the run when two copies of the link
ran at once. With `kind = "queue"` the link is a queue federation link instead: the workload queue exists on both
clusters, a policy federates the downstream one from the upstream queue of the same name, the publishers publish to
that upstream queue (default exchange), the link pulls while the downstream consumers are there, and `settle` waits
until the upstream queue itself has been empty for 2 s (the consumers still running, so the link still pulls).
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.faultproxy.background import FaultProxyThread
from chaos.nemesis import LocalCluster
from chaos.run import Environment
from chaos.scenario import ScenarioError
from chaos.shovel import (
    QUORUM,
    TwoClusters,
    _api,
    _read,
    count_copies,
    parse_settings,
    proxied_uris,
    spawn_cluster,
)
from cluster.federation.link import link_id
from node.ctl import Client, CtlError

EXCHANGE = "chaos-fx"
UPSTREAM = "chaos-up"
UP, DOWN = "up", "down"
COPY_LINE = re.compile(r"federation link copy (started|stopped) (\{.*\})")


@dataclass(frozen=True, slots=True)
class FederationSettings:
    upstream_nodes: int = 1
    downstream_nodes: int = 3
    ack_mode: str = "on-confirm"
    heartbeat_s: int = 4  # on the link's upstream connection: a partition is noticed after about 2 heartbeats
    prefetch: int = 1000
    reconnect_delay_s: float = 1.0
    settle_timeout_s: float = 120.0  # how long the link gets to empty its upstream queue after the faults
    kind: str = "exchange"  # "queue": queue federation of the workload queue instead (publishers on the upstream
    # queue of the same name, through the default exchange)

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> FederationSettings:
        settings = parse_settings(cls, raw, "federation")
        if settings.kind not in ("exchange", "queue"):
            raise ScenarioError(f"[federation] kind: exchange or queue (got {settings.kind!r})")
        return settings


class FederatedClusters(TwoClusters):
    """The nemesis's `Cluster` over both clusters: nodes `up.rmqN` and `down.rmqN`, plus the link's targets."""

    def __init__(self, upstream: LocalCluster, downstream: LocalCluster, queue: str, kind: str = "exchange") -> None:
        super().__init__(upstream, downstream, queue)
        self.sides = {UP: upstream, DOWN: downstream}
        self.kind = kind

    def _died(self, node: str) -> None:
        side, _, name = node.partition(".")
        if side == DOWN:  # the link runs downstream
            self.deaths.setdefault(name, []).append(int(time.time() * 1000))

    def leader_of(self, queue: str) -> str | None:
        leader = self.sides[DOWN].leader_of(queue)
        return f"{DOWN}.{leader}" if leader else None

    def named_targets(self, target: str) -> list[str] | None:
        down = self.sides[DOWN]
        if target == "link-node":
            runner = self.link_node()
            return [f"{DOWN}.{runner or down.nodes()[0]}"]
        if target == "downstream-leader":
            return [self.leader_of(self.queue) or f"{DOWN}.{down.nodes()[0]}"]
        if target in (UP, "upstream"):
            return [f"{UP}.{name}" for name in self.sides[UP].nodes()]
        if target in (DOWN, "downstream"):
            return [f"{DOWN}.{name}" for name in down.nodes()]
        return None

    def link_rows(self) -> list[dict[str, Any]]:
        return link_rows_of(self.sides[DOWN], self._ours)

    def _ours(self, row: dict[str, Any]) -> bool:
        if self.kind == "queue":
            return row.get("type") == "queue" and row.get("queue") == self.queue
        return row.get("exchange") == EXCHANGE

    def link_node(self) -> str | None:
        return running_node(self.link_rows())

    def upstream_backlog(self) -> int | None:
        """Messages (ready + unacked) in the link's upstream queue (None when no upstream node lists it)."""
        up = self.sides[UP]
        for name in up.nodes():
            for row in _api(up, name, "GET", "/api/queues") or []:
                if not isinstance(row, dict):
                    continue
                queue = str(row.get("name", ""))
                if queue == self.queue if self.kind == "queue" else queue.startswith(f"federation: {EXCHANGE} -> "):
                    return int(row.get("messages_ready", 0)) + int(row.get("messages_unacknowledged", 0))
        return None

    def upstream_bound(self) -> bool:
        """The workload queue's binding reached the upstream (chaos-fx -> the link's internal exchange); a queue
        link binds nothing."""
        if self.kind == "queue":
            return True
        up = self.sides[UP]
        for name in up.nodes():
            for row in _api(up, name, "GET", "/api/bindings") or []:
                if (isinstance(row, dict) and row.get("source") == EXCHANGE and row.get("routing_key") == self.queue
                        and str(row.get("destination", "")).startswith(f"federation: {EXCHANGE} -> ")):
                    return True
        return False

    def count_copies(self) -> Any:
        down = self.sides[DOWN]
        logs = {name: _read(Path(down.spec(name).log)) for name in down.nodes()}
        name = link_id("/", self.queue, UPSTREAM, "queue") if self.kind == "queue" else link_id("/", EXCHANGE, UPSTREAM)
        return count_copies(logs, self.deaths, name, COPY_LINE)

    link_label = "link"
    backlog_label = "its upstream queue"
    copy_line_hint = "`federation link copy started` line in the downstream nodes' logs"

    def link_backlog(self) -> int | None:
        return self.upstream_backlog()

    def link_states(self) -> list[tuple[Any, ...]]:
        return [(row.get("node"), row.get("status"), row.get("error")) for row in self.link_rows()]


def link_rows_of(cluster: LocalCluster, ours: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """The /api/federation-links rows of every node of `cluster` that `ours` accepts."""
    rows: list[dict[str, Any]] = []
    for name in cluster.nodes():
        rows.extend(row for row in _api(cluster, name, "GET", "/api/federation-links") or []
                    if isinstance(row, dict) and ours(row))
    return rows


def running_node(rows: list[dict[str, Any]]) -> str | None:
    """The node most of `rows` name as running the link (None when no row says running)."""
    votes = Counter(row.get("node") for row in rows
                    if row.get("status") == "running" and isinstance(row.get("node"), str))
    return str(votes.most_common(1)[0][0]) if votes else None


def _call_any(cluster: LocalCluster, method: str, path: str, body: Any, deadline: float) -> None:
    """One management call through the first node that takes it (retried until `deadline`)."""
    last = ""
    while time.monotonic() < deadline:
        for name in cluster.nodes():
            host, port = cluster.management_address(name)
            try:
                Client(f"{host}:{port}", "guest", "guest", 10.0).call(method, path, body)
                return
            except (CtlError, OSError) as exc:
                last = str(exc)
        time.sleep(0.5)
    raise RuntimeError(f"{method} {path} failed: {last}")


def _setup(both: FederatedClusters, upstream_uris: list[str], settings: FederationSettings,
           timeout_s: float = 90.0) -> None:
    """The exchange on both sides, the queue and its binding downstream, the upstream and the policy; then wait
    until a downstream node runs the link and the binding is upstream. A queue link: the queue on both sides, a
    policy federating the downstream one."""
    deadline = time.monotonic() + timeout_s
    vhost = "%2F"
    queue = urllib.parse.quote(both.queue, safe="")
    down = both.sides[DOWN]
    if settings.kind == "queue":
        for side in (UP, DOWN):
            _call_any(both.sides[side], "PUT", f"/api/queues/{vhost}/{queue}", {"durable": True, "arguments": QUORUM},
                      deadline)
    else:
        exchange = {"type": "direct", "durable": True}
        for side in (UP, DOWN):
            _call_any(both.sides[side], "PUT", f"/api/exchanges/{vhost}/{EXCHANGE}", exchange, deadline)
        _call_any(down, "PUT", f"/api/queues/{vhost}/{queue}", {"durable": True, "arguments": QUORUM}, deadline)
        _call_any(down, "POST", f"/api/bindings/{vhost}/e/{EXCHANGE}/q/{queue}", {"routing_key": both.queue},
                  deadline)
    value = {"uri": upstream_uris, "ack-mode": settings.ack_mode, "prefetch-count": settings.prefetch,
             "reconnect-delay": settings.reconnect_delay_s}
    _call_any(down, "PUT", f"/api/parameters/federation-upstream/{vhost}/{UPSTREAM}", {"value": value}, deadline)
    pattern, apply_to = (f"^{both.queue}$", "queues") if settings.kind == "queue" else (f"^{EXCHANGE}$", "exchanges")
    policy = {"pattern": pattern, "apply-to": apply_to, "definition": {"federation-upstream": UPSTREAM}}
    _call_any(down, "PUT", f"/api/policies/{vhost}/chaos-federation", policy, deadline)
    while time.monotonic() < deadline:
        if both.link_node() is not None and both.upstream_bound():
            return
        time.sleep(0.2)
    raise RuntimeError(f"federation link not running and bound within {timeout_s} s: {both.link_rows()}")


@contextmanager
def federation_environment(raw_settings: dict[str, Any], queue: str, seed: int, node_args: tuple[str, ...] = (),
                           data_dir: Path | None = None) -> Iterator[Environment]:
    """Both clusters, the fault proxy in front of the upstream and the link running; everything stopped and
    removed on the way out."""
    import tempfile

    settings = FederationSettings.parse(raw_settings)
    with ExitStack() as stack:
        root = data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="raftmq-chaos-fed-")))
        upstream = spawn_cluster(stack, root / "upstream", settings.upstream_nodes, node_args)
        downstream = spawn_cluster(stack, root / "downstream", settings.downstream_nodes, node_args)
        proxy = stack.enter_context(FaultProxyThread(seed=seed))
        api = f"http://127.0.0.1:{proxy.api_port}"
        upstream_uris = proxied_uris(api, upstream, "fed-up", settings.heartbeat_s)
        both = FederatedClusters(upstream, downstream, queue, settings.kind)
        _setup(both, upstream_uris, settings)
        yield Environment(both, tuple(upstream.url(n) for n in upstream.nodes()), None, api,
                          consumer_urls=tuple(downstream.url(n) for n in downstream.nodes()),
                          settle=lambda: both.settle_and_count(settings.settle_timeout_s), copies=True)
