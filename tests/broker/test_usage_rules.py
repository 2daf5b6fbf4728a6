"""Auto-delete and x-expires as the queue machine decides them (cluster/queue/usage.py), one rule in both modes:
a single node (the machine applied at once) and a scripted three-node cluster (tests/broker/cluster_harness.py,
the machine's decision applied through the log and carried out by the node that proposed the command)."""

from __future__ import annotations

from typing import Any

import pytest

from node.amqp import methods as m
from tests.broker.cluster_harness import Cluster, cluster_client, take
from tests.broker.harness import Client, connected, deliveries

MODES = ("single", "cluster")


class Setup:
    """A client and a way to let the queue commands take effect (a cluster commits its logs)."""

    def __init__(self, mode: str) -> None:
        self.cluster: Cluster | None = Cluster() if mode == "cluster" else None
        self.client: Client = connected() if self.cluster is None else cluster_client(self.cluster, "a")
        if self.cluster is not None:
            self.other: Client = cluster_client(self.cluster, "b")

    def settle(self) -> None:
        if self.cluster is not None:
            self.cluster.commit()

    def tick(self, now_ms: int) -> None:
        if self.cluster is None:
            self.client.broker.tick(now_ms)
        else:
            for node in self.cluster.brokers:
                self.cluster.tick(node, now_ms)
            self.cluster.commit()

    def at(self, now_ms: int) -> None:
        self.client.now_ms = now_ms
        if self.cluster is not None:
            self.other.now_ms = now_ms

    def exists(self, name: str) -> bool:
        brokers = [self.client.broker] if self.cluster is None else list(self.cluster.brokers.values())
        present = [name in broker.vhosts["/"].queues for broker in brokers]
        assert len(set(present)) == 1, present  # every node agrees
        return present[0]


@pytest.fixture(params=MODES)
def setup(request: Any) -> Setup:
    return Setup(request.param)


def test_a_cancel_with_unacked_messages_auto_deletes_the_queue(setup: Setup) -> None:
    c = setup.client
    c.declare("ad", auto_delete=True)
    setup.settle()
    c.call(m.BasicQos(prefetch_count=10))
    c.consume("ad", "t")
    setup.settle()
    out = c.publish("", "ad", b"m")
    setup.settle()
    assert deliveries(out + (take(setup.cluster, "a") if setup.cluster is not None else []))
    c.call(m.BasicCancel(consumer_tag="t"))  # the delivered message is still unacked
    setup.settle()
    assert not setup.exists("ad")


def test_a_queue_that_never_had_a_consumer_is_not_auto_deleted(setup: Setup) -> None:
    c = setup.client
    c.declare("ad", auto_delete=True)
    setup.settle()
    c.call(m.BasicGet(queue="ad", no_ack=True))
    setup.settle()
    setup.tick(60_000)
    assert setup.exists("ad")


def test_x_expires_is_reset_by_a_declare(setup: Setup) -> None:
    c = setup.client
    c.declare("exp", arguments={"x-expires": 500})
    setup.settle()
    setup.at(400)
    again = c if setup.cluster is None else setup.other  # (cluster: on a node that does not lead the queue)
    again.declare("exp", arguments={"x-expires": 500})  # a use: counted again from 400
    setup.settle()
    setup.tick(600)
    assert setup.exists("exp")
    setup.tick(900)
    assert not setup.exists("exp")


def test_x_expires_is_reset_by_a_get_and_held_off_by_a_consumer(setup: Setup) -> None:
    c = setup.client
    c.declare("exp", arguments={"x-expires": 500})
    setup.settle()
    setup.at(300)
    c.call(m.BasicGet(queue="exp", no_ack=True))
    setup.settle()
    setup.tick(700)
    assert setup.exists("exp")
    c.consume("exp", "t")
    setup.settle()
    setup.tick(5_000)
    assert setup.exists("exp")
    setup.at(5_000)
    c.call(m.BasicCancel(consumer_tag="t"))
    setup.settle()
    setup.tick(5_400)
    assert setup.exists("exp")
    setup.tick(5_500)
    assert not setup.exists("exp")


def test_a_policy_x_expires_counts_from_when_it_applied(setup: Setup) -> None:
    c = setup.client
    c.declare("pol")
    setup.settle()
    setup.tick(10_000)
    broker = c.broker if setup.cluster is None else setup.cluster.brokers["a"]
    broker.set_policy("/", "exp", "^pol$", "queues", {"expires": 1000}, 0)  # at 10 000, the broker's last tick
    effects = broker.take_effects()
    if setup.cluster is not None:
        setup.cluster.feed("a", effects)  # the record reaches every node; the leader (a) proposes SetArgs
    setup.settle()
    setup.tick(10_900)
    assert setup.exists("pol")
    setup.tick(11_000)
    assert not setup.exists("pol")


def test_a_cancelled_consumer_stays_cancelled_after_a_snapshot_install() -> None:
    cluster = Cluster()
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.declare("q")
    cluster.commit()
    b.call(m.BasicQos(prefetch_count=10))
    b.consume("q", "t")
    cluster.commit()
    a.publish("", "q", b"m")
    cluster.commit()
    assert deliveries(take(cluster, "b"))
    b.call(m.BasicCancel(consumer_tag="t"))  # still holding the message
    cluster.commit()
    cluster.pause("b")
    cluster.resume("b")  # b installs a snapshot and resyncs its parties with it
    cluster.commit()
    for broker in cluster.brokers.values():
        assert broker.vhosts["/"].queues["q"].machine.consumer_count == 0
