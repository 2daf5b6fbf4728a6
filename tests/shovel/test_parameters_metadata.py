"""Runtime parameters in the cluster metadata model (SetParameter/ClearParameter) and in the single-node broker's
definitions (ParameterRecord through storage records and recovery)."""

from __future__ import annotations

from cluster.metadata import model as md
from node.broker.broker import Broker
from node.broker.effects import Persist
from node.broker.records import ParameterRecord, from_cbor, to_cbor


def _state() -> md.MetadataState:
    state, _ = md.apply(md.MetadataState(), md.PutVhost("/"))
    return state


def test_set_clear_snapshot_and_vhost_cascade() -> None:
    record = md.ParameterRecord("/", "shovel", "s1", '{"src-uri": "amqp://a"}')
    state, outcome = md.apply(_state(), md.SetParameter(record, cid="c1"))
    assert outcome.ok and state.parameters[("/", "shovel", "s1")] == record
    assert md.apply(state, md.SetParameter(record, cid="c1"))[1].duplicate
    restored = md.restore(md.snapshot(state))
    assert restored.parameters == state.parameters
    old_snapshot = md.snapshot(state)
    del old_snapshot["parameters"]  # a snapshot written before parameters existed
    assert md.restore(old_snapshot).parameters == {}
    refused = md.apply(state, md.SetParameter(md.ParameterRecord("nope", "shovel", "x", "{}")))[1]
    assert not refused.ok
    cleared, outcome = md.apply(state, md.ClearParameter("/", "shovel", "s1"))
    assert cleared.parameters == {} and outcome.changes[0].kind == "parameter"
    gone, _ = md.apply(state, md.DeleteVhost("/"))
    assert gone.parameters == {}
    command = md.command_from_dict(md.command_to_dict(md.SetParameter(record, cid="c2")))
    assert command == md.SetParameter(record, cid="c2")


def test_broker_parameters_are_persisted_and_recovered() -> None:
    broker = Broker()
    assert broker.set_parameter("shovel", "/", "s1", '{"a": 1}') is True
    assert broker.set_parameter("shovel", "/", "s1", '{"a": 2}') is False
    records = [r for e in broker.take_effects() if isinstance(e, Persist) for r in e.records]
    assert [type(r) for r in records] == [ParameterRecord, ParameterRecord]
    assert broker.clear_parameter("shovel", "/", "s1") and not broker.clear_parameter("shovel", "/", "s1")
    records += [r for e in broker.take_effects() if isinstance(e, Persist) for r in e.records]
    again = Broker()
    again.recover([from_cbor(to_cbor(r)) for r in records[:2]])
    assert again.parameters == {("shovel", "/", "s1"): '{"a": 2}'}
    third = Broker()
    third.recover([from_cbor(to_cbor(r)) for r in records])
    assert third.parameters == {}
