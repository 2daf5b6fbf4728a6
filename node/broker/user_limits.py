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

MAX_CONNECTIONS = "max-connections"
MAX_CHANNELS = "max-channels"
LIMIT_NAMES = (MAX_CONNECTIONS, MAX_CHANNELS)


class UserLimitError(ValueError):
    """An unknown limit name or a value that is not an integer."""


def validate(limits: Mapping[str, Any]) -> dict[str, int]:
    """The limits as a plain dict; UserLimitError names the first bad entry."""
    checked: dict[str, int] = {}
    for name, value in limits.items():
        if name not in LIMIT_NAMES:
            raise UserLimitError(f"Unrecognised terms [{name!r}] in limits (known: {', '.join(LIMIT_NAMES)})")
        if not isinstance(value, int) or isinstance(value, bool):
            raise UserLimitError(f"{name}: {value!r} is not an integer")
        checked[name] = value
    return checked


def reached(limits: Mapping[str, int], name: str, count: int) -> int | None:
    """The limit `name` when `count` existing objects already reach it (one more is refused), else None."""
    limit = limits.get(name)
    if limit is None or limit < 0 or count < limit:
        return None
    return limit


def connection_refusal(user: str, limit: int) -> str:
    return f"Connection refused for user '{user}': user connection limit ({limit}) is reached"


def channel_refusal(user: str, limit: int) -> str:
    return f"number of channels opened for user '{user}' has reached the maximum allowed user limit of ({limit})"
