"""ShovelRunner: runs one shovel's `ShovelLink` (cluster/shovel/link.py) over two link connections (trio).

How it works: `run()` asks the machine what to do. On `Connect(i, j)` it opens the source URI i and the
destination URI j (cluster/link/client.py), sets up the topology, tells the machine `connected(queue_length)` and
then feeds it, in batches, what both connections report: source deliveries -> `delivery`, destination
Basic.Ack/Nack -> `confirm`, a closed channel or connection, or a consumer cancelled by the source broker ->
`down`. The machine's effects are carried out in order (publish, ack, nack at the source, cancel), and both
connections are flushed once per batch, so a burst of deliveries goes out as few TCP writes. A `Disconnect`
leaves the session: both connections close (the source broker requeues what was delivered and not acked), and
the machine's reconnect timer decides when `Connect` comes again. `DeleteSelf` calls `on_delete_self`.

Topology (what RabbitMQ's shovel declares, with two differences written down in docs/shovel.md):
- `src-queue`: a passive declare first; only a missing queue is declared (durable, with `src-queue-args`), so an
  existing quorum queue is used as it is (RabbitMQ re-declares it as a classic queue and fails: #10501).
- `src-exchange`: a durable, non-exclusive queue named `shovel.<vhost>.<name>` bound to the exchange with
  `src-exchange-key`, declared again after a reconnect: messages routed while the shovel was disconnected wait
  in it (RabbitMQ's exclusive queue loses them: rabbitmq-shovel#3). It is deleted when the shovel is deleted.
- `dest-queue`: passive declare, declared (durable, `dest-queue-args`) only when missing. Exchanges are never
  declared: a missing one fails the attempt (as in RabbitMQ).
The destination channel is in confirm mode with `on-confirm`; the source consumer uses `src-prefetch-count` and
no-ack consumption with `no-ack`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import trio

from cluster.link.client import LinkClosed, LinkConnection, open_link, wall_ms
from cluster.link.uri import AmqpUri, resolve_local
from cluster.shovel.link import (
    TERMINATED,
    AckSource,
    CancelConsume,
    Connect,
    DeleteSelf,
    Disconnect,
    Effect,
    NackSource,
    Publish,
    ShovelLink,
)
from cluster.shovel.params import ShovelDefinition
from node.amqp import methods as m
from node.amqp.client import ChannelClosed, ClientEvent, Closed, ContentIn, MethodIn

log = logging.getLogger("raftmq.shovel")
CONSUMER_TAG = "raftmq-shovel"
BATCH_MAX = 1000  # events handled before the connections are flushed


def exchange_source_queue(definition: ShovelDefinition) -> str:
    """The durable queue an exchange source consumes from (kept across reconnects)."""
    return f"shovel.{definition.vhost}.{definition.name}"


class _Down(Exception):
    def __init__(self, side: str, reason: str) -> None:
        super().__init__(f"{side}: {reason}")
        self.side = side
        self.reason = reason


class ShovelRunner:
    def __init__(self, definition: ShovelDefinition, node_name: str, local: AmqpUri | None = None,
                 on_delete_self: Callable[[ShovelDefinition], Awaitable[None]] | None = None,
                 may_run: Callable[[], bool] = lambda: True) -> None:
        self.definition = definition
        self.may_run = may_run  # checked before each batch: False (lease lost) ends the session
        self.link = ShovelLink(definition, node_name)
        self.local = local
        self.on_delete_self = on_delete_self
        self.node_name = node_name

    def _uri(self, uri: AmqpUri) -> AmqpUri:
        return resolve_local(uri, self.local)

    async def run(self) -> None:
        """Until the shovel terminates (delete-after) or the task is cancelled (deleted, moved, node stopping)."""
        effects = self.link.start(wall_ms())
        while True:
            connect = await self._carry_out_idle(effects)
            if self.link.state == TERMINATED:
                return
            if connect is None:
                wait_ms = (self.link.reconnect_at_ms or wall_ms() + 1000) - wall_ms()
                await trio.sleep(max(0.0, wait_ms / 1000))
                effects = self.link.tick(wall_ms())
                continue
            effects = await self._session(connect)

    async def _carry_out_idle(self, effects: list[Effect]) -> Connect | None:
        connect = None
        for effect in effects:
            if isinstance(effect, Connect):
                connect = effect
            elif isinstance(effect, DeleteSelf) and self.on_delete_self is not None:
                await self.on_delete_self(self.definition)
        return connect

    async def _session(self, connect: Connect) -> list[Effect]:
        d = self.definition
        name = f"Shovel {d.name}"
        async with AsyncExitStack() as stack:
            try:
                src = await stack.enter_async_context(open_link(self._uri(d.src_uri(connect.src_index)), name))
            except (OSError, trio.TooSlowError, LinkClosed) as exc:
                return self.link.connect_failed("src", _describe(exc), wall_ms())
            try:
                dest = await stack.enter_async_context(open_link(self._uri(d.dest_uri(connect.dest_index)), name))
            except (OSError, trio.TooSlowError, LinkClosed) as exc:
                return self.link.connect_failed("dest", _describe(exc), wall_ms())
            side = "dest"
            try:
                dest_ch = await self._setup_dest(dest)
                side = "src"
                src_ch, queue_length = await self._setup_src(src)
            except (LinkClosed, trio.TooSlowError) as exc:
                return self.link.connect_failed(side, _describe(exc), wall_ms())
            log.info("shovel %s/%s running: %s -> %s", d.vhost, d.name, d.src_uri(connect.src_index).redacted(),
                     d.dest_uri(connect.dest_index).redacted())
            effects = self.link.connected(wall_ms(), queue_length)
            return await self._pump(src, src_ch, dest, dest_ch, effects)
        return []  # (not reached: every path above returns)

    async def _declare_queue(self, link: LinkConnection, queue: str, args: dict[str, Any]) -> tuple[int, int]:
        """(channel, message count): a passive declare, or a durable declare when the queue is missing."""
        ch = await link.channel()
        try:
            ok = await link.call(ch, m.QueueDeclare(queue=queue, passive=True), m.QueueDeclareOk)
        except LinkClosed as exc:
            if exc.code != 404:
                raise
            ch = await link.channel()
            ok = await link.call(ch, m.QueueDeclare(queue=queue, durable=True, arguments=args), m.QueueDeclareOk)
        assert isinstance(ok, m.QueueDeclareOk)
        return ch, ok.message_count

    async def _setup_dest(self, dest: LinkConnection) -> int:
        d = self.definition
        with trio.fail_after(30):
            if d.dest_queue is not None:
                ch, _ = await self._declare_queue(dest, d.dest_queue, d.dest_queue_args)
            else:
                ch = await dest.channel()
            if d.ack_mode == "on-confirm":
                await dest.call(ch, m.ConfirmSelect(), m.ConfirmSelectOk)
            return ch

    async def _setup_src(self, src: LinkConnection) -> tuple[int, int | None]:
        d = self.definition
        with trio.fail_after(30):
            if d.src_queue is not None:
                queue = d.src_queue
                ch, count = await self._declare_queue(src, queue, d.src_queue_args)
            else:
                assert d.src_exchange is not None
                queue = exchange_source_queue(d)
                ch, count = await self._declare_queue(src, queue, d.src_queue_args)
                await src.call(ch, m.QueueBind(queue=queue, exchange=d.src_exchange, routing_key=d.src_exchange_key),
                               m.QueueBindOk)
            if d.src_prefetch_count:
                await src.call(ch, m.BasicQos(prefetch_count=d.src_prefetch_count), m.BasicQosOk)
            await src.call(ch, m.BasicConsume(queue=queue, consumer_tag=CONSUMER_TAG, no_ack=d.ack_mode == "no-ack",
                                              arguments=d.src_consumer_args), m.BasicConsumeOk)
            return ch, count

    async def _pump(self, src: LinkConnection, src_ch: int, dest: LinkConnection, dest_ch: int,
                    effects: list[Effect]) -> list[Effect]:
        send, receive = trio.open_memory_channel[tuple[str, ClientEvent]](math.inf)
        for side, link in (("src", src), ("dest", dest)):  # (a passive declare's 404 closed a channel in set-up)
            link.route_events(send, side, keep=lambda event: not isinstance(event, ChannelClosed))
        try:
            while True:
                if not self.may_run():
                    raise _Down("link", "this node no longer holds the shovel's lease")
                effects = self._carry_out(src, src_ch, dest, dest_ch, effects)
                if any(isinstance(e, Disconnect) for e in effects):
                    await src.flush()  # the last acks go out before the connections close
                    await dest.flush()
                    break
                await src.flush()
                await dest.flush()
                batch = [await receive.receive()]
                while len(batch) < BATCH_MAX:
                    try:
                        batch.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                effects = []
                for side, event in batch:
                    effects += self._event(side, event, src_ch, dest_ch)
        except (_Down, LinkClosed) as exc:
            side = exc.side if isinstance(exc, _Down) else "link"
            effects = self.link.down(side, exc.reason if isinstance(exc, _Down) else exc.text, wall_ms())
        return [e for e in effects if not isinstance(e, Disconnect)]

    def _carry_out(self, src: LinkConnection, src_ch: int, dest: LinkConnection, dest_ch: int,
                   effects: list[Effect]) -> list[Effect]:
        """Do the message effects; return the lifecycle ones (Disconnect, Connect, DeleteSelf) left over."""
        rest: list[Effect] = []
        for effect in effects:
            if isinstance(effect, Publish):
                dest.publish(dest_ch, effect.exchange, effect.routing_key, effect.properties, effect.body)
            elif isinstance(effect, AckSource):
                src.ack(src_ch, effect.tag, effect.multiple)
            elif isinstance(effect, NackSource):
                src.nack(src_ch, effect.tag, effect.multiple, requeue=True)
            elif isinstance(effect, CancelConsume):
                src.conn.send_method(src_ch, m.BasicCancel(consumer_tag=CONSUMER_TAG, nowait=True))
            else:
                rest.append(effect)
        return rest

    def _event(self, side: str, event: ClientEvent, src_ch: int, dest_ch: int) -> list[Effect]:
        now = wall_ms()
        if isinstance(event, ContentIn):
            deliver = event.method
            if side == "src" and isinstance(deliver, m.BasicDeliver):
                return self.link.delivery(deliver.delivery_tag, deliver.exchange, deliver.routing_key,
                                          event.properties, event.body, now)
            return []
        if isinstance(event, MethodIn):
            method = event.method
            if side == "dest" and isinstance(method, m.BasicAck):
                return self.link.confirm(method.delivery_tag, method.multiple, True, now)
            if side == "dest" and isinstance(method, m.BasicNack):
                return self.link.confirm(method.delivery_tag, method.multiple, False, now)
            if side == "src" and isinstance(method, m.BasicCancel):
                raise _Down("src", "the source broker cancelled the consumer (queue deleted?)")
            return []
        if isinstance(event, ChannelClosed) and event.channel in ((src_ch,) if side == "src" else (dest_ch,)):
            raise _Down(side, f"channel closed: {event.reply_code} {event.reply_text}")
        if isinstance(event, Closed):
            raise _Down(side, f"connection closed: {event.reply_code} {event.reply_text}")
        return []


def _describe(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "timed out"
    if isinstance(exc, LinkClosed):
        return f"{exc.code} {exc.text}"
    return f"{type(exc).__name__}: {exc}"
