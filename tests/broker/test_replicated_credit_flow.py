"""Replicated mode's credit flow (node/broker/credit_flow.py): a publisher whose queue is behind is paused
(`PauseReading`) and resumed (`ResumeReading`) by the broker, on the leader's node or a follower's; and the
credit window of a prefetch-limited consumer (node/broker/delivery.py, `credit_window`)."""

from __future__ import annotations

from typing import Any

from node.amqp import events as ev
from node.amqp import methods as m
from node.amqp.properties import BasicProperties
from node.broker.credit_flow import FLOW_PAUSE_MAX_MS, FLOW_QUIET_MS, FLOW_STALL_MS
from node.broker.effects import PauseReading, ProposeQueue, ResumeReading
from tests.broker.cluster_harness import Cluster, ClusterClient, cluster_client, take
from tests.broker.harness import deliveries

READY_MAX = 6
PUBLISHER = 7  # the publisher's conn id on its node (consumers use 1)


def _setup(publisher_node: str, **config: Any) -> tuple[Cluster, ClusterClient]:
    config.setdefault("publish_flow_ready_max", READY_MAX)
    cluster = Cluster(**config)
    declarer = cluster_client(cluster, "a")  # a leads the queue
    declarer.declare("q", durable=True, arguments={"x-queue-type": "quorum"})
    cluster.commit()
    publisher = cluster_client(cluster, publisher_node, PUBLISHER)
    for node in ("a", "b", "c"):
        take(cluster, node)
    return cluster, publisher


def _read(cluster: Cluster, client: ClusterClient, count: int, queue: str = "q") -> list[Any]:
    """One socket read holding `count` publishes, handed over as the runtime does (`handle_many`)."""
    method = m.BasicPublish(exchange="", routing_key=queue)
    events = [ev.ContentReceived(1, method, BasicProperties(delivery_mode=2), b"x") for _ in range(count)]
    return cluster.feed(client.node, client.broker.handle_many(client.conn_id, events, client.now_ms))


def _consumer(cluster: Cluster, node: str, prefetch: int) -> ClusterClient:
    consumer = cluster_client(cluster, node)
    consumer.call(m.BasicQos(prefetch_count=prefetch))
    consumer.consume("q", "t")
    cluster.commit()
    return consumer


def _ack_all(consumer: ClusterClient, effects: list[Any]) -> int:
    got = deliveries(effects)
    if got:
        consumer.ack(got[-1].method.delivery_tag, multiple=True)
        consumer.cluster.commit()
    return len(got)


def _resumes(effects: list[Any]) -> bool:
    return any(isinstance(e, ResumeReading) and e.conn_id == PUBLISHER for e in effects)


def _of_type(effects: list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def _paused(effects: list[Any]) -> bool:
    return bool(_of_type(effects, PauseReading))


def _resumed(cluster: Cluster, node: str) -> bool:
    return any(isinstance(e, ResumeReading) and e.conn_id == PUBLISHER for e in take(cluster, node))


def _check_paused_until_drained(publisher_node: str, consumer_node: str) -> None:
    cluster, publisher = _setup(publisher_node)
    consumer = _consumer(cluster, consumer_node, prefetch=2)
    assert not _paused(_read(cluster, publisher, 20))  # not committed yet: nothing is behind at this read
    cluster.commit()
    effects = _read(cluster, publisher, 1)
    assert _of_type(effects, PauseReading) == [PauseReading(PUBLISHER)]
    assert not _resumes(effects)
    while True:
        out = {node: take(cluster, node) for node in ("a", "b", "c")}
        if _resumes(out[publisher_node]):
            break
        assert _ack_all(consumer, out[consumer_node]), "the consumer got nothing more, yet the publisher is paused"
    ready = cluster.brokers[publisher_node].vhosts["/"].queues["q"].machine.ready_count
    assert ready <= READY_MAX // 2
    assert cluster.brokers[publisher_node].flow_pauses == 1


def test_a_publisher_on_the_leaders_node_is_paused_while_the_queue_is_behind_and_resumed_when_it_caught_up() -> None:
    _check_paused_until_drained("a", "a")


def test_a_publisher_on_a_follower_is_paused_by_a_backlog_consumed_on_another_node() -> None:
    _check_paused_until_drained("c", "b")


def test_every_publisher_of_the_queue_is_paused_and_resumed() -> None:
    cluster, publisher = _setup("b")
    other = cluster_client(cluster, "c", PUBLISHER)
    consumer = _consumer(cluster, "a", prefetch=2)
    _read(cluster, publisher, 20)
    cluster.commit()
    assert _paused(_read(cluster, publisher, 1))
    assert _paused(_read(cluster, other, 1))
    resumed: set[str] = set()
    for _ in range(20):
        out = {node: take(cluster, node) for node in ("a", "b", "c")}
        resumed |= {node for node in ("b", "c") if _resumes(out[node])}
        _ack_all(consumer, out["a"])
    assert resumed == {"b", "c"}
    assert not cluster.brokers["b"].flow_paused and not cluster.brokers["c"].flow_paused


def test_a_queue_without_consumers_never_pauses_its_publisher() -> None:
    cluster, publisher = _setup("b")
    for _ in range(5):
        assert not _paused(_read(cluster, publisher, 20))
        cluster.commit()
    assert cluster.brokers["b"].vhosts["/"].queues["q"].machine.ready_count == 100


def test_publishes_in_flight_through_raft_pause_their_publisher_until_applied() -> None:
    cluster, publisher = _setup("b", publish_flow_inflight_max=10)
    cluster.hold = True  # not committed: in flight
    assert _paused(_read(cluster, publisher, 11))  # no consumer needed: the replicated path itself is behind
    assert cluster.brokers["b"].vhosts["/"].queues["q"].flow_inflight == 11
    cluster.hold = False
    cluster.release()
    cluster.commit()
    assert cluster.brokers["b"].vhosts["/"].queues["q"].flow_inflight == 0
    assert _resumed(cluster, "b")


def test_abandoned_publishes_are_no_longer_in_flight() -> None:
    cluster, publisher = _setup("b", publish_flow_inflight_max=10)
    cluster.hold = True
    assert _paused(_read(cluster, publisher, 11))
    cluster.hold = False
    cluster.abandon()
    assert cluster.brokers["b"].vhosts["/"].queues["q"].flow_inflight == 0
    assert _resumed(cluster, "b")


def test_a_backlog_that_stays_while_its_queue_is_busy_ends_the_pause_and_the_publisher_is_left_alone() -> None:
    cluster, publisher = _setup("b")
    consumer = _consumer(cluster, "a", prefetch=2)  # requeues everything: busy, but the backlog never goes down
    _read(cluster, publisher, 20)
    cluster.commit()
    assert _paused(_read(cluster, publisher, 1))
    broker = cluster.brokers["b"]
    assert broker.next_deadline_ms() == FLOW_PAUSE_MAX_MS
    cluster.tick("b", FLOW_STALL_MS)
    assert not _resumed(cluster, "b")  # its last publish is still in flight: the node, not the consumer, is behind
    cluster.commit()

    def requeue_round(now_ms: int) -> None:
        for delivery in deliveries(take(cluster, "a")):
            consumer.call(m.BasicNack(delivery_tag=delivery.method.delivery_tag, requeue=True))
        cluster.commit()
        cluster.tick("b", now_ms)

    now_ms = FLOW_STALL_MS
    while now_ms < 2 * FLOW_STALL_MS - 1:
        now_ms += FLOW_STALL_MS // 10
        requeue_round(min(now_ms, 2 * FLOW_STALL_MS - 1))
        assert not _resumed(cluster, "b")
    requeue_round(2 * FLOW_STALL_MS)
    assert _resumed(cluster, "b")
    assert broker.flow_pauses_stalled == 1
    publisher.now_ms = 2 * FLOW_STALL_MS + 1
    assert not _paused(_read(cluster, publisher, 5))  # quiet
    cluster.commit()
    publisher.now_ms = 2 * FLOW_STALL_MS + FLOW_QUIET_MS
    assert _paused(_read(cluster, publisher, 1))


def test_a_consumer_that_stopped_holds_its_publisher_until_the_safety_net() -> None:
    """Nothing applied at all: indistinguishable from a node that applies nothing (loaded), so no stall."""
    cluster, publisher = _setup("b")
    _consumer(cluster, "a", prefetch=2)  # never acks
    _read(cluster, publisher, 20)
    cluster.commit()
    assert _paused(_read(cluster, publisher, 1))
    cluster.commit()
    for now_ms in range(0, FLOW_PAUSE_MAX_MS, FLOW_STALL_MS // 2):
        cluster.tick("b", now_ms)
        assert not _resumed(cluster, "b")
    cluster.tick("b", FLOW_PAUSE_MAX_MS)
    assert _resumed(cluster, "b")
    publisher.now_ms = FLOW_PAUSE_MAX_MS + 1
    assert not _paused(_read(cluster, publisher, 5))  # quiet


def test_a_connection_consuming_from_the_queue_is_not_paused_for_it() -> None:
    cluster, _publisher = _setup("b")
    both = _consumer(cluster, "b", prefetch=2)  # conn 1 on b consumes and publishes
    _read(cluster, both, 20)
    cluster.commit()
    assert not _paused(_read(cluster, both, 1))


def test_a_paused_connection_that_closes_is_forgotten() -> None:
    cluster, publisher = _setup("b")
    _consumer(cluster, "a", prefetch=2)
    _read(cluster, publisher, 20)
    cluster.commit()
    assert _paused(_read(cluster, publisher, 1))
    publisher.close()
    assert not cluster.brokers["b"].flow_paused
    assert cluster.brokers["b"].next_deadline_ms() is None


def test_a_deleted_queue_releases_its_publishers() -> None:
    cluster, publisher = _setup("b")
    consumer = _consumer(cluster, "a", prefetch=2)
    _read(cluster, publisher, 20)
    cluster.commit()
    assert _paused(_read(cluster, publisher, 1))
    consumer.call(m.QueueDelete(queue="q"))
    cluster.commit()
    assert _resumed(cluster, "b")


def test_a_prefetch_limited_consumer_gets_a_credit_window_of_twice_its_prefetch() -> None:
    cluster, _publisher = _setup("b")
    consumer = cluster_client(cluster, "c")
    consumer.call(m.BasicQos(prefetch_count=1000))
    effects = cluster.brokers["c"].handle(consumer.conn_id, ev.MethodReceived(1, m.BasicConsume(queue="q")), 0)
    grants = [e.command.credit for e in _of_type(effects, ProposeQueue) if type(e.command).__name__ == "AddCredit"]
    assert grants == [2000]
    unlimited = cluster_client(cluster, "c", 2)
    effects = cluster.brokers["c"].handle(unlimited.conn_id, ev.MethodReceived(1, m.BasicConsume(queue="q")), 0)
    grants = [e.command.credit for e in _of_type(effects, ProposeQueue) if type(e.command).__name__ == "AddCredit"]
    assert grants == [cluster.brokers["c"].config.consumer_credit_window]


def test_a_pause_ends_after_the_safety_net_whatever_the_backlog() -> None:
    cluster, publisher = _setup("b", publish_flow_inflight_max=10)
    cluster.hold = True  # never committed, never given up
    assert _paused(_read(cluster, publisher, 11))
    assert cluster.brokers["b"].next_deadline_ms() == FLOW_PAUSE_MAX_MS
    cluster.tick("b", FLOW_PAUSE_MAX_MS - 1)
    assert not _resumed(cluster, "b")
    assert cluster.brokers["b"].next_deadline_ms() == FLOW_PAUSE_MAX_MS
    cluster.tick("b", FLOW_PAUSE_MAX_MS)
    assert _resumed(cluster, "b")
