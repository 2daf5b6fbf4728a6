"""Queue metadata and x-argument validation, as rabbit_amqqueue does it (pure).

`validate_queue_args` checks every argument RabbitMQ checks at declare time and raises 406 with RabbitMQ's text
("invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}"); `queue_args` turns valid arguments
into the queue machine's `QueueArgs`. `assert_queue_equivalent` gives the 406 "inequivalent arg" of a redeclare.
x-queue-type: "classic" is accepted; "quorum" is accepted too and, on a single node, behaves as a classic durable
queue (in replicated mode every queue has a Raft group; x-quorum-initial-group-size, an int >= 1, is validated and
kept for the runtime's placement); any other value is refused with 406. x-dead-letter-strategy ("at-most-once",
the default, or "at-least-once") becomes `QueueArgs.dead_letter_strategy` for quorum queues (classic ones ignore it,
as RabbitMQ); the machine holds dead letters only with a DLX and x-overflow reject-publish as well, falling back to
at-most-once otherwise, as RabbitMQ 3.10 does, and only when replicated (a single node dead-letters synchronously).
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from cluster.queue.types import DEAD_LETTER_STRATEGIES, DeadLetterStrategy, QueueArgs
from node.broker.errors import precondition

QUEUE_TYPES = ("classic", "quorum")
EQUIVALENCE_ARGS = (
    "x-expires", "x-message-ttl", "x-max-length", "x-max-length-bytes", "x-overflow", "x-dead-letter-exchange",
    "x-dead-letter-routing-key", "x-max-priority", "x-single-active-consumer", "x-queue-type", "x-delivery-limit",
    "x-dead-letter-strategy",
)


def amqp_type_name(value: Any) -> str:
    """The RabbitMQ field-table type name of a decoded value (ints are reported as 'long')."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "void"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, bytearray):
        return "binary"
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_str(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _check_int(value: Any) -> str | None:
    return None if _is_int(value) else f"{{unacceptable_type,{amqp_type_name(value)}}}"


def _check_non_negative(value: Any) -> str | None:
    err = _check_int(value)
    if err is None and value < 0:
        return f"{{value_negative,{value}}}"
    return err


def _check_expires(value: Any) -> str | None:
    err = _check_int(value)
    if err is None and value == 0:
        return "{value_zero,0}"
    if err is None and value < 0:
        return f"{{value_negative,{value}}}"
    return err


def _check_priority(value: Any) -> str | None:
    err = _check_non_negative(value)
    if err is None and value > 255:
        return f"{{value_too_large,{value},255}}"
    return err


def _check_str(value: Any) -> str | None:
    return None if _as_str(value) is not None else f"{{unacceptable_type,{amqp_type_name(value)}}}"


def _check_overflow(value: Any) -> str | None:
    text = _as_str(value)
    if text is None:
        return f"{{unacceptable_type,{amqp_type_name(value)}}}"
    if text not in ("drop-head", "reject-publish", "reject-publish-dlx"):
        return f"{{invalid_overflow,<<\"{text}\">>}}"
    return None


def _check_dead_letter_strategy(value: Any) -> str | None:
    text = _as_str(value)
    if text is None or text not in DEAD_LETTER_STRATEGIES:
        shown = f"<<\"{text}\">>" if text is not None else repr(value)
        return f"{{invalid_dead_letter_strategy,{amqp_type_name(value)},{shown}}}"
    return None


def _check_bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{{unacceptable_type,{amqp_type_name(value)}}}"


def _check_queue_type(value: Any) -> str | None:
    text = _as_str(value)
    if text is None:
        return f"{{unacceptable_type,{amqp_type_name(value)}}}"
    if text not in QUEUE_TYPES:
        return f"{{unsupported_queue_type,<<\"{text}\">>}}"
    return None


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "x-expires": _check_expires, "x-message-ttl": _check_non_negative, "x-max-length": _check_non_negative,
    "x-max-length-bytes": _check_non_negative, "x-overflow": _check_overflow,
    "x-dead-letter-exchange": _check_str, "x-dead-letter-routing-key": _check_str,
    "x-max-priority": _check_priority, "x-single-active-consumer": _check_bool,
    "x-queue-type": _check_queue_type, "x-delivery-limit": _check_non_negative,
    "x-dead-letter-strategy": _check_dead_letter_strategy,
    "x-quorum-initial-group-size": _check_expires,  # an int >= 1 (0: value_zero), as rabbit_quorum_queue checks
}


def validate_queue_args(args: dict[str, Any], resource: str) -> None:
    for key, check in _CHECKS.items():
        if key in args:
            err = check(args[key])
            if err is not None:
                raise precondition(f"invalid arg '{key}' for {resource}: {err}")
    if "x-dead-letter-routing-key" in args and "x-dead-letter-exchange" not in args:
        raise precondition(f"invalid arg 'x-dead-letter-routing-key' for {resource}: routing_key_but_no_dlx_defined")


def queue_args(args: dict[str, Any], auto_delete: bool = False) -> QueueArgs:
    """The machine's arguments for x-arguments (and the declare flag auto_delete, fixed for the queue's life)."""
    overflow = _as_str(args.get("x-overflow")) or "drop-head"
    dlx = _as_str(args.get("x-dead-letter-exchange"))
    return QueueArgs(
        message_ttl_ms=args.get("x-message-ttl"), max_length=args.get("x-max-length"),
        max_length_bytes=args.get("x-max-length-bytes"), overflow=overflow,  # type: ignore[arg-type]
        dead_letter_exchange=dlx, dead_letter_routing_key=_as_str(args.get("x-dead-letter-routing-key")),
        max_priority=args.get("x-max-priority"),
        single_active_consumer=bool(args.get("x-single-active-consumer", False)),
        delivery_limit=args.get("x-delivery-limit"),
        dead_letter_strategy=_dead_letter_strategy(args),
        auto_delete=auto_delete,
        expires_ms=_expires_ms(args.get("x-expires")),
    )


def _expires_ms(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _dead_letter_strategy(args: dict[str, Any]) -> DeadLetterStrategy:
    """x-dead-letter-strategy of a quorum queue; classic queues dead-letter at most once (RabbitMQ ignores the
    argument for them)."""
    strategy = _as_str(args.get("x-dead-letter-strategy"))
    if strategy == "at-least-once" and _as_str(args.get("x-queue-type")) == "quorum":
        return "at-least-once"
    return "at-most-once"


def _fmt_bool(value: bool) -> str:
    return "true" if value else "false"


def _fmt_arg(value: Any) -> str:
    if value is None:
        return "none"
    shown = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if isinstance(shown, bool):
        shown = _fmt_bool(shown)
    return f"the value '{shown}' of type '{amqp_type_name(value)}'"


def inequivalent(key: str, resource: str, received: str, current: str) -> Exception:
    return precondition(f"inequivalent arg '{key}' for {resource}: received {received} but current is {current}")


def assert_args_equivalent(current: dict[str, Any], new: dict[str, Any], keys: tuple[str, ...], resource: str) -> None:
    for key in keys:
        old, fresh = current.get(key), new.get(key)
        if old is None and fresh is None:
            continue
        same_class = amqp_type_name(old) == amqp_type_name(fresh)
        old_norm = _as_str(old) if isinstance(old, (str, bytes)) else old
        new_norm = _as_str(fresh) if isinstance(fresh, (str, bytes)) else fresh
        if not (same_class and old_norm == new_norm):
            raise inequivalent(key, resource, _fmt_arg(fresh), _fmt_arg(old))


def assert_flag_equivalent(key: str, current: bool, received: bool, resource: str) -> None:
    if current != received:
        raise inequivalent(key, resource, f"'{_fmt_bool(received)}'", f"'{_fmt_bool(current)}'")


@dataclass(slots=True)
class QueueState:
    """A declared queue: its definition plus the queue machine holding its messages."""

    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    arguments: dict[str, Any]
    machine: Any
    exclusive_owner: int | str | None = None  # a local conn_id; replicated: "node/boot/conn" of another node
    consumers: dict[Hashable, Any] = field(default_factory=dict)
    persisted_ids: set[int] = field(default_factory=set)
    exclusive_consumer: Hashable | None = None
    tail: Any = None  # paged_tail.PagedTail while paged messages wait on disk (node/broker/paging.py)
    # replicated mode only (node/broker/replica.py); every field below but the last four is a function of the log
    members: dict[Hashable, None] = field(default_factory=dict)  # consumer and get-holder ids known to the machine
    is_leader: bool = False  # this node's replica belongs to the group's leader
    expire_proposed_ms: int | None = None  # when the leader last proposed Expire (not applied yet)
    purge_waiters: list[tuple[Any, bool]] = field(default_factory=list)  # (channel, nowait) of this node's purges
    held_sends: Any = None  # replica_control.HeldSends: at-least-once dead-letter republishing (volatile)
    flow_inflight: int = 0  # publishes proposed here not yet applied by the local replica (credit_flow.py)
    flow_applied: int = 0  # entries the local replica applied (credit_flow.py: whether anything happens)
    transient_checked: bool = False  # replicated: declared here in this boot, or its restart's transient purge proposed
    backend: Any = None  # the node.broker.backend.QueueBackend holding it, chosen at declare or recovery

    @property
    def stored(self) -> bool:
        """Durable and not exclusive: its definition and persistent messages go to storage."""
        return self.durable and self.exclusive_owner is None

    @property
    def resource(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost}'"
