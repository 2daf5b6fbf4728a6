"""QueueLink: the pure state machine of one queue federation link (one downstream queue x one upstream).

Pure, and built on `ExchangeLink` (cluster/federation/link.py): the same states (`starting`/`running`/
`terminated`), connect/retry timer, ack modes and confirms -> upstream acks. What differs (RabbitMQ's
rabbit_federation_queue_link):
- the upstream queue is the upstream's `queue` key (default: the local queue's name); nothing is bound upstream;
- the link consumes from it only while the local queue has demand: `demand(consumers, ready)` says how many
  consumers the local queue has and how many messages are ready in it; with at least one consumer and no ready
  message the machine answers `Consume` (the runner sends basic.consume with `x-priority: -1` and the upstream's
  `consumer-tag`, default `federation-link-<upstream>`), otherwise `Cancel` (basic.cancel); deliveries already on
  the way are still forwarded and acked;
- a delivery is republished to the default exchange with the local queue's name as routing key; the first hop
  sets `x-original-exchange` / `x-original-routing-key`, and an entry {uri (no password), queue, redelivered,
  cluster-name} is prepended to `x-received-from`. Queue federation has no hop limit and no loop check (as in
  RabbitMQ: messages may move back and forth between queues that federate each other, following the consumers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster.federation.link import RUNNING, Effect, ExchangeLink, link_id
from cluster.federation.params import Upstream
from node.amqp.properties import BasicProperties


@dataclass(frozen=True, slots=True)
class Consume:
    """Start consuming from the upstream queue (basic.consume, x-priority -1)."""


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop consuming from the upstream queue (basic.cancel); unacked deliveries are still settled."""


QueueEffect = Effect | Consume | Cancel


class QueueLink(ExchangeLink):
    def __init__(self, upstream: Upstream, vhost: str, queue: str, cluster_name: str) -> None:
        super().__init__(upstream, vhost, queue, cluster_name)  # `exchange` holds the local queue's name
        self.consuming = False
        self.consumers = 0
        self.ready = 0
        self.pauses = 0

    @property
    def queue(self) -> str:
        return self.exchange

    @property
    def queue_name(self) -> str:
        """The upstream queue."""
        return self.upstream.queue or self.queue

    @property
    def consumer_tag(self) -> str:
        return self.upstream.consumer_tag or f"federation-link-{self.upstream.name}"

    @property
    def publish_exchange(self) -> str:
        return ""

    def wants_messages(self) -> bool:
        return self.consumers > 0 and self.ready == 0

    def connected(self, now_ms: int, upstream_cluster: str) -> list[Any]:
        effects: list[Any] = list(super().connected(now_ms, upstream_cluster))
        self.consuming = False
        return effects + self._follow_demand()

    def down(self, reason: str, now_ms: int) -> list[Effect]:
        self.consuming = False
        return super().down(reason, now_ms)

    def connect_failed(self, reason: str, now_ms: int) -> list[Effect]:
        self.consuming = False
        return super().connect_failed(reason, now_ms)

    def demand(self, consumers: int, ready: int) -> list[QueueEffect]:
        """The local queue's consumer count and ready count now (the runner polls them)."""
        self.consumers, self.ready = consumers, ready
        return self._follow_demand() if self.state == RUNNING else []

    def _follow_demand(self) -> list[QueueEffect]:
        if self.wants_messages() and not self.consuming:
            self.consuming = True
            return [Consume()]
        if not self.wants_messages() and self.consuming:
            self.consuming = False
            self.pauses += 1
            return [Cancel()]
        return []

    def delivery(self, tag: int, routing_key: str, properties: BasicProperties, body: bytes,
                 redelivered: bool, exchange: str = "") -> list[Effect]:
        if self.state != RUNNING:
            return []
        headers = dict(properties.headers or {})
        received = headers.get("x-received-from")
        hops = list(received) if isinstance(received, list) else []
        if not hops:  # the first hop: where the message was published upstream
            headers.setdefault("x-original-exchange", exchange)
            headers.setdefault("x-original-routing-key", routing_key)
        entry = {"uri": self._uri_text, "queue": self.queue_name, "redelivered": redelivered,
                 "cluster-name": self.upstream_cluster}
        headers["x-received-from"] = [entry, *hops]
        return self._forward(tag, self.queue, properties, headers, body)

    def status(self) -> dict[str, Any]:
        row = super().status()
        for key in ("exchange", "upstream_exchange", "bindings", "dropped"):
            row.pop(key, None)
        row.update({"type": "queue", "queue": self.queue, "upstream_queue": self.queue_name,
                    "consumer_tag": self.consumer_tag, "id": link_id(self.vhost, self.queue, self.upstream.name,
                                                                     "queue"),
                    "consuming": self.consuming, "local_consumers": self.consumers, "local_ready": self.ready,
                    "pauses": self.pauses})
        return row
