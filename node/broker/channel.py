"""Per-connection and per-channel broker state (plain mutable records; the logic lives in the handler modules).

A channel numbers its deliveries (`next_delivery_tag`), remembers what each unacked tag refers to (queue, consumer
id, msg id), holds its consumers, QoS limits, flow state, confirm and tx state, and a bounded `pending` buffer of
deliveries the queue handed over that the channel may not send yet (flow off, socket not draining, or the
channel-global prefetch full). Consumer ids are broker-wide ints (replicated mode: (node, boot_id, n)); a channel
also owns one id for basic.get (replicated mode: every basic.get has its own id).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cluster.queue import MsgId
from node.broker.queues import QueueState


class Message(NamedTuple):
    """What the broker keeps per published message (the queue machine's opaque payload).

    A named tuple rather than a frozen dataclass: one is built per publish, and a tuple is several times cheaper.
    """

    exchange: str
    routing_key: str
    properties: Any
    body: bytes


class Unacked(NamedTuple):
    """What one unacked delivery tag refers to (one per delivery, hence a tuple)."""

    queue: QueueState
    consumer_id: Hashable
    msg_id: MsgId
    consumer: Consumer | None


@dataclass(slots=True)
class Consumer:
    consumer_id: Hashable  # an int; replicated mode: (node, boot_id, n)
    tag: str
    conn_id: int
    channel: ChannelState
    queue: QueueState
    no_ack: bool
    prefetch: int
    priority: int
    exclusive: bool
    credit: int = 0
    window: int = 0  # the credit it is topped up to (delivery.credit_window); 0 until its first grant
    granted: bool = False  # has had its first credit window
    unacked_count: int = 0
    cancelled: bool = False


@dataclass(slots=True)
class PendingDelivery:
    consumer: Consumer
    msg_id: MsgId
    message: Message
    redelivered: bool


@dataclass(slots=True)
class PendingPublish:
    """Replicated mode: a confirmed or transactional publish waiting for its target queues' Accepted."""

    confirm_seq: int  # 0 when not in confirm mode
    commit_id: int  # 0 outside a transaction
    targets: dict[tuple[str, str], Any] = field(default_factory=dict)  # (vhost, queue) -> its latest Enqueue
    sequences: list[int] = field(default_factory=list)  # every publish sequence it was proposed under
    resent: set[tuple[str, str]] = field(default_factory=set)  # re-proposed after a restore: Duplicate = done
    nacked: bool = False


@dataclass(slots=True)
class TxState:
    publishes: list[tuple[Any, Any, bytes]] = field(default_factory=list)
    acks: list[tuple[int, Unacked, str, bool]] = field(default_factory=list)  # (tag, unacked, kind, requeue)


@dataclass(slots=True)
class ChannelState:
    conn_id: int
    number: int
    get_consumer_id: Hashable
    next_delivery_tag: int = 1
    unacked: dict[int, Unacked] = field(default_factory=dict)  # keys ascending (tags grow; rollback re-sorts)
    consumers: dict[str, Consumer] = field(default_factory=dict)
    lingering: list[Consumer] = field(default_factory=list)  # cancelled, still holding unacked messages
    prefetch_consumer: int = 0
    prefetch_channel: int = 0
    pending: deque[PendingDelivery] = field(default_factory=deque)
    confirm: bool = False
    next_publish_seq: int = 1
    confirm_floor: int = 0
    confirm_waiting: dict[int, int] = field(default_factory=dict)  # seq -> persist token
    tx: TxState | None = None
    commits_waiting: dict[int, int] = field(default_factory=dict)  # tx.commit id -> Persist tokens unreported
    next_commit_id: int = 1
    last_queue: str = ""
    get_no_ack: bool = False
    reply_to_tag: str | None = None
    reply_to_token: str | None = None
    closed: bool = False
    conn: ConnState | None = None  # the owning connection (saves a lookup per delivery)
    write_ok: set[str] = field(default_factory=set)  # exchanges this channel may publish to (permission cache)
    publisher_id: Hashable = None  # replicated mode: a ChannelPublisherId(node, boot_id, conn_id, channel)
    repl_waiting: dict[int, PendingPublish] = field(default_factory=dict)  # replicated: publish sequence -> waiter


@dataclass(slots=True)
class ConnState:
    conn_id: int
    peer_host: str
    peer_is_loopback: bool
    username: str = ""
    vhost: str = ""
    opened: bool = False
    channels: dict[int, ChannelState] = field(default_factory=dict)
    writable: bool = True
    has_published: bool = False
    cancel_notify: bool = False
    blocked: bool = False
    permission_cache: dict[tuple[str, str, str], bool] = field(default_factory=dict)
    publish_seqs: dict[int, int] = field(default_factory=dict)  # replicated: channel -> last publish sequence
    metadata_confirmed: bool = False  # replicated: a method replayed after a metadata barrier (queue_lookup)
    # replicated: queue (vhost, name) -> tickets of this connection's proposals the local replica has not applied
    # yet, ascending (node/broker/read_your_writes.py)
    unapplied: dict[tuple[str, str], dict[int, None]] = field(default_factory=dict)
    internal: bool = False  # logged in with the nodes' internal login (cluster/authlink/amqp_login.py)
    link: bool = False  # logged in with the links' login to their own node (the same module)
