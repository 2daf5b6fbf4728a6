"""Queue incarnations: a queue deleted and declared again under its name must not come back with its old log.

Every quorum queue is the Raft group `q/<vhost>/<name>`, so a redeclared queue reuses its group id. A node that was
down while the queue was deleted and declared again still holds the old queue's log under that id. The fix
(node/runtime/cluster/runtime.py, cluster_incarnations.py, cluster_tracking.py): each declaration has an incarnation
(`QueueRecord.incarnation`), each node records the incarnation of the groups it hosts, deletes a stale group's local
state before Raft starts, and every entry/snapshot carries the incarnation, so a replica skips those of another one.
Unit tests first, then three real `raftmq node` processes.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.metadata import model as md
from cluster.queue import MsgId, Proposal, Settle, encode_proposal, parse_queue_group_id, queue_group_id
from cluster.queue.envelope import (
    PROPOSAL_IDS_PER_BOOT,
    Envelope,
    EnvelopeCodec,
    frame_snapshot,
    open_snapshot,
)
from cluster.raft.core.types import Entry, GroupId, Index, Membership, Term
from node.broker import records as br
from node.broker.effects import ProposeQueue
from node.clustering.incarnations import (
    QueueGroups,
    deleted_queues,
    queue_key,
    queues_pending_creation,
    redeclared,
    without_queue_deletions,
    without_queues,
)
from node.clustering.proposals import incarnation_of_cid, stale_groups
from node.runtime.cluster.incarnation_file import IncarnationFile
from node.runtime.cluster.runtime import ClusterRuntime
from node.runtime.config import NodeConfig, cluster_layout
from tests.cluster.cluster_proc import (
    ClusterProcs,
    api_queue_rows,
    channel,
    cluster_fixture,  # noqa: F401 (the `cluster` fixture)
    wait_until,
)

SECRET = "0123456789abcdef-secret"
CODEC = EnvelopeCodec("", lambda p: p, lambda p: p)  # another node's codec: writes and reads entries, keeps none
QUORUM = {"x-queue-type": "quorum"}

# ------------------------------------------------------------------------------------------------ pure parts


def test_group_ids_carry_the_incarnation_and_incarnation_0_keeps_the_legacy_form() -> None:
    assert queue_group_id("/", "orders") == queue_group_id("/", "orders", 0) == "q/%2F/orders"
    assert queue_group_id("/", "orders", 0xAB) == "q/%2F/orders/iab"
    assert queue_group_id("v/h", "a%b/i1", 2**63 - 1) == "q/v%2Fh/a%25b%2Fi1/i7fffffffffffffff"
    assert parse_queue_group_id("q/%2F/orders/iab") == ("/", "orders", 0xAB)
    assert parse_queue_group_id("q/%2F/orders") == ("/", "orders", 0)
    assert parse_queue_group_id("q/v%2Fh/a%25b%2Fi1/i7fffffffffffffff") == ("v/h", "a%b/i1", 2**63 - 1)
    with pytest.raises(ValueError):
        queue_group_id("/", "q", -1)


@pytest.mark.parametrize("bad", ["q/a/b/i", "q/a/b/i0", "q/a/b/iAB", "q/a/b/i0ab", "q/a/b/ab", "q/a/b/i+1",
                                 "q/a/b/i1_0", "q/a/b/i1/i2", "q/ia", "q/a/b/i" + "f" * 17])
def test_non_canonical_incarnation_suffixes_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_queue_group_id(bad)


@given(st.text(max_size=12), st.text(max_size=12), st.integers(0, 2**63 - 1))
@settings(max_examples=300, deadline=None)
def test_group_ids_round_trip_and_incarnations_never_collide(vhost: str, name: str, incarnation: int) -> None:
    group = queue_group_id(vhost, name, incarnation)
    assert parse_queue_group_id(group) == (vhost, name, incarnation)
    assert group.count("/") == (3 if incarnation else 2)
    if incarnation:  # no name, however spelled, has the id of another incarnation (or of the legacy form)
        assert group != queue_group_id(vhost, name, 0) and group != queue_group_id(vhost, name + "/i1", 0)


def test_frames_carry_the_incarnation_and_plain_data_is_incarnation_0() -> None:
    settle = Settle(("a", 1, 1), (MsgId(1),))
    data = encode_proposal(Proposal("a", 1, settle), lambda p: p)
    assert CODEC.encode(Envelope(0, "a", 1, settle)) == data  # incarnation 0: the plain proposal, as before
    assert CODEC.decode(data) == Envelope(0, "a", 1, settle)
    framed = CODEC.encode(Envelope(2**63 - 1, "a", 1, settle))
    assert framed.endswith(data) and CODEC.decode(framed) == Envelope(2**63 - 1, "a", 1, settle)
    assert frame_snapshot(0, b"s") == b"s" and open_snapshot(b"s") == (0, b"s")
    assert open_snapshot(frame_snapshot(5, b"")) == (5, b"")  # an empty snapshot of incarnation 5


def test_incarnations_from_command_ids_are_never_0() -> None:
    assert incarnation_of_cid("ffffffffffffffff0000") == 2**63 - 1
    assert incarnation_of_cid("") == 1 and incarnation_of_cid("not hex") == 1
    assert incarnation_of_cid("0" * 32) == 1
    assert incarnation_of_cid("00000000000000ab") == 0xAB


def test_stale_groups_are_gone_or_of_another_incarnation() -> None:
    recorded = {"q/%2F/a": 1, "q/%2F/b": 2, "q/%2F/c": 3}
    wanted = {"q/%2F/a": 1, "q/%2F/b": 7, "q/%2F/d": 4}
    assert stale_groups(recorded, wanted) == ["q/%2F/b", "q/%2F/c"]
    assert stale_groups({}, wanted) == []  # nothing recorded (a node from before incarnations): nothing deleted


def test_an_older_version_of_the_incarnation_map_never_replaces_a_newer_one(tmp_path: Path) -> None:
    store = IncarnationFile(tmp_path / "data")  # written from the trio thread and from a worker thread (runtime.py)
    store.save({"q/%2F/a": 1, "q/%2F/b": 2}, version=2)
    store.save({"q/%2F/a": 1}, version=1)  # a worker thread's write that came late
    assert store.load() == {"q/%2F/a": 1, "q/%2F/b": 2} and store.saved_version == 2
    store.save({"q/%2F/b": 2}, version=3)
    assert IncarnationFile(tmp_path / "data").load() == {"q/%2F/b": 2}


def test_the_incarnation_file_round_trips(tmp_path: Path) -> None:
    store = IncarnationFile(tmp_path / "data")
    assert store.load() == {}
    store.save({"q/%2F/a": 12})
    assert IncarnationFile(tmp_path / "data").load() == {"q/%2F/a": 12}
    store.path.write_text("{not json")
    assert store.load() == {}


def _state_with_queue(incarnation: int) -> md.MetadataState:
    state = md.MetadataState()
    for command in (md.AddNode("a", "127.0.0.1:1", 1), md.PutVhost("/"), md.DeclareExchange(md.ExchangeRecord("/", "x")),
                    md.DeclareQueue(md.QueueRecord("/", "q", "quorum", leader="a", members=("a",),
                                                   incarnation=incarnation), cid=f"c{incarnation}"),
                    md.Bind(md.BindingRecord("/", "x", "q", "queue", "k"))):
        state, outcome = md.apply(state, command)
        assert outcome.ok, (command, outcome)
    return state


def test_the_model_keeps_the_incarnation_of_an_equal_redeclare_and_takes_a_new_one_after_a_delete() -> None:
    state = _state_with_queue(5)
    queue = state.queues[("/", "q")]
    again, outcome = md.apply(state, md.DeclareQueue(dataclasses.replace(queue, incarnation=9), cid="x"))
    assert outcome.ok and again.queues[("/", "q")].incarnation == 5  # the same queue: nothing changes
    gone, _ = md.apply(state, md.DeleteQueue("/", "q", cid="y"))
    back, outcome = md.apply(gone, md.DeclareQueue(dataclasses.replace(queue, incarnation=9), cid="z"))
    assert outcome.ok and back.queues[("/", "q")].incarnation == 9
    assert redeclared(state, back) == {("/", "q")} and redeclared(state, again) == set()
    between = without_queues(state, {("/", "q")})
    assert ("/", "q") not in between.queues and not any(k[3] == "q" for k in between.bindings)


# ------------------------------------------------------------------------------------------------ the runtime


class FakeRaft:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.timing = None  # RaftNodeRuntime's stage timings: off, as without RAFTMQ_RAFT_TIMING

    def add_group(self, group: GroupId, membership: Membership, bootstrap: Any = None, volatile: bool = False) -> None:
        self.calls.append(("add", group))

    def remove_group(self, group: GroupId) -> None:
        self.calls.append(("remove", group))

    def propose(self, group: GroupId, data: bytes) -> bool:
        self.calls.append(("propose", group, CODEC.decode(data).incarnation))
        return True


class FakeBroker:
    def __init__(self) -> None:
        self.applied: list[Envelope] = []
        self.records: list[Any] = []
        self.envelope_codec = EnvelopeCodec("a", lambda p: p, lambda p: p)
        self.proposal_ids = itertools.count(7 * PROPOSAL_IDS_PER_BOOT)  # the broker numbers its proposals (boot 7)

    def propose(self, command: Any) -> ProposeQueue:
        return ProposeQueue("/", "q", command, next(self.proposal_ids))

    def apply_records(self, records: list[Any]) -> list[Any]:
        self.records.extend(records)
        return []

    def apply_committed(self, vhost: str, queue: str, envelopes: list[Envelope]) -> list[Any]:
        self.applied.extend(envelopes)
        return []

    def proposal_abandoned(self, vhost: str, queue: str, envelope: Envelope) -> list[Any]:
        return []


class FakeNode:
    effect_sinks: dict[type, Any] = {}

    def dispatch(self, effects: Any) -> None:
        list(effects)


def _runtime(tmp_path: Path) -> tuple[ClusterRuntime, FakeRaft, FakeBroker]:
    config = dataclasses.replace(NodeConfig(), node_name="a", cluster_secret=SECRET, data_dir=str(tmp_path),
                                 cluster_nodes=("a=127.0.0.1:5000", "b=127.0.0.1:5001", "c=127.0.0.1:5002"))
    broker = FakeBroker()
    runtime = ClusterRuntime(config, cluster_layout(config), broker, boot_id=7)
    runtime.node = FakeNode()
    raft = FakeRaft()
    runtime.raft = raft  # type: ignore[assignment]
    runtime._raft_running = True
    return runtime, raft, broker


OLD, NEW = GroupId("q/%2F/q/i5"), GroupId("q/%2F/q/i9")  # the group ids of incarnations 5 and 9 of queue "/" "q"


def test_a_redeclared_queue_is_another_group_and_stale_entries_are_skipped(tmp_path: Path) -> None:
    runtime, raft, broker = _runtime(tmp_path)
    runtime._mirror(_state_with_queue(5))
    assert raft.calls == [("add", OLD)] and runtime.incarnation_file.load() == {OLD: 5}
    old = Envelope(5, "b", 1, Settle(("b", 1, 1), (MsgId(1),)))
    runtime._on_apply_many(OLD, (Entry(Term(1), Index(1), CODEC.encode(old)),))
    assert broker.applied == [old]
    runtime._mirror(_state_with_queue(9))  # deleted and declared again, seen in one step
    assert raft.calls[1:] == [("remove", OLD), ("add", NEW)]
    assert [type(r).__name__ + ("-" if r.deleted else "+") for r in broker.records if r.__class__.__name__ ==
            "QueueRecord"] == ["QueueRecord+", "QueueRecord-", "QueueRecord+"]  # the broker dropped the old queue
    assert runtime.incarnation_file.load() == {NEW: 9}
    runtime._on_apply_many(OLD, (Entry(Term(2), Index(2), CODEC.encode(old)),))  # a late callback of the removed group
    assert broker.applied == [old]
    plain = CODEC.encode(dataclasses.replace(old, incarnation=0))
    runtime._on_apply_many(NEW, (Entry(Term(2), Index(1), CODEC.encode(old)), Entry(Term(2), Index(2), plain)))
    assert broker.applied == [old] and runtime.stats["stale_entries"] == 2  # the framing check is kept
    new = dataclasses.replace(old, incarnation=9)
    runtime._on_apply_many(NEW, (Entry(Term(2), Index(4), CODEC.encode(new)),))
    assert broker.applied == [old, new]
    runtime._on_propose(broker.propose(Settle(("a", 7, 1), (MsgId(2),))))
    assert raft.calls[-1] == ("propose", NEW, 9)  # proposals go to the new group, framed with its incarnation


def test_at_start_stale_groups_are_deleted_before_raft_runs(tmp_path: Path) -> None:
    runtime, raft, _ = _runtime(tmp_path)
    runtime._raft_running = False
    runtime.incarnation_file.save({OLD: 5, "q/%2F/gone/i3": 3, "q/%2F/q": 7})  # "q/%2F/q": an older build's id
    runtime.mirrored = _state_with_queue(9)
    runtime._drop_stale_groups(runtime.mirrored)
    runtime._sync_groups(runtime.mirrored)
    assert raft.calls == [("remove", "q/%2F/gone/i3"), ("remove", "q/%2F/q"), ("remove", OLD), ("add", NEW)]
    assert runtime.incarnation_file.load() == {OLD: 5, "q/%2F/gone/i3": 3, "q/%2F/q": 7, NEW: 9}  # crash: again
    runtime._raft_started()
    assert raft.calls[4:] == []
    assert runtime.incarnation_file.load() == {NEW: 9}


def test_a_local_delete_and_redeclare_keeps_the_new_queues_proposals_away_from_the_old_group(tmp_path: Path) -> None:
    runtime, raft, broker = _runtime(tmp_path)
    runtime._mirror(_state_with_queue(5))
    before = runtime._on_propose
    ack = Settle(("a", 7, 1), (MsgId(1),))
    before(broker.propose(ack))  # for the old queue: abandoned when the group goes
    runtime._persists.clear()
    runtime.persist(1, [br.QueueRecord("/", "q", deleted=True)])  # the client deletes ...
    runtime.persist(2, [br.QueueRecord("/", "q")])  # ... and declares it again at once
    assert OLD in runtime._quarantined
    before(broker.propose(Settle(("a", 7, 2), (MsgId(1),))))  # the new queue's: held
    assert [c for c in raft.calls if c[0] == "propose"] == [("propose", OLD, 5)]
    old = CODEC.encode(Envelope(5, "b", 1, ack))
    runtime._on_apply_many(OLD, (Entry(Term(1), Index(1), old),))
    assert broker.applied == []  # the old group feeds nothing to the broker's (new) queue
    gone = without_queues(_state_with_queue(5), {("/", "q")})
    runtime._persists.popleft()  # the deletion committed; the metadata step is mirrored
    runtime._mirror(gone)
    deleted = [r for r in broker.records if isinstance(r, br.QueueRecord) and r.deleted]
    assert deleted == []  # the client's new queue is not deleted from the broker
    assert OLD not in runtime._quarantined and OLD not in runtime.group_queues
    assert [p.proposal_id for p in runtime.tracker.of_group("q/%2F/q")] == [runtime.tracker.peek_id() - 1]
    runtime._persists.popleft()
    runtime._mirror(_state_with_queue(9))  # the new declaration committed
    assert raft.calls[-2:] == [("add", NEW), ("propose", NEW, 9)]  # the held proposal goes to the new group
    assert runtime.group_queues.group_of("q/%2F/q") == NEW


def test_queue_groups_map_both_ways() -> None:
    groups = QueueGroups()
    groups[OLD] = ("/", "q")
    assert groups.group_of("q/%2F/q") == OLD and groups.get(OLD) == ("/", "q") and OLD in groups
    groups[NEW] = ("/", "q")  # both hosted for a moment: the newest one is the queue's group
    assert groups.group_of(queue_key("/", "q")) == NEW
    del groups[OLD]
    assert groups.group_of("q/%2F/q") == NEW and list(groups) == [NEW] and len(groups) == 1
    assert groups.pop(NEW) == ("/", "q") and groups.group_of("q/%2F/q") is None and groups.get(NEW) is None


def test_pending_creations_and_deletions() -> None:
    persists = [(1, (br.QueueRecord("/", "a", deleted=True), br.QueueRecord("/", "b"))),
                (2, (br.QueueRecord("/", "a"), br.QueueRecord("/", "b", deleted=True)))]
    assert queues_pending_creation(persists) == {("/", "a")}
    assert deleted_queues(persists[1][1]) == [("/", "b")]
    records = [br.QueueRecord("/", "a", deleted=True), br.QueueRecord("/", "c", deleted=True)]
    assert without_queue_deletions(records, {("/", "a")}) == records[1:]


# ------------------------------------------------------------------------------------------------ real processes


def _ready(port: int, queue: str) -> int | None:
    """The queue's ready count in the node's own replica (management API), None while the node has no such queue."""
    try:
        rows = [row for row in api_queue_rows(port, timeout_s=5) if row["name"] == queue]
    except requests.RequestException:
        return None
    return int(rows[0]["messages_ready"]) if rows else None


def _api_row(port: int, queue: str) -> Any:
    try:
        return [row for row in api_queue_rows(port, timeout_s=5) if row["name"] == queue]
    except (requests.RequestException, ValueError) as error:
        return repr(error)


def _wait_or_dump(cluster: ClusterProcs, queue: str, predicate: Callable[[], bool], timeout_s: float,
                  what: str) -> None:
    """`wait_until`; on a timeout, prints the logs and every node's row of the queue first."""
    try:
        wait_until(predicate, timeout_s, what)
    except AssertionError:
        print(cluster.logs())
        for node in cluster.nodes:
            print(node.name, _api_row(node.port, queue))
        raise


def _wait_ready_count(port: int, queue: str, count: int, name: str) -> None:
    def reached() -> bool:
        return _ready(port, queue) == count

    wait_until(reached, 30, f"{count} ready in {queue} on {name}")


def _publish(port: int, queue: str, bodies: list[bytes]) -> None:
    with channel(port) as ch:
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)


def _n3_gives_the_new_messages_only(cluster: ClusterProcs, queue: str) -> None:
    """Takes every message by basic.get on n3 (answered from n3's own replica): the 5 new ones, in order; then the
    queue reads empty on every node."""
    got = []
    with channel(cluster.node("n3").port) as ch:
        while (answer := ch.basic_get(queue, auto_ack=True))[0] is not None:
            got.append(answer[2])
    assert got == [f"new-{i}".encode() for i in range(5)]
    for node in cluster.nodes:
        _wait_ready_count(node.port, queue, 0, node.name)


def test_a_node_down_during_delete_and_redeclare_catches_up_with_the_new_queue_only(cluster: ClusterProcs) -> None:
    queue = "q-incarnation"
    n1, n3 = cluster.nodes[0], cluster.node("n3")
    with channel(n1.port) as ch:
        ch.queue_declare(queue, durable=True, arguments=QUORUM)
    _publish(n1.port, queue, [f"old-{i}".encode() for i in range(20)])
    for node in cluster.nodes:
        _wait_ready_count(node.port, queue, 20, node.name)

    cluster.kill("n3")
    with channel(n1.port) as ch:
        ch.queue_delete(queue)
        ch.queue_declare(queue, durable=True, arguments=QUORUM)
    _publish(n1.port, queue, [f"new-{i}".encode() for i in range(5)])
    wait_until(lambda: _ready(n1.port, queue) == 5, 30, "5 new messages on n1")

    offset = len(n3.log_text())
    cluster.restart("n3")
    seen: list[int | None] = []

    def caught_up() -> bool:
        seen.append(_ready(n3.port, queue))
        return seen[-1] == 5

    _wait_or_dump(cluster, queue, caught_up, 60, "n3's replica to hold the 5 new messages")
    assert all(count is None or count <= 5 for count in seen), seen  # never an old message in n3's replica
    assert b"is stale" in n3.log_text()[offset:]  # the old group's local state was deleted at start
    _n3_gives_the_new_messages_only(cluster, queue)


def _row(port: int, queue: str) -> dict[str, Any]:
    rows = _api_row(port, queue)
    return rows[0] if isinstance(rows, list) and rows else {}


def test_a_paused_node_holding_the_old_incarnation_cannot_disturb_the_new_group(cluster: ClusterProcs) -> None:
    """n3 is frozen (SIGSTOP: not down, just silent) while the queue is deleted and declared again, then resumed:
    it wakes up still running the old queue's group, a voter with a longer log (40 entries against the new group's
    few), its election timer long expired. With the old shared group id its pre-vote and vote would be granted and
    its log would overwrite the new queue's; with the incarnation in the group id nobody hosts that group, its
    messages are dropped, and it removes the old group once its metadata catches up."""
    queue = "q-paused"
    n1, n2, n3 = cluster.nodes
    with channel(n1.port) as ch:
        ch.queue_declare(queue, durable=True, arguments=QUORUM)
    _publish(n1.port, queue, [f"old-{i}".encode() for i in range(40)])
    for node in cluster.nodes:
        _wait_ready_count(node.port, queue, 40, node.name)
    old = _row(n3.port, queue)
    assert n3.name in old["members"] and old["group"].startswith("q/%2F/q-paused/i"), old

    assert n3.process is not None
    os.kill(n3.process.pid, signal.SIGSTOP)
    try:
        with channel(n1.port) as ch:
            ch.queue_delete(queue)
            ch.queue_declare(queue, durable=True, arguments=QUORUM)
        _publish(n1.port, queue, [f"new-{i}".encode() for i in range(5)])
        for node in (n1, n2):
            _wait_ready_count(node.port, queue, 5, node.name)
        new = _row(n1.port, queue)
    finally:
        os.kill(n3.process.pid, signal.SIGCONT)
    assert new["group"] != old["group"] and new["group"].startswith("q/%2F/q-paused/i"), (old, new)
    print("old group on n3:", old["group"], old["raft"], "new group on n1:", new["group"], new["raft"])

    seen: dict[str, list[int | None]] = {node.name: [] for node in cluster.nodes}

    def converged() -> bool:
        for node in cluster.nodes:
            seen[node.name].append(_ready(node.port, queue))
        return all(counts[-1] == 5 for counts in seen.values()) and _row(n3.port, queue).get("group") == new["group"]

    _wait_or_dump(cluster, queue, converged, 60, "n3 to serve the new queue's group with the 5 new messages")
    for name in ("n1", "n2"):  # the new queue's content was never disturbed on the majority
        assert all(count == 5 for count in seen[name]), (name, seen[name])
    assert all(count is None or count <= 5 or count == 40 for count in seen["n3"]), seen["n3"]  # old or new, not mixed
    _n3_gives_the_new_messages_only(cluster, queue)
