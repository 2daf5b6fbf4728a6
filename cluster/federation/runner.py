"""ExchangeLinkRunner: runs one exchange federation link's `ExchangeLink` (cluster/federation/link.py) over two
link connections (trio): the upstream (a URI of the upstream's list) and this node (the downstream).

How it works: `run()` asks the machine what to do. On `Connect(i)` it opens upstream URI i and the local node,
sets up the topology, tells the machine `connected(upstream cluster name)` and then feeds it, in batches, what the
two connections and the manager report: upstream deliveries -> `delivery`, local Basic.Ack/Nack -> `confirm`, the
downstream exchange's bindings (pushed by the manager through `set_bindings`) -> `bindings`, a closed channel or
connection or a cancelled consumer -> `down`. Effects are carried out in order (publish locally, ack/nack
upstream, exchange.bind/unbind upstream with nowait: a failure closes the channel, which is a `down`), and both
connections are flushed once per batch.

Upstream topology, as RabbitMQ's plugin makes it (rabbit_federation_exchange_link): the upstream exchange is
declared passively (declared durable with the downstream exchange's type when it is missing); a durable queue named
`federation: <upstream X> -> <downstream cluster>[:<downstream X>]` (with `x-expires` / `x-message-ttl` from the
upstream's `expires` / `message-ttl`); and an internal, durable, auto-delete exchange `<queue name> A` or `... B`,
the queue bound to it, and it bound to the upstream exchange (exchange.bind) with each (routing key, arguments +
`x-bound-from`) of the downstream exchange's bindings. Each connect builds the other suffix than the one that
exists (probed passively), binds it fully, then deletes the old one, so bindings removed while the link was down
do not survive a reconnect and nothing routes nowhere in between. The internal exchange is declared `fanout`
(`INTERNAL_EXCHANGE_TYPE`), RabbitMQ's fallback when the upstream lacks the `x-federation-upstream` type: loop
safety is the link's own check on `x-received-from` (cluster/federation/link.py). The queue is kept when the link
stops (a restart or a move loses nothing buffered in it); the queue and the internal exchanges are deleted when
the link is removed by policy (`cleanup`, best effort), unless `resource-cleanup-mode` is `never`. Earlier raftmq
versions bound the upstream queue directly to the upstream exchange with the downstream's bindings: each connect
unbinds the queue from it for every binding the downstream has now (queue.unbind is idempotent; the Unbind-Oks are
not waited for).
While a session runs, the internal exchange is checked every `INTERNAL_EXCHANGE_CHECK_S` (a passive
exchange.declare on a channel of its own, as RabbitMQ's link does): when it is gone upstream (deleted by someone,
or auto-deleted), the server closes that channel with 404, and the link goes down and reconnects, which declares
it and its bindings again (without the check, nothing would be routed to the upstream queue until the link
reconnected for another reason).
`QueueLinkRunner` (queue_runner.py) reuses all this through the methods it overrides (`_setup_upstream`,
`_after_connect`, `_carry_out`, `_event`, `_delivery`, `_idle_input`, `cleanup`, `connection_name`).
"""

from __future__ import annotations

import logging
import math
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any

import trio

from cluster.federation.link import (
    TERMINATED,
    Ack,
    Bind,
    BindingKey,
    Connect,
    Disconnect,
    Effect,
    ExchangeLink,
    Nack,
    Publish,
    Unbind,
    internal_exchange_name,
    thaw_args,
)
from cluster.federation.params import Upstream
from cluster.link.client import LinkClosed, LinkConnection, open_link, wall_ms
from cluster.link.uri import AmqpUri, resolve_local
from node.amqp import methods as m
from node.amqp.client import ChannelClosed, Closed, ContentIn, MethodIn

log = logging.getLogger("raftmq.federation")
BATCH_MAX = 1000
# x-federation-upstream would filter by hops upstream already, but raftmq's route cache (node/broker/vhost.py) keys
# on (exchange, routing key) only, so a header-dependent result must not be cached: fanout until that is fixed.
INTERNAL_EXCHANGE_TYPE = "fanout"
INTERNAL_EXCHANGE_CHECK_S = 3.0  # RabbitMQ: internal_exchange_check_interval, 90 s


@dataclass(frozen=True, slots=True)
class _DeleteExchange:
    """The runner's own effect: delete an upstream exchange (the previous internal exchange), nowait."""
    name: str


class _Down(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ExchangeLinkRunner:
    def __init__(self, upstream: Upstream, vhost: str, exchange: str, exchange_type: str, cluster_name: str,
                 local: AmqpUri | None, bindings: set[BindingKey]) -> None:
        self.link = ExchangeLink(upstream, vhost, exchange, cluster_name)
        self.upstream = upstream
        self.exchange_type = exchange_type
        self.local = local
        self.link.bindings(bindings)
        self._send, self._receive = trio.open_memory_channel[tuple[str, Any]](math.inf)
        self._session_no = 0
        self._probe_ch: int | None = None  # the upstream channel of the internal exchange check (this session's)

    def set_bindings(self, wanted: set[BindingKey]) -> None:
        """The downstream exchange's bindings now (called by the manager; cheap when nothing changed)."""
        self._send.send_nowait(("bindings", frozenset(wanted)))

    def _uri(self, uri: AmqpUri) -> AmqpUri:
        return resolve_local(uri, self.local)

    async def run(self) -> None:
        effects = self.link.start(wall_ms())
        while True:
            connect = next((e for e in effects if isinstance(e, Connect)), None)
            if self.link.state == TERMINATED:
                return
            if connect is None:
                wait_ms = (self.link.reconnect_at_ms or wall_ms() + 1000) - wall_ms()
                with trio.move_on_after(max(0.0, wait_ms / 1000)):
                    while True:  # keep the machine's inputs (bindings, demand) current while waiting
                        side, value = await self._receive.receive()
                        self._idle_input(side, value)
                effects = self.link.tick(wall_ms())
                continue
            effects = await self._session(connect)

    def _idle_input(self, side: str, value: Any) -> None:
        """An input from the manager while no session runs."""
        if side == "bindings":
            self.link.bindings(set(value))

    @property
    def connection_name(self) -> str:
        return f"Federation link (upstream: {self.upstream.name}, exchange: {self.link.exchange})"

    async def _session(self, connect: Connect) -> list[Effect]:
        link = self.link
        name = self.connection_name
        assert self.local is not None
        local_uri = replace(self.local, vhost=link.vhost)
        async with AsyncExitStack() as stack:
            try:
                up = await stack.enter_async_context(open_link(self._uri(self.upstream.uri(connect.uri_index)), name))
                down = await stack.enter_async_context(open_link(local_uri, name))
                with trio.fail_after(30):
                    down_ch = await down.channel()
                    if self.upstream.ack_mode == "on-confirm":
                        await down.call(down_ch, m.ConfirmSelect(), m.ConfirmSelectOk)
                    self._probe_ch = None
                    up_ch = await self._setup_upstream(up)
            except (OSError, trio.TooSlowError, LinkClosed) as exc:
                return link.connect_failed(_describe(exc), wall_ms())
            cluster = up.server_properties.get("cluster_name")
            if isinstance(cluster, bytes):
                cluster = cluster.decode("utf-8", "replace")
            if not isinstance(cluster, str) or not cluster:
                uri = self.upstream.uri(connect.uri_index)
                cluster = f"{uri.host}:{uri.port}"
            log.info("federation link %s/%s <- %s running", link.vhost, link.exchange, self.upstream.name)
            effects: list[Any] = list(link.connected(wall_ms(), cluster))
            effects += self._after_connect()
            return await self._pump(up, up_ch, down, down_ch, effects)
        return []

    async def _setup_upstream(self, up: LinkConnection) -> int:
        link, u = self.link, self.upstream
        ch = await up.channel()
        try:
            await up.call(ch, m.ExchangeDeclare(exchange=link.upstream_exchange, passive=True), m.ExchangeDeclareOk)
        except LinkClosed as exc:
            if exc.code != 404:
                raise
            ch = await up.channel()
            await up.call(ch, m.ExchangeDeclare(exchange=link.upstream_exchange, type=self.exchange_type,
                                                durable=True), m.ExchangeDeclareOk)
        args: dict[str, Any] = {}
        if u.expires is not None:
            args["x-expires"] = u.expires
        if u.message_ttl is not None:
            args["x-message-ttl"] = u.message_ttl
        await up.call(ch, m.QueueDeclare(queue=link.queue_name, durable=True, arguments=args), m.QueueDeclareOk)
        for key, arguments in sorted(link.wanted, key=repr):  # earlier raftmq versions bound the queue directly
            up.conn.send_method(ch, m.QueueUnbind(queue=link.queue_name, exchange=link.upstream_exchange,
                                                  routing_key=key, arguments=thaw_args(arguments)), wall_ms())
        ch = await self._internal_exchange(up, ch)
        if u.ack_mode != "no-ack" and u.prefetch_count:
            await up.call(ch, m.BasicQos(prefetch_count=u.prefetch_count), m.BasicQosOk)
        await up.call(ch, m.BasicConsume(queue=link.queue_name, consumer_tag="raftmq-federation",
                                         no_ack=u.ack_mode == "no-ack"), m.BasicConsumeOk)
        self._probe_ch = await up.channel()
        return ch

    async def _internal_exchange(self, up: LinkConnection, ch: int) -> int:
        """Declare this connect's internal exchange (the suffix that does not exist now) and bind the queue to it;
        the old one is deleted after the bindings (`_after_connect`). Returns the channel to go on with."""
        link = self.link
        probe = await up.channel()
        try:
            await up.call(probe, m.ExchangeDeclare(exchange=internal_exchange_name(link.queue_name, "A"),
                                                   passive=True), m.ExchangeDeclareOk)
            link.suffix = "B"
        except LinkClosed as exc:
            if exc.code != 404:
                raise
            link.suffix = "A"
        name = link.internal_exchange
        await up.call(ch, m.ExchangeDelete(exchange=name), m.ExchangeDeleteOk)  # a leftover of an interrupted switch
        await up.call(ch, m.ExchangeDeclare(exchange=name, type=INTERNAL_EXCHANGE_TYPE, durable=True,
                                            auto_delete=True, internal=True), m.ExchangeDeclareOk)
        await up.call(ch, m.QueueBind(queue=link.queue_name, exchange=name), m.QueueBindOk)
        return ch

    def _after_connect(self) -> list[Any]:
        """After the bindings of a connect: delete the previous internal exchange."""
        old = internal_exchange_name(self.link.queue_name, "A" if self.link.suffix == "B" else "B")
        return [_DeleteExchange(old)]

    async def _pump(self, up: LinkConnection, up_ch: int, down: LinkConnection, down_ch: int,
                    effects: list[Effect]) -> list[Effect]:
        self._session_no += 1
        send = self._send.clone()
        for side, conn in (("up", up), ("down", down)):
            conn.route_events(send, f"{side}:{self._session_no}", keep=lambda event: not isinstance(event, ChannelClosed))
        next_check = trio.current_time() + INTERNAL_EXCHANGE_CHECK_S
        try:
            while True:
                self._carry_out(up, up_ch, down, down_ch, effects)
                await up.flush()
                await down.flush()
                batch: list[tuple[str, Any]] = []
                with trio.move_on_at(next_check):
                    batch.append(await self._receive.receive())
                if trio.current_time() >= next_check:
                    next_check = trio.current_time() + INTERNAL_EXCHANGE_CHECK_S
                    self._check_internal_exchange(up)
                    await up.flush()
                while len(batch) < BATCH_MAX:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                effects = []
                for side, event in batch:
                    effects += self._event(side, event, up_ch, down_ch)
        except (_Down, LinkClosed) as exc:
            reason = exc.reason if isinstance(exc, _Down) else exc.text
            return [e for e in self.link.down(reason, wall_ms()) if not isinstance(e, Disconnect)]

    def _check_internal_exchange(self, up: LinkConnection) -> None:
        """A passive declare of the internal exchange on the probe channel (sent by the next flush): Declare-Ok is
        ignored, a 404 closes the probe channel, which `_event` turns into a `down`."""
        if self._probe_ch is not None:
            up.conn.send_method(self._probe_ch, m.ExchangeDeclare(exchange=self.link.internal_exchange, passive=True),
                                wall_ms())

    def _carry_out(self, up: LinkConnection, up_ch: int, down: LinkConnection, down_ch: int,
                   effects: list[Any]) -> None:
        internal, exchange = self.link.internal_exchange, self.link.upstream_exchange
        for effect in effects:
            if isinstance(effect, Publish):
                down.publish(down_ch, self.link.publish_exchange, effect.routing_key, effect.properties, effect.body)
            elif isinstance(effect, Ack):
                up.ack(up_ch, effect.tag, effect.multiple)
            elif isinstance(effect, Nack):
                up.nack(up_ch, effect.tag, requeue=True)
            elif isinstance(effect, Bind):
                up.conn.send_method(up_ch, m.ExchangeBind(destination=internal, source=exchange,
                                                          routing_key=effect.routing_key, nowait=True,
                                                          arguments=thaw_args(effect.arguments)), wall_ms())
            elif isinstance(effect, Unbind):
                up.conn.send_method(up_ch, m.ExchangeUnbind(destination=internal, source=exchange,
                                                            routing_key=effect.routing_key, nowait=True,
                                                            arguments=thaw_args(effect.arguments)), wall_ms())
            elif isinstance(effect, _DeleteExchange):
                up.conn.send_method(up_ch, m.ExchangeDelete(exchange=effect.name, nowait=True), wall_ms())

    def _event(self, side: str, event: Any, up_ch: int, down_ch: int) -> list[Effect]:
        if side == "bindings":
            return self.link.bindings(set(event))
        if side not in (f"up:{self._session_no}", f"down:{self._session_no}"):
            return []  # an event of an earlier session's connections
        side = side.split(":")[0]
        if isinstance(event, ContentIn):
            deliver = event.method
            if side == "up" and isinstance(deliver, m.BasicDeliver):
                return self._delivery(deliver, event)
            return []
        if isinstance(event, MethodIn):
            method = event.method
            if side == "down" and isinstance(method, m.BasicAck):
                return self.link.confirm(method.delivery_tag, method.multiple, True)
            if side == "down" and isinstance(method, m.BasicNack):
                return self.link.confirm(method.delivery_tag, method.multiple, False)
            if side == "up" and isinstance(method, m.BasicCancel):
                raise _Down("upstream: the consumer was cancelled (queue deleted?)")
            return []
        if isinstance(event, ChannelClosed) and side == "up" and event.channel == self._probe_ch:
            raise _Down(f"upstream: internal exchange {self.link.internal_exchange!r} is gone: "
                        f"{event.reply_code} {event.reply_text}")
        if isinstance(event, ChannelClosed) and event.channel == (up_ch if side == "up" else down_ch):
            where = "upstream" if side == "up" else "downstream"
            raise _Down(f"{where}: channel closed: {event.reply_code} {event.reply_text}")
        if isinstance(event, Closed):
            where = "upstream" if side == "up" else "downstream"
            raise _Down(f"{where}: connection closed: {event.reply_code} {event.reply_text}")
        return []

    def _delivery(self, deliver: m.BasicDeliver, event: ContentIn) -> list[Effect]:
        return self.link.delivery(deliver.delivery_tag, deliver.routing_key, event.properties, event.body,
                                  deliver.redelivered)

    async def cleanup(self) -> None:
        """The link was removed by policy: delete its upstream queue and internal exchanges (best effort), unless
        cleanup is `never`."""
        if self.upstream.resource_cleanup_mode == "never":
            return
        with trio.move_on_after(10):
            try:
                async with open_link(self._uri(self.upstream.uri(self.link.uri_index)), "federation cleanup") as up:
                    ch = await up.channel()
                    await up.call(ch, m.QueueDelete(queue=self.link.queue_name), m.QueueDeleteOk)
                    for suffix in ("A", "B"):
                        await up.call(ch, m.ExchangeDelete(exchange=internal_exchange_name(self.link.queue_name,
                                                                                          suffix)),
                                      m.ExchangeDeleteOk)
            except (OSError, trio.TooSlowError, LinkClosed) as exc:
                log.warning("federation: could not delete upstream queue %r: %s", self.link.queue_name, exc)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "timed out"
    if isinstance(exc, LinkClosed):
        return f"{exc.code} {exc.text}"
    return f"{type(exc).__name__}: {exc}"
