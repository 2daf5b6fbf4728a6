"""Exchanges, their bindings and the per-type routing indexes (pure).

A destination is a `Dest(kind, name)` with kind "queue" or "exchange". A binding is identified, as in RabbitMQ, by
(source, destination, routing key, arguments). Each exchange keeps the set of its bindings plus an index for its
type: direct = routing key -> destinations, fanout = destinations, topic = a `TopicTrie`, headers = the binding list
evaluated with `headers_match`; x-federation-upstream (the exchange RabbitMQ's federation plugin declares on an
upstream per link) = a fanout that passes on only what `cluster.federation.link.upstream_exchange_routes` allows
(hop count, loop check). The default exchange ("") routes to the queue named by the routing key and is not
stored here (see vhost.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cluster.federation.link import upstream_exchange_routes
from node.broker.headers_match import headers_match
from node.broker.topic_trie import TopicTrie

FEDERATION_UPSTREAM = "x-federation-upstream"
EXCHANGE_TYPES = frozenset({"direct", "fanout", "topic", "headers", FEDERATION_UPSTREAM})
_FANOUT_INDEXED = frozenset({"fanout", FEDERATION_UPSTREAM})


class Dest(NamedTuple):
    kind: str  # "queue" | "exchange"
    name: str


def freeze_args(args: Mapping[str, Any]) -> Any:
    """A hashable, order-independent form of a field table (for binding identity)."""
    return tuple(sorted((k, _freeze_value(v)) for k, v in args.items()))


def _freeze_value(value: Any) -> Any:
    if isinstance(value, dict):
        return ("table", freeze_args(value))
    if isinstance(value, list):
        return ("array", tuple(_freeze_value(v) for v in value))
    if isinstance(value, bytearray):
        return bytes(value)
    return (type(value).__name__, value)


@dataclass(frozen=True, slots=True)
class Binding:
    source: str
    dest: Dest
    routing_key: str
    arguments: dict[str, Any]

    def key(self) -> tuple[str, Dest, str, Any]:
        return (self.source, self.dest, self.routing_key, freeze_args(self.arguments))


@dataclass(slots=True)
class Exchange:
    name: str
    type: str
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    bindings: dict[Any, Binding] = field(default_factory=dict)
    _direct: dict[str, dict[Dest, int]] = field(default_factory=dict)
    _fanout: dict[Dest, int] = field(default_factory=dict)
    _topic: TopicTrie[Dest] = field(default_factory=TopicTrie)

    @property
    def alternate_exchange(self) -> str | None:
        ae = self.arguments.get("alternate-exchange")
        if isinstance(ae, bytes):
            ae = ae.decode("utf-8", "replace")
        return ae if isinstance(ae, str) else None

    def add_binding(self, binding: Binding) -> bool:
        key = binding.key()
        if key in self.bindings:
            return False
        self.bindings[key] = binding
        if self.type == "direct":
            dests = self._direct.setdefault(binding.routing_key, {})
            dests[binding.dest] = dests.get(binding.dest, 0) + 1
        elif self.type in _FANOUT_INDEXED:
            self._fanout[binding.dest] = self._fanout.get(binding.dest, 0) + 1
        elif self.type == "topic":
            self._topic.add(binding.routing_key, binding.dest)
        return True

    def remove_binding(self, binding: Binding) -> bool:
        stored = self.bindings.pop(binding.key(), None)
        if stored is None:
            return False
        if self.type == "direct":
            dests = self._direct.get(stored.routing_key, {})
            _decrement(dests, stored.dest)
            if not dests:
                self._direct.pop(stored.routing_key, None)
        elif self.type in _FANOUT_INDEXED:
            _decrement(self._fanout, stored.dest)
        elif self.type == "topic":
            self._topic.remove(stored.routing_key, stored.dest)
        return True

    def bindings_to(self, dest: Dest) -> list[Binding]:
        return [b for b in self.bindings.values() if b.dest == dest]

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Dest]:
        if self.type == "direct":
            return self._direct.get(routing_key, ())
        if self.type == "fanout":
            return self._fanout
        if self.type == "topic":
            return self._topic.match(routing_key)
        if self.type == FEDERATION_UPSTREAM:
            return self._fanout if upstream_exchange_routes(self.arguments, dict(headers or {})) else ()
        return {b.dest for b in self.bindings.values() if headers_match(b.arguments, headers)}


def _decrement(counts: dict[Dest, int], dest: Dest) -> None:
    count = counts.get(dest, 0)
    if count <= 1:
        counts.pop(dest, None)
    else:
        counts[dest] = count - 1
