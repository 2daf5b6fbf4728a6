"""Per-vhost limits, as RabbitMQ's `rabbitmqctl set_vhost_limits` (pure).

What it is for: an operator caps a vhost's client connections (`max-connections`) and queues (`max-queues`).
How it works: a vhost's limits are a small dict kept on its `VHost` and stored with its `VHostRecord` (single node:
the definitions stream; cluster: the metadata group's vhost record, mirrored into every broker). A negative value
means no limit and 0 refuses every new connection or queue, as in RabbitMQ. The checks live where RabbitMQ makes
them: connection.open after the vhost access check (530 NOT_ALLOWED), and queue.declare of a queue that does not
exist yet (406 PRECONDITION_FAILED); the texts are RabbitMQ's. In a cluster, `max-queues` counts the cluster's
queues (every broker mirrors them all) but `max-connections` counts the connections of the node that checks
(docs/configuration.md, "Limits").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node.broker import limits as limits_table
from node.broker.limits import LimitError

MAX_CONNECTIONS = "max-connections"
MAX_QUEUES = "max-queues"
LIMIT_NAMES = (MAX_CONNECTIONS, MAX_QUEUES)


class VhostLimitError(LimitError):
    """An unknown limit name or a value that is not an integer."""


def validate(limits: Mapping[str, Any]) -> dict[str, int]:
    """The limits as a plain dict; VhostLimitError names the first bad entry."""
    return limits_table.validate(limits, LIMIT_NAMES, VhostLimitError)


reached = limits_table.reached


def queue_refusal(queue: str, vhost: str, limit: int) -> str:
    return f"cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({limit}) is reached"
