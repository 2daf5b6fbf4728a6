"""Publishing: checks, routing, enqueue, mandatory returns, publisher confirms, transactions, dead-lettering and
direct reply-to (pure handlers on the Broker).

A publish is checked in rabbit_channel's order (immediate, write permission, exchange exists, internal, user_id,
expiration), routed through the vhost's cached routing, and enqueued into each queue's machine. A persistent message
(delivery_mode 2) in a durable queue becomes a `MessageRecord` in the entry point's `Persist` effect; its confirm
waits for that token's `on_persisted`. Confirms released together are coalesced: the run of sequence numbers up to
the new confirm floor becomes one `multiple` ack. The hot path (default exchange, one queue, no tx) avoids per-message
lookups: write permission is cached per channel (cleared when permissions change) and routes per vhost.
Dead-lettered messages are republished to the queue's DLX with RabbitMQ's x-death headers; a cycle (the message
returns to a queue it died in, with no rejection on the way) drops it, as rabbit_dead_letter does.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from cluster.queue import DeadLetter, Enqueue, QueuedMessage
from node.amqp import methods as m
from node.broker import trace
from node.broker.backend import PublishPath, backend_of
from node.broker.channel import ChannelState, ConnState, Message, TxState
from node.broker.delivery import enqueue, settle_entries
from node.broker.effects import Block, Send, SendContent
from node.broker.errors import AmqpError, access_refused, not_found, precondition
from node.broker.queue_lookup import REPLY_TO_QUEUE
from node.broker.queues import QueueState
from node.broker.state import BrokerState
from node.broker.vhost import VHost

REPLY_TO_PREFIX = REPLY_TO_QUEUE + "."
_new_tuple = tuple.__new__
WRITE_OK_ENTRIES_MAX = 1024  # per channel: exchanges known to be writable
# A forwarded publish's [queue, exchange, routing key, had headers] (node/runtime/cluster/forward.py)
FORWARD_HEADER = "x-raftmq-forwarded"


def parse_expiration(expiration: str | None) -> int | None:
    if expiration is None:
        return None
    text = expiration.strip() if isinstance(expiration, str) else str(expiration)
    digits = text.lstrip("-")
    if not digits or not digits[0].isdigit():
        raise precondition(f"invalid expiration '{expiration}': no_integer")
    end = len(text) - len(digits)
    while end < len(text) and text[end].isdigit():
        end += 1
    if end < len(text):
        raise precondition(f"invalid expiration '{expiration}': {{leftover_string,\"{text[end:]}\"}}")
    value = int(text)
    if value < 0:
        raise precondition(f"invalid expiration '{expiration}': {{value_negative,{value}}}")
    return value


def handle_publish(broker: BrokerState, conn: ConnState, ch: ChannelState, event: Any) -> None:
    method, props = event.method, event.properties
    if method.immediate:
        raise AmqpError(540, "immediate=true", connection=True)
    vhost = broker.vhosts.get(conn.vhost) or broker.vhost_of(conn)
    name = method.exchange
    write_ok = ch.write_ok
    if name not in write_ok:  # cleared when permissions change
        broker.check_access(conn, "write", "exchange", name)
        if len(write_ok) >= WRITE_OK_ENTRIES_MAX:
            write_ok.clear()
        write_ok.add(name)
    if name:
        exchange = vhost.exchanges.get(name)
        if exchange is None:
            raise not_found("exchange", name, vhost.name)
        if exchange.internal:
            raise access_refused(f"cannot publish to internal exchange '{name}' in vhost '{vhost.name}'")
    user_id = props.user_id
    if user_id is not None and user_id != conn.username and not conn.internal:  # (forwarded: checked at its origin)
        raise precondition(f"user_id property set to '{user_id}' but authenticated user was '{conn.username}'")
    expiration = props.expiration
    ttl_ms = parse_expiration(expiration) if expiration is not None else None
    if conn.internal:
        forwarded_publish(broker, ch, vhost, props, event.body, ttl_ms)
        return
    if props.reply_to == REPLY_TO_QUEUE:
        if ch.reply_to_token is None:
            raise precondition("fast reply consumer does not exist")
        props = dataclasses.replace(props, reply_to=REPLY_TO_PREFIX + ch.reply_to_token)
    if not conn.has_published:
        conn.has_published = True
        if broker.alarms and not conn.blocked:
            conn.blocked = True
            broker.out.append(Block(conn.conn_id, f"low on {sorted(broker.alarms)[0]}"))
    if broker.trace_vhosts and vhost.name in broker.trace_vhosts:  # Firehose (node/broker/trace.py)
        trace.tap_in(broker, ch, vhost.name, method, props, event.body)
    if ch.tx is not None:
        if len(ch.tx.publishes) >= broker.config.tx_messages_max:
            raise AmqpError(506, f"too many messages in one transaction (max {broker.config.tx_messages_max})")
        ch.tx.publishes.append((method, props, event.body))
        return
    seq = 0
    if ch.confirm:
        seq = ch.next_publish_seq
        ch.next_publish_seq = seq + 1
    broker.publish_route(broker, ch, vhost, method, props, event.body, seq, ttl_ms)


def forwarded_publish(broker: BrokerState, ch: ChannelState, vhost: VHost[QueueState], props: Any, body: bytes,
                      ttl_ms: int | None) -> None:
    """A publish another node forwarded to an exclusive queue of this node (node/runtime/cluster/forward.py), on a
    connection of the nodes' internal login: into that queue only, never stored (node/broker/backend_owned.py),
    with the exchange and routing key it was published with there (the FORWARD_HEADER, removed again). A queue gone
    meanwhile makes it unroutable, and confirmed, as RabbitMQ confirms an unroutable publish."""
    headers = props.headers or {}
    spec = headers.get(FORWARD_HEADER)
    if not (isinstance(spec, list) and len(spec) == 4):
        raise precondition(f"a publish of the internal login needs the {FORWARD_HEADER} header")
    queue_name, exchange, routing_key = (v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else str(v)
                                         for v in spec[:3])
    rest = {key: value for key, value in headers.items() if key != FORWARD_HEADER}
    props = dataclasses.replace(props, headers=rest if rest or spec[3] else None)
    queue = vhost.queues.get(queue_name)
    rejected = False
    if queue is not None and queue.backend is not None and backend_of(queue).publish_path is PublishPath.ENQUEUE:
        broker.messages_routed += 1
        message = QueuedMessage(_new_tuple(Message, (exchange, routing_key, props, body)), len(body), False,
                                props.priority or 0, ttl_ms)
        rejected = enqueue(broker, queue, Enqueue(message, broker.now_ms)) < 0
    else:
        broker.messages_unroutable_dropped += 1
    if ch.confirm:
        seq = ch.next_publish_seq
        ch.next_publish_seq = seq + 1
        confirm_ready(broker, ch, () if rejected else (seq,), (seq,) if rejected else ())


def route_publish(broker: BrokerState, ch: ChannelState, vhost: VHost[QueueState], method: Any, props: Any,
                  body: bytes, seq: int, ttl_ms: int | None) -> list[int]:
    """Route and enqueue one message; returns the Persist tokens that make it durable."""
    name, routing_key = method.exchange, method.routing_key
    msg = _new_tuple(Message, (name, routing_key, props, body))  # Message(...) without the Python-level __new__
    tokens: list[int]
    if name == "" and routing_key.startswith(REPLY_TO_PREFIX):
        routed = _deliver_reply(broker, msg)
        tokens = []
        rejected = False
    elif name == "":  # the default exchange: the queue named by the routing key, no route cache needed
        routed = routing_key in vhost.queues
        tokens, rejected = enqueue_all(broker, vhost, (routing_key,) if routed else (), msg, ttl_ms)
    else:
        queue_names = vhost.route(name, routing_key, props.headers)
        routed = bool(queue_names)
        tokens, rejected = enqueue_all(broker, vhost, queue_names, msg, ttl_ms)
    if routed:
        broker.messages_routed += 1
    elif method.mandatory:
        broker.messages_unroutable_returned += 1
        ret = m.BasicReturn(reply_code=312, reply_text="NO_ROUTE", exchange=name, routing_key=routing_key)
        broker.out.append(SendContent(ch.conn_id, ch.number, ret, props, body))
    else:
        broker.messages_unroutable_dropped += 1
    if seq:
        if rejected:
            confirm_ready(broker, ch, (), (seq,))
        elif tokens:
            ch.confirm_waiting[seq] = len(tokens)
            waiters = broker.persist_waiters
            for token in tokens:
                waiting = waiters.get(token)
                if waiting is None:
                    waiters[token] = [(ch, seq)]
                else:
                    waiting.append((ch, seq))
        elif not ch.confirm_waiting:
            # the common case, inlined: nothing older unconfirmed, so this seq is the next floor
            if seq > ch.confirm_floor:
                ch.confirm_floor = seq
            broker.messages_confirmed += 1
            broker.out.append(Send(ch.conn_id, ch.number, m.BasicAck(delivery_tag=seq, multiple=False)))
        else:
            confirm_ready(broker, ch, (seq,), ())
    return tokens


def enqueue_all(broker: BrokerState, vhost: VHost[QueueState], queue_names: tuple[str, ...] | list[str], msg: Message,
                ttl_ms: int | None) -> tuple[list[int], bool]:
    """Enqueue into each named queue; returns the Persist tokens to wait for (each once) and whether any queue
    refused. Tokens repeat when several durable queues share one entry point's Persist, hence the check."""
    props = msg.properties
    persistent = props.delivery_mode == 2
    size = len(msg.body)
    priority = props.priority or 0
    plain: QueuedMessage | None = None  # built on first use: one of the two is all most publishes need
    stored: QueuedMessage | None = None
    tokens: list[int] = []
    rejected = False
    now_ms = broker.now_ms
    queues = vhost.queues
    touched = broker.flow_touched
    for queue_name in queue_names:
        queue = queues.get(queue_name)
        if queue is None:
            continue
        touched[id(queue)] = queue  # for the runtime's credit flow (Broker.publish_flow_behind)
        if persistent and queue.stored:
            if stored is None:
                stored = QueuedMessage(msg, size, True, priority, ttl_ms)
            message = stored
        else:
            if plain is None:
                plain = QueuedMessage(msg, size, False, priority, ttl_ms)
            message = plain
        token = enqueue(broker, queue, Enqueue(message, now_ms))
        if token > 0:
            if token not in tokens:
                tokens.append(token)
        elif token < 0:
            rejected = True
    return tokens, rejected


def _deliver_reply(broker: BrokerState, msg: Message) -> bool:
    target = broker.reply_tokens.get(msg.routing_key[len(REPLY_TO_PREFIX):])
    if target is None or target.closed or target.reply_to_tag is None:
        return False
    tag = target.next_delivery_tag
    target.next_delivery_tag = tag + 1
    deliver = m.BasicDeliver(consumer_tag=target.reply_to_tag, delivery_tag=tag, redelivered=False,
                             exchange=msg.exchange, routing_key=msg.routing_key)
    broker.out.append(SendContent(target.conn_id, target.number, deliver, msg.properties, msg.body))
    return True


# --- confirms ---------------------------------------------------------------------------------------------------


def confirm_select(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.ConfirmSelect) -> None:
    if ch.tx is not None:
        raise precondition("cannot switch from tx to confirm mode")
    ch.confirm = True
    if not method.nowait:
        broker.out.append(Send(ch.conn_id, ch.number, m.ConfirmSelectOk()))


def persisted_many(broker: BrokerState, waiters: list[tuple[ChannelState, int]]) -> None:
    """A Persist token is durable: release what waited for it. Each waiter is (channel, publish seq), or for
    seq < 0 (channel, -tx.commit number). The publishes of one channel it completes are confirmed together, so
    a contiguous run becomes one multiple ack."""
    if len(waiters) == 1:  # one publish per token: the common case without a group commit
        ch, seq = waiters[0]
        if seq > 0 and not ch.closed and ch.confirm_waiting.get(seq) == 1:
            del ch.confirm_waiting[seq]
            confirm_ready(broker, ch, (seq,), ())
            return
    ready: dict[int, tuple[ChannelState, list[int]]] = {}
    for ch, seq in waiters:
        if ch.closed:
            continue
        if seq < 0:
            _commit_persisted(broker, ch, -seq)
            continue
        remaining = ch.confirm_waiting.get(seq)
        if remaining is None:
            continue
        if remaining > 1:
            ch.confirm_waiting[seq] = remaining - 1
            continue
        del ch.confirm_waiting[seq]
        entry = ready.get(id(ch))
        if entry is None:
            ready[id(ch)] = (ch, [seq])
        else:
            entry[1].append(seq)
    for ch, seqs in ready.values():
        confirm_ready(broker, ch, seqs, ())


def confirm_ready(broker: BrokerState, ch: ChannelState, acks: tuple[int, ...] | list[int], nacks: tuple[int, ...]
                  ) -> None:
    """Send acks/nacks. Without nacks, when the batch holds every seq from the old confirm floor up to the new
    one (everything below the lowest still-unconfirmed seq), those go out as one multiple ack; the rest of the
    batch (seqs above an older unconfirmed one) are acked one by one."""
    lowest_waiting = next(iter(ch.confirm_waiting), ch.next_publish_seq)
    new_floor = lowest_waiting - 1
    old_floor = ch.confirm_floor
    if new_floor > old_floor:
        ch.confirm_floor = new_floor
    out = broker.out
    broker.messages_confirmed += len(acks)
    if not nacks and len(acks) == 1:
        out.append(Send(ch.conn_id, ch.number, m.BasicAck(acks[0], False)))
        return
    batch = sorted(acks)
    span = new_floor - old_floor
    if not nacks and span > 1 and len(batch) >= span and batch[0] == old_floor + 1 and batch[span - 1] == new_floor:
        out.append(Send(ch.conn_id, ch.number, m.BasicAck(delivery_tag=new_floor, multiple=True)))
        batch = batch[span:]
    for seq in batch:
        out.append(Send(ch.conn_id, ch.number, m.BasicAck(delivery_tag=seq, multiple=False)))
    for seq in sorted(nacks):
        broker.out.append(Send(ch.conn_id, ch.number, m.BasicNack(delivery_tag=seq, multiple=False,
                                                                     requeue=False)))


# --- transactions -----------------------------------------------------------------------------------------------


def tx_select(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.TxSelect) -> None:
    if ch.confirm:
        raise precondition("cannot switch from confirm to tx mode")
    if ch.tx is None:
        ch.tx = TxState()
    broker.out.append(Send(ch.conn_id, ch.number, m.TxSelectOk()))


def tx_commit(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.TxCommit) -> None:
    if ch.tx is None:
        raise precondition("channel is not transactional")
    tx, ch.tx = ch.tx, TxState()
    vhost = broker.vhost_of(conn)
    tokens: list[int] = []
    for publish_method, props, body in tx.publishes:
        tokens += route_publish(broker, ch, vhost, publish_method, props, body, 0, parse_expiration(props.expiration))
    for _tag, entry, kind, requeue in tx.acks:
        settle_entries(broker, [entry], kind, requeue)
    tokens = list(dict.fromkeys(tokens))  # publishes of one commit share the entry point's Persist token
    broker.mark_dirty(ch)
    if not tokens and not ch.commits_waiting:
        broker.out.append(Send(ch.conn_id, ch.number, m.TxCommitOk()))
        return
    commit_id = ch.next_commit_id
    ch.next_commit_id = commit_id + 1
    ch.commits_waiting[commit_id] = len(tokens)
    for token in tokens:
        broker.persist_waiters.setdefault(token, []).append((ch, -commit_id))
    _release_commits(broker, ch)


def _commit_persisted(broker: BrokerState, ch: ChannelState, commit_id: int) -> None:
    remaining = ch.commits_waiting.get(commit_id)
    if remaining is not None:
        ch.commits_waiting[commit_id] = remaining - 1
    _release_commits(broker, ch)


def _release_commits(broker: BrokerState, ch: ChannelState) -> None:
    """commit-ok goes out, in order, once every persistent message of that commit is on disk."""
    while ch.commits_waiting:
        commit_id, remaining = next(iter(ch.commits_waiting.items()))
        if remaining > 0:
            return
        del ch.commits_waiting[commit_id]
        broker.out.append(Send(ch.conn_id, ch.number, m.TxCommitOk()))


def tx_rollback(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.TxRollback) -> None:
    if ch.tx is None:
        raise precondition("channel is not transactional")
    tx, ch.tx = ch.tx, TxState()
    if tx.acks:
        restored = dict(ch.unacked)
        restored.update((tag, entry) for tag, entry, _kind, _requeue in tx.acks)
        ch.unacked = dict(sorted(restored.items()))
    broker.out.append(Send(ch.conn_id, ch.number, m.TxRollbackOk()))


# --- dead lettering ---------------------------------------------------------------------------------------------


def run_dead_letters(broker: BrokerState) -> None:
    hops = 0
    while broker.dead_letters:
        queue, effect = broker.dead_letters.pop(0)
        hops += 1
        if hops > broker.config.dead_letter_hops_max:
            broker.dead_letters.clear()
            return
        dead_letter(broker, queue, effect)


def dead_letter(broker: BrokerState, queue: QueueState, effect: DeadLetter) -> None:
    vhost = broker.vhosts.get(queue.vhost)
    dlx = queue.machine.args.dead_letter_exchange
    if vhost is None or dlx is None or (dlx != "" and dlx not in vhost.exchanges):
        return
    msg: Message = effect.message.payload
    props = with_x_death(msg, queue.name, effect.reason, broker.now_ms)
    routing_key = queue.machine.args.dead_letter_routing_key or msg.routing_key
    dead = Message(dlx, routing_key, props, msg.body)
    targets = list(vhost.route(dlx, routing_key, props.headers))
    if effect.reason != "rejected":
        deaths = props.headers.get("x-death", [])
        targets = [t for t in targets if not is_cycle(t, deaths)]
    enqueue_all(broker, vhost, targets, dead, None)


def with_x_death(msg: Message, queue_name: str, reason: str, now_ms: int) -> Any:
    """The properties of a dead-lettered copy, built as rabbit_dead_letter does (3.x, newest death first)."""
    props = msg.properties
    headers = dict(props.headers or {})
    deaths = [d for d in headers.get("x-death", []) if isinstance(d, dict)]
    previous = next((d for d in deaths if d.get("queue") == queue_name and d.get("reason") == reason), None)
    if previous is not None:
        deaths.remove(previous)
        entry = dict(previous)
        entry["count"] = int(previous.get("count", 1)) + 1
        entry["time"] = datetime.datetime.fromtimestamp(now_ms // 1000, tz=datetime.UTC)
    else:
        entry = {
            "count": 1, "reason": reason, "queue": queue_name,
            "time": datetime.datetime.fromtimestamp(now_ms // 1000, tz=datetime.UTC),
            "exchange": msg.exchange, "routing-keys": [msg.routing_key],
        }
        if props.expiration is not None:
            entry["original-expiration"] = props.expiration
    headers["x-death"] = [entry, *deaths]
    if "x-first-death-reason" not in headers:
        headers["x-first-death-reason"] = reason
        headers["x-first-death-queue"] = queue_name
        headers["x-first-death-exchange"] = msg.exchange
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = queue_name
    headers["x-last-death-exchange"] = msg.exchange
    return dataclasses.replace(props, headers=headers, expiration=None)


def is_cycle(queue_name: str, deaths: list[Any]) -> bool:
    """rabbit_dead_letter:is_cycle: the queue is in x-death and no death up to it was a rejection."""
    for index, death in enumerate(deaths):
        if isinstance(death, dict) and death.get("queue") == queue_name:
            return all(isinstance(d, dict) and d.get("reason") != "rejected" for d in deaths[: index + 1])
    return False
