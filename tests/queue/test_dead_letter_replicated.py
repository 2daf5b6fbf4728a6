"""At-least-once dead lettering through the broker's replicated mode, on the pure multi-replica harness.

The source quorum queue holds each dead letter until its leader saw every target accept it; a leader change, lost
or reordered republishes, a DLX that routes nowhere: every message reaches the target, and (thanks to the targets'
publisher dedup) exactly once in these scripts.
"""

from __future__ import annotations

from typing import Any

from cluster.queue import decode_proposal
from cluster.queue.ids import DeadLetterPublisher
from node.amqp import methods as m
from node.broker.replica import decode_payload
from node.broker.replica_dead_letters import DLX_RETRY_MS, DLX_SCAN_MS
from node.broker.replica_machine import replica_of
from tests.broker.cluster_harness import Cluster, ClusterClient, cluster_client, take
from tests.broker.harness import channel_close, deliveries

NODES = ("a", "b", "c")
ALO = {"x-queue-type": "quorum", "x-dead-letter-exchange": "dlx", "x-overflow": "reject-publish",
       "x-dead-letter-strategy": "at-least-once"}


def _queue(cluster: Cluster, node: str, name: str) -> Any:
    return cluster.brokers[node].vhosts["/"].queues[name]


def _setup(bind: bool = True, **extra: Any) -> tuple[Cluster, ClusterClient, ClusterClient]:
    cluster = Cluster()
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.call(m.ExchangeDeclare(exchange="dlx", type="fanout", durable=True))
    a.declare("dead", durable=True, arguments={"x-queue-type": "quorum"})
    if bind:
        a.bind("dead", "dlx")
    a.declare("q", durable=True, arguments={**ALO, **extra})
    cluster.commit()
    for body in (b"m1", b"m2", b"m3"):
        a.publish("", "q", body)
    b.consume("q", "t")
    cluster.commit()
    return cluster, a, b


def _reject_all(cluster: Cluster, b: ClusterClient) -> None:
    for delivered in deliveries(take(cluster, "b")):
        b.call(m.BasicReject(delivery_tag=delivered.method.delivery_tag, requeue=False))


def _dead_bodies(cluster: Cluster, node: str = "c") -> list[bytes]:
    machine = replica_of(_queue(cluster, node, "dead")).queue
    return [entry.message.payload.body for entry in machine._ready.iter_in_order()]


def _held(cluster: Cluster, node: str) -> int:
    held: int = _queue(cluster, node, "q").machine.held_count
    return held


def test_held_until_the_target_accepted_then_settled() -> None:
    cluster, _a, b = _setup()
    _reject_all(cluster, b)
    cluster.commit()
    for node in NODES:
        assert sorted(_dead_bodies(cluster, node)) == [b"m1", b"m2", b"m3"]
        assert _held(cluster, node) == 0
    assert len(set(cluster.snapshots(("/", "q")).values())) == 1


def test_a_new_leader_resends_what_the_old_one_lost() -> None:
    cluster, _a, b = _setup()
    _reject_all(cluster, b)
    cluster.hold = True
    cluster.commit()  # the rejects apply everywhere; the leader's republishes are caught in `held`
    assert all(_held(cluster, node) == 3 for node in NODES)
    cluster.held = cluster.held[:1]  # one republish got through before the crash, the rest were lost with it
    cluster.release()
    cluster.hold = False
    cluster.commit()
    cluster.crash("a")
    cluster.set_leader(("/", "q"), "b")
    cluster.commit()
    for node in ("b", "c"):
        assert sorted(_dead_bodies(cluster, node)) == [b"m1", b"m2", b"m3"]  # exactly once
        assert _held(cluster, node) == 0


def test_reordered_republishes_are_not_lost_to_the_high_water_dedup() -> None:
    cluster, _a, b = _setup()
    _reject_all(cluster, b)
    cluster.hold = True
    cluster.commit()
    cluster.held.reverse()  # hold sequence 3 commits first: 1 and 2 then look like duplicates to the target
    cluster.release()
    cluster.hold = False
    cluster.commit()
    assert sorted(_dead_bodies(cluster)) == [b"m1", b"m2", b"m3"]
    publishers = [decode_proposal(data, decode_payload).command.publisher_id for data in cluster.logs[("/", "dead")]]
    assert publishers.count(DeadLetterPublisher("/", "q", 1)) == 1  # sent again alone, under its own publisher id
    assert all(_held(cluster, node) == 0 for node in NODES)


def test_a_dlx_that_routes_nowhere_keeps_the_messages_and_retries() -> None:
    cluster, a, b = _setup(bind=False)
    _reject_all(cluster, b)
    cluster.commit()
    assert _held(cluster, "a") == 3 and _dead_bodies(cluster) == []
    assert cluster.brokers["a"].next_deadline_ms() is not None
    a.bind("dead", "dlx")
    cluster.commit()
    now_ms = 0
    for _ in range(4):
        now_ms += max(DLX_RETRY_MS, DLX_SCAN_MS)
        cluster.tick("a", now_ms)
        cluster.commit()
    assert sorted(_dead_bodies(cluster)) == [b"m1", b"m2", b"m3"]
    assert all(_held(cluster, node) == 0 for node in NODES)
    assert cluster.brokers["a"].next_deadline_ms() is None


def test_abandoned_republishes_are_sent_again_by_the_retry_scan() -> None:
    cluster, _a, b = _setup()
    _reject_all(cluster, b)
    cluster.hold = True
    cluster.commit()
    cluster.abandon()  # the runtime gave up on the republishes
    cluster.hold = False
    cluster.tick("a", DLX_RETRY_MS + DLX_SCAN_MS)
    cluster.commit()
    assert sorted(_dead_bodies(cluster)) == [b"m1", b"m2", b"m3"]
    assert all(_held(cluster, node) == 0 for node in NODES)


def test_held_messages_survive_a_restart_from_snapshot_and_count_against_max_length() -> None:
    cluster, a, b = _setup(bind=False, **{"x-max-length": 3})
    _reject_all(cluster, b)
    cluster.commit()
    cluster.crash("c")
    cluster.restart("c")
    assert _held(cluster, "c") == 3
    a.call(m.ConfirmSelect())
    a.publish("", "q", b"over")
    cluster.commit()
    assert any(isinstance(e.method, m.BasicNack) for e in take(cluster, "a") if hasattr(e, "method"))


def test_without_reject_publish_it_is_at_most_once() -> None:
    cluster, _a, b = _setup(**{"x-overflow": "drop-head"})
    _reject_all(cluster, b)
    cluster.commit()
    assert sorted(_dead_bodies(cluster)) == [b"m1", b"m2", b"m3"]
    assert _held(cluster, "a") == 0


def test_bad_strategy_is_precondition_failed() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    effects = a.declare("q", arguments={"x-dead-letter-strategy": "exactly-once"})
    code, text = channel_close(effects)
    assert code == 406
    assert text == ("PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': "
                    "{invalid_dead_letter_strategy,longstr,<<\"exactly-once\">>}")


def test_settle_lost_with_the_leader_is_proposed_by_the_next_one_without_resending() -> None:
    cluster, _a, b = _setup()
    _reject_all(cluster, b)
    cluster.hold = True
    cluster.commit()
    cluster.release()  # the republishes commit ...
    cluster.commit()
    assert cluster.held  # the settles
    cluster.held = []  # ... but the settles die with the leader
    cluster.hold = False
    cluster.crash("a")
    assert _held(cluster, "b") == 3
    dead_log_length = len(cluster.logs[("/", "dead")])
    cluster.set_leader(("/", "q"), "b")
    cluster.commit()
    assert len(cluster.logs[("/", "dead")]) == dead_log_length  # it saw the acceptances: nothing sent again
    for node in ("b", "c"):
        assert sorted(_dead_bodies(cluster, node)) == [b"m1", b"m2", b"m3"]
        assert _held(cluster, node) == 0


def test_a_lagging_node_that_installs_a_snapshot_forgets_settled_messages() -> None:
    cluster, _a, b = _setup(bind=False)
    _reject_all(cluster, b)
    cluster.commit()
    assert _held(cluster, "c") == 3
    state = _queue(cluster, "c", "q").held_sends
    cluster.pause("c")
    _a.bind("dead", "dlx")
    cluster.commit()
    cluster.tick("a", DLX_RETRY_MS + DLX_SCAN_MS)
    cluster.commit()
    assert _held(cluster, "a") == 0
    cluster.resume("c")
    assert _held(cluster, "c") == 0
    assert state is None or (not state.accepted and not state.sent)
