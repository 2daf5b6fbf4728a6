"""The broker model: one object per node holding users, vhosts, connections and channels (pure, no I/O).

The runtime calls `open_connection`, then `handle(conn_id, event, now_ms)` for every event `ServerConnection`
produced, `tick(now_ms)` periodically, `on_persisted(token)` when storage made a `Persist` durable, `set_alarm` from
its resource probes and `set_writable(conn_id, writable)` as the connection's output buffer fills and drains. Every
entry point returns the effects to carry out, in order. AMQP errors raised while handling a method become
`CloseChannel`/`CloseConnection` effects with RabbitMQ's reply code and text.

`Broker` is the facade on top of `BrokerState` (node/broker/state.py: the fields and the helpers handlers share).
Handlers live in `definitions` (exchanges, queues, bindings), `delivery` (consume, ack, get, qos, flow, credit) and
`publish` (routing, confirms, tx, dead-lettering, direct reply-to); they take the state and append to its `out`.
`method_table` maps each AMQP channel method to its handler; `authenticator` is the per-connection login check.
The modules are layered (docs/ARCHITECTURE.md, "Inside node/broker"; `.importlinter` contract `broker-layers`).

Storage is batched: every record written during one entry point shares one `Persist` (one token), placed where the
first record was, records in order. A definition change's reply waits for its token (`reply_gate`: the channel's
effects are held until `on_persisted`; `on_persist_failed` closes the channel instead, cluster mode). `handle_many` (one read's events) and `on_persisted_many` (one commit's tokens)
let the runtime widen both batches: the effects are those of calling `handle`/`on_persisted` one at a time, except
for fewer Persist tokens and confirms coalesced into multiple acks.

The owner barrier (replicated mode; `reply_gate`, docs/ARCHITECTURE.md "Exclusive queues in a cluster"): a method
meeting what this node's definitions may be behind on (`MetadataUnconfirmed`) waits for a metadata read barrier.

Queue backends (node/broker/backend.py; docs/ARCHITECTURE.md, "Queue backends"): every queue gets its backend
when declared or recovered, from `_choose_backends`, the one place that reads the node's mode
(`BrokerConfig.replicated`). A single node's queues are `LocalBackend`s; a cluster node's are `ReplicatedBackend`s
(docs/cluster.md): queue commands come out as `ProposeQueue` effects and committed entries come back, as
`cluster.queue.envelope` envelopes, through `apply_committed`; its exclusive queues are node-local
(`OwnedBackend`/`RemoteBackend`, backend_owned.py). The entry points of the cluster are thin wrappers over `replica`,
`replica_publish`, `replica_control` (queues) and `committed_definitions` (definitions from other nodes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from cluster.queue.envelope import Envelope
from cluster.queue.ids import ChannelPublisherId
from node.amqp import events as ev
from node.amqp import methods as m
from node.broker import (
    committed_definitions,
    credit_flow,
    definitions,
    delivery,
    method_table,
    paged_tail,
    paging,
    policies,
    policy_apply,
    publish,
    read_your_writes,
    recovery,
    replica,
    replica_control,
    replica_publish,
    replica_wire,
    reply_gate,
)
from node.broker.auth import Permission
from node.broker.authenticator import ConnAuthenticator
from node.broker.backend_local import LocalBackend, publish_flow_behind
from node.broker.backend_mirror import MirrorBackend, mirror_spec
from node.broker.backend_owned import OwnedBackend, RemoteBackend, forward_outcome
from node.broker.backend_replicated import ReplicatedBackend
from node.broker.channel import ChannelState, ConnState
from node.broker.effects import Block, CloseChannel, CloseConnection, Effect, Send, Unblock
from node.broker.errors import AmqpError, MetadataUnconfirmed
from node.broker.queues import QueueState
from node.broker.records import ParameterRecord, PolicyRecord, Record
from node.broker.state import BrokerConfig as BrokerConfig  # (imported from here by the runtime and tests)
from node.broker.state import BrokerState


def alarm_reason(kind: str) -> str:
    """The connection.blocked reason RabbitMQ gives ("low on memory", "low on disk")."""
    return f"low on {kind}"


class Broker(BrokerState):
    """The facade the runtime calls (see the module docstring); the state and its helpers are `BrokerState`'s."""

    def __init__(self, config: BrokerConfig | None = None) -> None:
        super().__init__(config)
        self.parameters: dict[tuple[str, str, str], str] = {}  # (component, vhost, name) -> JSON (single node)
        self.handlers = method_table.HANDLERS
        self.parking = True  # reads may park (read_your_writes); off while a closing connection's parked run
        self.envelope_codec = replica_wire.envelope_codec(self.config.node_name)  # queue log entries (cluster mode)
        self._choose_backends()
        self._bootstrap()

    def _choose_backends(self) -> None:
        """The one place the node's mode is looked at: which queue backend new and recovered queues get, and the
        broker-wide consequences of a cluster (ids, shared definitions, read-your-writes, the replicated publish
        path and basic.get through the log)."""
        if not self.config.replicated:
            local, mirror = LocalBackend(), MirrorBackend()
            self.backends = (local, mirror)
            self.choose_backend = lambda queue: (
                mirror if mirror_spec(self.vhosts.get(queue.vhost), queue) is not None else local)
            self.publish_route = publish.route_publish
            return
        replicated, owned, remote = ReplicatedBackend(), OwnedBackend(), RemoteBackend()
        self.backends = (replicated, owned, remote)  # (replicated first: its after_read runs the credit flow of every queue)
        self.choose_backend = lambda queue: (  # node-local exclusive queues: node/broker/backend_owned.py
            replicated if queue.exclusive_owner is None else owned if type(queue.exclusive_owner) is int else remote)
        self.publish_route = replica_publish.route_publish
        self.handlers = {**method_table.HANDLERS, **replica.HANDLERS}
        self.global_ids = self.definitions_shared = self.reads_wait_for_replica = True

    # --- set-up and administration ---------------------------------------------------------------------------

    def _bootstrap(self) -> None:
        cfg = self.config
        self.add_vhost(cfg.default_vhost)
        self.add_user(cfg.default_user, cfg.default_pass, ("administrator",))
        self.set_permissions(cfg.default_user, cfg.default_vhost, Permission())
        self.take_effects()

    def set_policy(self, vhost: str, name: str, pattern: str, apply_to: str | None, definition: dict[str, Any],
                   priority: int | None) -> bool:
        """Add or replace a policy and apply it (True: it is new). PolicyError if invalid, KeyError for an unknown
        vhost; nothing changes then. The record is queued for storage (collect it with `take_effects`)."""
        policy = policies.make_policy(vhost, name, pattern, apply_to, definition, priority)
        if vhost not in self.vhosts:
            raise KeyError(vhost)
        created = name not in self.vhosts[vhost].policies
        policy_apply.put_policy(self, policy)
        self.persist((policies.record_of(policy),))
        self._settle_round()  # (dead letters a new limit made)
        return created

    def clear_policy(self, vhost: str, name: str) -> bool:
        """Remove a policy (False: there was none); objects revert to their own arguments."""
        if not policy_apply.remove_policy(self, vhost, name):
            return False
        self.persist((PolicyRecord(vhost, name, deleted=True),))
        self._settle_round()
        return True

    def set_parameter(self, component: str, vhost: str, name: str, value_json: str) -> bool:
        """Store a runtime parameter (validated by its component's owner before; True: it is new). KeyError for
        an unknown vhost. The record is queued for storage (collect it with `take_effects`)."""
        if vhost not in self.vhosts:
            raise KeyError(vhost)
        key = (component, vhost, name)
        created = key not in self.parameters
        self.parameters[key] = value_json
        self.persist((ParameterRecord(component, vhost, name, value_json),))
        return created

    def clear_parameter(self, component: str, vhost: str, name: str) -> bool:
        """Remove a runtime parameter (False: there was none)."""
        if self.parameters.pop((component, vhost, name), None) is None:
            return False
        self.persist((ParameterRecord(component, vhost, name, deleted=True),))
        return True

    def take_effects(self) -> list[Effect]:
        self._close_batch()
        if self.open_batches:
            self.seal_proposals()
        out, self.out = self.out, []
        return reply_gate.divert(self, out) if self.held else out

    # --- authenticator protocol -----------------------------------------------------------------------------

    def authenticator_for(self, conn_id: int) -> ConnAuthenticator:
        return ConnAuthenticator(self, conn_id)

    def authenticate(self, mechanism: str, response: bytes) -> str | None:
        """Peer-agnostic form: treats the peer as non-loopback (use `authenticator_for` per connection)."""
        return self.check_login(mechanism, response, False)

    # --- entry points ---------------------------------------------------------------------------------------

    def open_connection(self, conn_id: int, peer_host: str, peer_is_loopback: bool) -> None:
        self.conns[conn_id] = ConnState(conn_id, peer_host, peer_is_loopback)

    def handle(self, conn_id: int, event: Any, now_ms: int) -> list[Effect]:
        if now_ms > self.now_ms:
            self.now_ms = now_ms
        conn = self.conns.get(conn_id)
        if conn is None:
            return []
        if type(event) is ev.ContentReceived and not self.parked and not self.deferred:  # the hot path, one level less
            self.proposing_conn = conn
            try:
                self._guarded(conn, event.channel, event.method, publish.handle_publish, event)
            finally:
                self.proposing_conn = None
        else:
            self._handle_event(conn, event)
        return self._finish()

    def handle_many(self, conn_id: int, events: list[Any], now_ms: int) -> list[Effect]:
        """`handle` for each event in turn (one read's worth), with the same effects in the same order, except
        that every record written for the whole list shares one `Persist` (one token, one confirm round)."""
        self.now_ms = max(self.now_ms, now_ms)
        touched = self.flow_touched
        touched.clear()
        for event in events:
            conn = self.conns.get(conn_id)
            if conn is None:
                break
            self._handle_event(conn, event)
            self._settle_round()
        for backend in self.backends:
            backend.after_read(self, conn_id)
        return self._finish()

    def publish_flow_behind(self, conn_id: int) -> int:
        """Credit flow for the runtime, single node (`backend_local.publish_flow_behind`): the ready messages of the
        fullest queue behind its draining consumers that this connection's last read published to, or 0."""
        return publish_flow_behind(self, conn_id)

    def _handle_event(self, conn: ConnState, event: Any) -> None:
        """One event of the connection, or deferred behind its channel's metadata barrier (the owner barrier), or
        parked behind its channel's waiting read (read_your_writes)."""
        if self.deferred and reply_gate.deferring(self, conn, event):
            return
        parked = self.parked
        if parked:
            channel = getattr(event, "channel", None)
            park = parked.get((conn.conn_id, channel)) if channel is not None else None
            if park is not None:
                park.events.append(event)
                return
            if type(event) is ev.ConnectionClosed:
                self._run_parked(conn)
        self.proposing_conn = conn
        try:
            self._run_event(conn, event)
        finally:
            self.proposing_conn = None

    def _run_event(self, conn: ConnState, event: Any) -> None:
        kind = type(event)
        if kind is ev.ContentReceived:
            self._guarded(conn, event.channel, event.method, publish.handle_publish, event)
        elif kind is ev.MethodReceived:
            method = event.method
            method_kind = type(method)
            if (conn.unapplied and method_kind in read_your_writes.READS and self.parking
                    and read_your_writes.parked_for(self, conn, event.channel, method)):
                self.parked[(conn.conn_id, event.channel)].events.append(event)
            elif method_kind in reply_gate.GATED_METHODS and self.gate_replies:
                reply_gate.run_gated(self, conn, event.channel, method)
            elif method_kind in read_your_writes.GATED_REPLIES and self.reads_wait_for_replica:
                read_your_writes.run_reply_gated(self, conn, event.channel, method)
            else:
                self._guarded(conn, event.channel, method, self._dispatch, method)
        elif kind is ev.ChannelOpened:
            reply_gate.drop_channel(self, (conn.conn_id, event.channel))
            self._open_channel(conn, event.channel)
        elif kind is ev.ChannelClosed:
            key = (conn.conn_id, event.channel)
            reply_gate.drop_channel(self, key)
            tickets: list[int] = []
            self.ticket_sink = tickets if event.by_client else None
            try:
                self.close_channel_state(conn, event.channel)
            finally:
                self.ticket_sink = None
            if event.by_client:  # after our replies (and a Close of ours) for what the client sent before it
                if tickets:  # close-ok once this node's replica applied what the close proposed (read_your_writes)
                    read_your_writes.gate_replies(self, key, tickets, len(self.out))
                self.out.append(Send(conn.conn_id, event.channel, m.ChannelCloseOk()))
        elif kind is ev.ConnectionOpened:
            conn.username, conn.vhost, conn.opened = event.username, event.vhost, True
            capabilities = event.client_properties.get("capabilities")
            if isinstance(capabilities, dict):
                conn.cancel_notify = bool(capabilities.get("consumer_cancel_notify", False))
        elif kind is ev.ConnectionClosed:
            written = self.records_pending()
            self._connection_closed(conn)
            if event.by_client:  # after our replies (a channel's Close) for what the client sent before it
                reply_gate.answer_connection_close(self, conn.conn_id, written)

    def tick(self, now_ms: int) -> list[Effect]:
        self.now_ms = max(self.now_ms, now_ms)
        for backend in self.backends:
            backend.tick(self)
        for conn in self.conns.values():
            for ch in conn.channels.values():
                self.dirty[(conn.conn_id, ch.number)] = ch
        return self._finish()

    def next_deadline_ms(self) -> int | None:
        """The earliest time `tick` has work to do (message TTL or x-expires), if any."""
        best: int | None = None
        for backend in self.backends:
            due = backend.next_deadline_ms(self)
            if due is not None and (best is None or due < best):
                best = due
        return best

    def on_persisted(self, token: int) -> list[Effect]:
        if self.held_gates:
            reply_gate.release(self, token)
        waiters = self.persist_waiters.pop(token, None)
        if waiters:
            publish.persisted_many(self, waiters)
        if self.deferred_gates or self.close_oks:
            reply_gate.barrier_passed(self, token, self._handle_event)
            self._settle_round()
        return self._finish()

    def on_persist_failed(self, token: int, reply_code: int, reply_text: str) -> list[Effect]:
        """`token`'s records will never be durable (cluster mode: the metadata group refused them or did not
        commit them in time): each channel whose replies wait for it is closed with this channel error instead
        of answering ok (reply_gate.fail). Anything else waiting for the token proceeds as `on_persisted`."""
        if self.held_gates:
            reply_gate.fail(self, token, reply_code, reply_text)
        return self.on_persisted(token)

    def on_persisted_many(self, tokens: Iterable[int]) -> list[Effect]:
        """`on_persisted` for every token one commit covered, at once: a channel's publishes they complete are
        confirmed together (a contiguous run is one multiple ack instead of one ack per token)."""
        waiters: list[tuple[ChannelState, int]] = []
        for token in tokens:
            if self.held_gates:
                reply_gate.release(self, token)
            found = self.persist_waiters.pop(token, None)
            if found:
                waiters.extend(found)
        if waiters:
            publish.persisted_many(self, waiters)
        if self.deferred_gates or self.close_oks:
            for token in tokens:
                reply_gate.barrier_passed(self, token, self._handle_event)
            self._settle_round()
        return self._finish()

    def set_alarm(self, kind: str, active: bool) -> list[Effect]:
        was_on = bool(self.alarms)
        if active:
            self.alarms.add(kind)
        else:
            self.alarms.discard(kind)
        if self.alarms and not was_on:
            reason = alarm_reason(kind)
            for conn in self.conns.values():
                if conn.has_published and not conn.blocked:
                    conn.blocked = True
                    self.out.append(Block(conn.conn_id, reason))
        elif not self.alarms and was_on:
            for conn in self.conns.values():
                if conn.blocked:
                    conn.blocked = False
                    self.out.append(Unblock(conn.conn_id))
        if kind == paging.MEMORY_ALARM:
            paging.memory_alarm(self)  # messages already in memory go to disk (then at every tick)
        return self._finish()

    def set_writable(self, conn_id: int, writable: bool) -> list[Effect]:
        """The runtime's output buffer for the connection is over (False) or back under (True) its limit.

        Calling it with True after each flush also tops up consumer credit, so deliveries keep flowing in
        windows of `consumer_credit_window` per consumer and the broker never holds unbounded data for a slow
        client.
        """
        conn = self.conns.get(conn_id)
        if conn is not None:
            conn.writable = writable
            if writable:
                for ch in conn.channels.values():
                    self.dirty[(conn_id, ch.number)] = ch
        return self._finish()

    def recover(self, records: list[Record]) -> list[Effect]:
        """Rebuild from storage's records; returns the `PageIn` effects of queues recovered with a tail."""
        for param in (r for r in records if type(r) is ParameterRecord):
            key = (param.component, param.vhost, param.name)
            if param.deleted:
                self.parameters.pop(key, None)
            else:
                self.parameters[key] = param.value
        stored_policies = [r for r in records if type(r) is PolicyRecord]
        recovery.recover(self, [r for r in records if type(r) is not PolicyRecord] if stored_policies else records)
        self._batch = None
        self.open_batches.clear()
        self.out.clear()
        policy_apply.apply_records(self, stored_policies)  # (a policy's limits may drop recovered messages)
        return self._finish()

    def on_tail_offsets(self, items: list[tuple[str, int, int]]) -> list[Effect]:
        """Storage appended paged-out records: (stream, msg_id, log offset) each, in append order."""
        paged_tail.on_tail_offsets(self, items)
        return self._finish()

    def on_paged_in(self, vhost: str, queue: str, request_id: int, records: list[Any]) -> list[Effect]:
        """The records a `PageIn` asked for, decoded, in its order."""
        paging.on_paged_in(self, vhost, queue, request_id, records)
        return self._finish()

    # --- replicated mode (docs/cluster.md, "node/broker, replicated mode"; the logic is in `replica`) -------

    def apply_committed(self, vhost: str, queue: str, envelopes: Iterable[Envelope]) -> list[Effect]:
        """A Raft group's committed entries, in log order, read by `envelope_codec` (the broker is entered once per
        applied batch; confirms it releases are coalesced). An unknown queue ignores them."""
        replica.apply_committed(self, vhost, queue, envelopes)
        return self._finish_replicated()

    def proposal_abandoned(self, vhost: str, queue: str, envelope: Envelope) -> list[Effect]:
        """The runtime gave up on a proposal: a publish waiting on it is nacked, a get answered get-empty."""
        replica.proposal_abandoned(self, vhost, queue, envelope)
        return self._finish_replicated()

    def forward_outcome(self, vhost: str, queue: str, publisher_id: Any, sequence: int, acked: bool) -> list[Effect]:
        """The owner's node confirmed (or nacked) a `ForwardPublish` of this node (backend_owned.py)."""
        forward_outcome(self, vhost, queue, publisher_id, sequence, acked)
        return self._finish_replicated()

    def queue_snapshot(self, vhost: str, queue: str, sealed: bool | None = None) -> bytes:
        return replica_control.snapshot(self, vhost, queue, sealed)

    def queue_msg_id_span(self, vhost: str, queue: str) -> tuple[int, int | None] | None:
        """(next message id, oldest one still in the queue or None) of a replicated queue here; None: not one."""
        return replica_control.msg_id_span(self, vhost, queue)

    def queue_sealed(self, vhost: str, queue: str) -> bool:
        """The queue's replica applied the seal of its log (cluster/queue/seal.py)."""
        return replica_control.sealed(self, vhost, queue)

    def seal_queue(self, vhost: str, queue: str) -> list[Effect]:
        """Propose the seal of the queue's log (it moves to a mirror log: docs/mirrored_queues.md)."""
        replica_control.seal(self, vhost, queue)
        return self._finish_replicated()

    def queue_restore(self, vhost: str, queue: str, data: bytes) -> list[Effect]:
        """Replace the queue's replica with a snapshot (b"": empty); local consumers and waiters resync."""
        replica_control.restore(self, vhost, queue, data)
        return self._finish_replicated()

    def set_queue_leader(self, vhost: str, queue: str, is_local_leader: bool, alone: bool = False) -> list[Effect]:
        """`alone`: this node is the queue group's only voter as well as its leader (a classic queue's node)."""
        replica_control.set_leader(self, vhost, queue, is_local_leader, alone)
        if is_local_leader:
            policy_apply.resend_leader_policies(self, (vhost, queue))
        return self._finish_replicated()

    def keep_transient(self, vhost: str, queue: str) -> None:
        """Cluster: the queue's log outlives its nodes (a mirrored queue's ISR log, node/runtime/cluster/
        mirror_groups.py), so its transient messages survive a leader change, as on RabbitMQ's mirrors: no new
        leader drops them as an earlier life's (`replica_control._drop_transient_of_earlier_life`)."""
        vh = self.vhosts.get(vhost)
        q = vh.queues.get(queue) if vh is not None else None
        if q is not None:
            q.transient_checked = True

    def node_down(self, node: str) -> list[Effect]:
        replica_control.node_down(self, node)
        return self._finish_replicated()

    def apply_records(self, records: Iterable[Record]) -> list[Effect]:
        """Definitions committed by other nodes, mirrored without persisting (policies after the rest)."""
        records = list(records)
        mirrored_policies = [r for r in records if type(r) is PolicyRecord]
        committed_definitions.apply_records(self, [r for r in records if type(r) is not PolicyRecord])
        policy_apply.apply_records(self, mirrored_policies)
        return self._finish_replicated()

    def _finish_replicated(self) -> list[Effect]:
        replica_publish.flush_confirms(self)
        return self._finish()

    # --- what BrokerState leaves to the facade (the handler modules call these) -----------------------------

    def dispatch_guarded(self, conn: ConnState, channel: int, method: Any) -> None:
        """Run a method's handler; an AmqpError becomes a channel or connection close."""
        self._guarded(conn, channel, method, self._dispatch, method)

    def delete_queue(self, queue: QueueState) -> None:
        definitions.delete_queue(self, queue)

    # --- internals ------------------------------------------------------------------------------------------

    def _run_parked(self, conn: ConnState | None = None) -> None:
        """Run parked events: those whose wait is over (`unparked`), or every parked event of `conn`, which is
        closing (nothing of it waits any more: its reads see what the replica has)."""
        if conn is not None:
            for key in [k for k in self.parked if k[0] == conn.conn_id]:
                self.unparked.append((key, self.parked.pop(key).events))
        while self.unparked:
            (conn_id, _channel), events = self.unparked.pop(0)
            owner = self.conns.get(conn_id)
            if owner is None:
                continue
            self.parking = conn is None or conn_id != conn.conn_id  # (a closing connection's reads wait for nothing)
            try:
                for event in events:
                    self._handle_event(owner, event)
            finally:
                self.parking = True
            self._settle_round()

    def _guarded(self, conn: ConnState, channel: int, method: Any, fn: Callable[..., None], arg: Any) -> None:
        ch = conn.channels.get(channel)
        if ch is None or ch.closed:
            return
        try:
            fn(self, conn, ch, arg)
        except MetadataUnconfirmed:
            event = arg if type(arg) is ev.ContentReceived else ev.MethodReceived(channel, method)
            reply_gate.defer(self, conn, channel, event)
        except AmqpError as err:
            class_id = getattr(method, "CLASS_ID", 0)
            method_id = getattr(method, "METHOD_ID", 0)
            if err.connection:
                self.out.append(CloseConnection(conn.conn_id, err.reply_code, err.reply_text, class_id, method_id))
                for number in list(conn.channels):
                    self.close_channel_state(conn, number)
            else:
                self.out.append(CloseChannel(conn.conn_id, channel, err.reply_code, err.reply_text, class_id,
                                             method_id))
                self.close_channel_state(conn, channel)

    @staticmethod
    def _dispatch(broker: Broker, conn: ConnState, ch: ChannelState, method: Any) -> None:
        handler = broker.handlers.get(type(method))
        if handler is None:
            name = type(method).__name__
            raise AmqpError(540, f"method {name} not implemented by the broker", connection=True)
        handler(broker, conn, ch, method)

    def _open_channel(self, conn: ConnState, number: int) -> None:
        old = conn.channels.get(number)
        if old is not None:
            self.close_channel_state(conn, number)
        get_id = self.new_consumer_id()
        ch = ChannelState(conn.conn_id, number, get_id, conn=conn)
        conn.channels[number] = ch
        self.getters[get_id] = ch
        if self.global_ids:
            ch.publisher_id = ChannelPublisherId(self.config.node_name, self.config.boot_id, conn.conn_id, number)
            self.publishers[ch.publisher_id] = ch

    def close_channel_state(self, conn: ConnState, number: int) -> None:
        ch = conn.channels.pop(number, None)
        if ch is None:
            return
        ch.closed = True
        delivery.channel_gone(self, ch)
        self.getters.pop(ch.get_consumer_id, None)
        if ch.publisher_id is not None and self.publishers.get(ch.publisher_id) is ch:
            del self.publishers[ch.publisher_id]
        if ch.reply_to_token is not None:
            self.reply_tokens.pop(ch.reply_to_token, None)
        self.dirty.pop((conn.conn_id, number), None)

    def _connection_closed(self, conn: ConnState) -> None:
        for number in list(conn.channels):
            self.close_channel_state(conn, number)
        definitions.delete_exclusive_queues(self, conn)
        self.conns.pop(conn.conn_id, None)
        if self.held:
            reply_gate.drop_connection(self, conn.conn_id)
        self.flow_routes.pop(conn.conn_id, None)
        if conn.unapplied or self.parked:
            read_your_writes.forget_connection(self, conn)
        if self.flow_paused or self.flow_quiet:
            credit_flow.forget(self, conn.conn_id)

    def _settle_round(self) -> None:
        """What every entry point ends with: dead letters republished, credit topped up, pending drained."""
        if self.dead_letters:
            publish.run_dead_letters(self)
        if self.dirty:
            delivery.refill_dirty(self)
            if self.dead_letters:
                publish.run_dead_letters(self)

    def _finish(self) -> list[Effect]:
        if self.unparked:
            self._run_parked()
        if self.dead_letters or self.dirty:
            self._settle_round()
        if self.paging:
            paged_tail.issue_reads(self)  # (the PageIns the queue machines asked for)
        if self._batch is not None:
            self._close_batch()
        if self.flow_paused:
            credit_flow.recheck(self)
        if self.open_batches:
            self.seal_proposals()
        out = self.out
        self.out = []
        return reply_gate.divert(self, out) if self.held else out

