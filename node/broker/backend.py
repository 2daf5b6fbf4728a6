"""The queue backend interface: what the broker's handlers ask of whatever holds a queue's messages (pure).

A queue's backend is chosen once, when the queue is declared or recovered (`BrokerState.choose_backend`, installed
by the `Broker` facade), and kept in `QueueState.backend`. Handlers (definitions, delivery, publish, policy_apply,
paging) never ask which mode the node runs in: they call the queue's backend for what differs between backends.

- `LocalBackend` (node/broker/backend_local.py): the queue machine lives in this process and commands apply at
  once; storage is the node's own (records, paging). A single node's queues.
- `ReplicatedBackend` (node/broker/backend_replicated.py): the queue machine is a replica of the queue's log;
  commands are proposed (`ProposeQueue`) and take effect when committed entries come back
  (`Broker.apply_committed`). Every non-exclusive queue of a cluster: quorum and classic queues (a Raft group) and
  mirrored queues (a mirror log, committed below its high watermark; the runtime tells the two apart).
- `OwnedBackend` / `RemoteBackend` (node/broker/backend_owned.py): a cluster's exclusive queues, node-local: held
  in process on the owner connection's node, forwarded to from the others.
- `MirrorBackend` (node/broker/backend_mirror.py): a classic queue an `ha-mode` policy applies to, on a single
  node (one replica: the local machine, plus the mirror's leader/epoch/ISR/HW/LEO for management).

Every method takes the broker state and the queue as arguments; a backend holds no per-queue state itself (what
a queue needs lives on its `QueueState`). The per-broker hooks run for every backend in `BrokerState.backends`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Any

from node.broker.channel import ChannelState, Consumer
from node.broker.queues import QueueState
from node.broker.state import BrokerState
from node.broker.vhost import VHost


class PublishPath(Enum):
    """Where a publish routed to a queue goes, as this node sees the queue (`QueueBackend.publish_path`)."""

    ENQUEUE = "enqueue"  # into the queue's machine in this process, at once
    PROPOSE = "propose"  # an `Enqueue` proposed to the queue's log (`ProposeQueue`)
    FORWARD = "forward"  # to the node that holds the queue (`ForwardPublish`): it holds nothing here


class QueueBackend(ABC):
    """What holds one queue's messages (see the module docstring)."""

    name: str = ""  # a label for diagnostics; handlers ask the properties below, never the name
    can_page = False  # may keep a backlog on disk (node/broker/paging.py)
    publish_path = PublishPath.ENQUEUE

    # --- a queue's life ----------------------------------------------------------------------------------------

    @abstractmethod
    def create(self, broker: BrokerState, vhost: VHost[QueueState], queue: QueueState) -> None:
        """Install the queue's machine (and what else it needs) and write its definition if this backend keeps
        it; the queue is not in the vhost yet."""

    @abstractmethod
    def delete(self, broker: BrokerState, queue: QueueState) -> None:
        """The queue is gone from its vhost (bindings and consumers already dropped): forget what waits on it and
        write its definition's deletion if this backend keeps it."""

    @abstractmethod
    def purge(self, broker: BrokerState, ch: ChannelState, queue: QueueState, nowait: bool) -> None:
        """queue.purge (checked by the handler): drop the ready messages and answer queue.purge-ok on `ch` (unless
        `nowait`), now or once the purge took effect."""

    @abstractmethod
    def get(self, broker: BrokerState, ch: ChannelState, queue: QueueState, no_ack: bool) -> None:
        """basic.get (checked by the handler): answer get-ok or get-empty on `ch`, now or once the Get took effect."""

    @abstractmethod
    def declared(self, broker: BrokerState, queue: QueueState) -> None:
        """queue.declare (new or again) of this queue: tell its machine (`Declare`, a use for x-expires)."""

    # --- questions the handlers ask ----------------------------------------------------------------------------

    @abstractmethod
    def consumer_count(self, queue: QueueState) -> int:
        """The consumers queue.declare-ok reports and exclusive / if-unused checks see (every node's)."""

    def credit_window(self, window: int, consumer: Consumer, prefetch: int) -> int:
        """The credit window of a consumer with `prefetch` (0: none), starting from the configured `window`."""
        return window

    @abstractmethod
    def apply_args(self, broker: BrokerState, queue: QueueState, merged: dict[str, Any]) -> None:
        """Bring the queue's machine to the effective arguments `merged` (its own under the vhost's policies)."""

    def hand_over(self, queue: QueueState, to: QueueBackend) -> bool:
        """A policy change asks for backend `to` (`BrokerState.choose_backend`): move the queue there if the two
        share its machine and storage (a backend and its subclass, e.g. local and single-node mirrored); False:
        it keeps this backend for life."""
        if isinstance(to, type(self)) or isinstance(self, type(to)):
            queue.backend = to
            return True
        return False

    # --- per-broker hooks (run for every backend in `BrokerState.backends`) ------------------------------------

    @abstractmethod
    def tick(self, broker: BrokerState) -> None:
        """Timers of this backend's queues (`broker.now_ms` is current)."""

    @abstractmethod
    def next_deadline_ms(self, broker: BrokerState) -> int | None:
        """The earliest time `tick` has work to do, if any."""

    @abstractmethod
    def after_read(self, broker: BrokerState, conn_id: int) -> None:
        """After one read's events of `conn_id`: credit flow for the queues it published to (`flow_touched`)."""


def expiry_deadline_ms(broker: BrokerState, backend: QueueBackend) -> int | None:
    """The earliest message expiry or queue expiry (`x-expires`, while the queue has no consumer: the machine's
    `next_expiry_ms()`) among the queues `backend` holds in this process: `next_deadline_ms` of the backends whose
    machines live here."""
    best: int | None = None
    for vhost in broker.vhosts.values():
        for queue in vhost.queues.values():
            if queue.backend is not backend:
                continue
            due = queue.machine.next_expiry_ms()
            if due is not None and (best is None or due < best):
                best = due
    return best


def backend_of(queue: QueueState) -> QueueBackend:
    """The queue's backend, typed (`QueueState.backend` is `Any`: node/broker/queues.py sits below this module)."""
    backend: QueueBackend = queue.backend
    return backend
