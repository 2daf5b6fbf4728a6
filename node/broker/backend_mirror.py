"""The mirrored queue backend of a single node: a classic queue an `ha-mode` policy applies to (pure).

What it is for: RabbitMQ 3.x makes a classic queue mirrored through a policy (`ha-mode`, node/broker/ha_policy.py).
`Broker` gives a classic, non-exclusive queue this backend when the policy that applies to it at declare or
recovery has `ha-mode`, and moves it between this backend and the local one when a policy change adds or removes
`ha-mode` (`QueueBackend.hand_over`: both keep the same machine and storage).

How it works: on a single node the mirror has one replica, this node, so it is its own ISR and leader in epoch 0:
every append is committed at once (HW = LEO), which is what RabbitMQ does with a mirrored queue on a one-node
cluster (no mirrors to wait for). The queue machine, its storage, confirms (on the node's persist), paging and
timers are therefore `LocalBackend`'s; this backend adds what the mirror reports (`mirror_status`: leader, epoch,
ISR, HW and each replica's LEO, for management and `raftmq ctl list_queues`). The replica's log is the queue's
sequence of accepted messages: its LEO is the count of message ids the machine handed out.

A cluster's mirrored queues are not this backend's: there every non-exclusive queue is on `ReplicatedBackend`, and
the runtime holds a mirrored queue's log (node/runtime/cluster/mirror_groups.py; docs/mirrored_queues.md).
"""

from __future__ import annotations

from typing import Any

from node.broker import definitions
from node.broker.backend_local import LocalBackend
from node.broker.ha_policy import HaSpec, ha_spec, mirror_replicas, mirror_settings
from node.broker.policies import queue_type_of
from node.broker.queues import QueueState
from node.broker.state import BrokerState
from node.broker.vhost import VHost


def mirror_spec(vhost: VHost[Any] | None, queue: QueueState) -> HaSpec | None:
    """The mirroring the queue's policy asks for; None for a queue that cannot be mirrored (quorum, exclusive:
    RabbitMQ never mirrors exclusive queues) or without an `ha-mode` policy."""
    if vhost is None or queue.exclusive_owner is not None or queue_type_of(queue.arguments) != "classic":
        return None
    policy = vhost.policy_for("queue", queue.name, "classic")
    return ha_spec(policy.definition) if policy is not None else None


class MirrorBackend(LocalBackend):
    """A one-replica mirrored queue on a single node (see the module docstring)."""

    name = "mirror"

    def tick(self, broker: BrokerState) -> None:
        definitions.expire_queues(broker, broker.now_ms, self)  # (the local backend's tick spills under alarm)

    def after_read(self, broker: BrokerState, conn_id: int) -> None:
        """Nothing: the local backend's hook remembers every published queue for credit flow."""

    def status(self, broker: BrokerState, queue: QueueState, node: str) -> dict[str, Any] | None:
        """What the management API shows of the mirror on `node` (this one); None if no `ha-mode` policy applies
        any more."""
        spec = mirror_spec(broker.vhosts.get(queue.vhost), queue)
        if spec is None:
            return None
        replicas = mirror_replicas(spec, (node,), node)
        leo = queue.machine.msg_ids_used
        settings = mirror_settings(spec, len(replicas))
        return {"leader": node, "epoch": 0, "replicas": list(replicas), "isr": [node], "hw": leo,
                "leo": {node: leo}, "min_insync": settings.min_insync, "truncation": settings.truncation,
                "promote_on_failure": settings.promote_on_failure, "sync_mode": spec.sync_mode}


def mirror_status(broker: BrokerState, queue: QueueState, node: str) -> dict[str, Any] | None:
    """The queue's mirror as management on `node` shows it; None for a queue that is not mirrored."""
    backend = queue.backend
    return backend.status(broker, queue, node) if isinstance(backend, MirrorBackend) else None
