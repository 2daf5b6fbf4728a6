"""ExchangeLink: the pure state machine of one exchange federation link (one downstream exchange x one upstream).

Pure: inputs are method calls with `now_ms`, outputs are frozen effects the runner (cluster/federation/runner.py)
carries out over two link connections (the upstream, and this node). States: `starting` (connecting, or waiting
`reconnect-delay` after a failure; `error` holds the last failure), `running`, `terminated` (stopped by policy).

Inputs:
- `start(now_ms)` -> `Connect(uri_index)`; `connect_failed(reason)` / `down(reason)` -> `Disconnect` and a
  reconnect timer (the next URI of the upstream's list is tried); `tick(now_ms)` -> `Connect` when due.
- `connected(now_ms, upstream_cluster)`: the upstream queue is declared and consumed. `upstream_cluster` is the
  upstream's `cluster_name` server property (its URI's host:port if it sends none).
- `bindings(now_ms, wanted)`: the downstream exchange's current bindings as a set of (routing key, arguments
  frozen by `freeze_args`); the machine answers `Bind` / `Unbind` for the difference with what it has bound upstream
  (all of it after a (re)connect). The runner binds the upstream exchange to the link's internal exchange with
  them (exchange.bind). Each binding's arguments get an `x-bound-from` entry as RabbitMQ's plugin adds it
  (rabbit_federation_exchange_link:update_binding): {cluster-name (this cluster), vhost, exchange ("vhost:name"),
  hops}, hops = max-hops for a binding made here, min(previous hops - 1, max-hops) for one that a link of another
  cluster made here (it has `x-bound-from` already), and a binding whose hops reach 0 or whose `x-bound-from`
  already names the upstream cluster is not replayed. So when the upstream is itself downstream of another
  cluster, its own link replays these bindings one hop further, while hops remain.
- `delivery(tag, routing_key, properties, body, redelivered)`: loop safety first (rabbit_federation_util:
  should_forward): a message whose `x-received-from` already has `max-hops` entries, or an entry naming this
  cluster (`cluster-name`), is acked upstream and dropped. Otherwise -> `Publish` to the downstream exchange with
  the routing key kept and an entry {uri (no password), exchange, redelivered, cluster-name (the upstream's)}
  prepended to `x-received-from`; `user_id` is cleared unless `trust-user-id`. Then per ack mode: `no-ack`
  nothing; `on-publish` `Ack(tag)` at once; `on-confirm` the ack waits for the local confirm.
- `confirm(seq, multiple, ack)`: the local broker's Basic.Ack/Nack for the publishes (numbered 1, 2, ... from each
  connect); acked -> `Ack` (one `Ack(tag, multiple=True)` for a multiple confirm of several), nacked ->
  `Nack(requeue)`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from cluster.federation.params import Upstream
from node.amqp.properties import BasicProperties

STARTING = "starting"
RUNNING = "running"
TERMINATED = "terminated"
BindingKey = tuple[str, tuple[tuple[str, Any], ...]]


@dataclass(frozen=True, slots=True)
class Connect:
    uri_index: int


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason: str


@dataclass(frozen=True, slots=True)
class Bind:
    routing_key: str
    arguments: tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Unbind:
    routing_key: str
    arguments: tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Publish:
    seq: int  # local confirm sequence number (0 when none is awaited)
    routing_key: str
    properties: BasicProperties
    body: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    tag: int
    multiple: bool = False


@dataclass(frozen=True, slots=True)
class Nack:
    tag: int


Effect = Connect | Disconnect | Bind | Unbind | Publish | Ack | Nack


class Table(tuple[tuple[str, Any], ...]):
    """A frozen field table inside frozen binding arguments: sorted (key, value) pairs (`freeze_args`)."""

    __slots__ = ()


def freeze(value: Any) -> Any:
    """A hashable form of an argument value: a table -> `Table`, an array -> tuple, bytes -> str."""
    if isinstance(value, dict):
        return Table(sorted((str(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)) and not isinstance(value, Table):
        return tuple(freeze(v) for v in value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value


def thaw(value: Any) -> Any:
    """The field-table form of a `freeze`d value (what goes on the wire)."""
    if isinstance(value, Table):
        return {k: thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def freeze_args(arguments: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A binding's arguments as a BindingKey holds them (sorted pairs, values frozen)."""
    return tuple(sorted((str(k), freeze(v)) for k, v in arguments.items()))


def thaw_args(arguments: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {k: thaw(v) for k, v in arguments}


def bound_from(arguments: tuple[tuple[str, Any], ...], max_hops: int, upstream_cluster: str, cluster_name: str,
               vhost: str, exchange: str) -> tuple[tuple[str, Any], ...] | None:
    """The arguments a downstream binding is replayed upstream with (`x-bound-from` entry prepended), or None
    when it is not replayed (rabbit_federation_exchange_link:update_binding; see the module header)."""
    args = dict(arguments)
    previous = args.get("x-bound-from")
    entries = list(previous) if isinstance(previous, tuple) else []
    if entries:
        first = dict(entries[0]) if isinstance(entries[0], Table) else {}
        seen = any(isinstance(e, Table) and _text(dict(e).get("cluster-name")) == upstream_cluster for e in entries)
        prev_hops = first.get("hops")
        hops = 0 if seen or not isinstance(prev_hops, int) else min(prev_hops - 1, max_hops)
    else:
        hops = max_hops
    if hops <= 0:
        return None
    entry = freeze({"cluster-name": cluster_name, "vhost": vhost, "exchange": f"{vhost}:{exchange}", "hops": hops})
    args["x-bound-from"] = (entry, *entries)
    return tuple(sorted(args.items()))


def internal_exchange_name(queue_name: str, suffix: str) -> str:
    """RabbitMQ's internal upstream exchange: `<upstream queue name> A` or `... B` (alternating per connect)."""
    return f"{queue_name} {suffix}"


def upstream_queue_name(upstream_exchange: str, downstream_cluster: str, downstream_exchange: str) -> str:
    """RabbitMQ's name: `federation: <upstream X> -> <downstream cluster>[:<downstream X>]` (the suffix only when
    the two exchange names differ)."""
    suffix = "" if upstream_exchange == downstream_exchange else f":{downstream_exchange}"
    return f"federation: {upstream_exchange} -> {downstream_cluster}{suffix}"


def link_id(vhost: str, name: str, upstream: str, kind: str = "exchange") -> str:
    """A short stable id of a link (RabbitMQ's status rows carry one too; the restart path uses it). `name` is the
    federated exchange's or queue's; `kind` "exchange" or "queue"."""
    text = f"{vhost}\0{name}\0{upstream}" if kind == "exchange" else f"{vhost}\0{kind}\0{name}\0{upstream}"
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def should_forward(hops: list[Any], max_hops: int, cluster_name: str, vhost: str | None = None) -> bool:
    """rabbit_federation_util:should_forward: `hops` is a message's `x-received-from` list; False when it already
    has `max_hops` entries or an entry naming `cluster_name` (and `vhost`, when given and the entry has one)."""
    if len(hops) >= max_hops:
        return False
    for hop in hops:
        if not isinstance(hop, dict) or _text(hop.get("cluster-name")) != cluster_name:
            continue
        if vhost is None or "vhost" not in hop or _text(hop["vhost"]) == vhost:
            return False
    return True


def upstream_exchange_routes(arguments: dict[str, Any], headers: dict[str, Any] | None) -> bool:
    """Whether an exchange of type `x-federation-upstream` (RabbitMQ's plugin declares one on the upstream per
    link, arguments `x-max-hops`, `x-downstream-name`, `x-downstream-vhost`) passes a message on to its bindings
    (as a fanout): rabbit_federation_upstream_exchange:route. For the broker's routing (not wired in yet)."""
    received = (headers or {}).get("x-received-from")
    if not isinstance(received, list):
        return True
    max_hops = arguments.get("x-max-hops", 1)
    name = _text(arguments.get("x-downstream-name", ""))
    vhost = arguments.get("x-downstream-vhost")
    return should_forward(received, max_hops if isinstance(max_hops, int) else 1, name,
                          _text(vhost) if vhost is not None else None)


class ExchangeLink:
    def __init__(self, upstream: Upstream, vhost: str, exchange: str, cluster_name: str) -> None:
        self.upstream = upstream
        self.vhost = vhost
        self.exchange = exchange  # the downstream (local) exchange
        self.cluster_name = cluster_name  # this (downstream) cluster
        self.state = STARTING
        self.error = ""
        self.uri_index = 0
        self.reconnect_at_ms: int | None = None
        self.last_changed_ms = 0
        self.upstream_cluster = ""
        self._uri_text = ""
        self.forwarded = 0
        self.dropped = 0  # refused by the loop check (acked upstream, not forwarded)
        self.failures = 0
        self.suffix = "A"  # of the internal exchange upstream (the runner picks it at each connect)
        self._bound: set[BindingKey] = set()
        self._wanted: set[BindingKey] = set()
        self._next_seq = 1
        self._unconfirmed: dict[int, int] = {}

    @property
    def upstream_exchange(self) -> str:
        return self.upstream.exchange or self.exchange

    @property
    def publish_exchange(self) -> str:
        """Where forwarded messages are published locally (the downstream exchange)."""
        return self.exchange

    @property
    def queue_name(self) -> str:
        return upstream_queue_name(self.upstream_exchange, self.cluster_name, self.exchange)

    @property
    def internal_exchange(self) -> str:
        return internal_exchange_name(self.queue_name, self.suffix)

    # ------------------------------------------------------------ lifecycle
    def start(self, now_ms: int) -> list[Effect]:
        self._set(STARTING, now_ms)
        return [Connect(self.uri_index)]

    def connected(self, now_ms: int, upstream_cluster: str) -> list[Effect]:
        if self.state != STARTING:
            return []
        self._set(RUNNING, now_ms)
        self.error = ""
        self.upstream_cluster = upstream_cluster
        self._uri_text = self.upstream.uri(self.uri_index).redacted()  # (parsed once, not per message)
        self._reset()
        return self._sync_bindings()

    def connect_failed(self, reason: str, now_ms: int) -> list[Effect]:
        if self.state == TERMINATED:
            return []
        self.uri_index = (self.uri_index + 1) % len(self.upstream.uris)
        return self._retry(reason, now_ms)

    def down(self, reason: str, now_ms: int) -> list[Effect]:
        if self.state == TERMINATED:
            return []
        return self._retry(reason, now_ms)

    def stop(self, reason: str, now_ms: int) -> list[Effect]:
        if self.state == TERMINATED:
            return []
        self._set(TERMINATED, now_ms)
        self.error = reason
        return [Disconnect(reason)]

    def tick(self, now_ms: int) -> list[Effect]:
        if self.state == STARTING and self.reconnect_at_ms is not None and now_ms >= self.reconnect_at_ms:
            self.reconnect_at_ms = None
            return [Connect(self.uri_index)]
        return []

    # ------------------------------------------------------------ bindings and messages
    @property
    def wanted(self) -> frozenset[BindingKey]:
        """The downstream exchange's bindings as last told (`bindings`)."""
        return frozenset(self._wanted)

    def bindings(self, wanted: set[BindingKey]) -> list[Effect]:
        self._wanted = set(wanted)
        return self._sync_bindings() if self.state == RUNNING else []

    def delivery(self, tag: int, routing_key: str, properties: BasicProperties, body: bytes,
                 redelivered: bool) -> list[Effect]:
        if self.state != RUNNING:
            return []
        mode = self.upstream.ack_mode
        headers = dict(properties.headers or {})
        received = headers.get("x-received-from")
        hops = list(received) if isinstance(received, list) else []
        if not self._should_forward(hops):
            self.dropped += 1
            return [] if mode == "no-ack" else [Ack(tag)]
        entry = {"uri": self._uri_text, "exchange": self.upstream_exchange,
                 "redelivered": redelivered, "cluster-name": self.upstream_cluster}
        headers["x-received-from"] = [entry, *hops]
        return self._forward(tag, routing_key, properties, headers, body)

    def _forward(self, tag: int, routing_key: str, properties: BasicProperties, headers: dict[str, Any],
                 body: bytes) -> list[Effect]:
        """Republish a delivery downstream with `headers` (x-received-from already added): the user id dropped
        unless trusted, a confirm sequence under on-confirm, the upstream ack at once under on-publish."""
        mode = self.upstream.ack_mode
        fields: dict[str, Any] = {"headers": headers}
        if not self.upstream.trust_user_id:
            fields["user_id"] = None
        seq = 0
        if mode == "on-confirm":
            seq = self._next_seq
            self._next_seq += 1
            self._unconfirmed[seq] = tag
        self.forwarded += 1
        effects: list[Effect] = [Publish(seq, routing_key, replace(properties, **fields), body)]
        if mode == "on-publish":
            effects.append(Ack(tag))
        return effects

    def confirm(self, seq: int, multiple: bool, ack: bool) -> list[Effect]:
        if self.state != RUNNING:
            return []
        seqs = sorted(s for s in self._unconfirmed if s <= seq) if multiple else \
            ([seq] if seq in self._unconfirmed else [])
        tags = [self._unconfirmed.pop(s) for s in seqs]
        if ack and len(tags) > 1:
            # one multiple ack: delivery tags grow with the publish sequence, so every tag still outstanding
            # upstream and below the highest confirmed one is among these (checked on the oldest unconfirmed)
            oldest = next(iter(self._unconfirmed.values()), None)
            if oldest is None or oldest > tags[-1]:
                return [Ack(tags[-1], multiple=True)]
        return [Ack(t) if ack else Nack(t) for t in tags]

    def _should_forward(self, hops: list[Any]) -> bool:
        return should_forward(hops, self.upstream.max_hops, self.cluster_name)

    # ------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        status = self.state if self.state != STARTING or not self.error else "error"
        return {"type": "exchange", "vhost": self.vhost, "exchange": self.exchange,
                "upstream_exchange": self.upstream_exchange, "upstream": self.upstream.name,
                "id": link_id(self.vhost, self.exchange, self.upstream.name),
                "status": status, "error": self.error, "uri": self.upstream.uri(self.uri_index).redacted(),
                "upstream_cluster": self.upstream_cluster, "queue": self.queue_name, "forwarded": self.forwarded,
                "dropped": self.dropped, "pending": len(self._unconfirmed), "failures": self.failures,
                "bindings": len(self._bound), "timestamp_ms": self.last_changed_ms}

    # ------------------------------------------------------------ internals
    def _sync_bindings(self) -> list[Effect]:
        target: set[BindingKey] = set()
        for key, args in self._wanted:
            replayed = bound_from(args, self.upstream.max_hops, self.upstream_cluster, self.cluster_name,
                                  self.vhost, self.exchange)
            if replayed is not None:
                target.add((key, replayed))
        effects: list[Effect] = [Bind(k, a) for k, a in sorted(target - self._bound, key=repr)]
        effects += [Unbind(k, a) for k, a in sorted(self._bound - target, key=repr)]
        self._bound = target
        return effects

    def _set(self, state: str, now_ms: int) -> None:
        self.state = state
        self.last_changed_ms = now_ms

    def _reset(self) -> None:
        self._next_seq = 1
        self._unconfirmed.clear()
        self._bound = set()

    def _retry(self, reason: str, now_ms: int) -> list[Effect]:
        self.failures += 1
        self._set(STARTING, now_ms)
        self.error = reason
        self._reset()
        self.reconnect_at_ms = now_ms + self.upstream.reconnect_delay_ms
        return [Disconnect(reason)]
