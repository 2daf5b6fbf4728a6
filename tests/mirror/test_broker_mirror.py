"""A mirrored queue on a single node, in process: an `ha-mode` policy gives a classic queue the mirrored backend
(at declare, and on a policy change, both ways), it works as a classic queue (one replica: committed at once),
and `raftmq ctl list_queues` and /api/queues show leader, epoch, ISR, HW and the replica's LEO."""

from __future__ import annotations

import json

import pytest
import trio

from node import ctl
from node.broker.backend_local import LocalBackend
from node.broker.backend_mirror import MirrorBackend, mirror_status
from node.broker.policies import PolicyError
from tests.broker.harness import Client, bodies, connected, new_broker
from tests.management.helpers import raw_exchange, served_broker

HA = {"ha-mode": "exactly", "ha-params": 3, "ha-min-insync": 2}


def test_policy_picks_the_backend_at_declare_and_on_change() -> None:
    broker = new_broker()
    broker.set_policy("/", "ha", "^ha\\.", "queues", HA, 0)
    client = connected(broker)
    client.declare("ha.q")
    client.declare("plain")
    client.declare("ha.excl", exclusive=True)  # RabbitMQ never mirrors exclusive queues
    client.declare("ha.qq", durable=True, arguments={"x-queue-type": "quorum"})
    queues = broker.vhosts["/"].queues
    assert isinstance(queues["ha.q"].backend, MirrorBackend)
    assert [type(queues[n].backend) for n in ("plain", "ha.excl", "ha.qq")] == [LocalBackend] * 3
    client.publish("", "ha.q", b"m1")
    client.publish("", "ha.q", b"m2")
    status = mirror_status(broker, queues["ha.q"], "rabbit@n")
    assert status is not None
    assert (status["leader"], status["epoch"], status["isr"], status["hw"], status["leo"]) == (
        "rabbit@n", 0, ["rabbit@n"], 2, {"rabbit@n": 2})
    assert status["min_insync"] == 1  # capped by the one replica: a single node serves
    assert bodies(client.consume("ha.q", no_ack=True)) == [b"m1", b"m2"]

    broker.set_policy("/", "ha2", "^plain$", "queues", {"ha-mode": "all"}, 0)  # a policy change adds ha-mode
    assert isinstance(queues["plain"].backend, MirrorBackend)
    broker.clear_policy("/", "ha")  # ... and removes it: the queue and its consumer carry on
    assert type(queues["ha.q"].backend) is LocalBackend and mirror_status(broker, queues["ha.q"], "n") is None
    assert bodies(client.publish("", "ha.q", b"m3")) == [b"m3"]

    with pytest.raises(PolicyError, match='ha-mode="exactly" takes an integer'):
        broker.set_policy("/", "bad", ".*", "queues", {"ha-mode": "exactly"}, 0)


async def test_ctl_list_queues_shows_the_mirror(capsys: pytest.CaptureFixture[str]) -> None:
    async with served_broker() as s:
        s.broker.set_policy("/", "ha", "^ha\\.", "queues", HA, 0)
        client = Client(s.broker)
        client.open()
        client.declare("ha.orders", durable=True)
        client.declare("q2")
        client.publish("", "ha.orders", b"x")
        argv = ["--node", f"127.0.0.1:{s.port}", "list_queues", "name", "leader", "epoch", "isr", "hw", "mirror.leo"]
        assert await trio.to_thread.run_sync(ctl.main, argv) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[1].split() == ["ha.orders", "rabbit@test", "0", "rabbit@test", "1", '{"rabbit@test":', "1}"]
        assert lines[2].split() == ["q2", "rabbit@test"]  # not mirrored: no mirror columns
        assert await trio.to_thread.run_sync(ctl.main, ["--node", f"127.0.0.1:{s.port}", "--json", "list_queues"]) == 0
        row = json.loads(capsys.readouterr().out)[0]
        assert row["effective_policy_definition"] == HA and row["policy"] == "ha"
        assert row["slave_nodes"] == [] and row["synchronised_slave_nodes"] == []
        assert row["mirror"]["replicas"] == ["rabbit@test"] and row["mirror"]["truncation"] == "leader-epoch"
        raw = await raw_exchange(s.port, b"GET /metrics/per-object HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = raw.decode()
        assert 'raftmq_mirror_isr_size{vhost="/",queue="ha.orders"} 1' in text
        assert 'raftmq_mirror_high_watermark{vhost="/",queue="ha.orders"} 1' in text
        assert "q2" not in "".join(line for line in text.splitlines() if line.startswith("raftmq_mirror"))
        raw = await raw_exchange(s.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        totals = [line for line in raw.decode().splitlines() if line.startswith("raftmq_mirror_queues")]
        assert totals == ["raftmq_mirror_queues 1", "raftmq_mirror_queues_under_replicated 0",
                          "raftmq_mirror_queues_below_min_insync 0", "raftmq_mirror_queues_without_leader 0"]
