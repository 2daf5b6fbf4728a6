"""Pure tests of node/broker/ha_policy.py: RabbitMQ's refusals of bad ha-* definitions (through the policy
validation the API uses), the parsed spec with its defaults, the replica choice and the core's settings."""

from __future__ import annotations

from typing import Any

import pytest

from node.broker.ha_policy import HaSpec, ha_spec, mirror_replicas, mirror_settings, validate_ha
from node.broker.policies import PolicyError, applied_definition, make_policy, match_policy


@pytest.mark.parametrize(("definition", "message"), [
    ({"ha-params": 2}, "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"),
    ({"ha-mode": "some"}, '<<"some">> is not a valid ha-mode value'),
    ({"ha-mode": "all", "ha-params": 2}, 'ha-mode="all" does not take parameters'),
    ({"ha-mode": "exactly"}, 'ha-mode="exactly" takes an integer, none given'),
    ({"ha-mode": "exactly", "ha-params": 0}, 'ha-mode="exactly" takes an integer, 0 given'),
    ({"ha-mode": "exactly", "ha-params": "2"}, 'ha-mode="exactly" takes an integer, <<"2">> given'),
    ({"ha-mode": "nodes", "ha-params": []}, 'ha-mode="nodes" list must be non-empty'),
    ({"ha-mode": "nodes", "ha-params": ["a", 1]}, 'ha-mode="nodes" takes a list of strings, [1] given'),
    ({"ha-mode": "nodes", "ha-params": "a"}, 'ha-mode="nodes" takes a list, <<"a">> given'),
    ({"ha-mode": "all", "ha-sync-mode": "auto"}, 'ha-sync-mode must be "manual" or "automatic", got <<"auto">>'),
    ({"ha-mode": "all", "ha-sync-batch-size": 0}, "ha-sync-batch-size takes an integer greater than 0, 0 given"),
    ({"ha-mode": "all", "ha-promote-on-failure": "never"},
     'ha-promote-on-failure must be "always" or "when-synced", got <<"never">>'),
    ({"ha-mode": "all", "ha-promote-on-shutdown": True},
     'ha-promote-on-shutdown must be "always" or "when-synced", got true'),
    ({"ha-mode": "all", "ha-min-insync": 0}, "ha-min-insync takes an integer greater than 0, 0 given"),
    ({"ha-mode": "all", "ha-truncation": "none"}, 'ha-truncation must be "leader-epoch" or "hw", got <<"none">>'),
])
def test_bad_definitions_are_refused_with_rabbitmqs_words(definition: dict[str, Any], message: str) -> None:
    assert validate_ha(definition) == message
    with pytest.raises(PolicyError) as err:
        make_policy("/", "ha", ".*", "queues", definition, 0)
    assert str(err.value) == f"Validation failed: {message}"


def test_a_valid_definition_gives_the_spec_with_defaults() -> None:
    make_policy("/", "ha", ".*", "queues", {"ha-mode": "exactly", "ha-params": 2}, 0)  # accepted
    assert ha_spec({"ha-mode": "exactly", "ha-params": 2}) == HaSpec("exactly", 2)
    spec = ha_spec({"ha-mode": "nodes", "ha-params": ["b", "a"], "ha-sync-mode": "automatic",
                    "ha-promote-on-failure": "always", "ha-min-insync": 2, "ha-truncation": "hw"})
    assert spec == HaSpec("nodes", ("b", "a"), "automatic", "always", "when-synced", 2, "hw")
    assert ha_spec({"max-length": 1}) is None and ha_spec(None) is None
    assert ha_spec({"ha-mode": "exactly"}) is None  # (invalid)


def test_replica_choice() -> None:
    nodes = ("c", "a", "b")
    assert mirror_replicas(HaSpec("all"), nodes, "b") == ("b", "c", "a")
    assert mirror_replicas(HaSpec("exactly", 2), nodes, "b") == ("b", "c")
    assert mirror_replicas(HaSpec("exactly", 5), nodes, "c") == ("c", "a", "b")
    assert mirror_replicas(HaSpec("nodes", ("a", "c")), nodes, "c") == ("c", "a")
    assert mirror_replicas(HaSpec("nodes", ("a", "x")), nodes, "b") == ("a",)
    assert mirror_replicas(HaSpec("nodes", ("x",)), nodes, "b") == ("b",)  # none exists: the declaring node
    assert mirror_replicas(HaSpec("exactly", 3), ("n",), "n") == ("n",)


def test_settings_from_the_spec() -> None:
    settings = mirror_settings(HaSpec("exactly", 3, min_insync=2, promote_on_failure="always", truncation="hw"), 3)
    assert (settings.min_insync, settings.promote_on_failure, settings.truncation) == (2, "always", "hw")
    assert mirror_settings(HaSpec("all", min_insync=3), 1).min_insync == 1  # capped by the replica count
    assert mirror_settings(HaSpec("all"), 3).promote_on_failure == "when-synced"  # our safe default


def test_ha_keys_act_on_classic_queues_only() -> None:
    ha = make_policy("/", "ha", ".*", "queues", {"ha-mode": "all", "max-length": 5}, 0)
    assert applied_definition(ha, "queue") == {"ha-mode": "all", "max-length": 5}
    assert match_policy([ha], "queue", "q", "quorum") is None  # (rabbit_quorum_queue refuses ha-* keys)
