"""The broker's state, below every handler module: `BrokerConfig` and `BrokerState` (pure, no I/O).

`BrokerState` holds what one node's broker knows (users, vhosts, connections, channels, consumers, what waits for
storage or for the queue groups, the effects of the running entry point in `out`) and the small helpers every
handler module calls on it: `persist` (one `Persist` per entry point), `check_access`, `vhost_of`, `mark_dirty`,
fresh ids and names. What differs between a single node and a cluster node is a queue's backend
(node/broker/backend.py, installed by `Broker`) plus three flags named for what they mean (`global_ids`,
`definitions_shared`, `reads_wait_for_replica`). Handler modules (definitions, delivery, publish, paging,
policy_apply, recovery, committed_definitions, replica*, reply_gate) take a `BrokerState` and import nothing above
them; `Broker` (node/broker/broker.py), the facade the runtime calls, subclasses it, dispatches events to the
handlers and supplies the operations that need them (`dispatch_guarded`, `delete_queue`, `close_channel_state`,
abstract here).
"""

from __future__ import annotations

import base64
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from cluster.queue.envelope import PROPOSAL_IDS_PER_BOOT
from cluster.queue.ids import ConsumerId, GetterId
from node.amqp.auth import parse_sasl_response
from node.broker import user_limits, vhost_limits
from node.broker.auth import Permission, UserStore
from node.broker.channel import ChannelState, ConnState, Consumer
from node.broker.effects import Effect, Persist
from node.broker.errors import AmqpError
from node.broker.queues import QueueState
from node.broker.records import PermissionRecord, Record, UserRecord, VHostRecord
from node.broker.vhost import VHost


def counter_rng(seed: bytes = b"raftmq") -> Callable[[int], bytes]:
    """A deterministic byte source (sha256 of seed + counter); the runtime may inject os.urandom instead."""
    state = {"n": 0}

    def rng(n_bytes: int) -> bytes:
        out = b""
        while len(out) < n_bytes:
            state["n"] += 1
            out += hashlib.sha256(seed + state["n"].to_bytes(8, "big")).digest()
        return out[:n_bytes]

    return rng


@dataclass(slots=True)
class BrokerConfig:
    default_vhost: str = "/"
    default_user: str = "guest"
    default_pass: str = "guest"
    loopback_users: frozenset[str] = frozenset({"guest"})
    rng: Callable[[int], bytes] = field(default_factory=counter_rng)
    consumer_credit_window: int = 256  # deliveries a consumer may be handed ahead of the runtime's writes
    tx_messages_max: int = 65536
    dead_letter_hops_max: int = 10000  # per entry point; bounds dead-letter cascades
    node_name: str = ""  # replicated mode: this node's name (ids of consumers, getters and publishers)
    boot_id: int = 0  # replicated mode: different at every start of the node
    replicated: bool = False  # every queue a replica: commands go out as ProposeQueue (docs/cluster.md)
    queue_messages_in_memory_max: int = 10_000  # per stored queue; past it messages wait on disk (0: never)
    publish_flow_ready_max: int = 1024  # a publisher is read more slowly while its queue has more ready (0: never)
    publish_flow_inflight_max: int = 2048  # replicated: ... or this node has more publishes to it in flight (0: never)
    durable_replies: bool = True  # definition replies wait for on_persisted (reply_gate.py; cluster: metadata commit)
    # cluster mode: (user, password) of the nodes' internal login (cluster/authlink/amqp_login.py), None: none
    internal_login: tuple[str, str] | None = None
    # (user, password) of the links' login to their own node (`amqp://` shovels and federation links; the same
    # module): configure, write and read in any existing vhost. None: none
    link_login: tuple[str, str] | None = None


@dataclass(slots=True)
class HeldReplies:
    """One channel's held effects and the Persist tokens they wait for (mutable state, not a message)."""

    tokens: set[int]
    from_index: int  # effects of the running entry point's `out` from this index on are held (0 afterwards)
    effects: list[Effect] = field(default_factory=list)
    class_id: int = 0  # the method that gated the channel first: named in the channel error of `fail`
    method_id: int = 0


@dataclass(slots=True)
class FlowPause:
    """A connection the broker paused: the queues it waits for, and the backlog's progress."""

    queues: list[QueueState]
    since_ms: int
    backlog: int  # the lowest ready + in-flight (this node's) of `queues` seen during the pause
    inflight: int  # this node's publishes in flight to `queues` at the last look
    applied: int  # entries of `queues` the local replica had applied when the clock last moved on
    progress_ms: int  # the stall clock: when the backlog last fell to a new low, moved on while nothing was applied
    looked_ms: int  # when the clock last moved on (entry points between share the broker's now_ms)


class BrokerState(ABC):
    """One node's broker state and the helpers the handler modules share (see the module docstring)."""

    publish_route: Callable[..., list[int]]  # routes and enqueues one publish (set by Broker: single node or replica)
    choose_backend: Callable[[QueueState], Any]  # the QueueBackend (node/broker/backend.py) for a new queue (Broker)

    def __init__(self, config: BrokerConfig | None = None) -> None:
        self.config = config or BrokerConfig()
        self.users = UserStore(loopback_users=self.config.loopback_users)
        self.vhosts: dict[str, VHost[QueueState]] = {}
        self.conns: dict[int, ConnState] = {}
        self.consumers: dict[Hashable, Consumer] = {}
        self.getters: dict[Hashable, ChannelState] = {}
        self.reply_tokens: dict[str, ChannelState] = {}
        self.persist_waiters: dict[int, list[tuple[ChannelState, int]]] = {}
        self.held: dict[tuple[int, int], HeldReplies] = {}  # channels whose replies wait (reply_gate)
        self.held_gates: dict[int, list[tuple[int, int]]] = {}  # Persist token -> channels it holds
        # Replicated mode, the owner barrier (broker.py): channels whose events wait for a metadata read barrier,
        # the channels each barrier token releases, and the close-oks each token releases (conn ids).
        self.deferred: dict[tuple[int, int], list[Any]] = {}
        self.deferred_gates: dict[int, list[tuple[tuple[int, int], list[Any]]]] = {}
        self.close_oks: dict[int, list[int]] = {}
        self.dirty: dict[tuple[int, int], ChannelState] = {}
        self.dead_letters: list[tuple[QueueState, Any]] = []
        self.alarms: set[str] = set()
        self.out: list[Effect] = []
        self._batch: list[Record] | None = None  # records of the open Persist (see `persist`)
        self._batch_token = 0
        self._batch_index = 0
        self.open_batches: list[Any] = []  # replicated: publish batches to seal before `out` leaves (replica_wire)
        self.now_ms = 0
        self._next_consumer_id = 1
        self._next_token = 1
        self._next_proposal_id = self.config.boot_id * PROPOSAL_IDS_PER_BOOT
        # Set by Broker from the node's mode, once (node/broker/broker.py, `_choose_backends`):
        self.backends: tuple[Any, ...] = ()  # the QueueBackends in use; their per-broker hooks run from the facade
        self.global_ids = False  # consumer, getter and publisher ids name this node and boot (other nodes see them)
        self.definitions_shared = False  # every definition goes to the cluster's metadata, which may be ahead of us
        self.reads_wait_for_replica = False  # replies and reads wait until this node applied the conn's proposals
        self.gate_replies = self.config.durable_replies  # cluster mode: until the metadata group committed
        self.publishers: dict[Hashable, ChannelState] = {}  # replicated: publisher id -> its channel
        self.detaching: dict[Hashable, None] = {}  # replicated: local consumer ids whose Detach is proposed
        self.detach_retries: dict[Hashable, int] = {}  # replicated: abandoned Detach proposals sent again
        self.down_consumers: dict[Hashable, None] = {}  # replicated: ids of down nodes, to detach when leader
        # replicated: (vhost, queue) whose local replica leads -> whether it is the group's only voter too
        self.leading: dict[tuple[str, str], bool] = {}
        # replicated: getter id -> (channel waiting, queue, no_ack, the Get's proposal id)
        self.pending_gets: dict[Hashable, tuple[ChannelState, QueueState, bool, int]] = {}
        self.confirm_batch: dict[int, tuple[ChannelState, list[int], list[int]]] = {}  # replicated: acks, nacks
        self.paging: dict[str, QueueState] = {}  # queue stream -> queue with a paged tail (node/broker/paging.py)
        self.next_page_request = 0
        self.policy_sent: dict[tuple[str, str], tuple[Any, int]] = {}  # replicated: SetArgs proposed, and when
        self.policy_checked_ms = 0  # replicated: when `tick` last compared leader queues with their policies
        self.flow_touched: dict[int, QueueState] = {}  # queues enqueued into by the running entry point, by id
        self.trace_vhosts: set[str] = set()  # vhosts with Firehose tracing on, on this node (node/broker/trace.py)
        self.trace_node = ""  # this node's name in the trace headers
        # Monotonic counters for Prometheus (node/runtime/metrics.py): publishes routed to a queue, unroutable ones
        # dropped or returned (mandatory), and publisher confirms (acks) sent.
        self.messages_routed = 0
        self.messages_unroutable_dropped = 0
        self.messages_unroutable_returned = 0
        self.messages_confirmed = 0
        self.flow_routes: dict[int, list[QueueState]] = {}  # conn_id -> queues its last read published to
        self.flow_paused: dict[int, FlowPause] = {}  # replicated: connections not read (credit_flow)
        self.flow_quiet: dict[int, int] = {}  # replicated: conn_id -> no pauses before this now_ms (a stalled one)
        self.flow_pauses = 0  # replicated: publisher connections paused, and pauses ended by a stall
        self.flow_pauses_stalled = 0
        # replicated: read-your-writes per connection (read_your_writes.py)
        self.proposing_conn: ConnState | None = None  # the connection whose event is being handled
        self.ticket_sink: list[int] | None = None  # tickets of the running handler, when its replies wait for them
        self.proposal_tickets: dict[int, int] = {}  # proposal id -> ticket, until applied or given up
        self.ticket_owner: dict[int, tuple[ConnState, tuple[str, str], int]] = {}  # ticket -> (conn, queue, ms)
        self.parked: dict[tuple[int, int], Any] = {}  # channels whose events wait (read_your_writes.Parked)
        self.unparked: list[tuple[tuple[int, int], list[Any]]] = []  # parked events free to run now, in order

    # --- set-up and administration ---------------------------------------------------------------------------

    def add_vhost(self, name: str) -> VHost[QueueState]:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VHost.create(name)
            self.persist((VHostRecord(name),))
        return vhost

    def set_tracing(self, vhost: str, on: bool, node: str) -> None:
        """Firehose tracing of `vhost` on this node on or off (node/broker/trace.py; node-local, not persisted)."""
        self.trace_node = node
        if on:
            self.trace_vhosts.add(vhost)
        else:
            self.trace_vhosts.discard(vhost)

    def set_vhost_limits(self, name: str, limits: dict[str, int]) -> None:
        """Replace the vhost's limits (validated by the caller: node/broker/vhost_limits.py); KeyError if none."""
        vhost = self.vhosts[name]
        vhost.limits = dict(limits)
        self.persist((VHostRecord(name, limits=dict(limits)),))

    def connection_limit_reached(self, vhost: str) -> int | None:
        """The vhost's max-connections when its open connections on this node reach it, else None."""
        found = self.vhosts.get(vhost)
        if found is None or vhost_limits.MAX_CONNECTIONS not in found.limits:
            return None
        count = sum(1 for conn in self.conns.values() if conn.opened and conn.vhost == vhost)
        return vhost_limits.reached(found.limits, vhost_limits.MAX_CONNECTIONS, count)

    def add_user(self, name: str, password: str, tags: tuple[str, ...] = ()) -> None:
        user = self.users.add_user(name, password, tags, self.config.rng(4))
        self.persist((UserRecord(user.name, user.password_hash, user.tags,
                                 limits=dict(self.users.limits.get(name, {}))),))

    def set_user_limits(self, name: str, limits: dict[str, int]) -> None:
        """Replace the user's limits (validated by the caller: node/broker/user_limits.py); KeyError if none."""
        user = self.users.users[name]
        self.users.set_limits(name, limits)
        self.persist((UserRecord(user.name, user.password_hash, user.tags, limits=dict(limits)),))

    def user_limit_reached(self, username: str, name: str, own: int = 0) -> int | None:
        """The user's limit `name` (max-connections, max-channels) when what the user holds on this node reaches
        it, else None; `own` adds what the asking connection holds that the broker has not heard of yet."""
        limits = self.users.limits.get(username)
        if not limits or name not in limits:
            return None
        conns = [c for c in self.conns.values() if c.opened and c.username == username]
        if name == user_limits.MAX_CONNECTIONS:
            return user_limits.reached(limits, name, len(conns))
        return user_limits.reached(limits, name, own + sum(len(c.channels) for c in conns))

    def forget_permission_caches(self) -> None:
        """After a permission or user change: every connection checks its permissions afresh."""
        for conn in self.conns.values():
            conn.permission_cache.clear()
            for ch in conn.channels.values():
                ch.write_ok.clear()

    def set_permissions(self, user: str, vhost: str, permission: Permission) -> None:
        self.users.set_permissions(user, vhost, permission)
        self.forget_permission_caches()
        p = permission
        self.persist((PermissionRecord(user, vhost, p.configure, p.write, p.read),))

    # --- authenticator protocol -----------------------------------------------------------------------------

    def check_login(self, mechanism: str, response: bytes, peer_is_loopback: bool) -> str | None:
        if mechanism == "EXTERNAL":  # the response is the verified certificate's login name (node/amqp/auth.py)
            name = response.decode("utf-8", "surrogateescape")
            if name not in self.users.users or (name in self.users.loopback_users and not peer_is_loopback):
                return None
            return name
        parsed = parse_sasl_response(mechanism, response)
        if parsed is None:
            return None
        user = self.users.authenticate_plain(parsed[0], parsed[1], peer_is_loopback)
        return user.name if user is not None else None

    def vhost_access(self, username: str, vhost: str) -> bool:
        return vhost in self.vhosts and self.users.vhost_access(username, vhost)

    # --- helpers shared by the handler modules --------------------------------------------------------------

    def new_consumer_id(self) -> Hashable:
        """A fresh consumer id: an int, or with `global_ids` a `ConsumerId(node_name, boot_id, n)`."""
        cid = self._next_consumer_id
        self._next_consumer_id += 1
        if self.global_ids:
            return ConsumerId(self.config.node_name, self.config.boot_id, cid)
        return cid

    def new_getter_id(self) -> GetterId:
        """A fresh id for one basic.get of a Raft queue, `GetterId(node_name, boot_id, n)` (n from the consumers'
        counter: a getter id never holds a consumer id's values)."""
        n = self._next_consumer_id
        self._next_consumer_id += 1
        return GetterId(self.config.node_name, self.config.boot_id, n)

    def new_proposal_id(self) -> int:
        """This node's number for its next queue proposal (`ProposeQueue`): ids start at boot_id *
        PROPOSAL_IDS_PER_BOOT, so a restarted node never reuses an id of its earlier life."""
        proposal_id = self._next_proposal_id
        self._next_proposal_id += 1
        return proposal_id

    def new_token(self) -> int:
        token = self._next_token
        self._next_token += 1
        return token

    def last_token(self) -> int:
        """The latest token handed out (Persist tokens and proposal tickets share this space)."""
        return self._next_token - 1

    def random_name(self, prefix: str) -> str:
        return prefix + base64.urlsafe_b64encode(self.config.rng(16)).decode("ascii").rstrip("=")

    def persist(self, records: tuple[Record, ...] | list[Record]) -> int:
        """Queue records for storage; returns the token `on_persisted` will report.

        Every record written during one entry point goes into one `Persist` (one token), placed where the first
        of them was: records keep their order, so each stream sees exactly what it saw with one Persist each,
        and storage and confirms handle one token where they would have handled hundreds.
        """
        batch = self._batch
        if batch is None:
            self._batch = list(records)
            self._batch_token = token = self.new_token()
            self._batch_index = len(self.out)
            self.out.append(Persist(token, ()))  # placeholder, filled by _close_batch
            return token
        batch.extend(records)
        return self._batch_token

    def records_pending(self) -> int:
        """How many records the open Persist holds (0 when none is open)."""
        return len(self._batch) if self._batch is not None else 0

    def pending_token(self) -> int:
        """The token of the open Persist (meaningful while `records_pending()` is above 0)."""
        return self._batch_token

    def _close_batch(self) -> None:
        batch = self._batch
        if batch is not None:
            self._batch = None
            self.out[self._batch_index] = Persist(self._batch_token, tuple(batch))

    def seal_proposals(self) -> None:
        """Replicated mode: every publish batch still open puts its final `EnqueueMany` in `out` (replica_wire.Batch:
        an effect is never changed once the runtime may see it)."""
        for batch in self.open_batches:
            batch.seal()
        self.open_batches.clear()

    def vhost_of(self, conn: ConnState) -> VHost[QueueState]:
        vhost = self.vhosts.get(conn.vhost)
        if vhost is None:
            raise AmqpError(320, f"vhost '{conn.vhost}' is gone", connection=True)
        return vhost

    def check_access(self, conn: ConnState, access: str, kind: str, name: str) -> None:
        key = (access, kind, name)
        allowed = conn.permission_cache.get(key)
        if allowed is None and conn.internal:  # the nodes' internal login publishes, nothing else (auth docstring)
            allowed = access == "write"
        elif allowed is None and conn.link:  # a link's login to its own node may do everything (RabbitMQ's "none")
            allowed = True
        if allowed is None:
            allowed = self.users.allowed(conn.username, conn.vhost, access, name)  # type: ignore[arg-type]
            if len(conn.permission_cache) > 1024:
                conn.permission_cache.clear()
            conn.permission_cache[key] = allowed
        if not allowed:
            shown = name or "amq.default"
            raise AmqpError(
                403, f"{access} access to {kind} '{shown}' in vhost '{conn.vhost}' refused for user '{conn.username}'"
            )

    def mark_dirty(self, ch: ChannelState) -> None:
        self.dirty[(ch.conn_id, ch.number)] = ch

    # --- supplied by the facade (Broker), which knows the handlers -----------------------------------------

    @abstractmethod
    def dispatch_guarded(self, conn: ConnState, channel: int, method: Any) -> None:
        """Run a method's handler; an AmqpError becomes a channel or connection close."""

    @abstractmethod
    def delete_queue(self, queue: QueueState) -> None:
        """Delete the queue as queue.delete does (`definitions.delete_queue`); delivery, below definitions,
        deletes a queue its machine reported unused or expired (`QueueUnused`, `QueueExpired`) through this."""

    @abstractmethod
    def close_channel_state(self, conn: ConnState, number: int) -> None:
        """Forget a channel: its consumers detach, its unacked messages go back, what waits on it is dropped."""
