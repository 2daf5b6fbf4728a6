"""Per-user limits, as RabbitMQ 3.10's `rabbitmqctl set_user_limits` (pure).

What it is for: an operator caps a user's client connections (`max-connections`) and the channels open on them
(`max-channels`). How it works: a user's limits are a small dict in `UserStore.limits` and stored with its
`UserRecord` (single node: the definitions stream; cluster: the metadata group's user record, mirrored into every
broker). A negative value means no limit and 0 refuses every new connection or channel, as in RabbitMQ. The checks
live where RabbitMQ makes them, with its texts: connection.open (530 NOT_ALLOWED "Connection refused for user
'u': user connection limit (N) is reached") and channel.open (530 NOT_ALLOWED, which closes the connection:
"number of channels opened for user 'u' has reached the maximum allowed user limit of (N)"). Both count what the
node that checks holds (its own connections and their channels), as `max-connections` of a vhost does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node.broker import limits as limits_table
from node.broker.limits import LimitError

MAX_CONNECTIONS = "max-connections"
MAX_CHANNELS = "max-channels"
LIMIT_NAMES = (MAX_CONNECTIONS, MAX_CHANNELS)


class UserLimitError(LimitError):
    """An unknown limit name or a value that is not an integer."""


def validate(limits: Mapping[str, Any]) -> dict[str, int]:
    """The limits as a plain dict; UserLimitError names the first bad entry."""
    return limits_table.validate(limits, LIMIT_NAMES, UserLimitError)


reached = limits_table.reached
