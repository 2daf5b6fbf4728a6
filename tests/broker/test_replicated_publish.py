"""Replicated mode: publishing, confirms, transactions, basic.get and dedup across three brokers (pure)."""

from __future__ import annotations

from cluster.queue.envelope import Envelope
from node.amqp import events as ev
from node.amqp import methods as m
from node.amqp.properties import BasicProperties
from node.broker.effects import CloseChannel, Persist, ProposeQueue
from node.broker.records import MessageRecord, QueueRecord
from tests.broker.cluster_harness import Cluster, ClusterClient, cluster_client, take
from tests.broker.harness import bodies, channel_close, of_type

KEY = ("/", "q")


def _setup(**declare: object) -> tuple[Cluster, ClusterClient, ClusterClient, ClusterClient]:
    cluster = Cluster()
    a, b, c = (cluster_client(cluster, node) for node in ("a", "b", "c"))
    a.declare("q", durable=True, arguments={"x-queue-type": "quorum", **declare})  # type: ignore[dict-item]
    cluster.commit()
    for node in ("a", "b", "c"):
        take(cluster, node)
    return cluster, a, b, c


def _acks(effects: list[object]) -> list[tuple[int, bool]]:
    return [(x.delivery_tag, x.multiple) for x in of_type(effects, m.BasicAck)]  # type: ignore[arg-type]


def test_confirm_waits_for_the_local_replica_then_consumer_on_another_node_gets_it() -> None:
    cluster, a, b, _c = _setup()
    a.call(m.ConfirmSelect())
    effects = a.publish("", "q", b"one") + a.publish("", "q", b"two")
    assert _acks(effects) == []  # nothing is confirmed before the entries commit
    cluster.commit()
    assert _acks(take(cluster, "a")) == [(1, False), (2, False)]
    b.consume("q", "t")
    cluster.commit()
    delivered = take(cluster, "b")
    assert bodies(delivered) == [b"one", b"two"]
    assert bodies(take(cluster, "a")) == [] and bodies(take(cluster, "c")) == []
    b.ack(2, multiple=True)
    cluster.commit()
    for broker in cluster.brokers.values():
        queue = broker.vhosts["/"].queues["q"]
        assert queue.machine.ready_count == 0 and queue.machine.unacked_count == 0


def test_confirms_released_together_coalesce_into_one_multiple_ack() -> None:
    cluster, a, _b, _c = _setup()
    a.call(m.ConfirmSelect())
    cluster.hold = True
    for n in range(3):
        a.publish("", "q", b"%d" % n)
    cluster.hold = False
    proposals = [data for _node, _key, data in cluster.held]
    cluster.held.clear()
    broker = cluster.brokers["a"]
    effects = broker.apply_committed("/", "q", broker.envelope_codec.read_batch(proposals, 0).envelopes)
    assert _acks(effects) == [(3, True)]


def test_no_message_records_and_every_definition_is_persisted() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    a.declare("tmp", durable=False, exclusive=True)
    broker = cluster.brokers["a"]
    event = ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key="tmp"), BasicProperties(delivery_mode=2),
                               b"x")
    assert not any(isinstance(e, Persist) for e in broker.handle(a.conn_id, event, 0))
    queue_records = [r for r in cluster.records if isinstance(r, QueueRecord)]
    assert queue_records and queue_records[-1].durable is False
    assert queue_records[-1].exclusive_owner == "a/1/1"
    assert not any(isinstance(r, MessageRecord) for r in cluster.records)
    assert "tmp" in cluster.brokers["b"].vhosts["/"].queues  # mirrored, locked to its owner
    b = cluster_client(cluster, "b")
    assert channel_close(b.consume("tmp"))[0] == 405


def test_fanout_confirm_waits_for_every_target_and_reject_publish_nacks() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    a.declare("q1", durable=True)
    a.declare("q2", durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    a.call(m.ExchangeDeclare(exchange="fan", type="fanout", durable=True))
    a.bind("q1", "fan")
    a.bind("q2", "fan")
    cluster.commit()
    a.call(m.ConfirmSelect())
    take(cluster, "a")
    a.publish("fan", "", b"first")
    a.publish("fan", "", b"second")  # q2 is full: the confirm is a nack
    cluster.commit()
    out = take(cluster, "a")
    assert _acks(out) == [(1, False)]
    assert [x.delivery_tag for x in of_type(out, m.BasicNack)] == [2]
    for broker in cluster.brokers.values():
        assert broker.vhosts["/"].queues["q1"].machine.ready_count == 2


def test_unroutable_mandatory_returns_and_confirms_at_once() -> None:
    _cluster, a, _b, _c = _setup()
    a.call(m.ConfirmSelect())
    effects = a.publish("", "nowhere", b"x", mandatory=True)
    assert of_type(effects, m.BasicReturn) and _acks(effects) == [(1, False)]


def test_tx_commit_ok_waits_for_accepted() -> None:
    cluster, a, _b, _c = _setup()
    a.call(m.TxSelect())
    a.publish("", "q", b"t1")
    a.publish("", "q", b"t2")
    effects = a.call(m.TxCommit())
    assert not of_type(effects, m.TxCommitOk)
    cluster.commit()
    assert len(of_type(take(cluster, "a"), m.TxCommitOk)) == 1
    assert cluster.brokers["c"].vhosts["/"].queues["q"].machine.ready_count == 2


def test_basic_get_answers_when_applied_and_ack_settles_everywhere() -> None:
    cluster, a, _b, c = _setup()
    a.publish("", "q", b"g")
    cluster.commit()
    effects = c.call(m.BasicGet(queue="q"))
    assert not of_type(effects, m.BasicGetOk)
    cluster.commit()
    got = take(cluster, "c")
    oks = [e for e in got if isinstance(getattr(e, "method", None), m.BasicGetOk)]
    assert len(oks) == 1 and oks[0].body == b"g"  # type: ignore[union-attr]
    c.call(m.BasicGet(queue="q"))
    cluster.commit()
    assert of_type(take(cluster, "c"), m.BasicGetEmpty)
    c.ack(1)
    cluster.commit()
    snaps = cluster.snapshots(KEY)
    assert len(set(snaps.values())) == 1
    assert cluster.brokers["a"].vhosts["/"].queues["q"].machine.unacked_count == 0


def _get_answers(effects: list[object]) -> list[bytes | None]:
    """The bodies of the get-oks among `effects`, None for each get-empty, in order."""
    out: list[bytes | None] = []
    for effect in effects:
        method = getattr(effect, "method", None)
        if isinstance(method, m.BasicGetOk):
            out.append(effect.body)  # type: ignore[attr-defined]
        elif isinstance(method, m.BasicGetEmpty):
            out.append(None)
    return out


def test_gets_a_restored_snapshot_covers_are_answered_as_they_were_applied() -> None:
    """A node that lags while its client's Gets commit elsewhere, then installs a peer's snapshot covering them
    (a mirrored queue's follower behind its leader's trim): the Get that took a message answers get-ok with it
    (held unacked here, its ack settles it everywhere), the one that found the queue empty answers get-empty."""
    cluster, a, _b, c = _setup()
    a.publish("", "q", b"g")
    cluster.commit()
    cluster.pause("c")
    c.call(m.BasicGet(queue="q"))
    c.call(m.BasicGet(queue="q"))
    cluster.commit()  # a and b apply both Gets; c nothing
    assert _get_answers(take(cluster, "c")) == []
    cluster.resume("c")
    assert _get_answers(take(cluster, "c")) == [b"g", None]
    c.ack(1)
    cluster.commit()
    assert len(set(cluster.snapshots(KEY).values())) == 1
    queue = cluster.brokers["a"].vhosts["/"].queues["q"].machine
    assert (queue.ready_count, queue.unacked_count) == (0, 0)


def test_a_get_a_restored_snapshot_does_not_cover_waits_for_its_entry() -> None:
    cluster, a, _b, c = _setup()
    a.publish("", "q", b"g")
    cluster.commit()
    cluster.pause("c")
    cluster.hold = True
    c.call(m.BasicGet(queue="q"))  # proposed, not in the log yet
    cluster.hold = False
    cluster.resume("c")  # the snapshot is from before the Get
    assert _get_answers(take(cluster, "c")) == []
    cluster.release()
    cluster.commit()
    assert _get_answers(take(cluster, "c")) == [b"g"]


def test_a_retried_proposal_is_applied_once() -> None:
    cluster, a, _b, _c = _setup()
    a.call(m.ConfirmSelect())
    a.publish("", "q", b"once")
    cluster.duplicate_last(KEY)
    cluster.commit()
    assert _acks(take(cluster, "a")) == [(1, False)]
    for broker in cluster.brokers.values():
        assert broker.vhosts["/"].queues["q"].machine.ready_count == 1


def test_a_resent_enqueue_under_a_new_proposal_id_is_a_duplicate_and_still_confirms() -> None:
    cluster, a, _b, _c = _setup()
    a.call(m.ConfirmSelect())
    cluster.hold = True
    a.publish("", "q", b"x")
    cluster.hold = False
    (_node, _key, data), = cluster.held
    cluster.held.clear()
    enqueue = next(iter(cluster.brokers["a"].publishers.values())).repl_waiting[1].targets[KEY]
    cluster.logs[KEY].append(data)
    cluster.logs[KEY].append(cluster.brokers["a"].envelope_codec.encode(Envelope(0, "a", 999, enqueue)))
    cluster.commit()
    assert _acks(take(cluster, "a")) == [(1, False)]
    assert cluster.brokers["b"].vhosts["/"].queues["q"].machine.ready_count == 1


def test_abandoned_publish_is_nacked_and_abandoned_get_answered_empty() -> None:
    cluster, a, _b, c = _setup()
    a.call(m.ConfirmSelect())
    cluster.hold = True
    a.publish("", "q", b"lost")
    c.call(m.BasicGet(queue="q"))
    cluster.abandon()
    cluster.hold = False
    assert [x.delivery_tag for x in of_type(take(cluster, "a"), m.BasicNack)] == [1]
    assert of_type(take(cluster, "c"), m.BasicGetEmpty)


def test_a_get_answered_late_is_returned_to_the_queue() -> None:
    cluster, a, _b, c = _setup()
    a.publish("", "q", b"late")
    cluster.commit()
    cluster.hold = True
    c.call(m.BasicGet(queue="q"))
    held = list(cluster.held)
    cluster.abandon()  # the client got get-empty ...
    cluster.hold = False
    assert of_type(take(cluster, "c"), m.BasicGetEmpty)
    for _node, key, data in held:  # ... but the Get commits after all
        cluster.logs[key].append(data)
    cluster.commit()
    assert not of_type(take(cluster, "c"), m.BasicGetOk)
    for broker in cluster.brokers.values():
        queue = broker.vhosts["/"].queues["q"]
        assert queue.machine.ready_count == 1 and queue.machine.unacked_count == 0


def test_only_proposals_leave_the_publishing_broker() -> None:
    cluster, a, _b, _c = _setup()
    broker = cluster.brokers["a"]
    publish = ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key="q"), BasicProperties(), b"x")
    effects = broker.handle(a.conn_id, publish, 0)
    assert [type(e) for e in effects] == [ProposeQueue]
    enqueue = effects[0].command  # type: ignore[union-attr]
    assert enqueue.publisher_id == ("a", 1, 1, 1) and enqueue.sequence == 1


def test_quorum_arguments_are_validated() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    code, text = channel_close(a.declare("bad", durable=True, arguments={"x-queue-type": "quorum",
                                                                          "x-quorum-initial-group-size": 0}))
    assert code == 406 and "x-quorum-initial-group-size" in text
    a.open(2)
    a.declare("good", channel=2, durable=True, arguments={"x-queue-type": "quorum", "x-quorum-initial-group-size": 3,
                                                          "x-delivery-limit": 5})
    record = [r for r in cluster.records if isinstance(r, QueueRecord) and r.name == "good"][-1]
    assert record.arguments["x-quorum-initial-group-size"] == 3
    assert cluster.brokers["b"].vhosts["/"].queues["good"].machine.args.delivery_limit == 5


def test_publishes_reordered_by_a_retry_are_sent_again_not_lost() -> None:
    cluster, a, _b, _c = _setup()
    a.call(m.ConfirmSelect())
    cluster.hold = True
    a.publish("", "q", b"first")
    a.publish("", "q", b"second")
    cluster.hold = False
    (_n1, _k1, first), (_n2, _k2, second) = cluster.held
    cluster.held.clear()
    cluster.logs[KEY] += [second, first]  # the first was lost and retried after the second committed
    cluster.commit()
    assert _acks(take(cluster, "a")) == [(2, False), (1, False)]
    c = cluster_client(cluster, "c", conn_id=7)
    c.consume("q", "t")
    cluster.commit()
    assert bodies(take(cluster, "c")) == [b"second", b"first"]


def test_publishes_waiting_for_a_deleted_queue_are_confirmed_and_gets_answered() -> None:
    cluster, a, _b, _c = _setup()
    a.call(m.ConfirmSelect())
    a.open(2)
    cluster.hold = True
    a.publish("", "q", b"x")
    a.call(m.BasicGet(queue="q"), 2)
    cluster.hold = False
    effects = a.call(m.QueueDelete(queue="q"), 2)
    assert _acks(effects) == [(1, False)]
    assert of_type(effects, m.BasicGetEmpty)


def test_purge_ok_waits_for_the_purge_to_apply_so_a_later_confirmed_message_survives() -> None:
    # The chaos harness found this: purge-ok sent at proposal time let a message confirmed on another node just
    # after purge-ok be removed by the Purge when it was applied later in the log.
    cluster, a, b, _c = _setup()
    a.publish("", "q", b"old")
    cluster.commit()
    cluster.hold = True
    assert of_type(a.call(m.QueuePurge(queue="q")), m.QueuePurgeOk) == []  # not before the Purge applies
    cluster.hold = False
    cluster.release()
    cluster.commit()
    oks = of_type(take(cluster, "a"), m.QueuePurgeOk)
    assert [ok.message_count for ok in oks] == [1]  # type: ignore[attr-defined]
    b.call(m.ConfirmSelect())
    b.publish("", "q", b"new")
    cluster.commit()
    assert _acks(take(cluster, "b")) == [(1, False)]
    for broker in cluster.brokers.values():
        assert broker.vhosts["/"].queues["q"].machine.ready_count == 1


def test_an_abandoned_purge_closes_the_channel_instead_of_claiming_success() -> None:
    cluster, a, _b, _c = _setup()
    cluster.hold = True
    a.call(m.QueuePurge(queue="q"))
    cluster.hold = False
    cluster.abandon()
    effects = take(cluster, "a")
    assert of_type(effects, m.QueuePurgeOk) == []
    assert [e.reply_code for e in effects if isinstance(e, CloseChannel)] == [541]
