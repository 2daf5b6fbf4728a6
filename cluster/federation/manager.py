"""FederationManager: the federation links of one node (exchange and queue) — which ones it runs, their tasks,
their status.

How it works: every `POLL_S` (and at once after `poke()`) the manager reads the node's view (the management view:
policies, exchanges and queues with the policy that applies to each, bindings, runtime parameters). For each
exchange or queue whose policy has `federation-upstream` or `federation-upstream-set`, `resolve`
(cluster/federation/params.py) gives the upstreams; each (vhost, kind, exchange or queue, upstream) is one link.
`owner(vhost, "federation:<exchange>:<upstream>")` (queues: `"federation-queue:<queue>:<upstream>"`) picks the
node that runs it (single node: this one; cluster: the shovels' rendezvous choice, docs/shovel.md). It starts an
`ExchangeLinkRunner` or a `QueueLinkRunner` (cluster/federation/queue_runner.py; it reads the local queue's
consumer and ready counts through `view.queue_demand`) for each link it owns and does not run, cancels one it no
longer owns or whose upstream definition (or exchange type) changed, and pushes the downstream exchange's current
bindings to each running exchange link (the link binds/unbinds upstream for the difference). Those include the
bindings that links of other clusters made here (this exchange -> their internal exchange, with `x-bound-from`),
so the link replays them one hop further while their hop count allows (cluster/federation/link.py). A link no node should run any more (policy or upstream
removed, exchange deleted) also has its upstream queue deleted (best effort); a link that moved or stopped keeps it.
A runner that fails unexpectedly is logged and started again after its reconnect delay. Every start and stop of a
link's copy here is logged (`federation link copy started|stopped {json}`: the chaos checker counts copies).
`running_here` tells the lease (cluster/link/ownership.py `busy`) whether a copy still exists here, so in a
cluster a link that moves is released only once its copy here has closed its connections.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from cluster.federation.link import BindingKey, freeze_args, link_id
from cluster.federation.params import COMPONENTS, POLICY_KEYS, Upstream, resolve
from cluster.federation.queue_runner import QueueLinkRunner
from cluster.federation.runner import ExchangeLinkRunner
from cluster.link.client import wall_ms
from cluster.link.uri import AmqpUri

log = logging.getLogger("raftmq.federation")
POLL_S = 0.5
LinkKey = tuple[str, str, str, str]  # vhost, kind ("exchange" or "queue"), exchange or queue name, upstream name
EXCHANGE, QUEUE = "exchange", "queue"


@dataclass
class _Entry:
    identity: str
    runner: ExchangeLinkRunner
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


@dataclass(frozen=True)
class _Wanted:
    upstream: Upstream
    exchange_type: str  # "" for a queue link
    bindings: frozenset[BindingKey]

    @property
    def identity(self) -> str:
        return json.dumps([self.upstream.value, self.exchange_type], sort_keys=True)


def wanted_links(view: Any) -> dict[LinkKey, _Wanted]:
    """Every link the stored policies, exchanges and upstreams call for (the same on every node)."""
    policies = {(p["vhost"], p["name"]): p["definition"] for p in view.policies()
                if POLICY_KEYS & set(p["definition"])}
    if not policies:
        return {}
    stored = {(p["component"], p["vhost"], p["name"]): json.dumps(p["value"]) for p in view.parameters()
              if p["component"] in COMPONENTS}
    links: dict[LinkKey, _Wanted] = {}
    for vhost, queue, policy in view.queue_policies():
        if (vhost, policy) in policies:
            for upstream in resolve(policies[(vhost, policy)], vhost, stored):
                links[(vhost, QUEUE, queue, upstream.name)] = _Wanted(upstream, "", frozenset())
    exchanges = [x for x in view.exchanges()
                 if x["name"] and not x["name"].startswith("amq.") and (x["vhost"], x.get("policy")) in policies]
    if not exchanges:
        return links
    names = {(x["vhost"], x["name"]) for x in exchanges}
    bindings: dict[tuple[str, str], set[BindingKey]] = {key: set() for key in names}
    for b in view.bindings():
        key = (b["vhost"], b["source"])
        if key in bindings:
            bindings[key].add((b["routing_key"], freeze_args(b.get("arguments") or {})))
    for x in exchanges:
        vhost, name = x["vhost"], x["name"]
        for upstream in resolve(policies[(vhost, x["policy"])], vhost, stored):
            links[(vhost, EXCHANGE, name, upstream.name)] = _Wanted(upstream, x["type"],
                                                                    frozenset(bindings[(vhost, name)]))
    return links


class FederationManager:
    def __init__(self, node_name: str, cluster_name: str, view: Any,
                 owner: Callable[[str, str], str | None] | None = None, local: AmqpUri | None = None) -> None:
        self.node_name = node_name
        self.cluster_name = cluster_name
        self.view = view
        self.owner = owner or (lambda vhost, name: node_name)
        self.local = local
        self._entries: dict[LinkKey, _Entry] = {}
        self._live: Counter[tuple[str, str]] = Counter()  # (vhost, owner name) -> copies whose task has not finished
        self._wake = trio.Event()

    def poke(self) -> None:
        self._wake.set()

    def restart(self, vhost: str, link: str) -> bool:
        """Restart the link with this id (`link_id`) running here (False: no such link runs on this node). The
        upstream queue is kept, so nothing it buffered is lost."""
        key = next((k for k in self._entries if k[0] == vhost and link_id(k[0], k[2], k[3], k[1]) == link), None)
        if key is None:
            return False
        self._entries.pop(key).scope.cancel()
        self.poke()
        return True

    def running_here(self, vhost: str, name: str) -> bool:
        """Whether a copy of the link with this owner name (`_owner_name`) still exists here (running, or stopping:
        its task has not finished closing its connections). In a cluster the lease is released only after that."""
        return self._live[(vhost, name)] > 0

    def status(self) -> list[dict[str, Any]]:
        """RabbitMQ's /api/federation-links rows for the links this node runs, plus `node`."""
        rows = []
        for key in sorted(self._entries):
            row = self._entries[key].runner.link.status()
            row["node"] = self.node_name
            row["local_connection"] = self._entries[key].runner.connection_name
            row["timestamp"] = _iso(row.pop("timestamp_ms"))
            rows.append(row)
        return rows

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                try:
                    self._reconcile(nursery)
                except Exception:
                    log.exception("federation: reconcile failed")
                with trio.move_on_after(POLL_S):
                    await self._wake.wait()
                self._wake = trio.Event()

    def _reconcile(self, nursery: trio.Nursery) -> None:
        wanted = wanted_links(self.view)
        mine = {k: w for k, w in wanted.items() if self.owner(k[0], _owner_name(k)) == self.node_name}
        for key, entry in list(self._entries.items()):
            w = mine.get(key)
            if w is None or w.identity != entry.identity:
                del self._entries[key]
                entry.scope.cancel()
                if key not in wanted:
                    log.info("federation link %s removed", _label(key))
                    nursery.start_soon(entry.runner.cleanup)
                else:
                    log.info("federation link %s stopped here (moved or changed)", _label(key))
            elif key[1] == EXCHANGE:
                entry.runner.set_bindings(set(w.bindings))
        for key, w in mine.items():
            if key in self._entries:
                continue
            entry = _Entry(w.identity, self._runner(key, w))
            self._entries[key] = entry
            nursery.start_soon(self._run_one, key, entry, w)
            log.info("federation link %s starting on %s", _label(key), self.node_name)

    def _runner(self, key: LinkKey, w: _Wanted) -> ExchangeLinkRunner:
        if key[1] == QUEUE:
            return QueueLinkRunner(w.upstream, key[0], key[2], self.cluster_name, self.local,
                                   self.view.queue_demand)
        return ExchangeLinkRunner(w.upstream, key[0], key[2], w.exchange_type, self.cluster_name, self.local,
                                  set(w.bindings))

    async def _run_one(self, key: LinkKey, entry: _Entry, w: _Wanted) -> None:
        report = {"name": link_id(key[0], key[2], key[3], key[1]), "link": _label(key), "node": self.node_name}
        live = (key[0], _owner_name(key))
        self._live[live] += 1
        log.info("federation link copy started %s", json.dumps({**report, "at_ms": wall_ms()}))
        try:
            with entry.scope:
                await self._run_runner(key, entry, w)
        finally:
            log.info("federation link copy stopped %s", json.dumps({**report, "at_ms": wall_ms()}))
            self._live[live] -= 1

    async def _run_runner(self, key: LinkKey, entry: _Entry, w: _Wanted) -> None:
        while True:
            try:
                await entry.runner.run()
                return
            except Exception as exc:
                log.exception("federation link %s failed", _label(key))
                entry.runner.link.stop(f"failed: {type(exc).__name__}: {exc}", wall_ms())
            await trio.sleep(max(w.upstream.reconnect_delay_ms, 1000) / 1000)
            entry.runner = self._runner(key, w)


def _label(key: LinkKey) -> str:
    vhost, kind, name, upstream = key
    return f"({kind}) {vhost}/{name} <- {upstream}"


def _owner_name(key: LinkKey) -> str:
    """The name the owner choice hashes (exchange links keep the name they had before queue links existed)."""
    _vhost, kind, name, upstream = key
    return f"federation:{name}:{upstream}" if kind == EXCHANGE else f"federation-queue:{name}:{upstream}"


def _iso(ms: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
