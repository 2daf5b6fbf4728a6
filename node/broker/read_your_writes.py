"""Read-your-writes per connection in replicated mode: replies and reads wait for this node's replica.

What it is for: in cluster mode a queue command is a proposal that this node's replica applies later. A client that
got consume-ok, cancel-ok or channel close-ok, or that published, then sends its next command must see the change
(RabbitMQ's guarantee, through the node it is connected to): a message published after cancel-ok must not go to
the cancelled consumer, declare-ok must count the consumer just added and the message just published, queue.delete
if-empty must see that message, a basic.get on another channel must find the message a closed channel gave back.

How:
- Tickets. Every `ProposeQueue` the broker emits while it handles an event of a connection (`proposing_conn`)
  gets a ticket (a token of the broker's token space), remembered per connection and queue in
  `ConnState.unapplied` (ascending), and under the proposal's id (the broker numbers its proposals,
  `BrokerState.new_proposal_id`); when this node's replica applied that proposal id, or the runtime gave it up, the
  ticket is done (`done`). Nothing here reads a clock: `expire` ends tickets older than `TICKET_MAX_MS` of broker time.
- Replies (`GATED_REPLIES`: basic.consume, basic.cancel, basic.recover; and the client's channel.close): the
  channel is gated (`reply_gate.gate`) on the tickets its handler created, so the ok leaves once the replica
  applied them; a consume-ok waits for none of a queue whose group this node leads as its only voter (a classic
  queue's node: `BrokerState.leading` says so), as its Attach commits here before anything proposed after it. A
  definition change made while the replica applied the last of them (the auto-delete of the queue
  a cancel emptied: the machine's `QueueUnused`, carried out by the node whose Detach or Cancel emptied it) adds its Persist token to the gate: cancel-ok then
  also waits for the deletion's commit.
- Reads (`READS`: queue.declare of an existing name, for its counts; queue.delete if-empty / if-unused) of a queue
  the connection has tickets for are *parked*: the channel's events from that one on wait, in order, in
  `broker.parked` until every ticket the connection had for that queue when the read arrived is done (`upto`);
  then the facade runs them (`unparked`).
  Other channels and connections are untouched; a parked channel's later events (publishes too) keep their order.
  A basic.get does not park: it is a proposal itself, sent after the connection's earlier ones to its queue. A
  closing connection runs its parked events at once (`Broker._run_parked`).

Cost on the hot path: a ticket per proposal (a publish batch is one proposal), a few dict operations; reads and
replies only wait when the connection has proposals of that queue in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from node.amqp import methods as m
from node.broker import reply_gate
from node.broker.channel import ConnState
from node.broker.queues import QueueState
from node.broker.state import BrokerState

GATED_REPLIES: Final[frozenset[type]] = frozenset({m.BasicConsume, m.BasicCancel, m.BasicRecover})
READS: Final[frozenset[type]] = frozenset({m.QueueDeclare, m.QueueDelete})
TICKET_MAX_MS: Final = 60_000  # a ticket never reported done (a proposal the runtime never saw) ends after this
TICKETED_MAX: Final = 200_000  # proposals waiting to be applied; beyond, the oldest are forgotten (their tickets end)

QueueKey = tuple[str, str]


@dataclass(slots=True)
class Parked:
    """A channel whose events wait for the connection's earlier proposals to `queue` (mutable state)."""

    queue: QueueKey
    upto: int  # every ticket of the connection for `queue` up to this one must be done
    events: list[Any] = field(default_factory=list)


# --- tickets --------------------------------------------------------------------------------------------------


def issue(broker: BrokerState, conn: ConnState, queue: QueueState, proposal_id: int) -> None:
    """This node's proposal `proposal_id` to `queue` made for `conn`: ticket it (see the module docstring)."""
    ticket = broker.new_token()
    tickets = broker.proposal_tickets
    if len(tickets) >= TICKETED_MAX:
        oldest = list(tickets.items())[: TICKETED_MAX // 2]
        for old_id, old in oldest:
            del tickets[old_id]
            _end(broker, old)
    tickets[proposal_id] = ticket
    key = (queue.vhost, queue.name)
    broker.ticket_owner[ticket] = (conn, key, broker.now_ms)
    waiting = conn.unapplied.get(key)
    if waiting is None:
        conn.unapplied[key] = {ticket: None}
    else:
        waiting[ticket] = None
    sink = broker.ticket_sink
    if sink is not None:
        sink.append(ticket)


def done(broker: BrokerState, proposal_id: int) -> None:
    """This node's proposal `proposal_id` was applied by the local replica, or given up."""
    ticket = broker.proposal_tickets.pop(proposal_id, None)
    if ticket is not None:
        _end(broker, ticket)


def _end(broker: BrokerState, ticket: int) -> None:
    held_gates = broker.held_gates
    if held_gates and ticket in held_gates:
        if broker.records_pending():  # a definition change made meanwhile (auto-delete): the ok waits for it too
            token = broker.pending_token()
            for channel_key in list(held_gates[ticket]):
                if channel_key in broker.held:
                    reply_gate.gate(broker, channel_key, token, 0)
        reply_gate.release(broker, ticket)
    owner = broker.ticket_owner.pop(ticket, None)
    if owner is None:
        return
    conn, key, _issued_ms = owner
    waiting = conn.unapplied.get(key)
    if waiting is not None:
        waiting.pop(ticket, None)
        if not waiting:
            del conn.unapplied[key]
    if broker.parked:
        _check_parked(broker, conn, key)


def expire(broker: BrokerState) -> None:
    """End tickets older than TICKET_MAX_MS (the runtime reports every proposal it was given as applied or given up;
    this is the safety net for one it never saw)."""
    owners = broker.ticket_owner
    if not owners:
        return
    limit = broker.now_ms - TICKET_MAX_MS
    old = []
    for ticket, (_conn, _key, issued_ms) in owners.items():  # issue order
        if issued_ms > limit:
            break
        old.append(ticket)
    for ticket in old:
        _end(broker, ticket)


def forget_connection(broker: BrokerState, conn: ConnState) -> None:
    """The connection is gone: its tickets no longer hold anything of it (they end as usual, finding nothing)."""
    conn.unapplied.clear()
    for key in [k for k in broker.parked if k[0] == conn.conn_id]:
        del broker.parked[key]


# --- replies ---------------------------------------------------------------------------------------------------


def run_reply_gated(broker: BrokerState, conn: ConnState, channel: int, method: Any) -> None:
    """Handle a method of GATED_REPLIES; its channel's effects wait for the tickets the handler created."""
    start = len(broker.out)
    tickets: list[int] = []
    broker.ticket_sink = tickets
    try:
        broker.dispatch_guarded(conn, channel, method)
    finally:
        broker.ticket_sink = None
    if tickets and type(method) is m.BasicConsume:
        tickets = [ticket for ticket in tickets if not _commits_alone(broker, ticket)]
    if tickets and channel in conn.channels:
        gate_replies(broker, (conn.conn_id, channel), tickets, start, method)


def _commits_alone(broker: BrokerState, ticket: int) -> bool:
    """Whether the ticket's proposal goes to a queue whose group this node leads as its only voter: the proposal
    commits here, before anything the connection proposes next, so its consume-ok need not wait for it."""
    owner = broker.ticket_owner.get(ticket)
    return owner is not None and broker.leading.get(owner[1], False)


def gate_replies(broker: BrokerState, key: tuple[int, int], tickets: list[int], from_index: int,
                 method: Any = None) -> None:
    """The channel's effects from `from_index` of `out` on wait until every ticket is done."""
    owners = broker.ticket_owner
    for ticket in tickets:
        if ticket in owners:
            reply_gate.gate(broker, key, ticket, from_index, method)


# --- reads -----------------------------------------------------------------------------------------------------


def parked_for(broker: BrokerState, conn: ConnState, channel: int, method: Any) -> bool:
    """Whether a read must wait: park its channel (the caller then parks the event) and say so."""
    waiting = conn.unapplied
    if not waiting or (type(method) is m.QueueDelete and not (method.if_empty or method.if_unused)):
        return False
    name = method.queue
    if not name:
        ch = conn.channels.get(channel)
        if ch is None or type(method) is m.QueueDeclare:  # a server-named queue is new: nothing to wait for
            return False
        name = ch.last_queue
    key = (conn.vhost, name)
    if key not in waiting:
        return False
    broker.parked[(conn.conn_id, channel)] = Parked(key, broker.last_token())
    return True


def _check_parked(broker: BrokerState, conn: ConnState, key: QueueKey) -> None:
    waiting = conn.unapplied.get(key)
    first = next(iter(waiting)) if waiting else None
    for park_key, park in list(broker.parked.items()):
        if park_key[0] == conn.conn_id and park.queue == key and (first is None or first > park.upto):
            del broker.parked[park_key]
            broker.unparked.append((park_key, park.events))
