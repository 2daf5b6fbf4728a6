"""QueueLinkRunner: runs one queue federation link's `QueueLink` (cluster/federation/queue_link.py), on the
exchange runner's machinery (cluster/federation/runner.py: two link connections, batches, confirms -> acks,
reconnects).

How it works: besides what the exchange runner does, a poller task reads the local queue's consumer count and
ready count every `DEMAND_POLL_S` (sent on only when they changed) through `demand(vhost, queue)` (the node's management view: every replica of a
quorum queue knows both) and feeds them to the machine as `demand` inputs; the machine answers `Consume` (sent as
basic.consume with `x-priority: -1` and the link's consumer tag, not waited for) or `Cancel` (basic.cancel).
Upstream topology: the upstream queue is declared passively, and declared durable (no arguments) if missing;
`basic.qos` with the upstream's `prefetch-count`. Forwarded messages are published to this node's default
exchange with the local queue's name as routing key. Nothing is deleted upstream when the link is removed (the
upstream queue is a user queue, not one the link made).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from cluster.federation.params import Upstream
from cluster.federation.queue_link import Cancel, Consume, QueueLink
from cluster.federation.runner import ExchangeLinkRunner
from cluster.link.client import LinkClosed, LinkConnection, wall_ms
from cluster.link.uri import AmqpUri
from node.amqp import methods as m
from node.amqp.client import ContentIn

DEMAND_POLL_S = 0.02
Demand = Callable[[str, str], "tuple[int, int] | None"]  # (vhost, queue) -> (consumers, ready); None: no queue


class QueueLinkRunner(ExchangeLinkRunner):
    link: QueueLink

    def __init__(self, upstream: Upstream, vhost: str, queue: str, cluster_name: str, local: AmqpUri | None,
                 demand: Demand) -> None:
        super().__init__(upstream, vhost, queue, "", cluster_name, local, set())
        self.link = QueueLink(upstream, vhost, queue, cluster_name)
        self._demand = demand

    @property
    def connection_name(self) -> str:
        return f"Federation link (upstream: {self.upstream.name}, queue: {self.link.queue})"

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._poll_demand)
            await super().run()
            nursery.cancel_scope.cancel()

    async def _poll_demand(self) -> None:
        last: tuple[int, int] | None = None
        while True:
            counts = self._demand(self.link.vhost, self.link.queue) or (0, 0)
            if counts != last:  # (the counts are cheap to read; the pump only wakes on a change)
                self._send.send_nowait(("demand", counts))
                last = counts
            await trio.sleep(DEMAND_POLL_S)

    def _idle_input(self, side: str, value: Any) -> None:
        if side == "demand":
            self.link.demand(*value)

    async def _setup_upstream(self, up: LinkConnection) -> int:
        link, u = self.link, self.upstream
        ch = await up.channel()
        try:
            await up.call(ch, m.QueueDeclare(queue=link.queue_name, passive=True), m.QueueDeclareOk)
        except LinkClosed as exc:
            if exc.code != 404:
                raise
            ch = await up.channel()
            await up.call(ch, m.QueueDeclare(queue=link.queue_name, durable=True), m.QueueDeclareOk)
        if u.ack_mode != "no-ack" and u.prefetch_count:
            await up.call(ch, m.BasicQos(prefetch_count=u.prefetch_count), m.BasicQosOk)
        return ch

    def _after_connect(self) -> list[Any]:
        return []  # no internal exchange upstream

    def _carry_out(self, up: LinkConnection, up_ch: int, down: LinkConnection, down_ch: int,
                   effects: list[Any]) -> None:
        rest: list[Any] = []
        for effect in effects:
            if isinstance(effect, Consume):
                super()._carry_out(up, up_ch, down, down_ch, rest)
                rest = []
                up.conn.send_method(up_ch, m.BasicConsume(
                    queue=self.link.queue_name, consumer_tag=self.link.consumer_tag,
                    no_ack=self.upstream.ack_mode == "no-ack", arguments={"x-priority": -1}), wall_ms())
            elif isinstance(effect, Cancel):
                super()._carry_out(up, up_ch, down, down_ch, rest)
                rest = []
                up.conn.send_method(up_ch, m.BasicCancel(consumer_tag=self.link.consumer_tag), wall_ms())
            else:
                rest.append(effect)
        super()._carry_out(up, up_ch, down, down_ch, rest)

    def _event(self, side: str, event: Any, up_ch: int, down_ch: int) -> list[Any]:
        if side == "demand":
            return list(self.link.demand(*event))
        return super()._event(side, event, up_ch, down_ch)

    def _delivery(self, deliver: m.BasicDeliver, event: ContentIn) -> list[Any]:
        return self.link.delivery(deliver.delivery_tag, deliver.routing_key, event.properties, event.body,
                                  deliver.redelivered, deliver.exchange)

    async def cleanup(self) -> None:
        """Nothing to delete upstream: the upstream queue belongs to the upstream's users."""
