"""How a node hands connection events to the broker and carries out the broker's effects (mixed into `Node`).

`Dispatcher.dispatch` is the only place events meet the broker: it passes each connection's pending events to
`Broker.handle_many` (or `Broker.handle`) and carries out the returned effects: `Persist` on the store, the effects
named in `Node.effect_sinks` by their sink, the rest on the protocol core of the connection named by their
`conn_id` (deliveries inlined, the others through `CONNECTION_EFFECTS` by exact type), repeating until no
connection has events left. `Connection` is the runtime state of one client connection that this and the reader
and writer tasks of node/runtime/server.py share; everything here runs on the trio thread. It also counts the
publishes that arrive and the deliveries that leave (`messages_received`/`messages_delivered`, node/runtime/metrics.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from node.amqp.connection import ServerConnection, reply_text
from node.amqp.events import ConnectionClosed, ConnectionOpened, ContentReceived
from node.amqp.methods import BasicAck, BasicDeliver, BasicGetOk
from node.amqp.spec import ReplyCode
from node.broker.effects import Block, CloseChannel, CloseConnection, Persist, Send, SendContent, Unblock
from node.runtime.config import NodeConfig
from node.runtime.store import Store

log = logging.getLogger("raftmq.node")

DISPATCH_ROUNDS_MAX = 100_000  # events+effects cascades longer than this indicate a bug; stop and log


def wall_ms() -> int:
    """Wall-clock milliseconds: the broker's time base (message TTLs and timestamps survive restarts)."""
    return int(time.time() * 1000)


def mono_ms() -> int:
    """trio's monotonic clock in milliseconds: the time base of the protocol cores (heartbeats)."""
    return int(trio.current_time() * 1000)


@dataclass(eq=False, slots=True)
class Connection:
    """Runtime state of one client connection; only the trio thread touches it."""

    conn_id: int
    stream: trio.abc.Stream  # a SocketStream, or an SSLStream around one on the amqps listener
    core: ServerConnection
    output: deque[bytes] = field(default_factory=deque)
    output_bytes: int = 0
    writable: bool = True
    opened: bool = False
    finished: bool = False
    dirty: bool = False  # queued in Node._dirty: events or output to collect
    broker_told_closed: bool = False
    output_ready: trio.Event = field(default_factory=trio.Event)
    send_lock: trio.Lock = field(default_factory=trio.Lock)
    flow_quiet_until_s: float = 0.0  # credit flow: no pauses before this trio time
    read_paused: bool = False  # credit flow, cluster mode: the broker said PauseReading (until ResumeReading)
    read_resumed: trio.Event = field(default_factory=trio.Event)
    cancel_scope: trio.CancelScope | None = None
    close_ok_held: bool = False  # the broker answers the client's Connection.Close later (HoldCloseOk)


class Dispatcher:
    """The dispatch half of `Node` (node/runtime/server.py), which sets these attributes."""

    config: NodeConfig
    broker: Any
    store: Store | Any
    connections: dict[int, Connection]
    effect_sinks: dict[type, Callable[[Any], None]]
    _dirty: deque[Connection]
    messages_received = 0  # publishes that arrived (Prometheus rabbitmq_global_messages_received_total)
    messages_delivered = 0  # Basic.Deliver and Basic.GetOk sent (rabbitmq_global_messages_delivered_total)

    def dispatch(self, effects: Iterable[Any] = ()) -> None:
        """Carry out effects, then hand every pending event of every touched connection to the broker.

        A connection is queued at most once while it waits (`Connection.dirty`), so a batch of effects for one
        connection costs one pump and one writer wake-up, however many effects it holds."""
        self.apply_effects(effects)
        dirty = self._dirty
        rounds = 0
        while dirty:
            rounds += 1
            if rounds > DISPATCH_ROUNDS_MAX:
                log.error("dispatch: cascade longer than %d rounds; stopping", DISPATCH_ROUNDS_MAX)
                self._clear_dirty()
                return
            self._pump(dirty.popleft())

    def _mark(self, conn: Connection) -> None:
        if not conn.dirty:
            conn.dirty = True
            self._dirty.append(conn)

    def _clear_dirty(self) -> None:
        for conn in self._dirty:
            conn.dirty = False
        self._dirty.clear()

    def _pump(self, conn: Connection) -> None:
        """Every event of `conn` (including those its own effects add) to the broker, then its output once."""
        core = conn.core
        try:
            events = core.next_events()
            while events:
                closed = False
                for event in events:
                    cls = type(event)
                    if cls is ContentReceived:
                        self.messages_received += 1
                    elif cls is ConnectionOpened:
                        conn.opened = True
                    elif cls is ConnectionClosed:
                        closed = conn.broker_told_closed = True
                self.apply_effects(self._handle_events(conn.conn_id, events, wall_ms()))
                if closed and not conn.close_ok_held:  # only now: the broker's last words were written
                    conn.finished = True
                events = core.next_events()
        finally:
            conn.dirty = False
        self._collect_output(conn)

    def _handle_events(self, conn_id: int, events: list[Any], now_ms: int) -> list[Any]:
        """One read's events to the broker at once (`Broker.handle_many`: one Persist, one commit round for all of
        them), or one by one through `Broker.handle` for a broker without it."""
        broker = self.broker
        handle_many = getattr(broker, "handle_many", None)
        if handle_many is not None:
            return list(handle_many(conn_id, events, now_ms))
        effects: list[Any] = []
        for event in events:
            effects.extend(broker.handle(conn_id, event, now_ms))
        return effects

    def apply_effects(self, effects: Iterable[Any]) -> None:
        """Carry out effects in order: Persist on the store, the rest on their connection's core (by type)."""
        connections = self.connections
        dirty = self._dirty
        for effect in effects:
            cls = type(effect)
            if cls is SendContent:  # a delivery (the hot path, inlined)
                conn = connections.get(effect.conn_id)
                if conn is None or conn.finished:
                    continue
                method = effect.method
                if type(method) is BasicDeliver:
                    conn.core.send_deliver(effect.channel, method.consumer_tag, method.delivery_tag,
                                           method.redelivered, method.exchange, method.routing_key,
                                           effect.properties, effect.body)
                    self.messages_delivered += 1
                else:
                    conn.core.send_content(effect.channel, method, effect.properties, effect.body)
                    if type(method) is BasicGetOk:
                        self.messages_delivered += 1
                if not conn.dirty:
                    conn.dirty = True
                    dirty.append(conn)
                continue
            if cls is Persist:
                self.store.persist(effect.token, effect.records)
                continue
            sink = self.effect_sinks.get(cls)
            if sink is not None:
                sink(effect)
                continue
            conn = connections.get(effect.conn_id)
            if conn is None or conn.finished:
                continue
            apply = CONNECTION_EFFECTS.get(cls) or effect_handler_by_isinstance(effect)
            if apply is None:
                log.error("unknown effect %r", effect)
                continue
            apply(conn.core, effect)
            if not conn.dirty:
                conn.dirty = True
                dirty.append(conn)

    def _collect_output(self, conn: Connection) -> None:
        data = conn.core.data_to_send()
        if not data:
            return
        conn.output.append(data)
        conn.output_bytes += len(data)
        conn.output_ready.set()
        if conn.writable and conn.output_bytes > self.config.output_buffer_high_bytes:
            conn.writable = False
            self._set_writable(conn, False)

    def _set_writable(self, conn: Connection, writable: bool) -> None:
        self.apply_effects(self.broker.set_writable(conn.conn_id, writable))

    def dispatch_guarded(self, conn: Connection, produce: Callable[[], Iterable[Any]] | None = None) -> None:
        """`dispatch` (of `produce()`'s effects, if given), but a bug below the runtime closes this connection
        (541) instead of the whole node."""
        try:
            self.dispatch(produce() if produce is not None else ())
        except Exception:
            log.exception("connection %d: internal error; closing it", conn.conn_id)
            self._clear_dirty()
            conn.core.close_connection(
                int(ReplyCode.INTERNAL_ERROR), reply_text(ReplyCode.INTERNAL_ERROR, "internal error"))
            self._collect_output(conn)
            conn.finished = True


def _send_content(core: ServerConnection, effect: SendContent) -> None:
    method = effect.method
    if type(method) is BasicDeliver:
        core.send_deliver(effect.channel, method.consumer_tag, method.delivery_tag, method.redelivered,
                          method.exchange, method.routing_key, effect.properties, effect.body)
    else:
        core.send_content(effect.channel, method, effect.properties, effect.body)


def _send(core: ServerConnection, effect: Send) -> None:
    method = effect.method
    if type(method) is BasicAck:
        core.send_ack(effect.channel, method.delivery_tag, method.multiple)
    else:
        core.send_method(effect.channel, method)


def _close_channel(core: ServerConnection, effect: CloseChannel) -> None:
    core.close_channel(effect.channel, effect.reply_code, effect.reply_text, effect.class_id, effect.method_id)


def _close_connection(core: ServerConnection, effect: CloseConnection) -> None:
    core.close_connection(effect.reply_code, effect.reply_text, effect.class_id, effect.method_id)


def _block(core: ServerConnection, effect: Block) -> None:
    core.block(effect.reason)


def _unblock(core: ServerConnection, effect: Unblock) -> None:
    core.unblock()


# How each connection-bound effect is carried out, by exact type (one dict lookup instead of an isinstance chain).
CONNECTION_EFFECTS: dict[type, Callable[[ServerConnection, Any], None]] = {
    SendContent: _send_content,
    Send: _send,
    CloseChannel: _close_channel,
    CloseConnection: _close_connection,
    Block: _block,
    Unblock: _unblock,
}


def effect_handler_by_isinstance(effect: Any) -> Callable[[ServerConnection, Any], None] | None:
    """The slow path for a subclass of a known effect type."""
    for cls, apply in CONNECTION_EFFECTS.items():
        if isinstance(effect, cls):
            return apply
    return None
