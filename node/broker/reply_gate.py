"""Replies that wait for durability: a method that changes durable definitions answers only once its records are on disk.

On a single node the token is reported once the store's fsync covers it; in cluster mode once the metadata group
committed the definition commands (docs/cluster.md). A method of
`GATED_METHODS` (declare, delete, bind, unbind, purge of exchanges and queues, tx.commit) that wrote records while
it was handled *gates* its channel on the entry point's `Persist` token: from that method's first effect on, every
effect for that channel (its reply, later replies, deliveries, a channel close) is held in order in the channel's
`HeldReplies` instead of going out, until `on_persisted` reports the token; then the held effects go out, in order,
ahead of anything that entry point produces. If the change cannot be made durable (cluster mode: the metadata
group refused it or did not commit it in time), `fail` reports the token instead: each channel it holds loses
what it held (the ok must never leave) and is closed with the given channel error, through the broker's normal
channel-close path (its unacked deliveries go back to their queues). A method that wrote nothing (a passive or repeated declare, a
transient queue, delete of a missing name) does not gate. Publishes and acks are never gated: their records only
gate a channel that is already held, and publisher confirms already wait for their own tokens.

How: `run_gated` wraps the handler (it notes `Broker.records_pending()` and `len(out)` before it); `divert`,
called where an entry point hands out its effects, moves the effects of held channels from `out` into their
holds (an effect before its channel's gate point stays); `release` is called for each persisted token. Other
channels and connections are untouched. While any channel is held the effects of each entry point are scanned once
(the cost is only paid during the fsync a definition change waits for).

Bounds: a held channel gets no delivery credit top-ups (delivery.refill), so at most one credit window per
consumer is held; replies are bounded by what the client sends during the wait, and a hold past
`HELD_EFFECTS_MAX` effects (a stalled disk) closes the connection (541) instead of growing. A channel the client
closes (`ChannelClosed`) or a connection that goes drops its holds: the broker answers the client's Close at
once (the client discards anything else after its Close), and a reused channel number must never receive the old
channel's replies.

The owner barrier (replicated mode; node/broker/broker.py): `defer` holds a channel's events, starting with the
one whose handler raised `MetadataUnconfirmed`, behind a metadata read barrier (a Persist of a
`MetadataBarrierRecord`); `deferring` appends the channel's later events there (a channel or connection the client
closes or reopens drops them; past `DEFERRED_EVENTS_MAX` the connection is closed, 541), and the broker handles
them again, in order, when the barrier's token is reported (`barrier_passed`). A client's Connection.Close is
answered (`answer_connection_close`) once what the close wrote (its exclusive queues' deletion) is committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from node.amqp import events as ev
from node.amqp import methods as m
from node.broker.channel import ConnState
from node.broker.effects import CloseChannel, CloseConnection, Effect, HoldCloseOk, Send, SendCloseOk
from node.broker.records import MetadataBarrierRecord
from node.broker.state import BrokerState, HeldReplies

GATED_METHODS: frozenset[type] = frozenset({
    m.ExchangeDeclare, m.ExchangeDelete, m.ExchangeBind, m.ExchangeUnbind,
    m.QueueDeclare, m.QueueDelete, m.QueueBind, m.QueueUnbind, m.QueuePurge,
    m.TxCommit,
})
HELD_EFFECTS_MAX = 100_000  # per channel: far above one credit window per consumer plus a client's pipelined replies
HELD_OVERFLOW_TEXT = "INTERNAL_ERROR - too many replies waiting for the disk"

ChannelKey = tuple[int, int]  # (conn_id, channel number)
DEFERRED_EVENTS_MAX = 100_000  # per channel waiting for a metadata read barrier (far above a client's pipelining)
DEFERRED_OVERFLOW_TEXT = "INTERNAL_ERROR - too many commands waiting for the cluster metadata"


def run_gated(broker: BrokerState, conn: ConnState, channel: int, method: Any) -> None:
    """Handle a definition-changing method; gate its channel if it wrote records."""
    start = len(broker.out)
    before = broker.records_pending()
    broker.dispatch_guarded(conn, channel, method)
    if broker.records_pending() > before:
        gate(broker, (conn.conn_id, channel), broker.pending_token(), start, method)


def gate(broker: BrokerState, key: ChannelKey, token: int, from_index: int, method: Any = None) -> None:
    held = broker.held.get(key)
    if held is None:
        broker.held[key] = HeldReplies({token}, from_index, class_id=getattr(method, "CLASS_ID", 0),
                                       method_id=getattr(method, "METHOD_ID", 0))
    elif token not in held.tokens:
        held.tokens.add(token)
    else:
        return
    broker.held_gates.setdefault(token, []).append(key)


def divert(broker: BrokerState, out: list[Effect]) -> list[Effect]:
    """`out` without the effects of held channels (those go to their holds, in order)."""
    held = broker.held
    kept: list[Effect] = []
    for index, effect in enumerate(out):
        channel = getattr(effect, "channel", None)
        if channel is not None:
            hold = held.get((effect.conn_id, channel))  # type: ignore[union-attr]
            if hold is not None and index >= hold.from_index:
                hold.effects.append(effect)
                continue
        kept.append(effect)
    for key, hold in list(held.items()):
        hold.from_index = 0
        if len(hold.effects) > HELD_EFFECTS_MAX:
            kept.append(CloseConnection(key[0], 541, HELD_OVERFLOW_TEXT))
            drop_connection(broker, key[0])
    return kept


def release(broker: BrokerState, token: int) -> None:
    """`token` is durable: channels no longer waiting for anything send what they held (appended to out)."""
    keys = broker.held_gates.pop(token, None)
    if not keys:
        return
    for key in keys:
        hold = broker.held.get(key)
        if hold is None:
            continue
        hold.tokens.discard(token)
        if not hold.tokens:
            del broker.held[key]
            broker.out.extend(hold.effects)
            conn = broker.conns.get(key[0])
            ch = conn.channels.get(key[1]) if conn is not None else None
            if ch is not None:
                broker.mark_dirty(ch)  # credit top-ups paused while held


def fail(broker: BrokerState, token: int, reply_code: int, reply_text: str) -> None:
    """`token` will never be durable: every channel it holds drops what it held and is closed with the error."""
    keys = broker.held_gates.pop(token, None)
    if not keys:
        return
    for key in keys:
        hold = broker.held.pop(key, None)
        if hold is None:
            continue  # already failed by another token, or closed by the client
        conn = broker.conns.get(key[0])
        if conn is None or key[1] not in conn.channels:
            continue
        broker.out.append(CloseChannel(key[0], key[1], reply_code, reply_text, hold.class_id, hold.method_id))
        broker.close_channel_state(conn, key[1])


def drop_channel(broker: BrokerState, key: ChannelKey) -> None:
    broker.held.pop(key, None)


def drop_connection(broker: BrokerState, conn_id: int) -> None:
    for key in [k for k in broker.held if k[0] == conn_id]:
        del broker.held[key]


def defer(broker: BrokerState, conn: ConnState, channel: int, event: Any) -> None:
    """Hold this channel's events behind a metadata read barrier, starting with `event` (handled again then)."""
    key = (conn.conn_id, channel)
    events = broker.deferred[key] = [event]
    token = broker.persist((MetadataBarrierRecord(),))
    broker.deferred_gates.setdefault(token, []).append((key, events))


def deferring(broker: BrokerState, conn: ConnState, event: Any) -> bool:
    """Whether `event` waits behind its channel's barrier (then appended there)."""
    kind = type(event)
    if kind is ev.ConnectionClosed:
        for key in [k for k in broker.deferred if k[0] == conn.conn_id]:
            del broker.deferred[key]
        return False
    key = (conn.conn_id, getattr(event, "channel", -1))
    waiting = broker.deferred.get(key)
    if waiting is None:
        return False
    if kind is ev.ChannelClosed or kind is ev.ChannelOpened:
        del broker.deferred[key]
        return False
    if len(waiting) >= DEFERRED_EVENTS_MAX:  # a client pipelining without bound while the metadata is slow
        del broker.deferred[key]
        broker.out.append(CloseConnection(conn.conn_id, 541, DEFERRED_OVERFLOW_TEXT))
        for number in list(conn.channels):
            broker.close_channel_state(conn, number)
        return True
    waiting.append(event)
    return True


def barrier_passed(broker: BrokerState, token: int, handle_event: Callable[[ConnState, Any], None]) -> None:
    """`token` is committed: the close-oks it held go out, and the events its barrier deferred are handled again
    (`handle_event`, the broker's), the first one with the metadata taken as confirmed."""
    for conn_id in broker.close_oks.pop(token, ()):
        broker.out.append(SendCloseOk(conn_id))
    for key, events in broker.deferred_gates.pop(token, ()):
        conn = broker.conns.get(key[0])
        if broker.deferred.get(key) is not events or conn is None:
            continue  # dropped (channel closed), maybe deferred again since behind a later barrier
        del broker.deferred[key]
        conn.metadata_confirmed = True
        try:
            handle_event(conn, events[0])
        finally:
            conn.metadata_confirmed = False
        for event in events[1:]:  # (deferred again behind a new barrier if one of them meets another owner)
            if broker.conns.get(key[0]) is not conn:
                break
            handle_event(conn, event)


def answer_connection_close(broker: BrokerState, conn_id: int, records_before: int) -> None:
    """Close-Ok for the client's Connection.Close: at once, or in replicated mode, when the close wrote records
    (its exclusive queues' deletion), `HoldCloseOk` now and `SendCloseOk` once they are committed."""
    if broker.definitions_shared and broker.records_pending() > records_before:
        broker.close_oks.setdefault(broker.pending_token(), []).append(conn_id)
        broker.out.append(HoldCloseOk(conn_id))
    else:
        broker.out.append(Send(conn_id, 0, m.ConnectionCloseOk()))
