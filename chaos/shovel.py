"""Shovel scenarios: a source cluster, a destination cluster and a dynamic shovel between them, under faults.

How it works: a scenario with a `[shovel]` table (`source_nodes`, `dest_nodes`, `ack_mode`, `heartbeat_s`,
`prefetch`, `settle_timeout_s`) gets `shovel_environment`: it starts the two clusters (nodes `rmq1..` of each in
its own temporary directory, one cluster each), puts our fault proxy (chaos/faultproxy) in front of every
destination node (proxies `shovel-dest-<node>`), and defines the dynamic shovel `chaos-shovel` through the source's
management API: from the workload queue on the source node that runs it (`src-uri` `amqp://`, the node itself) to
the same queue name on the destination, `dest-uri` listing the proxies (with a short heartbeat, so a cut link is
noticed), both queues quorum queues. The workload's publishers (confirms) use the source nodes, its consumers and
the drain the destination nodes. `TwoClusters` is the nemesis's view: node names `src.rmq1`, `dst.rmq1`, ..., and
targets `shovel-node` (the source node the source nodes name as running the shovel), `dest-leader` (the leader of
the destination queue), `source-leader`, `source`, `dest`. A partition between the clusters is a toxic on every
destination proxy (`timeout` 0: the proxy holds the bytes both ways, so heartbeats stop, as in a partition; new
connections open at TCP level and then hang), which needs no root and no namespaces; clients on the host still
reach every node. After the faults heal and publishing ends, `settle` waits until the source queue has no message
left (ready or unacked): with `on-confirm` the shovel acks at the source only what the destination confirmed, so
everything confirmed to the source is then in the destination, and the drain empties it there. The checker runs
with `copies`: a shovel republishes what it had published but not seen confirmed when its link broke, so a payload
can arrive twice as two fresh messages (counted as duplicates, not violations). `settle` also counts the copies
of the shovel that ran at once (`count_copies`: the source nodes log every start and stop of a copy, and
`TwoClusters` notes when it kills a source node): more than one at any moment fails the run.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from chaos.faultproxy.background import FaultProxyThread
from chaos.nemesis import LocalCluster
from chaos.run import Environment, free_base_port
from chaos.scenario import ScenarioError
from node.ctl import Client, CtlError

SHOVEL_NAME = "chaos-shovel"
SOURCE, DEST = "src", "dst"
QUORUM = {"x-queue-type": "quorum"}
HTTP_TIMEOUT_S = 2.0
SettingsT = TypeVar("SettingsT")


@dataclass(frozen=True, slots=True)
class ShovelSettings:
    source_nodes: int = 3
    dest_nodes: int = 3
    ack_mode: str = "on-confirm"
    heartbeat_s: int = 4  # on the shovel's destination link: a partition is noticed after about 2 heartbeats
    prefetch: int = 1000
    reconnect_delay_s: float = 1.0
    settle_timeout_s: float = 120.0  # how long the shovel gets to empty the source queue after the faults

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> ShovelSettings:
        return parse_settings(cls, raw, "shovel")


def parse_settings(cls: type[SettingsT], raw: dict[str, Any], table: str) -> SettingsT:
    """A scenario's `[table]` as the settings dataclass `cls`; an unknown key is a ScenarioError."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(raw) - known
    if unknown:
        raise ScenarioError(f"[{table}]: unknown keys {sorted(unknown)} (known: {sorted(known)})")
    return cls(**raw)


class TwoClusters:
    """The nemesis's `Cluster` over both clusters: nodes `src.rmqN` and `dst.rmqN`, plus the shovel targets."""

    def __init__(self, source: LocalCluster, dest: LocalCluster, queue: str) -> None:
        self.sides = {SOURCE: source, DEST: dest}
        self.queue = queue
        self.deaths: dict[str, list[int]] = {}  # source node -> when it was killed (wall ms): its copy ended then
        self.copies: CopyCount | None = None  # set by `settle`

    def _died(self, node: str) -> None:
        side, _, name = node.partition(".")
        if side == SOURCE:
            self.deaths.setdefault(name, []).append(int(time.time() * 1000))

    def _split(self, node: str) -> tuple[LocalCluster, str]:
        side, _, name = node.partition(".")
        return self.sides[side], name

    def nodes(self) -> list[str]:
        return [f"{side}.{name}" for side, cluster in self.sides.items() for name in cluster.nodes()]

    def pid(self, node: str) -> int | None:
        cluster, name = self._split(node)
        return cluster.pid(name)

    def url(self, node: str) -> str:
        cluster, name = self._split(node)
        return cluster.url(name)

    def kill(self, node: str) -> None:
        cluster, name = self._split(node)
        cluster.kill(name)
        self._died(node)

    def pause(self, node: str) -> None:
        cluster, name = self._split(node)
        cluster.pause(name)

    def resume(self, node: str) -> None:
        cluster, name = self._split(node)
        cluster.resume(name)

    def restart(self, node: str) -> None:
        cluster, name = self._split(node)
        if cluster.pid(name) is not None:
            self.kill(node)
        cluster.restart(name)

    def restart_many(self, nodes: list[str]) -> None:
        """Per cluster: all its nodes started, then waited for (chaos.nemesis.LocalCluster.restart_many)."""
        for node in nodes:
            cluster, name = self._split(node)
            if cluster.pid(name) is not None:
                self.kill(node)
        for side, cluster in self.sides.items():
            names = [name for node in nodes for s, _, name in [node.partition(".")] if s == side]
            if names:
                cluster.restart_many(names)

    def leader_of(self, queue: str) -> str | None:
        """The leader of the queue on the source cluster (where the publishers are)."""
        leader = self.sides[SOURCE].leader_of(queue)
        return f"{SOURCE}.{leader}" if leader else None

    def named_targets(self, target: str) -> list[str] | None:
        """The shovel scenario's own target kinds; None for any other target."""
        if target == "shovel-node":
            runner = self.shovel_node()
            return [f"{SOURCE}.{runner}"] if runner else [f"{SOURCE}.{self.sides[SOURCE].nodes()[0]}"]
        if target == "dest-leader":
            leader = self.sides[DEST].leader_of(self.queue)
            return [f"{DEST}.{leader or self.sides[DEST].nodes()[0]}"]
        if target == "source-leader":
            leader = self.leader_of(self.queue)
            return [leader or f"{SOURCE}.{self.sides[SOURCE].nodes()[0]}"]
        if target in (SOURCE, "source"):
            return [f"{SOURCE}.{name}" for name in self.sides[SOURCE].nodes()]
        if target in (DEST, "dest"):
            return [f"{DEST}.{name}" for name in self.sides[DEST].nodes()]
        return None

    def shovel_node(self) -> str | None:
        """The source node running the shovel, as most live source nodes name it (None when none names one)."""
        votes = Counter(row.get("node") for row in self.shovel_rows() if isinstance(row.get("node"), str))
        return str(votes.most_common(1)[0][0]) if votes else None

    def shovel_rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for name in self.sides[SOURCE].nodes():
            rows.extend(row for row in _api(self.sides[SOURCE], name, "GET", "/api/shovels") or []
                        if isinstance(row, dict) and row.get("name") == SHOVEL_NAME)
        return rows

    def source_backlog(self) -> int | None:
        """Messages (ready + unacked) in the source queue, from its leader's view (None when nobody answers)."""
        source = self.sides[SOURCE]
        for name in source.nodes():
            for row in _api(source, name, "GET", "/api/queues") or []:
                if isinstance(row, dict) and row.get("name") == self.queue:
                    return int(row.get("messages_ready", 0)) + int(row.get("messages_unacknowledged", 0))
        return None

    def count_copies(self) -> CopyCount:
        """The most copies of the shovel that ran at once, from the source nodes' logs (`shovel copy started` and
        `stopped` lines, cluster/shovel/manager.py) and the kill times of the source nodes."""
        source = self.sides[SOURCE]
        logs = {name: _read(Path(source.spec(name).log)) for name in source.nodes()}
        return count_copies(logs, self.deaths, SHOVEL_NAME)

    # What moves the messages, for error texts and the settle step; a federation scenario (chaos/federation.py)
    # overrides these and `count_copies`.
    link_label = "shovel"
    backlog_label = "the source queue"
    copy_line_hint = "`shovel copy started` line in the source nodes' logs (log level above info?)"

    def link_backlog(self) -> int | None:
        return self.source_backlog()

    def link_states(self) -> list[tuple[Any, ...]]:
        """(node, state) of every copy of the link the clusters list."""
        return [(row.get("node"), row.get("state")) for row in self.shovel_rows()]

    def link_running(self) -> bool:
        return any(state == "running" for _node, state, *_rest in self.link_states())

    def settle_and_count(self, timeout_s: float) -> str | None:
        """`settle`, then `count_copies`: two copies at once is an error."""
        error = self.settle(timeout_s)
        self.copies = self.count_copies()
        if self.copies.most > 1:
            return error or f"{self.copies.most} copies of the {self.link_label} ran at once: {self.copies.overlap}"
        if not self.copies.intervals:
            return error or f"no {self.copy_line_hint}"
        return error

    def settle(self, timeout_s: float) -> str | None:
        """Wait until the link's backlog stays empty for 2 s while the link runs; an error text if it does not."""
        deadline = time.monotonic() + timeout_s
        empty_since: float | None = None
        backlog: int | None = None
        while time.monotonic() < deadline:
            backlog = self.link_backlog()
            if backlog == 0 and self.link_running():
                empty_since = empty_since or time.monotonic()
                if time.monotonic() - empty_since >= 2.0:
                    return None
            else:
                empty_since = None
            time.sleep(0.2)
        return (f"the {self.link_label} did not empty {self.backlog_label} within {timeout_s} s (backlog {backlog}, "
                f"{self.link_label} {self.link_states()})")


COPY_LINE = re.compile(r"shovel copy (started|stopped) (\{.*\})")


@dataclass(frozen=True, slots=True)
class CopyCount:
    intervals: tuple[tuple[str, int, int | None], ...]  # (node, started wall ms, ended wall ms or None: still runs)
    most: int  # the most copies running at the same time
    overlap: tuple[tuple[str, int, int | None], ...] = ()  # the intervals of the first moment with `most` copies


def count_copies(logs: Mapping[str, str], deaths: Mapping[str, Iterable[int]], shovel: str,
                 line: re.Pattern[str] = COPY_LINE) -> CopyCount:
    """Pure: each node's copies of `shovel` as intervals (a started line opens one, a stopped line or the node's
    death closes it), and the most that overlap. A copy ends no later than its process: a kill -9 ends it. `line`:
    the log line of a start or stop (chaos/federation.py counts federation links' copies with its own)."""
    intervals: list[tuple[str, int, int | None]] = []
    for node, text in logs.items():
        events: list[tuple[int, int, str]] = [(at, 0, "died") for at in deaths.get(node, ())]
        for match in line.finditer(text):
            report = json.loads(match.group(2))
            if report.get("name") == shovel:
                events.append((int(report["at_ms"]), 1 if match.group(1) == "started" else 0, match.group(1)))
        opened: int | None = None
        for at, _, what in sorted(events):
            if what == "started":
                opened = at if opened is None else opened
            elif opened is not None:
                intervals.append((node, opened, at))
                opened = None
        if opened is not None:
            intervals.append((node, opened, None))
    most, overlap = 0, ()  # type: tuple[int, tuple[tuple[str, int, int | None], ...]]
    for _, start, _ in intervals:
        running = tuple(i for i in intervals if i[1] <= start and (i[2] is None or i[2] > start))
        if len(running) > most:
            most, overlap = len(running), running
    return CopyCount(tuple(sorted(intervals, key=lambda i: i[1])), most, overlap)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _api(cluster: LocalCluster, node: str, method: str, path: str, body: Any = None) -> Any:
    if cluster.pid(node) is None:
        return None
    host, port = cluster.management_address(node)
    try:
        return Client(f"{host}:{port}", "guest", "guest", HTTP_TIMEOUT_S).call(method, path, body)
    except (CtlError, ValueError, OSError):
        return None


def shovel_definition(queue: str, dest_uris: list[str], settings: ShovelSettings) -> dict[str, Any]:
    return {"src-uri": "amqp://", "src-queue": queue, "src-queue-args": QUORUM,
            "src-prefetch-count": settings.prefetch, "dest-uri": dest_uris, "dest-queue": queue,
            "dest-queue-args": QUORUM, "ack-mode": settings.ack_mode,
            "reconnect-delay": settings.reconnect_delay_s}


def _add_proxy(api: str, name: str, upstream: tuple[str, int]) -> str:
    body = json.dumps({"name": name, "listen": "127.0.0.1:0", "upstream": f"{upstream[0]}:{upstream[1]}"})
    request = urllib.request.Request(f"{api}/proxies", data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.loads(response.read())["listen"])


def spawn_cluster(stack: ExitStack, root: Path, nodes: int, node_args: tuple[str, ...],
                  prefix: str = "rmq") -> LocalCluster:
    """One side of a two- or three-cluster scenario, its nodes named `prefix`1..N, started on free ports and
    stopped when `stack` closes."""
    cluster = LocalCluster.spawn(root, nodes, free_base_port(nodes), node_args, clustered=nodes > 1, prefix=prefix)
    stack.callback(cluster.stop_all)
    return cluster


def proxied_uris(api: str, cluster: LocalCluster, prefix: str, heartbeat_s: int) -> list[str]:
    """A fault-proxy listener (`prefix-<node>`) in front of each node of `cluster`, as the link's amqp URIs."""
    query = f"?heartbeat={heartbeat_s}&connection_timeout=3000"
    uris = []
    for name in cluster.nodes():
        listen = _add_proxy(api, f"{prefix}-{name}", (cluster.spec(name).host, cluster.spec(name).port))
        uris.append(f"amqp://guest:guest@{listen}/%2F{query}")
    return uris


@contextmanager
def shovel_environment(raw_settings: dict[str, Any], queue: str, seed: int, node_args: tuple[str, ...] = (),
                       data_dir: Path | None = None) -> Iterator[Environment]:
    """Both clusters, the fault proxy in front of the destination and the shovel defined and running; everything
    stopped and removed on the way out."""
    import tempfile

    settings = ShovelSettings.parse(raw_settings)
    with ExitStack() as stack:
        root = data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="raftmq-chaos-shovel-")))
        source = spawn_cluster(stack, root / "source", settings.source_nodes, node_args)
        dest = spawn_cluster(stack, root / "dest", settings.dest_nodes, node_args)
        proxy = stack.enter_context(FaultProxyThread(seed=seed))
        api = f"http://127.0.0.1:{proxy.api_port}"
        dest_uris = proxied_uris(api, dest, "shovel-dest", settings.heartbeat_s)
        both = TwoClusters(source, dest, queue)
        _define_shovel(both, shovel_definition(queue, dest_uris, settings))
        yield Environment(both, tuple(source.url(n) for n in source.nodes()), None, api,
                          consumer_urls=tuple(dest.url(n) for n in dest.nodes()),
                          settle=lambda: both.settle_and_count(settings.settle_timeout_s), copies=True)


def _define_shovel(both: TwoClusters, definition: dict[str, Any], timeout_s: float = 60.0) -> None:
    """PUT the parameter through the first source node that takes it, then wait until a node runs the shovel."""
    source = both.sides[SOURCE]
    path = f"/api/parameters/shovel/%2F/{urllib.parse.quote(SHOVEL_NAME)}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name in source.nodes():
            host, port = source.management_address(name)
            try:
                Client(f"{host}:{port}", "guest", "guest", 10.0).call("PUT", path, {"value": definition})
            except (CtlError, OSError):
                continue
            while time.monotonic() < deadline:
                if any(row.get("state") == "running" for row in both.shovel_rows()):
                    return
                time.sleep(0.2)
        time.sleep(0.5)
    raise RuntimeError(f"shovel {SHOVEL_NAME} not running within {timeout_s} s: {both.shovel_rows()}")
