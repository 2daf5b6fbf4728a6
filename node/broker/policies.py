"""Policies, as RabbitMQ 3.10 has them: validation, matching and the effective arguments they give (pure).

What it is for: a policy (vhost, name, pattern, apply-to, priority, definition) sets queue and exchange options
from outside the client. `validate_policy` refuses a bad one with a `PolicyError` naming the problem (the HTTP API
answers 400 with it). `match_policy` picks the ONE policy that applies to an object: its pattern matches the
name (`re.search`, as Erlang's `re:run` finds a match anywhere), its apply-to covers the object's kind
("queues" | "exchanges" | "all"; 3.10 has no per-queue-type values), and for a quorum queue every key of its
definition is one a quorum queue accepts (RabbitMQ's `is_policy_applicable`); among those the highest priority
wins, ties going to the lowest name (RabbitMQ sorts the vhost's policies by name, then stably by priority).

How the effective arguments are made (`effective_queue_arguments`): each policy key stands for an x-argument
(`max-length` -> `x-max-length`, ...). For max-length, max-length-bytes, message-ttl, expires and delivery-limit
the effective value is the minimum of the client's x-argument and the policy's value; for the others
(overflow, dead-letter-exchange, dead-letter-routing-key, dead-letter-strategy, queue-mode) the client's
x-argument wins and the policy only fills what the client left unset. delivery-limit and dead-letter-strategy
apply to quorum queues only (a classic queue has neither in RabbitMQ). For exchanges `alternate-exchange` is the
only key; the exchange's own argument wins (`VHost.alternate_of` asks at routing time).

How they reach the queues (`put_policy`, `apply_to_queue`, ...) is node/broker/policy_apply.py; this module keeps
the rules, the effective arguments of the machine (`machine_args`) and the records (`record_of`, `from_record`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

from cluster.queue.types import QueueArgs
from node.broker.ha_policy import HA_KEYS, validate_ha
from node.broker.queues import queue_args
from node.broker.records import PolicyRecord

APPLY_TO: Final = ("queues", "exchanges", "all")
PRIORITY_MAX: Final = 2**31 - 1
PATTERN_LENGTH_MAX: Final = 4096
NAME_LENGTH_MAX: Final = 255

# policy key -> the queue x-argument it stands for
QUEUE_KEYS: Final[dict[str, str]] = {
    "message-ttl": "x-message-ttl", "expires": "x-expires", "max-length": "x-max-length",
    "max-length-bytes": "x-max-length-bytes", "overflow": "x-overflow",
    "dead-letter-exchange": "x-dead-letter-exchange", "dead-letter-routing-key": "x-dead-letter-routing-key",
    "delivery-limit": "x-delivery-limit", "dead-letter-strategy": "x-dead-letter-strategy",
    "queue-mode": "x-queue-mode",
}
EXCHANGE_KEYS: Final = frozenset({"alternate-exchange"})
MIN_WINS: Final = frozenset({"message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit"})
QUORUM_ONLY: Final = frozenset({"delivery-limit", "dead-letter-strategy"})
# the keys rabbit_quorum_queue accepts in a policy; a policy with any other key does not apply to a quorum queue
QUORUM_APPLICABLE: Final = frozenset({
    "max-length", "max-length-bytes", "overflow", "expires", "delivery-limit", "dead-letter-exchange",
    "dead-letter-routing-key", "dead-letter-strategy", "message-ttl",
    "federation-upstream", "federation-upstream-set",  # RabbitMQ 3.10 federates quorum queues too
})
OVERFLOW_MODES: Final = ("drop-head", "reject-publish", "reject-publish-dlx")
DEAD_LETTER_STRATEGIES: Final = ("at-most-once", "at-least-once")
QUEUE_MODES: Final = ("default", "lazy")


class PolicyError(ValueError):
    """A policy refused by validation; the message says why (RabbitMQ's wording where it has one)."""


@dataclass(frozen=True, slots=True)
class Policy:
    vhost: str
    name: str
    pattern: str
    apply_to: str = "all"
    definition: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 0

    def applies_to_kind(self, kind: str) -> bool:
        """kind: "queue" or "exchange"."""
        return self.apply_to == "all" or self.apply_to == kind + "s"

    def matches_name(self, name: str) -> bool:
        return _compiled(self.pattern).search(name) is not None


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# --- validation -------------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_non_negative(key: str, value: Any) -> str | None:
    if not _is_int(value) or value < 0:
        return f"{value!r} is not a valid value for {key}: a non-negative integer is required"
    return None


def _check_positive(key: str, value: Any) -> str | None:
    if not _is_int(value) or value < 1:
        return f"{value!r} is not a valid value for {key}: an integer >= 1 is required"
    return None


def _check_text(key: str, value: Any) -> str | None:
    return None if isinstance(value, str) else f"{value!r} is not a valid value for {key}: a string is required"


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(key: str, value: Any) -> str | None:
        if value not in choices:
            return f"{value!r} is not a valid value for {key}: one of {', '.join(choices)}"
        return None

    return check


_CHECKS: Final[dict[str, Any]] = {
    "message-ttl": _check_non_negative, "expires": _check_positive, "max-length": _check_non_negative,
    "max-length-bytes": _check_non_negative, "delivery-limit": _check_non_negative,
    "overflow": _one_of(OVERFLOW_MODES), "dead-letter-exchange": _check_text,
    "dead-letter-routing-key": _check_text, "dead-letter-strategy": _one_of(DEAD_LETTER_STRATEGIES),
    "queue-mode": _one_of(QUEUE_MODES), "alternate-exchange": _check_text,
    "federation-upstream": lambda key, value: _check_federation_name(key, value, "upstream"),
    "federation-upstream-set": lambda key, value: _check_federation_name(key, value, "upstream set"),
    **{key: lambda key, value: None for key in HA_KEYS},  # checked together by ha_policy.validate_ha
}


def _check_federation_name(key: str, value: Any, kind: str) -> str | None:
    """rabbit_federation_parameters:validate_policy (the keys are used by cluster/federation)."""
    if not isinstance(value, str):
        return f"{json.dumps(value)} is not a valid federation {kind} name"
    return None


def validate_policy(name: str, pattern: str, apply_to: str, definition: Mapping[str, Any], priority: int) -> None:
    """Raise PolicyError if RabbitMQ would refuse this policy; return None when it is valid."""
    if not isinstance(name, str) or not name or len(name) > NAME_LENGTH_MAX:
        raise PolicyError(f"invalid policy name {name!r}")
    if not isinstance(pattern, str) or len(pattern) > PATTERN_LENGTH_MAX:
        raise PolicyError("pattern must be a string (at most 4096 characters)")
    try:
        _compiled(pattern)
    except re.error as exc:
        raise PolicyError(f"invalid pattern {pattern!r}: {exc}") from None
    if apply_to not in APPLY_TO:
        raise PolicyError(f"apply-to {apply_to!r} is not one of {', '.join(APPLY_TO)}")
    if not _is_int(priority) or not -PRIORITY_MAX <= priority <= PRIORITY_MAX:
        raise PolicyError(f"priority {priority!r} is not an integer")
    if not isinstance(definition, Mapping) or not definition:
        raise PolicyError("no policy provided: the definition must set at least one key")
    unknown = sorted(k for k in definition if k not in _CHECKS)
    if unknown:
        raise PolicyError(f"Validation failed: {unknown} are not recognised policy settings")
    if "federation-upstream" in definition and "federation-upstream-set" in definition:
        raise PolicyError("Validation failed: cannot specify federation-upstream and federation-upstream-set together")
    for key in sorted(definition):
        error = _CHECKS[key](key, definition[key])
        if error is not None:
            raise PolicyError(f"Validation failed: {error}")
    error = validate_ha(definition)
    if error is not None:
        raise PolicyError(f"Validation failed: {error}")


def make_policy(vhost: str, name: str, pattern: str, apply_to: str | None, definition: Mapping[str, Any],
                priority: int | None) -> Policy:
    """A validated policy (PolicyError otherwise); apply-to defaults to "all", priority to 0."""
    apply_to = apply_to or "all"
    priority = 0 if priority is None else priority
    validate_policy(name, pattern, apply_to, definition, priority)
    return Policy(vhost, name, pattern, apply_to, dict(definition), priority)


# --- matching ---------------------------------------------------------------------------------------------------


def _applicable(policy: Policy, kind: str, queue_type: str) -> bool:
    if not policy.applies_to_kind(kind):
        return False
    if kind == "queue" and queue_type == "quorum":
        return all(key in QUORUM_APPLICABLE for key in policy.definition)
    return True


def match_policy(policies: Iterable[Policy], kind: str, name: str, queue_type: str = "classic") -> Policy | None:
    """The one policy that applies to the object `name` of `kind` ("queue" | "exchange"), or None.

    Highest priority first; equal priorities go to the lowest policy name. Exclusive and server-named queues are
    matched like any other (as RabbitMQ does)."""
    candidates = [p for p in policies if _applicable(p, kind, queue_type) and p.matches_name(name)]
    if not candidates:
        return None
    return min(candidates, key=lambda p: (-p.priority, p.name))


# --- effective arguments ----------------------------------------------------------------------------------------


def effective_queue_arguments(arguments: Mapping[str, Any], policy: Policy | None,
                              queue_type: str = "classic") -> dict[str, Any]:
    """The queue's x-arguments with the policy's values merged in (see the module docstring for precedence)."""
    merged = dict(arguments)
    if policy is None:
        return merged
    for key, value in policy.definition.items():
        x_key = QUEUE_KEYS.get(key)
        if x_key is None or (key in QUORUM_ONLY and queue_type != "quorum"):
            continue
        current = merged.get(x_key)
        if current is None:
            merged[x_key] = value
        elif key in MIN_WINS and _is_int(current):
            merged[x_key] = min(current, value)
    return merged


def effective_alternate_exchange(arguments: Mapping[str, Any], policy: Policy | None) -> str | None:
    """The exchange's alternate exchange: its own argument, else the policy's."""
    own = arguments.get("alternate-exchange")
    if isinstance(own, bytes):
        own = own.decode("utf-8", "replace")
    if isinstance(own, str):
        return own
    if policy is not None:
        value = policy.definition.get("alternate-exchange")
        if isinstance(value, str):
            return value
    return None


def applied_definition(policy: Policy | None, kind: str, queue_type: str = "classic") -> dict[str, Any]:
    """What the management API shows as `effective_policy_definition`: the keys of the policy that act on this
    object ({} without a policy)."""
    if policy is None:
        return {}
    if kind == "exchange":
        return {k: v for k, v in policy.definition.items() if k in EXCHANGE_KEYS}
    return {k: v for k, v in policy.definition.items()
            if (k in QUEUE_KEYS and (k not in QUORUM_ONLY or queue_type == "quorum"))
            or (k in HA_KEYS and queue_type == "classic")}


def policy_row(policy: Policy) -> dict[str, Any]:
    """A policy as RabbitMQ's /api/policies lists it."""
    return {"vhost": policy.vhost, "name": policy.name, "pattern": policy.pattern, "apply-to": policy.apply_to,
            "definition": dict(policy.definition), "priority": policy.priority}


# --- machine arguments and records -----------------------------------------------------------------------------


def queue_type_of(arguments: Mapping[str, Any]) -> str:
    kind = arguments.get("x-queue-type")
    if isinstance(kind, bytes):
        kind = kind.decode("utf-8", "replace")
    return "quorum" if kind == "quorum" else "classic"


def machine_args(merged: Mapping[str, Any], auto_delete: bool = False) -> QueueArgs:
    """The queue machine's arguments for effective x-arguments (`queue_args`, plus the dead-letter strategy when
    the machine knows that field) of a queue declared with `auto_delete`."""
    args = queue_args(dict(merged), auto_delete)
    strategy = merged.get("x-dead-letter-strategy")
    if strategy in DEAD_LETTER_STRATEGIES and "dead_letter_strategy" in QueueArgs.__dataclass_fields__:
        extra: dict[str, Any] = {"dead_letter_strategy": strategy}
        args = dataclasses.replace(args, **extra)
    return args


def record_of(policy: Policy, deleted: bool = False) -> PolicyRecord:
    return PolicyRecord(policy.vhost, policy.name, policy.pattern, policy.apply_to, dict(policy.definition),
                        policy.priority, deleted)


def from_record(record: PolicyRecord) -> Policy | None:
    """The policy a stored or mirrored record holds (None if it does not validate any more)."""
    try:
        return make_policy(record.vhost, record.name, record.pattern, record.apply_to, record.definition,
                           record.priority)
    except PolicyError:
        return None


