"""Policies on the pure broker: single node (applied at once, reverted when cleared, stored and recovered,
alternate exchanges) and replicated mode (the queue's Raft leader proposes SetArgs; every replica agrees)."""

from __future__ import annotations

from typing import Any

import pytest

from node.amqp import methods as m
from node.broker.broker import Broker
from node.broker.policies import PolicyError
from node.broker.records import PolicyRecord, from_cbor, to_cbor
from tests.broker.cluster_harness import Cluster, cluster_client
from tests.broker.harness import Client, bodies, connected, new_broker, of_type, persists


def count(c: Client, queue: str) -> int:
    ok = of_type(c.declare(queue, passive=True), m.QueueDeclareOk)
    return int(ok[0].message_count)


def publish_n(c: Client, queue: str, n: int, **props: Any) -> None:
    for i in range(n):
        c.publish("", queue, f"m{i}".encode(), **props)


def test_max_length_policy_drops_heads_at_once_and_clearing_reverts() -> None:
    c = connected()
    c.declare("jobs", durable=True)
    publish_n(c, "jobs", 5)
    c.broker.set_policy("/", "cap", "^jobs$", "queues", {"max-length": 2}, 0)
    c.broker.take_effects()
    assert count(c, "jobs") == 2
    publish_n(c, "jobs", 3)
    assert count(c, "jobs") == 2
    assert c.broker.clear_policy("/", "cap") and not c.broker.clear_policy("/", "cap")
    publish_n(c, "jobs", 3)
    assert count(c, "jobs") == 5
    assert bodies(c.consume("jobs", no_ack=True)) == [b"m1", b"m2", b"m0", b"m1", b"m2"]


def test_a_queue_declared_later_gets_the_policy_and_its_own_smaller_limit_wins() -> None:
    c = connected()
    c.broker.set_policy("/", "cap", "^cap", None, {"max-length": 3, "overflow": "reject-publish"}, None)
    c.declare("cap.a")
    c.declare("cap.b", arguments={"x-max-length": 1})
    c.declare("other")
    for queue in ("cap.a", "cap.b", "other"):
        publish_n(c, queue, 5)
    assert (count(c, "cap.a"), count(c, "cap.b"), count(c, "other")) == (3, 1, 5)


def test_priority_picks_one_policy_and_a_higher_one_replaces_it() -> None:
    c = connected()
    c.declare("q")
    c.broker.set_policy("/", "low", ".*", "all", {"max-length": 4}, 1)
    publish_n(c, "q", 6)
    assert count(c, "q") == 4
    c.broker.set_policy("/", "high", "^q$", "queues", {"max-length": 1}, 5)
    assert count(c, "q") == 1
    c.broker.clear_policy("/", "high")
    publish_n(c, "q", 6)
    assert count(c, "q") == 4


def test_message_ttl_policy_expires_messages() -> None:
    c = connected()
    c.declare("ttl")
    c.broker.set_policy("/", "ttl", "ttl", "queues", {"message-ttl": 100}, 0)
    publish_n(c, "ttl", 3)
    c.broker.tick(50)
    assert count(c, "ttl") == 3
    c.broker.tick(1000)
    c.now_ms = 1000
    assert count(c, "ttl") == 0


def test_max_length_policy_dead_letters_to_the_policy_dlx() -> None:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="dlx", type="fanout"))
    c.declare("dead")
    c.bind("dead", "dlx")
    c.declare("src")
    publish_n(c, "src", 3)
    c.broker.set_policy("/", "p", "^src$", "queues", {"max-length": 1, "dead-letter-exchange": "dlx"}, 0)
    c.broker.take_effects()
    assert (count(c, "src"), count(c, "dead")) == (1, 2)


def test_invalid_policy_or_unknown_vhost_changes_nothing() -> None:
    c = connected()
    c.declare("q")
    with pytest.raises(PolicyError):
        c.broker.set_policy("/", "bad", ".*", "all", {"max-length": -1}, 0)
    with pytest.raises(KeyError):
        c.broker.set_policy("nowhere", "p", ".*", "all", {"max-length": 1}, 0)
    assert c.broker.take_effects() == []
    assert c.broker.vhosts["/"].policies == {}
    publish_n(c, "q", 3)
    assert count(c, "q") == 3


def test_alternate_exchange_policy_routes_unroutable_messages() -> None:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="ae", type="fanout"))
    c.declare("lost")
    c.bind("lost", "ae")
    c.call(m.ExchangeDeclare(exchange="orders", type="direct"))
    c.publish("orders", "nowhere")
    assert count(c, "lost") == 0
    c.broker.set_policy("/", "ae", "^orders$", "exchanges", {"alternate-exchange": "ae"}, 0)
    c.publish("orders", "nowhere")
    assert count(c, "lost") == 1
    c.broker.set_policy("/", "ae", "^orders$", "queues", {"max-length": 100}, 0)  # (no longer for exchanges)
    c.publish("orders", "nowhere")
    assert count(c, "lost") == 1


def test_policies_are_stored_and_recovered_with_their_effect() -> None:
    c = connected()
    stored = [r for p in persists(c.declare("jobs", durable=True)) for r in p.records]
    c.broker.set_policy("/", "cap", "^jobs$", "queues", {"max-length": 2}, 3)
    c.broker.set_policy("/", "gone", ".*", "all", {"expires": 5000}, 0)
    c.broker.clear_policy("/", "gone")
    stored += [r for p in persists(c.broker.take_effects()) for r in p.records]
    assert [type(r) for r in stored].count(PolicyRecord) == 3
    recovered = [from_cbor(to_cbor(r)) for r in stored]
    fresh = new_broker()
    fresh.recover(recovered)
    assert sorted(fresh.vhosts["/"].policies) == ["cap"]
    assert fresh.vhosts["/"].policies["cap"].priority == 3
    assert fresh.vhosts["/"].queues["jobs"].machine.args.max_length == 2
    assert fresh.vhosts["/"].queues["jobs"].machine.args.expires_ms is None


def test_expires_policy_sets_the_queue_expiry() -> None:
    b = new_broker()
    c = connected(b)
    c.declare("idle")
    b.set_policy("/", "exp", "idle", "queues", {"expires": 1000}, 0)
    assert b.vhosts["/"].queues["idle"].machine.args.expires_ms == 1000
    b.tick(5000)
    assert "idle" not in b.vhosts["/"].queues


# --- replicated mode ------------------------------------------------------------------------------------------


def mirror_policy(cluster: Cluster, record: PolicyRecord) -> None:
    for node, broker in cluster.brokers.items():
        cluster.feed(node, broker.apply_records([record]))
    cluster.commit()


def replica_args(broker: Broker, queue: str) -> Any:
    return broker.vhosts["/"].queues[queue].machine.args


def test_replicated_leader_proposes_set_args_and_every_replica_applies_it() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    cluster.feed("a", a.declare("qq", durable=True, arguments={"x-queue-type": "quorum"}))
    cluster.commit()
    for i in range(5):
        cluster.feed("a", a.publish("", "qq", f"m{i}".encode()))
    cluster.commit()
    before = len(cluster.logs[("/", "qq")])
    mirror_policy(cluster, PolicyRecord("/", "cap", "^qq$", "queues", {"max-length": 2, "delivery-limit": 1}))
    assert len(cluster.logs[("/", "qq")]) == before + 1  # one SetArgs, from the leader only
    for broker in cluster.brokers.values():
        args = replica_args(broker, "qq")
        assert (args.max_length, args.delivery_limit) == (2, 1)
        assert broker.vhosts["/"].queues["qq"].machine.ready_count == 2
    cluster.brokers["a"].tick(10_000)  # nothing differs: no further proposal
    cluster.feed("a", cluster.brokers["a"].tick(20_000))
    assert len(cluster.logs[("/", "qq")]) == before + 1
    mirror_policy(cluster, PolicyRecord("/", "cap", deleted=True))
    for broker in cluster.brokers.values():
        assert replica_args(broker, "qq").max_length is None


def test_replicated_new_leader_proposes_what_the_old_one_did_not() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    cluster.feed("a", a.declare("q2", durable=True, arguments={"x-queue-type": "quorum"}))
    cluster.commit()
    cluster.hold = True
    mirror_policy(cluster, PolicyRecord("/", "cap", "^q2$", "all", {"max-length": 7}))
    cluster.held.clear()  # the leader's SetArgs is lost
    cluster.hold = False
    assert replica_args(cluster.brokers["b"], "q2").max_length is None
    cluster.set_leader(("/", "q2"), "b")
    cluster.commit()
    for broker in cluster.brokers.values():
        assert replica_args(broker, "q2").max_length == 7


def test_replicated_dead_letter_strategy_and_delivery_limit_reach_quorum_replicas_only() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    cluster.feed("a", a.declare("qq", durable=True, arguments={"x-queue-type": "quorum",
                                                                "x-overflow": "reject-publish"}))
    cluster.feed("a", a.declare("cq", durable=True))
    cluster.commit()
    mirror_policy(cluster, PolicyRecord("/", "dlx", "q$", "queues", {
        "dead-letter-exchange": "dlx", "dead-letter-strategy": "at-least-once", "delivery-limit": 4}))
    for broker in cluster.brokers.values():
        qq, cq = replica_args(broker, "qq"), replica_args(broker, "cq")
        assert (qq.dead_letter_exchange, qq.dead_letter_strategy, qq.delivery_limit) == ("dlx", "at-least-once", 4)
        assert qq.holds_dead_letters
        assert (cq.dead_letter_exchange, cq.dead_letter_strategy, cq.delivery_limit) == ("dlx", "at-most-once", None)
