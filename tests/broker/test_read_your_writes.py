"""Replicated mode: a connection sees its own changes (node/broker/read_your_writes.py), on three brokers (pure).

consume-ok, cancel-ok and channel close-ok leave once this node's replica applied what they proposed (consume-ok at
once where this node leads the queue's group as its only voter); declare-ok
counts and queue.delete if-empty/if-unused wait for the connection's earlier proposals to that queue; the node whose
Detach empties an auto-delete queue deletes it, and its client's cancel-ok waits for the deletion.
"""

from __future__ import annotations

from node.amqp import events as ev
from node.amqp import methods as m
from tests.broker.cluster_harness import Cluster, ClusterClient, cluster_client, take
from tests.broker.harness import bodies, channel_close, of_type


def _setup(leader: str = "a", **declare: object) -> tuple[Cluster, ClusterClient, ClusterClient]:
    cluster = Cluster()
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    owner = a if leader == "a" else b
    owner.declare("q", durable=True, arguments={"x-queue-type": "quorum"}, **declare)  # type: ignore[arg-type]
    cluster.commit()
    for node in ("a", "b", "c"):
        take(cluster, node)
    return cluster, a, b


def test_consume_ok_waits_for_the_attach_to_apply() -> None:
    cluster, _a, b = _setup()
    cluster.hold = True
    b.consume("q", tag="t")
    assert of_type(take(cluster, "b"), m.BasicConsumeOk) == []
    cluster.hold = False
    cluster.release()
    cluster.commit()
    assert [ok.consumer_tag for ok in of_type(take(cluster, "b"), m.BasicConsumeOk)] == ["t"]
    assert cluster.brokers["b"].vhosts["/"].queues["q"].machine.consumer_count == 1


def test_consume_ok_leaves_at_once_where_the_node_leads_the_group_alone_and_reads_still_wait() -> None:
    cluster, _a, b = _setup()
    cluster.set_leader(("/", "q"), "b", alone=True)  # as for a classic queue declared on b: its one voter
    take(cluster, "b")
    cluster.hold = True
    b.consume("q", tag="t")
    assert [ok.consumer_tag for ok in of_type(take(cluster, "b"), m.BasicConsumeOk)] == ["t"]
    b.call(m.QueueDeclare(queue="q", passive=True))
    assert of_type(take(cluster, "b"), m.QueueDeclareOk) == []  # the count waits for the Attach
    cluster.hold = False
    cluster.release()
    cluster.commit()
    assert [ok.consumer_count for ok in of_type(take(cluster, "b"), m.QueueDeclareOk)] == [1]
    cluster.set_leader(("/", "q"), "b")  # a leader with other voters: its consume-ok waits again
    cluster.hold = True
    b.consume("q", tag="t2")
    assert of_type(take(cluster, "b"), m.BasicConsumeOk) == []


def test_cancel_ok_waits_for_the_detach_so_a_later_publish_stays_in_the_queue() -> None:
    cluster, a, b = _setup()
    b.consume("q", tag="t")
    cluster.commit()
    take(cluster, "b")
    cluster.hold = True
    b.call(m.BasicCancel(consumer_tag="t"))
    assert of_type(take(cluster, "b"), m.BasicCancelOk) == []
    cluster.hold = False
    cluster.release()
    cluster.commit()
    assert of_type(take(cluster, "b"), m.BasicCancelOk)
    a.publish("", "q", b"after")
    cluster.commit()
    assert bodies(take(cluster, "b")) == []
    assert cluster.brokers["a"].vhosts["/"].queues["q"].machine.ready_count == 1


def test_channel_close_ok_waits_until_the_unacked_message_is_back() -> None:
    cluster, a, b = _setup()
    a.publish("", "q", b"m")
    cluster.commit()
    b.open(2)
    b.call(m.BasicGet(queue="q"), 2)
    cluster.commit()
    assert of_type(take(cluster, "b"), m.BasicGetOk)
    cluster.hold = True
    b.handle(ev.ChannelClosed(2, by_client=True))
    assert of_type(take(cluster, "b"), m.ChannelCloseOk) == []
    cluster.hold = False
    cluster.release()
    cluster.commit()
    assert of_type(take(cluster, "b"), m.ChannelCloseOk)
    assert cluster.brokers["b"].vhosts["/"].queues["q"].machine.ready_count == 1


def test_declare_ok_counts_the_connections_own_publish_and_later_events_keep_their_order() -> None:
    cluster, a, _b = _setup()
    a.open(2)
    cluster.hold = True
    a.publish("", "q", b"one")  # channel 1, not applied yet
    a.call(m.QueueDeclare(queue="q", passive=True), 2)  # parked: the count must include "one"
    a.publish("", "q", b"two", channel=2)  # waits behind the declare on its channel
    assert of_type(take(cluster, "a"), m.QueueDeclareOk) == []
    assert len(cluster.held) == 1  # "two" was not proposed yet
    cluster.hold = False
    cluster.release()
    cluster.commit()
    assert [(ok.message_count, ok.consumer_count) for ok in of_type(take(cluster, "a"), m.QueueDeclareOk)] == [(1, 0)]
    assert cluster.brokers["a"].vhosts["/"].queues["q"].machine.ready_count == 2


def test_a_declare_waits_only_for_the_connections_own_proposals_to_that_queue() -> None:
    cluster, a, b = _setup()
    a.declare("other", durable=True, arguments={"x-queue-type": "quorum"})
    cluster.commit()
    take(cluster, "a")
    cluster.hold = True
    a.publish("", "other", b"x")
    b.publish("", "q", b"y")  # another connection's
    assert [ok.message_count for ok in of_type(a.call(m.QueueDeclare(queue="q", passive=True)), m.QueueDeclareOk)
            ] == [0]


def test_delete_if_empty_sees_the_message_just_published() -> None:
    cluster, a, _b = _setup()
    cluster.hold = True
    a.publish("", "q", b"x")
    a.call(m.QueueDelete(queue="q", if_empty=True))
    assert take(cluster, "a") == []
    cluster.hold = False
    cluster.release()
    cluster.commit()
    assert channel_close(take(cluster, "a"))[0] == 406
    assert "q" in cluster.brokers["a"].vhosts["/"].queues


def test_the_node_whose_cancel_empties_an_auto_delete_queue_deletes_it_before_cancel_ok() -> None:
    cluster, _a, b = _setup(auto_delete=True)  # led by a; the consumer is on b
    b.consume("q", tag="t")
    cluster.commit()
    take(cluster, "b")
    cluster.pause("a")  # the leader applies nothing: b decides alone
    b.call(m.BasicCancel(consumer_tag="t"))
    deleted_before = len([r for r in cluster.records if getattr(r, "deleted", False)])
    cluster.commit()
    assert of_type(take(cluster, "b"), m.BasicCancelOk)
    assert "q" not in cluster.brokers["b"].vhosts["/"].queues
    assert len([r for r in cluster.records if getattr(r, "deleted", False)]) == deleted_before + 1  # one deletion
    assert "q" not in cluster.brokers["a"].vhosts["/"].queues  # (the metadata reached the leader)


def test_an_abandoned_attach_answers_consume_ok_then_cancels_the_consumer() -> None:
    cluster, _a, b = _setup()
    cluster.hold = True
    b.consume("q", tag="t")
    cluster.hold = False
    cluster.abandon()
    kinds = [type(e.method) for e in take(cluster, "b") if hasattr(e, "method")]
    assert kinds == [m.BasicConsumeOk, m.BasicCancel]


def test_a_closing_connection_runs_its_parked_events() -> None:
    cluster, a, _b = _setup()
    a.open(2)
    cluster.hold = True
    a.publish("", "q", b"one")
    a.call(m.QueueDeclare(queue="q", passive=True), 2)  # parked
    a.publish("", "q", b"two", channel=2)  # parked behind it
    a.close()
    cluster.hold = False
    cluster.release()
    cluster.commit()
    assert cluster.brokers["b"].vhosts["/"].queues["q"].machine.ready_count == 2
    assert not cluster.brokers["a"].parked


def test_the_leader_deletes_an_auto_delete_queue_whose_deciding_node_never_applied_its_detach() -> None:
    cluster, _a, b = _setup(auto_delete=True)  # led by a; the consumer is on b
    b.consume("q", tag="t")
    cluster.commit()
    cluster.pause("b")  # b proposes its Detach but applies nothing (as if it died right after)
    b.call(m.BasicCancel(consumer_tag="t"))
    cluster.commit()
    assert "q" in cluster.brokers["a"].vhosts["/"].queues  # the leader does not decide on b's Detach ...
    cluster.tick("a", 1_000)
    assert "q" in cluster.brokers["a"].vhosts["/"].queues
    cluster.tick("a", 10_000)  # ... until the queue has stayed without consumers for a while
    assert "q" not in cluster.brokers["a"].vhosts["/"].queues
