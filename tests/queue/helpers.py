"""Small builders shared by the queue tests."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cluster.queue import Deliver, Proposal, QueuedMessage, QueueEffect, decode_proposal, encode_proposal

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def msg(body: str = "m", size_bytes: int = 10, priority: int = 0, ttl_ms: int | None = None) -> QueuedMessage:
    return QueuedMessage(
        payload=body.encode(), size_bytes=size_bytes, persistent=False, priority=priority, ttl_ms=ttl_ms
    )


def delivered(effects: list[QueueEffect]) -> list[tuple[object, int]]:
    return [(e.consumer_id, e.msg_id) for e in effects if isinstance(e, Deliver)]


def bodies(effects: list[QueueEffect]) -> list[bytes]:
    return [e.message.payload for e in effects if isinstance(e, Deliver)]


def identity(value: Any) -> Any:
    return value


def roundtrip(proposal: Proposal) -> Proposal:
    """A proposal through the queue log's codec and back (payloads as they are)."""
    return decode_proposal(encode_proposal(proposal, identity), identity)


cbor_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4) | st.binary(max_size=4),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)
