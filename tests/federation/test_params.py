"""Federation parameters (cluster/federation/params.py) and the policy keys (node/broker/policies.py): RabbitMQ's
keys, defaults and refusal texts; the implicit set `all`; set elements overriding upstream keys."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cluster.federation.params import (
    FederationParamError,
    parse_upstream,
    parse_upstream_set,
    resolve,
)
from node.broker.policies import PolicyError, validate_policy

URI = "amqp://guest:guest@127.0.0.1:5672"


def test_upstream_defaults_are_rabbitmqs() -> None:
    u = parse_upstream("/", "up", {"uri": URI})
    assert u.uris == (URI,)
    assert (u.prefetch_count, u.reconnect_delay_ms, u.ack_mode, u.trust_user_id, u.max_hops) == (
        1000, 5000, "on-confirm", False, 1)
    assert u.exchange is None and u.expires is None and u.message_ttl is None and u.queue is None


def test_upstream_every_key() -> None:
    u = parse_upstream("v", "up", {"uri": [URI, "amqp://h2"], "prefetch-count": 10, "reconnect-delay": 2,
                                   "ack-mode": "no-ack", "trust-user-id": True, "exchange": "x2", "max-hops": 3,
                                   "expires": 60000, "message-ttl": 1000, "queue": "q", "consumer-tag": "t"})
    assert u.uris == (URI, "amqp://h2") and u.uri(1).host == "h2"
    assert (u.prefetch_count, u.reconnect_delay_ms, u.ack_mode, u.trust_user_id, u.exchange, u.max_hops,
            u.expires, u.message_ttl, u.queue, u.consumer_tag) == (10, 2000, "no-ack", True, "x2", 3, 60000, 1000,
                                                                     "q", "t")


@pytest.mark.parametrize(("value", "error"), [
    ({}, 'Key "uri" not found in federation-upstream'),
    ({"uri": URI, "prefetch-count": "many"}, 'prefetch-count should be a number, actually was "many"'),
    ({"uri": URI, "max-hops": "2"}, 'max-hops should be a number, actually was "2"'),
    ({"uri": URI, "trust-user-id": "yes"}, 'trust-user-id should be boolean, actually was "yes"'),
    ({"uri": URI, "exchange": 5}, "exchange should be binary, actually was 5"),
    ({"uri": URI, "ack-mode": "later"},
     'ack-mode should be one of [on-confirm, on-publish, no-ack], actually was "later"'),
    ({"uri": URI, "colour": "blue"}, 'Unrecognised terms [{<<"colour">>,"blue"}] in federation-upstream'),
    ({"uri": []}, "uri should be a URI string or a non-empty list of URI strings"),
    ({"uri": "http://x"}, '"http://x" not a valid URI'),
    ({"uri": URI, "max-hops": 0}, "max-hops should be a positive integer"),
])
def test_upstream_refusals(value: dict[str, Any], error: str) -> None:
    with pytest.raises(FederationParamError) as info:
        parse_upstream("/", "up", value)
    assert str(info.value).startswith(error)


def test_upstream_set() -> None:
    assert parse_upstream_set("/", "s", [{"upstream": "a"}, {"upstream": "b", "max-hops": 2}])[1]["max-hops"] == 2
    for value, error in [({"upstream": "a"}, "federation-upstream-set should be a list"),
                         ([{"max-hops": 2}], 'Key "upstream" not found in federation-upstream-set'),
                         ([{"upstream": "a", "max-hops": "x"}], "max-hops should be a number"),
                         ([{"upstream": "a", "uri": URI}], "Unrecognised terms")]:
        with pytest.raises(FederationParamError) as info:
            parse_upstream_set("/", "s", value)
        assert str(info.value).startswith(error)


def _stored() -> dict[tuple[str, str, str], str]:
    return {("federation-upstream", "/", "a"): json.dumps({"uri": URI}),
            ("federation-upstream", "/", "b"): json.dumps({"uri": "amqp://h2", "max-hops": 2}),
            ("federation-upstream", "other", "c"): json.dumps({"uri": URI}),
            ("federation-upstream-set", "/", "s"): json.dumps([{"upstream": "b", "max-hops": 5},
                                                                {"upstream": "missing"}])}


def test_resolve_upstream_set_and_implicit_all() -> None:
    stored = _stored()
    assert [u.name for u in resolve({"federation-upstream": "a"}, "/", stored)] == ["a"]
    assert resolve({"federation-upstream": "missing"}, "/", stored) == []
    assert [u.name for u in resolve({"federation-upstream-set": "all"}, "/", stored)] == ["a", "b"]
    in_set = resolve({"federation-upstream-set": "s"}, "/", stored)
    assert [(u.name, u.max_hops, u.uris) for u in in_set] == [("b", 5, ("amqp://h2",))]  # the set overrides


def test_policy_keys() -> None:
    validate_policy("p", "^x", "exchanges", {"federation-upstream-set": "all"}, 0)
    validate_policy("p", "^x", "all", {"federation-upstream": "a", "message-ttl": 5}, 0)
    with pytest.raises(PolicyError, match="cannot specify federation-upstream and federation-upstream-set"):
        validate_policy("p", "^x", "exchanges", {"federation-upstream": "a", "federation-upstream-set": "all"}, 0)
    with pytest.raises(PolicyError, match="5 is not a valid federation upstream name"):
        validate_policy("p", "^x", "exchanges", {"federation-upstream": 5}, 0)
    with pytest.raises(PolicyError, match="5 is not a valid federation upstream set name"):
        validate_policy("p", "^x", "exchanges", {"federation-upstream-set": 5}, 0)
