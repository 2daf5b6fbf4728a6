"""The checked cbor forms of a queue proposal's fields: ids, ints, bools, msg-id lists, queue arguments, messages.

The building blocks of replicated_codec.py. Encoders turn a field into a cbor-able value; decoders take the decoded
cbor value as untrusted and raise `ProposalDecodeError` (a ValueError) and nothing else for a wrong type, range or
shape. Consumer and publisher ids are opaque hashables, tuples of str/int (or plain str/int) in practice: cbor turns
tuples into lists, so `encode_id` writes lists and `decode_id` gives every list back as a tuple (nested at most
`ID_DEPTH_MAX` deep). Every int fits cbor's native 64-bit ints (`INT_MIN`..`INT_MAX`, no bignums). A message is
`[payload, size_bytes, persistent, priority, ttl_ms]`; its payload is the caller's (`EncodePayload`,
`DecodePayload`), and a failure of the caller's decoder is a `ProposalDecodeError` too.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Final

from cluster.queue.ids import from_wire, to_wire
from cluster.queue.types import DEAD_LETTER_STRATEGIES, OVERFLOW_MODES, MsgId, QueueArgs, QueuedMessage

ID_DEPTH_MAX: Final = 8  # nesting allowed inside one consumer/publisher id
INT_MIN: Final = -(2**63)  # every int field fits cbor's native 64-bit ints (no bignums)
INT_MAX: Final = 2**64 - 1
PRIORITY_MAX: Final = 255

EncodePayload = Callable[[Any], Any]
DecodePayload = Callable[[Any], Any]


class ProposalDecodeError(ValueError):
    """The bytes are not a valid encoded proposal (the only exception decoding raises)."""


# --- ids ------------------------------------------------------------------------------------------------------


def encode_id(value: Hashable) -> Any:
    """A consumer/publisher id as a cbor-able value: a typed id (`cluster.queue.ids`) as its wire array, other
    tuples as lists."""
    if isinstance(value, tuple):
        wire = to_wire(value)
        if wire is not None:
            return wire
        return [encode_id(item) for item in value]
    return value


def decode_id(value: Any) -> Hashable:
    """Inverse of `encode_id`: a typed id's wire array comes back as that id, other lists as tuples. Raises
    ProposalDecodeError for non-id values."""
    return _decode_id(value, 0)


def _decode_id(value: Any, depth: int) -> Hashable:
    kind = type(value)
    if kind is list:
        if depth >= ID_DEPTH_MAX:
            raise ProposalDecodeError(f"id nested deeper than {ID_DEPTH_MAX}")
        items = tuple(value)
        for item in items:  # the usual id, a flat tuple of str/int: checked in place, no recursion
            item_kind = type(item)
            if item_kind is int:
                if not INT_MIN <= item <= INT_MAX:
                    raise ProposalDecodeError(f"id part out of range: {item!r:.80}")
            elif not (item_kind is str or item_kind is bytes or item is None or item_kind is bool):
                return tuple([_decode_id(part, depth + 1) for part in items])  # nested: the general path
        return from_wire(items)
    if kind is int:
        return field_int(value, INT_MIN)
    if kind is str or kind is bytes or value is None or kind is bool:
        return value  # type: ignore[no-any-return]
    raise ProposalDecodeError(f"bad id {value!r:.80}")


# --- field checks ---------------------------------------------------------------------------------------------


def field_int(value: Any, low: int = 0, high: int = INT_MAX) -> int:
    """An int field within [low, high] (the default: non-negative, as counts, sizes and times are)."""
    if type(value) is not int or not low <= value <= high:
        raise ProposalDecodeError(f"expected an int in {low}..{high}, got {value!r:.80}")
    return value


def field_opt_int(value: Any) -> int | None:
    return None if value is None else field_int(value)


def field_bool(value: Any) -> bool:
    if type(value) is not bool:
        raise ProposalDecodeError(f"expected a bool, got {value!r:.80}")
    return value


def field_msg_ids(value: Any) -> tuple[MsgId, ...]:
    if not isinstance(value, list):
        raise ProposalDecodeError("expected a list of msg ids")
    if value and (set(map(type, value)) != {int} or min(value) < 1 or max(value) > INT_MAX):
        for item in value:
            field_int(item, 1)  # raises, naming the first bad id
    return tuple(value)


def fields_of(row: list[Any], count: int) -> list[Any]:
    if len(row) != count:
        raise ProposalDecodeError(f"expected {count} fields, got {len(row)}")
    return row


def field_opt_str(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise ProposalDecodeError(f"expected a str or null, got {value!r:.80}")
    return value


def field_choice(value: Any, choices: tuple[str, ...]) -> Any:
    if type(value) is not str or value not in choices:
        raise ProposalDecodeError(f"expected one of {choices}, got {value!r:.80}")
    return value


def encode_args(args: QueueArgs) -> list[Any]:
    return [
        args.message_ttl_ms,
        args.max_length,
        args.max_length_bytes,
        args.overflow,
        args.dead_letter_exchange,
        args.dead_letter_routing_key,
        args.max_priority,
        args.single_active_consumer,
        args.delivery_limit,
        args.dead_letter_strategy,
    ] + ([args.auto_delete, args.expires_ms] if args.auto_delete or args.expires_ms is not None else [])


def decode_args(value: Any) -> QueueArgs:
    if type(value) is not list or len(value) not in (10, 12):
        raise ProposalDecodeError("expected the 10 queue argument fields (12 with auto_delete and expires_ms)")
    ttl, max_length, max_bytes, overflow, dlx, dlrk, max_priority, sac, delivery_limit, strategy = value[:10]
    auto_delete, expires_ms = value[10:] if len(value) == 12 else (False, None)
    return QueueArgs(
        message_ttl_ms=field_opt_int(ttl),
        max_length=field_opt_int(max_length),
        max_length_bytes=field_opt_int(max_bytes),
        overflow=field_choice(overflow, OVERFLOW_MODES),
        dead_letter_exchange=field_opt_str(dlx),
        dead_letter_routing_key=field_opt_str(dlrk),
        max_priority=None if max_priority is None else field_int(max_priority, 0, PRIORITY_MAX),
        single_active_consumer=field_bool(sac),
        delivery_limit=field_opt_int(delivery_limit),
        dead_letter_strategy=field_choice(strategy, DEAD_LETTER_STRATEGIES),
        auto_delete=field_bool(auto_delete),
        expires_ms=field_opt_int(expires_ms),
    )


def encode_message(message: QueuedMessage, encode_payload: EncodePayload) -> list[Any]:
    return [
        encode_payload(message.payload),
        message.size_bytes,
        message.persistent,
        message.priority,
        message.ttl_ms,
    ]


def check_message(value: Any) -> list[Any]:
    """The 5 fields of an encoded message, every scalar checked (the payload is the caller's)."""
    if type(value) is not list or len(value) != 5:
        raise ProposalDecodeError("expected a message [payload, size_bytes, persistent, priority, ttl_ms]")
    _, size_bytes, persistent, priority, ttl_ms = value
    if type(size_bytes) is not int or not 0 <= size_bytes <= INT_MAX:
        field_int(size_bytes)  # raises with the usual message
    if type(persistent) is not bool:
        field_bool(persistent)
    if type(priority) is not int or not 0 <= priority <= PRIORITY_MAX:
        field_int(priority, 0, PRIORITY_MAX)
    if ttl_ms is not None:
        field_int(ttl_ms)
    return value


def decode_message(value: Any, decode_payload: DecodePayload) -> QueuedMessage:
    raw_payload, size_bytes, persistent, priority, ttl_ms = check_message(value)
    try:
        payload = decode_payload(raw_payload)
    except Exception as exc:  # the payload codec is the caller's; its failures are decode errors too
        raise ProposalDecodeError(f"bad payload: {exc}") from exc
    return QueuedMessage(payload, size_bytes, persistent, priority, ttl_ms)
