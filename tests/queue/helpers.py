"""Small builders shared by the queue tests."""

from __future__ import annotations

from cluster.queue import Deliver, QueuedMessage, QueueEffect


def msg(body: str = "m", size_bytes: int = 10, priority: int = 0, ttl_ms: int | None = None) -> QueuedMessage:
    return QueuedMessage(
        payload=body.encode(), size_bytes=size_bytes, persistent=False, priority=priority, ttl_ms=ttl_ms
    )


def delivered(effects: list[QueueEffect]) -> list[tuple[object, int]]:
    return [(e.consumer_id, e.msg_id) for e in effects if isinstance(e, Deliver)]


def bodies(effects: list[QueueEffect]) -> list[bytes]:
    return [e.message.payload for e in effects if isinstance(e, Deliver)]
