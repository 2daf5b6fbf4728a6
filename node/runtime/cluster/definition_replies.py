"""What a client hears when a definition change fails in cluster mode, and which queues die with a node.

`refusal_reply` / `not_committed_text`: the channel error for a metadata refusal or a command not committed in
time; `uncommitted_creations`: the deletion records that take the broker back to the committed metadata after a
failed Persist; `died_with_earlier_life`: the queues deleted at a node's start (its connections' exclusive queues,
its non-durable classic queues), as in RabbitMQ; `dies_with_its_node`: such a non-durable classic queue, whose Raft
group is therefore volatile (no fsync for its entries). Pure functions of the metadata state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from cluster.metadata import model as md
from node.broker import records as br
from node.clustering.definitions import broker_record

# A definition change the metadata group cannot commit closes the client's channel (`Broker.on_persist_failed`):
# 541 INTERNAL_ERROR as RabbitMQ answers a declare its metadata store / quorum cannot carry out; a refusal
# gets the code of its reason (404 a missing exchange or queue, 406 a conflicting definition).
INTERNAL_ERROR, NOT_FOUND, PRECONDITION_FAILED = 541, 404, 406
EXCLUSIVE_OWNER_SEPARATOR = "/"  # exclusive owners are "<node>/<boot_id>/<conn_id>" (node/broker/records.py)

def not_committed_text(command: md.Command, timeout_s: float) -> str:
    return (f"INTERNAL_ERROR - {type(command).__name__} not committed by the cluster metadata within "
            f"{timeout_s:.0f} s (no majority of nodes reachable?)")


def refusal_reply(command: md.Command, refused: str) -> tuple[int, str]:
    """The channel error for a metadata refusal (the reason's wording is `cluster.metadata.model`'s)."""
    if "exists with a different definition" in refused:
        return PRECONDITION_FAILED, f"PRECONDITION_FAILED - {refused}"
    if refused.startswith("no "):
        return NOT_FOUND, f"NOT_FOUND - {refused}"
    return INTERNAL_ERROR, f"INTERNAL_ERROR - cluster metadata refused {type(command).__name__}: {refused}"


def uncommitted_creations(records: Iterable[Any], state: md.MetadataState) -> list[Any]:
    """Deletion records for what `records` created (exchanges, queues, bindings) that `state` lacks: the broker
    applied a failed Persist at once, and must not keep definitions the cluster never recorded. Bindings first."""
    undo: list[Any] = []
    committed_bindings: list[Any] | None = None
    for record in records:
        if getattr(record, "deleted", True):
            continue
        if isinstance(record, br.BindingRecord):
            if committed_bindings is None:
                committed_bindings = [broker_record("bindings", b) for b in state.bindings.values()]
            if record not in committed_bindings:
                undo.insert(0, dataclasses.replace(record, deleted=True))
        elif isinstance(record, br.QueueRecord | br.ExchangeRecord):
            committed = state.queues if isinstance(record, br.QueueRecord) else state.exchanges
            if (record.vhost, record.name) not in committed:
                undo.append(dataclasses.replace(record, deleted=True))
    return undo


def died_with_earlier_life(state: md.MetadataState, node: str) -> list[md.QueueRecord]:
    """At `node`'s start, the queues that died with its earlier life (as in RabbitMQ): the exclusive queues of its
    connections, and its non-durable classic queues (their one member was this node)."""
    return [queue for queue in state.queues.values()
            if owned_by(queue.exclusive_owner, node)
            or (dies_with_its_node(queue) and (queue.members or (queue.leader,)) == (node,))]


def dies_with_its_node(queue: md.QueueRecord) -> bool:
    """A non-durable classic queue: its one member's next life deletes it (`died_with_earlier_life`), so its Raft
    group is volatile (its entries need no fsync: cluster/raft/core/image.py `must_sync`), as RabbitMQ keeps such a
    queue's messages off the disk."""
    return not queue.durable and queue.type == "classic" and len(queue.members or (queue.leader,)) == 1


def owned_by(owner: str, node: str) -> bool:
    """Whether an exclusive owner id names a connection of `node`."""
    return bool(owner) and owner.startswith(node + EXCLUSIVE_OWNER_SEPARATOR)
