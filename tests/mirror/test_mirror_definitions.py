"""Pure: a classic queue declared under an `ha-mode` policy becomes a "mirrored" queue in the cluster metadata
(replicas by ha-mode, the declaring node leading) with its controller record; exclusive queues, quorum queues and
queues no ha policy applies to stay as they were; a redeclare keeps the queue mirrored."""

from __future__ import annotations

from cluster.metadata import model as md
from node.broker import records as br
from node.clustering.definitions import client_local_placement, commands_for
from tests.cluster.test_cluster_units import _apply_all, _state_with_nodes


def _with_policy(definition: dict[str, object], priority: int = 0, name: str = "ha") -> md.MetadataState:
    state = _apply_all(_state_with_nodes("a", "b", "c"), [md.PutVhost("/")])
    return _apply_all(state, [md.SetPolicy(md.PolicyRecord("/", name, "^ha", "queues", definition, priority))])


def test_an_ha_policy_at_declare_makes_a_mirrored_queue_with_its_controller_record() -> None:
    state = _with_policy({"ha-mode": "exactly", "ha-params": 2, "ha-min-insync": 2,
                          "ha-promote-on-failure": "always"})
    place = client_local_placement("b", 3)
    records = [br.QueueRecord("/", "ha.q"), br.QueueRecord("/", "plain"),
               br.QueueRecord("/", "ha.qq", arguments={"x-queue-type": "quorum"}),
               br.QueueRecord("/", "ha.excl", durable=False, exclusive_owner="b/1/7")]
    after = _apply_all(state, commands_for(records, state, place))
    mirrored = after.queues[("/", "ha.q")]
    assert (mirrored.type, mirrored.leader, mirrored.members) == ("mirrored", "b", ("b", "c"))
    record = after.mirrors[("/", "ha.q")]
    assert (record.leader, record.epoch, record.isr, record.min_insync, record.promote_on_failure) == (
        "b", 0, ("b", "c"), 2, "always")
    assert [after.queues[("/", n)].type for n in ("plain", "ha.qq", "ha.excl")] == ["classic", "quorum", "classic"]
    assert set(after.mirrors) == {("/", "ha.q")}

    again = commands_for([br.QueueRecord("/", "ha.q")], after, client_local_placement("a", 3))
    assert _apply_all(after, again) == after  # a redeclare on another node changes nothing


def test_a_higher_priority_policy_without_ha_mode_wins() -> None:
    state = _with_policy({"ha-mode": "all"})
    state = _apply_all(state, [md.SetPolicy(md.PolicyRecord("/", "cap", "^ha", "queues", {"max-length": 5}, 1))])
    after = _apply_all(state, commands_for([br.QueueRecord("/", "ha.q")], state, client_local_placement("a", 3)))
    assert after.queues[("/", "ha.q")].type == "classic" and not after.mirrors
