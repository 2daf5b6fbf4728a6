"""One virtual host: its exchanges, queues and bindings, and routing with a result cache (pure).

`route(exchange, routing_key, headers)` walks exchange-to-exchange bindings breadth-first, each exchange at most once
(cycle-safe), follows an exchange's alternate-exchange when that exchange alone routed nowhere (its own
`alternate-exchange` argument, else the one of the policy that applies to it), and returns each queue name at most
once, in a stable order. Results for walks that met no header-dependent exchange (headers, x-federation-upstream:
`HEADER_ROUTED`) are cached per (exchange, routing key);
any change to exchanges, bindings, queues or policies clears the cache. The cache is bounded. The vhost also holds
its policies (`policies`, by name; node/broker/policies.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from node.broker.exchanges import FEDERATION_UPSTREAM, Binding, Dest, Exchange
from node.broker.policies import Policy, effective_alternate_exchange, match_policy

ROUTE_CACHE_ENTRIES_MAX = 8192
PREDECLARED = (
    ("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"), ("amq.headers", "headers"),
    ("amq.match", "headers"), ("amq.rabbitmq.trace", "topic"),
)
PREDECLARED_INTERNAL = frozenset({"amq.rabbitmq.trace"})  # Firehose's (node/broker/trace.py): clients cannot publish
HEADER_ROUTED = frozenset({"headers", FEDERATION_UPSTREAM})  # their route depends on the message headers: never cached

Q = TypeVar("Q")


@dataclass(slots=True)
class VHost(Generic[Q]):
    name: str
    exchanges: dict[str, Exchange] = field(default_factory=dict)
    queues: dict[str, Q] = field(default_factory=dict)
    policies: dict[str, Policy] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)  # max-connections, max-queues (node/broker/vhost_limits.py)
    _route_cache: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    _policy_alternates: dict[str, str | None] = field(default_factory=dict)  # exchange -> AE from its policy

    @classmethod
    def create(cls, name: str) -> VHost[Q]:
        vhost: VHost[Q] = cls(name)
        for ex_name, ex_type in PREDECLARED:
            vhost.exchanges[ex_name] = Exchange(ex_name, ex_type, durable=True, internal=ex_name in PREDECLARED_INTERNAL)
        return vhost

    def invalidate(self) -> None:
        self._route_cache.clear()
        self._policy_alternates.clear()

    def policy_for(self, kind: str, name: str, queue_type: str = "classic") -> Policy | None:
        """The policy that applies to the queue or exchange `name` (kind "queue" | "exchange"), if any."""
        if not self.policies:
            return None
        return match_policy(self.policies.values(), kind, name, queue_type)

    def alternate_of(self, exchange: Exchange) -> str | None:
        """The exchange's alternate exchange: its argument, else its policy's (memoised until `invalidate`)."""
        own = exchange.alternate_exchange
        if own is not None or not self.policies:
            return own
        name = exchange.name
        if name not in self._policy_alternates:
            self._policy_alternates[name] = effective_alternate_exchange(
                exchange.arguments, self.policy_for("exchange", name))
        return self._policy_alternates[name]

    def add_binding(self, binding: Binding) -> bool:
        added = self.exchanges[binding.source].add_binding(binding)
        if added:
            self._route_cache.clear()
        return added

    def remove_binding(self, binding: Binding) -> bool:
        exchange = self.exchanges.get(binding.source)
        removed = exchange is not None and exchange.remove_binding(binding)
        if removed:
            self._route_cache.clear()
        return removed

    def bindings_to(self, dest: Dest) -> list[Binding]:
        out: list[Binding] = []
        for exchange in self.exchanges.values():
            out.extend(exchange.bindings_to(dest))
        return out

    def route(self, exchange_name: str, routing_key: str, headers: Mapping[str, Any] | None) -> tuple[str, ...]:
        cache_key = (exchange_name, routing_key)
        cached = self._route_cache.get(cache_key)
        if cached is not None:
            return cached
        if exchange_name == "":
            return (routing_key,) if routing_key in self.queues else ()
        queues, cacheable = self._walk(exchange_name, routing_key, headers)
        result = tuple(queues)
        if cacheable:
            if len(self._route_cache) >= ROUTE_CACHE_ENTRIES_MAX:
                self._route_cache.clear()
            self._route_cache[cache_key] = result
        return result

    def _walk(self, start: str, routing_key: str, headers: Mapping[str, Any] | None) -> tuple[dict[str, None], bool]:
        queues: dict[str, None] = {}
        seen = {start}
        work = [start]
        cacheable = True
        while work:
            exchange = self.exchanges.get(work.pop(0))
            if exchange is None:
                continue
            if exchange.type in HEADER_ROUTED:
                cacheable = False
            dests = exchange.route(routing_key, headers)
            routed_any = False
            for dest in sorted(dests):
                routed_any = True
                if dest.kind == "queue":
                    if dest.name in self.queues:
                        queues[dest.name] = None
                elif dest.name not in seen:
                    seen.add(dest.name)
                    work.append(dest.name)
            alternate = self.alternate_of(exchange)
            if not routed_any and alternate is not None and alternate not in seen:
                seen.add(alternate)
                work.append(alternate)
        return queues, cacheable
