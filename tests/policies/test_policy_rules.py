"""Pure tests of node/broker/policies.py: validation, matching (priority, apply-to, quorum applicability) and the
effective arguments (min of the two for limits, the client's argument first for the rest)."""

from __future__ import annotations

from typing import Any

import pytest

from node.broker.policies import (
    Policy,
    PolicyError,
    applied_definition,
    effective_alternate_exchange,
    effective_queue_arguments,
    machine_args,
    make_policy,
    match_policy,
)


def policy(name: str, pattern: str = ".*", apply_to: str = "all", priority: int = 0, **definition: Any) -> Policy:
    return make_policy("/", name, pattern, apply_to, {k.replace("_", "-"): v for k, v in definition.items()},
                       priority)


@pytest.mark.parametrize(("pattern", "apply_to", "definition", "priority", "fragment"), [
    ("(", "all", {"max-length": 1}, 0, "invalid pattern"),
    (".*", "queue", {"max-length": 1}, 0, "apply-to"),
    (".*", "all", {}, 0, "no policy provided"),
    (".*", "all", {"max-length": -1}, 0, "max-length"),
    (".*", "all", {"max-length": "10"}, 0, "max-length"),
    (".*", "all", {"max-length": True}, 0, "max-length"),
    (".*", "all", {"expires": 0}, 0, "expires"),
    (".*", "all", {"message-ttl": 1.5}, 0, "message-ttl"),
    (".*", "all", {"overflow": "drop-tail"}, 0, "overflow"),
    (".*", "all", {"dead-letter-strategy": "exactly-once"}, 0, "dead-letter-strategy"),
    (".*", "all", {"dead-letter-exchange": 5}, 0, "dead-letter-exchange"),
    (".*", "all", {"queue-master-locator": "min-masters"}, 0, "not recognised"),
    (".*", "all", {"max-length": 1}, True, "priority"),
])
def test_invalid_policies_are_refused_with_the_reason(pattern: str, apply_to: str, definition: dict[str, Any],
                                                       priority: Any, fragment: str) -> None:
    with pytest.raises(PolicyError) as err:
        make_policy("/", "p", pattern, apply_to, definition, priority)
    assert fragment in str(err.value)


def test_valid_policy_defaults() -> None:
    p = make_policy("/", "p", "^q", None, {"max-length": 0, "queue-mode": "lazy"}, None)
    assert (p.apply_to, p.priority) == ("all", 0)
    make_policy("/", "p", ".", "exchanges", {"alternate-exchange": "ae"}, -5)


def test_highest_priority_wins_then_lowest_name() -> None:
    low, high = policy("z-low", priority=1, max_length=5), policy("y-high", priority=7, max_length=9)
    assert match_policy([low, high], "queue", "q") is high
    a, b = policy("b", max_length=1), policy("a", max_length=2)
    assert match_policy([a, b], "queue", "q") is b
    assert match_policy([a, b], "queue", "q") is match_policy([b, a], "queue", "q")


def test_pattern_is_searched_not_anchored() -> None:
    p = policy("p", pattern="orders", max_length=1)
    assert match_policy([p], "queue", "eu.orders.v2") is p
    anchored = policy("a", pattern="^orders$", max_length=1)
    assert match_policy([anchored], "queue", "eu.orders") is None
    assert match_policy([anchored], "queue", "orders") is anchored


def test_apply_to_selects_the_kind() -> None:
    queues, exchanges = policy("q", apply_to="queues", max_length=1), policy("e", apply_to="exchanges",
                                                                            alternate_exchange="ae")
    assert match_policy([queues, exchanges], "queue", "x") is queues
    assert match_policy([queues, exchanges], "exchange", "x") is exchanges


def test_a_policy_with_a_key_quorum_queues_refuse_does_not_apply_to_them() -> None:
    lazy = policy("lazy", priority=9, queue_mode="lazy", max_length=3)
    plain = policy("plain", max_length=4)
    assert match_policy([lazy, plain], "queue", "q", "classic") is lazy
    assert match_policy([lazy, plain], "queue", "q", "quorum") is plain


def test_limits_take_the_minimum_and_the_client_wins_the_rest() -> None:
    p = policy("p", max_length=10, max_length_bytes=100, message_ttl=5000, expires=60000, overflow="reject-publish",
               dead_letter_exchange="dlx-policy", dead_letter_routing_key="rk")
    args = {"x-max-length": 20, "x-message-ttl": 1000, "x-overflow": "drop-head", "x-dead-letter-exchange": "mine"}
    merged = effective_queue_arguments(args, p)
    assert merged == {"x-max-length": 10, "x-max-length-bytes": 100, "x-message-ttl": 1000, "x-expires": 60000,
                      "x-overflow": "drop-head", "x-dead-letter-exchange": "mine", "x-dead-letter-routing-key": "rk"}
    assert args == {"x-max-length": 20, "x-message-ttl": 1000, "x-overflow": "drop-head",
                    "x-dead-letter-exchange": "mine"}  # (not changed in place)
    assert effective_queue_arguments(args, None) == args


def test_quorum_only_keys_reach_quorum_queues_only() -> None:
    p = policy("p", delivery_limit=3, dead_letter_strategy="at-least-once", dead_letter_exchange="dlx")
    assert "x-delivery-limit" not in effective_queue_arguments({}, p, "classic")
    merged = effective_queue_arguments({"x-queue-type": "quorum", "x-delivery-limit": 5}, p, "quorum")
    assert merged["x-delivery-limit"] == 3 and merged["x-dead-letter-strategy"] == "at-least-once"
    assert applied_definition(p, "queue", "classic") == {"dead-letter-exchange": "dlx"}
    assert applied_definition(p, "queue", "quorum") == dict(p.definition)
    args = machine_args(merged)
    assert args.delivery_limit == 3 and args.dead_letter_exchange == "dlx"
    assert getattr(args, "dead_letter_strategy", "at-least-once") == "at-least-once"


def test_alternate_exchange_argument_wins_over_the_policy() -> None:
    p = policy("p", apply_to="exchanges", alternate_exchange="from-policy")
    assert effective_alternate_exchange({}, p) == "from-policy"
    assert effective_alternate_exchange({"alternate-exchange": "own"}, p) == "own"
    assert effective_alternate_exchange({}, None) is None
    assert applied_definition(p, "exchange") == {"alternate-exchange": "from-policy"}
