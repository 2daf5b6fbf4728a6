"""What per-vhost and per-user limits share (pure): checking a limits table and asking whether a count reached one.

A limits table maps a limit's name (`max-connections`, ...) to an integer; a negative value means no limit and 0
refuses every new object, as in RabbitMQ. node/broker/vhost_limits.py and user_limits.py name their limits, texts
and error types on top of this.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class LimitError(ValueError):
    """An unknown limit name or a value that is not an integer."""


def validate(limits: Mapping[str, Any], known: tuple[str, ...], error: type[LimitError]) -> dict[str, int]:
    """The limits as a plain dict; `error` names the first bad entry."""
    checked: dict[str, int] = {}
    for name, value in limits.items():
        if name not in known:
            raise error(f"Unrecognised terms [{name!r}] in limits (known: {', '.join(known)})")
        if not isinstance(value, int) or isinstance(value, bool):
            raise error(f"{name}: {value!r} is not an integer")
        checked[name] = value
    return checked


def reached(limits: Mapping[str, int], name: str, count: int) -> int | None:
    """The limit `name` when `count` existing objects already reach it (one more is refused), else None."""
    limit = limits.get(name)
    if limit is None or limit < 0 or count < limit:
        return None
    return limit
