"""Vhost limits in the pure layers: validation, the limit check, the records that store them (definitions stream
and cluster metadata), and the translation between the two. The AMQP behaviour is tested on real processes in
tests/integration/test_vhost_limits.py."""

from __future__ import annotations

import cbor2
import pytest

from cluster.metadata import model as md
from node.broker import records as br
from node.broker import vhost_limits
from node.clustering import definitions as cluster_defs


def test_validate_accepts_known_integer_limits() -> None:
    assert vhost_limits.validate({"max-connections": 10, "max-queues": -1}) == {"max-connections": 10,
                                                                                "max-queues": -1}
    for bad in ({"max-channels": 1}, {"max-queues": "10"}, {"max-queues": True}, {"max-queues": 1.5}):
        with pytest.raises(vhost_limits.VhostLimitError):
            vhost_limits.validate(bad)


def test_reached_follows_rabbitmq() -> None:
    limits = {"max-queues": 2, "max-connections": 0}
    assert vhost_limits.reached(limits, "max-queues", 1) is None
    assert vhost_limits.reached(limits, "max-queues", 2) == 2
    assert vhost_limits.reached(limits, "max-connections", 0) == 0  # 0 refuses all
    assert vhost_limits.reached({"max-queues": -1}, "max-queues", 10**6) is None  # negative: no limit
    assert vhost_limits.reached({}, "max-queues", 10**6) is None


def test_vhost_record_keeps_limits_and_reads_older_records() -> None:
    record = br.VHostRecord("v", limits={"max-queues": 3})
    assert br.from_cbor(cbor2.loads(cbor2.dumps(br.to_cbor(record)))) == record
    assert br.from_cbor(["vhost", "v", False]) == br.VHostRecord("v")  # written before limits existed


def test_metadata_round_trip_and_translation() -> None:
    state, _ = md.apply(md.MetadataState(), md.PutVhost("v", limits={"max-connections": 5}))
    assert state.vhosts["v"].limits == {"max-connections": 5}
    assert md.from_plain(md.to_plain(state.vhosts["v"])) == state.vhosts["v"]
    mirrored = cluster_defs.mirror_records(md.MetadataState(), state)
    assert br.VHostRecord("v", limits={"max-connections": 5}) in mirrored
    changed, _ = md.apply(state, md.PutVhost("v", limits={}))
    assert cluster_defs.mirror_records(state, changed) == [br.VHostRecord("v", limits={})]
    command = cluster_defs.command_for(br.VHostRecord("v", limits={"max-queues": 1}), state,
                                       cluster_defs.client_local_placement("n1", 3))
    assert command == md.PutVhost("v", limits={"max-queues": 1})
