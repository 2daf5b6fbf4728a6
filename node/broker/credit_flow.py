"""Credit flow in replicated mode: a publisher is not read while a queue it publishes to is behind (pure).

What it is for: in cluster mode a publish costs the node a read and a proposal, and its delivery costs a Raft round,
an apply and a write, all on one thread; a publisher's reads can outrun the deliveries, and the queue then grows
for as long as the publisher keeps up its pace (end-to-end latency growing with the run). As RabbitMQ's credit flow
(reader -> channel -> queue) and the single node's (`Broker.publish_flow_behind`), a publisher whose target queue is
behind is not read again until it caught up, so its messages wait in the client and the kernel, not in the queue.

How it works: the decision is the broker's, the mechanics the runtime's. After a read (`after_read`, from
`handle_many`) the broker looks at the queues that read published to (`Broker.flow_touched`); when one is over its
bound it emits `PauseReading(conn_id)`, and the runtime stops reading that connection until `ResumeReading`. A
queue is over its bound when this node's in-flight publishes to it (proposed here, not yet applied by the local
replica: the replicated path and the apply backlog; `QueueState.flow_inflight`) exceed `publish_flow_inflight_max`,
or when it has consumers (on any node: the replica knows them all) and the local replica's ready messages
(committed, not delivered: the same on every replica once applied, so a publisher on a follower sees a backlog that
builds up on the leader's node) exceed `publish_flow_ready_max`. At the end of every entry point (`recheck`) each
paused connection's queues are looked at again: it is resumed once every one is at or under half its bounds
(hysteresis: a resumed publisher gets more than one read in); or when nothing of this node's is in flight to them
any more and their backlog (ready + in flight) has not fallen to a new low for `FLOW_STALL_MS` of activity (the local replica applied entries
of them, yet the backlog stays: its consumers are stuck, e.g. a requeue loop; as RabbitMQ, a queue may grow behind
them), after which that connection is not paused for `FLOW_QUIET_MS`; or, as a safety net, after
`FLOW_PAUSE_MAX_MS` (a consumer that stopped acking: nothing happens at all), also followed by `FLOW_QUIET_MS`.
Neither publishes in flight nor time in which the replica applied nothing count as a stall: the node itself is
behind then (a loaded node may apply nothing for seconds), and in-flight publishes always end, applied or given up
after `proposal_timeout_ms`. A connection consuming from an over-bound
queue is never paused for it (its own acks drain it). Time is the broker's `now_ms`; `next_deadline_ms` makes the
runtime tick when a stall or the safety net is due.
"""

from __future__ import annotations

from typing import Final

from node.broker.effects import PauseReading, ResumeReading
from node.broker.queues import QueueState
from node.broker.state import BrokerState, FlowPause

FLOW_STALL_MS: Final = 3000  # a pause ends when the backlog did not go down for this long (slow consumers)
FLOW_PAUSE_MAX_MS: Final = 30_000  # a pause ends after this long whatever the backlog (safety net)
FLOW_QUIET_MS: Final = 10_000  # after a stalled pause: no pauses of that connection for this long
FLOW_QUEUES_MAX: Final = 64  # queues one read's publishes are looked at for


def inflight_done(queue: QueueState, messages: int) -> None:
    """Publishes proposed here that the local replica applied (or that were given up). Never below 0: a
    proposal given up may commit after all, and a snapshot install skips entries (the count is then reset)."""
    queue.flow_inflight = max(0, queue.flow_inflight - messages)


def _live(broker: BrokerState, queue: QueueState) -> bool:
    vhost = broker.vhosts.get(queue.vhost)
    return vhost is not None and vhost.queues.get(queue.name) is queue


def _over(broker: BrokerState, queue: QueueState, fraction: int) -> bool:
    """Over `1/fraction` of its bounds (fraction 1: the pause threshold, 2: the resume threshold)."""
    config = broker.config
    inflight_max = config.publish_flow_inflight_max
    if inflight_max > 0 and queue.flow_inflight > inflight_max // fraction:
        return True
    ready_max = config.publish_flow_ready_max
    if ready_max <= 0:
        return False
    machine = queue.machine
    return bool(machine.ready_count > ready_max // fraction and machine.consumer_count)


def _counts(queues: list[QueueState]) -> tuple[int, int]:
    """(ready messages, this node's publishes in flight) of `queues`."""
    return sum(int(q.machine.ready_count) for q in queues), sum(q.flow_inflight for q in queues)


def _applied(queues: list[QueueState]) -> int:
    return sum(q.flow_applied for q in queues)


def _consumes_from(broker: BrokerState, conn_id: int, queue: QueueState) -> bool:
    conn = broker.conns.get(conn_id)
    if conn is None:
        return False
    return any(consumer.queue is queue for ch in conn.channels.values() for consumer in ch.consumers.values())


def after_read(broker: BrokerState, conn_id: int) -> None:
    """After one read's events of `conn_id`: pause it when a queue it published to is over its bounds."""
    touched = broker.flow_touched
    if not touched:
        return
    queues = list(touched.values())[:FLOW_QUEUES_MAX]
    touched.clear()
    if conn_id in broker.flow_paused or conn_id not in broker.conns:
        return
    quiet_until = broker.flow_quiet.get(conn_id)
    if quiet_until is not None:
        if broker.now_ms < quiet_until:
            return
        del broker.flow_quiet[conn_id]
    over = [q for q in queues if _over(broker, q, 1) and not _consumes_from(broker, conn_id, q)]
    if not over:
        return
    now_ms = broker.now_ms
    ready, inflight = _counts(over)
    broker.flow_paused[conn_id] = FlowPause(over, now_ms, ready + inflight, inflight, _applied(over), now_ms, now_ms)
    broker.flow_pauses += 1
    broker.out.append(PauseReading(conn_id))


def recheck(broker: BrokerState) -> None:
    """Resume every paused connection whose queues caught up, or whose pause stalled."""
    now_ms = broker.now_ms
    for conn_id, pause in list(broker.flow_paused.items()):
        if conn_id not in broker.conns:
            del broker.flow_paused[conn_id]
            continue
        queues = [q for q in pause.queues if _live(broker, q) and _over(broker, q, 2)]
        if queues:
            ready, inflight = _counts(queues)
            applied = _applied(queues)
            if ready + inflight < pause.backlog:  # (applying moves in-flight publishes to ready: no change)
                pause.progress_ms, pause.backlog = now_ms, ready + inflight
            elif now_ms > pause.looked_ms and applied == pause.applied:
                pause.progress_ms += now_ms - pause.looked_ms  # nothing applied meanwhile: idle, not stuck
            if now_ms > pause.looked_ms:
                pause.applied, pause.looked_ms = applied, now_ms
            pause.queues, pause.inflight = queues, inflight
            expired = now_ms - pause.since_ms >= FLOW_PAUSE_MAX_MS
            if not expired and (inflight or now_ms - pause.progress_ms < FLOW_STALL_MS):
                continue
            broker.flow_pauses_stalled += 1
            broker.flow_quiet[conn_id] = now_ms + FLOW_QUIET_MS
        del broker.flow_paused[conn_id]
        broker.out.append(ResumeReading(conn_id))


def next_deadline_ms(broker: BrokerState) -> int | None:
    """When the earliest pause stalls (the runtime ticks then), if any connection is paused."""
    if not broker.flow_paused:
        return None
    return min(_due_ms(pause) for pause in broker.flow_paused.values())


def _due_ms(pause: FlowPause) -> int:
    safety_ms = pause.since_ms + FLOW_PAUSE_MAX_MS
    if pause.inflight:
        return safety_ms
    return min(max(pause.progress_ms + FLOW_STALL_MS, pause.looked_ms + FLOW_STALL_MS // 4), safety_ms)


def forget(broker: BrokerState, conn_id: int) -> None:
    """A closed connection."""
    broker.flow_paused.pop(conn_id, None)
    broker.flow_quiet.pop(conn_id, None)
