"""How policies reach the broker's queues (pure; the broker calls these, node/broker/policies.py has the rules).

The vhost keeps its policies by name; a change re-applies every queue the changed policy's old or new pattern
matches (`apply_to_queue`): its effective arguments become `QueueArgs`, and when they differ from the machine's, a
local queue's backend applies `SetArgs` to the machine at once while for a Raft queue only its leader proposes it
(`propose_if_leader`, re-proposed from `tick` each second while the replica still differs, and on gaining
leadership), so all replicas change at one log index. Stored (recovery) and mirrored (cluster metadata) policy records come in through
`apply_records`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from cluster.queue import SetArgs
from cluster.queue.types import QueueArgs
from node.broker.backend import backend_of
from node.broker.policies import (
    Policy,
    effective_queue_arguments,
    from_record,
    queue_type_of,
)
from node.broker.queues import QueueState
from node.broker.records import PolicyRecord
from node.broker.state import BrokerState
from node.broker.vhost import VHost

POLICY_RESEND_MS: Final = 1000  # replicated mode: a SetArgs not applied by then is proposed again


def queue_policy(vhost: VHost[Any], queue: QueueState) -> Policy | None:
    return vhost.policy_for("queue", queue.name, queue_type_of(queue.arguments))


def effective_of(vhost: VHost[Any], queue: QueueState) -> dict[str, Any]:
    """The queue's effective x-arguments under the vhost's policies."""
    qtype = queue_type_of(queue.arguments)
    return effective_queue_arguments(queue.arguments, vhost.policy_for("queue", queue.name, qtype), qtype)


def apply_to_queue(broker: BrokerState, vhost: VHost[Any], queue: QueueState) -> None:
    """Bring the queue's machine to the arguments its policy gives (x-expires among them).

    The queue's backend applies them (`QueueBackend.apply_args`): a local queue's machine at once, a Raft queue
    through its leader's `SetArgs` proposal (`propose_if_leader`)."""
    chosen = broker.choose_backend(queue)
    if chosen is not queue.backend:
        backend_of(queue).hand_over(queue, chosen)  # (ha-mode added or removed: node/broker/backend_mirror.py)
    merged = effective_of(vhost, queue)
    backend_of(queue).apply_args(broker, queue, merged)


def propose_if_leader(broker: BrokerState, queue: QueueState, wanted: QueueArgs) -> None:
    key = (queue.vhost, queue.name)
    if not queue.is_leader or queue.machine.args == wanted:
        broker.policy_sent.pop(key, None)
        return
    sent = broker.policy_sent.get(key)
    if sent is not None and sent[0] == wanted and broker.now_ms - sent[1] < POLICY_RESEND_MS:
        return
    broker.policy_sent[key] = (wanted, broker.now_ms)
    queue.machine.apply(SetArgs(wanted, broker.now_ms))


def apply_to_vhost(broker: BrokerState, vhost: VHost[Any], changed: Iterable[Policy]) -> None:
    """Re-apply the policies to the vhost's queues after the `changed` policies (old and new versions) changed:
    only a queue whose name one of them matches can have another policy now. Routing forgets cached AEs."""
    vhost.invalidate()
    patterns = [p for p in changed if p.apply_to != "exchanges"]
    for queue in list(vhost.queues.values()):
        if any(p.matches_name(queue.name) for p in patterns):
            apply_to_queue(broker, vhost, queue)


def resend_leader_policies(broker: BrokerState, only: tuple[str, str] | None = None) -> None:
    """Replicated mode: leader queues (all, or `only`) whose replica has other arguments than their policy gives
    propose SetArgs (again): from `tick` (a lost or abandoned proposal) and when leadership is gained."""
    for vhost_name, name in [only] if only is not None else list(broker.leading):
        vhost = broker.vhosts.get(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        if vhost is not None and queue is not None and queue.is_leader:
            apply_to_queue(broker, vhost, queue)


def put_policy(broker: BrokerState, policy: Policy) -> bool:
    """Store (or replace) a policy and re-apply; False when its vhost is unknown."""
    vhost = broker.vhosts.get(policy.vhost)
    if vhost is None:
        return False
    old = vhost.policies.get(policy.name)
    vhost.policies[policy.name] = policy
    apply_to_vhost(broker, vhost, (policy,) if old is None else (policy, old))
    return True


def remove_policy(broker: BrokerState, vhost_name: str, name: str) -> bool:
    """Drop a policy and re-apply (objects revert to their own arguments); False when there was none."""
    vhost = broker.vhosts.get(vhost_name)
    old = vhost.policies.pop(name, None) if vhost is not None else None
    if vhost is None or old is None:
        return False
    apply_to_vhost(broker, vhost, (old,))
    return True


def apply_records(broker: BrokerState, records: Iterable[PolicyRecord]) -> None:
    """Stored (recovery) or mirrored (cluster metadata) policy records, in order; nothing is persisted."""
    for record in records:
        if record.deleted:
            remove_policy(broker, record.vhost, record.name)
            continue
        policy = from_record(record)
        if policy is not None:
            put_policy(broker, policy)
