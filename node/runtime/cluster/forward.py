"""Forwarding publishes to node-local exclusive queues of other nodes (cluster mode, trio).

What it is for: an exclusive queue lives on its owner connection's node (node/broker/backend_owned.py). A publish
routed to it on another node comes out of the broker as a `ForwardPublish` effect; `Forwarder.submit` queues it
for a link to the owner's node, and the owner's answer (publisher confirm or nack) goes back to the broker as
`Broker.forward_outcome`, which releases the client's confirm through the same path as a Raft queue's outcome.

How it works: one link per (peer node, vhost), opened on first use with the link client (cluster/link/client.py)
to the peer's AMQP port, logged in with the nodes' internal login derived from the cluster secret (cluster/authlink/
amqp_login.py: no user of the user table is needed), with one channel in confirm mode. Publishes go to the default
exchange with the queue's name as routing key and the original exchange and routing key in a header (node/broker/
publish.py `forwarded_publish`: the owner's node enqueues into its local queue only, delivers with the original
exchange and routing key, and confirms at once; a queue gone meanwhile is unroutable, which RabbitMQ confirms too).
Dead letters of a queue led here whose DLX routes to such a queue are forwarded the same way (at least once: the
source holds them until the owner's confirm, node/broker/replica_dead_letters.py). In submission order, at most
`INFLIGHT_MAX` unconfirmed per link. A link that fails (peer down, refused, closed) nacks what it had in flight and
what waited for it; the next publish opens a new link (publishes in the `RETRY_AFTER_S` after a failure are nacked
at once). The broker counts forwarded publishes as in flight for
credit flow, so a publisher far ahead of a slow link is paused like one ahead of a Raft queue.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from typing import Any

import trio

from cluster.authlink.amqp_login import internal_login
from cluster.link.client import LinkClosed, open_link
from cluster.link.uri import AmqpUri
from node.amqp import methods as m
from node.amqp.client import ChannelClosed, Closed, MethodIn
from node.amqp.properties import BasicProperties
from node.broker.effects import ForwardPublish
from node.broker.publish import FORWARD_HEADER

log = logging.getLogger("raftmq.cluster.forward")

INFLIGHT_MAX = 1024  # unconfirmed forwarded publishes per link
QUEUED_MAX = 65_536  # publishes waiting for a link; beyond this they are nacked at once
CONNECT_TIMEOUT_MS = 3000
IDLE_CLOSE_S = 60.0  # a link without publishes for this long closes
RETRY_AFTER_S = 0.5  # after a failed link, publishes are nacked at once for this long (no connect storm)


def with_origin(publish: ForwardPublish) -> BasicProperties:
    """The properties with FORWARD_HEADER added: the owner's node delivers with the original exchange and routing
    key, and removes the header (node/broker/publish.py `forwarded_publish`)."""
    props: BasicProperties = publish.properties
    headers = dict(props.headers or {})
    headers[FORWARD_HEADER] = [publish.queue, publish.exchange, publish.routing_key, props.headers is not None]
    return dataclasses.replace(props, headers=headers)


class _Link:
    """The link to one (node, vhost): its waiting publishes and those sent but not confirmed yet."""

    def __init__(self, node: str, vhost: str) -> None:
        self.node = node
        self.vhost = vhost
        self.waiting: deque[ForwardPublish] = deque()
        self.inflight: dict[int, ForwardPublish] = {}  # confirm sequence -> publish
        self.wake = trio.Event()
        self.room = trio.Event()
        self.running = False
        self.retry_at = 0.0  # after a failure: publishes before this trio time are nacked without a new connect
        self.failures = 0  # failures in a row (logged once per streak)


class Forwarder:
    """The cluster runtime's forwarding of publishes to exclusive queues owned on other nodes."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.links: dict[tuple[str, str], _Link] = {}
        self.nursery: trio.Nursery | None = None
        self.stats = {"forwarded": 0, "acked": 0, "nacked": 0, "links_opened": 0, "link_failures": 0}

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def submit(self, effect: ForwardPublish) -> None:
        """A `ForwardPublish` effect (called inside the node's dispatch: never blocks)."""
        key = (effect.node, effect.vhost)
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = _Link(effect.node, effect.vhost)
        if len(link.waiting) >= QUEUED_MAX or self.nursery is None or trio.current_time() < link.retry_at:
            self._answer([effect], acked=False, inside_dispatch=True)
            return
        link.waiting.append(effect)
        link.wake.set()
        if not link.running:
            link.running = True
            self.nursery.start_soon(self._serve, link)

    # ------------------------------------------------------------------------------------------ internals

    def _uri(self, node: str, vhost: str) -> AmqpUri | None:
        member = next((p for p in self.cluster.layout.members if p.name == node), None)
        if member is None:
            return None
        host = member.host if member.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        username, password = internal_login(self.cluster.layout.secret)
        return AmqpUri(host=host, port=member.amqp_port, username=username, password=password, vhost=vhost,
                       connection_timeout_ms=CONNECT_TIMEOUT_MS)

    def _answer(self, publishes: list[ForwardPublish], acked: bool, inside_dispatch: bool = False) -> None:
        if not publishes:
            return
        self.stats["acked" if acked else "nacked"] += len(publishes)
        broker = self.cluster.broker
        for publish in publishes:
            effects = broker.forward_outcome(publish.vhost, publish.queue, publish.publisher_id, publish.sequence,
                                             acked)
            if inside_dispatch:
                self.cluster.node.apply_effects(effects)
            else:
                self.cluster.dispatch(effects)

    async def _serve(self, link: _Link) -> None:
        """Open the link, send until it fails or stays idle; a failure nacks what it could not deliver."""
        failed = False
        try:
            uri = self._uri(link.node, link.vhost)
            if uri is None:
                raise LinkClosed(404, f"no cluster member {link.node}")
            async with open_link(uri, connection_name=f"raftmq forward {self.cluster.name} -> {link.node}") as conn:
                self.stats["links_opened"] += 1
                if link.failures:
                    log.info("cluster: forwarding link to %s (vhost %s) open again", link.node, link.vhost)
                link.failures = 0
                channel = await conn.channel()
                await conn.call(channel, m.ConfirmSelect(nowait=False), m.ConfirmSelectOk)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._confirms, conn, link)
                    await self._send(conn, channel, link)
                    nursery.cancel_scope.cancel()
        except* (OSError, LinkClosed, trio.TooSlowError, trio.BrokenResourceError) as group:
            failed = True
            self.stats["link_failures"] += 1
            link.failures += 1
            link.retry_at = trio.current_time() + RETRY_AFTER_S
            if link.failures == 1:
                log.warning("cluster: forwarding link to %s (vhost %s) failed: %s (publishes to its exclusive "
                            "queues are nacked while it fails)", link.node, link.vhost, group.exceptions[0])
        finally:
            link.running = False
            if failed or link.inflight:
                lost = list(link.inflight.values()) + list(link.waiting)
                link.inflight.clear()
                link.waiting.clear()
                self._answer(lost, acked=False)
            elif link.waiting and self.nursery is not None:  # (submitted while the idle link was closing)
                link.running = True
                self.nursery.start_soon(self._serve, link)

    async def _send(self, conn: Any, channel: int, link: _Link) -> None:
        idle_since = trio.current_time()
        while True:
            if not link.waiting:
                link.wake = trio.Event()
                with trio.move_on_after(IDLE_CLOSE_S):
                    await link.wake.wait()
                if not link.waiting:
                    if link.inflight:
                        idle_since = trio.current_time()
                    elif trio.current_time() - idle_since >= IDLE_CLOSE_S:
                        return  # an idle link closes (the next publish opens a new one)
                    continue
            while link.waiting and len(link.inflight) < INFLIGHT_MAX:
                publish = link.waiting.popleft()
                seq = conn.publish(channel, "", publish.queue, with_origin(publish), publish.body)
                link.inflight[seq] = publish
                self.stats["forwarded"] += 1
            await conn.flush()
            idle_since = trio.current_time()
            if len(link.inflight) >= INFLIGHT_MAX:
                link.room = trio.Event()
                await link.room.wait()

    async def _confirms(self, conn: Any, link: _Link) -> None:
        async for event in conn.events:
            if isinstance(event, MethodIn) and isinstance(event.method, m.BasicAck | m.BasicNack):
                method = event.method
                tag = method.delivery_tag
                tags = [t for t in link.inflight if t <= tag] if method.multiple else [tag]
                done = [link.inflight.pop(t) for t in tags if t in link.inflight]
                self._answer(done, acked=isinstance(method, m.BasicAck))
                link.room.set()
            elif isinstance(event, ChannelClosed | Closed):
                raise LinkClosed(event.reply_code, event.reply_text)
        raise LinkClosed(320, "connection ended")
