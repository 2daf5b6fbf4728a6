"""Bounding a mirrored queue's log: `Replica.trim` (a snapshot of the host's state machine below the HW, the log
prefix dropped), a lagging follower fetching the leader's snapshot, the leader-epoch rules across a trimmed prefix,
crash images with a snapshot, and a seeded random run (publishes, lossy fetch rounds, trims, leader moves, follower
crashes) checking after every step that every replica's state machine is a prefix of the leader's committed history
and that the logs stay bounded. Pure: the replicas over a hand-driven message pump, no clock, no files."""

from __future__ import annotations

import pathlib
import random

import pytest

from cluster.mirror_queues.core.replica import Replica
from cluster.mirror_queues.core.types import (
    Confirmed,
    Effect,
    EpochEndRequest,
    EpochEndResponse,
    FetchResponse,
    Message,
    Record,
    Send,
    Settings,
    Snapshot,
    SnapshotInstalled,
    Truncated,
)
from cluster.mirror_queues.runtime.storage import ReplicaStore, read_records

SEP = "|"


class Host:
    """A replica's state machine: the list of payloads it applied, in order (its snapshot is that list joined)."""

    def __init__(self) -> None:
        self.applied: list[str] = []

    def data(self) -> str:
        return SEP.join(self.applied)

    def restore(self, data: str) -> None:
        self.applied = data.split(SEP) if data else []

    def apply(self, replica: Replica) -> None:
        for record in replica.records(len(self.applied), replica.hw):
            assert record.offset == len(self.applied)
            self.applied.append(record.msg)


class Pump:
    """Replicas, their hosts and a FIFO of messages; a dropped message is simply not delivered."""

    def __init__(self, names: tuple[str, ...], settings: Settings, directory: pathlib.Path | None = None) -> None:
        self.settings = settings
        self.stores = {n: ReplicaStore(directory / n) for n in names} if directory is not None else {}
        self.replicas = {n: Replica(n, settings) for n in names}
        self.hosts = {n: Host() for n in names}
        self.queue: list[tuple[str, Message]] = []
        self.epoch = 0
        self.leader = names[0]
        self.confirmed: dict[int, str] = {}
        self.installs = 0
        self.isolated: set[str] = set()  # messages to and from these are dropped
        for n, r in self.replicas.items():
            if n == self.leader:
                self.run(n, r.become_leader(0, frozenset(names), 0))
            else:
                self.run(n, r.become_follower(self.leader, 0))

    def run(self, name: str, effects: list[Effect]) -> None:
        if name in self.stores:
            self.stores[name].persist(self.replicas[name], effects)
        host = self.hosts[name]
        for e in effects:
            if isinstance(e, Send):
                self.queue.append((e.dst, e.message))
            elif isinstance(e, Confirmed):
                self.confirmed[e.offset] = e.msg
            elif isinstance(e, SnapshotInstalled):
                self.installs += 1
                host.restore(e.snapshot.data)
            elif isinstance(e, Truncated):
                assert e.to_leo >= len(host.applied) or e.to_leo == 0, "a safe run never cuts applied records"
        host.apply(self.replicas[name])

    def poll_all(self) -> None:
        for n, r in self.replicas.items():
            if n not in self.isolated:
                self.run(n, r.poll())

    def deliver(self, drop: float = 0.0, rng: random.Random | None = None) -> None:
        queue, self.queue = self.queue, []
        for dst, message in queue:
            if (rng is not None and rng.random() < drop) or dst in self.isolated or message.src in self.isolated:
                continue
            self.run(dst, self.replicas[dst].handle(message, 0))

    def rounds(self, n: int = 4) -> None:
        for _ in range(n):
            self.poll_all()
            self.deliver()
            self.deliver()

    def trim(self, name: str) -> bool:
        r = self.replicas[name]
        host = self.hosts[name]
        done = r.trim(len(host.applied), host.data())
        if done and name in self.stores:
            self.stores[name].persist(r)
        return done

    def move_leader(self, to: str) -> None:
        self.epoch += 1
        self.leader = to
        self.queue.clear()
        for n, r in self.replicas.items():
            if n == to:
                self.run(n, r.become_leader(self.epoch, frozenset(self.replicas), 0))
            else:
                self.run(n, r.become_follower(to, self.epoch))


def test_trim_drops_the_prefix_and_keeps_offsets() -> None:
    p = Pump(("a", "b"), Settings())
    a = p.replicas["a"]
    for i in range(10):
        p.run("a", a.publish(f"m{i}"))
    p.rounds()
    assert a.hw == 10 and p.hosts["b"].applied == [f"m{i}" for i in range(10)]
    assert not a.trim(11, "x") and not a.trim(0, "x")  # beyond the HW / not above the log start
    assert p.trim("a") and a.log_start == 10 and a.log == [] and a.leo == 10
    assert a.snapshot == Snapshot(10, 0, SEP.join(f"m{i}" for i in range(10)))
    assert a.epochs == [(0, 10)]
    p.run("a", a.publish("m10"))
    p.rounds()
    assert a.log == [Record(10, 0, "m10")] and a.committed() == [Record(10, 0, "m10")]
    assert p.hosts["b"].applied[-1] == "m10" and p.installs == 0  # b was not behind the log start


def test_a_follower_behind_the_log_start_gets_the_snapshot_then_the_records() -> None:
    p = Pump(("a", "b", "c"), Settings())
    a = p.replicas["a"]
    for i in range(5):
        p.run("a", a.publish(f"m{i}"))
    p.rounds()
    p.replicas["c"].role = "none"  # c stops fetching; a drops it from the ISR as its lag check would
    a.isr.discard("c")
    for i in range(5, 20):
        p.run("a", a.publish(f"m{i}"))
    p.rounds()
    assert p.trim("a") and a.log_start == 20
    for i in range(20, 23):
        p.run("a", a.publish(f"m{i}"))
    p.rounds()
    c = p.replicas["c"]
    p.run("c", c.become_follower("a", 0))
    p.rounds()
    assert p.installs == 1 and c.log_start == 20 and c.leo == 23
    assert [r.msg for r in c.log] == ["m20", "m21", "m22"]
    assert p.hosts["c"].applied == p.hosts["a"].applied == [f"m{i}" for i in range(23)]
    assert c.epochs == [(0, 20)]


def test_epoch_end_across_a_trimmed_prefix() -> None:
    """Leader a: epoch 0 (m0-m4), b leads epoch 1 (m5-m7), a leads epoch 2; a trims at 6 inside epoch 1."""
    p = Pump(("a", "b"), Settings())
    a, b = p.replicas["a"], p.replicas["b"]
    for i in range(5):
        p.run("a", a.publish(f"m{i}"))
    p.rounds()
    p.move_leader("b")
    p.rounds()
    for i in range(5, 8):
        p.run("b", b.publish(f"m{i}"))
    p.rounds()
    p.move_leader("a")
    p.rounds()
    assert a.epochs == [(0, 0), (1, 5), (2, 8)]
    assert p.hosts["a"].applied[:6] == [f"m{i}" for i in range(6)]
    assert a.trim(6, SEP.join(p.hosts["a"].applied[:6]))
    assert a.epochs == [(1, 6), (2, 8)] and a.snapshot is not None and a.snapshot.epoch == 1
    assert a.end_offset_for(1) == (1, 8)  # epoch 1 still ends where it did
    assert a.end_offset_for(0) == (-1, -1)  # older than the cache: no common epoch
    reply = a.handle(EpochEndRequest("b", 2, 1), 0)
    assert reply == [Send("b", EpochEndResponse("a", 2, 1, 8))]
    reply = a.handle(EpochEndRequest("b", 2, 0), 0)
    assert reply == [Send("b", EpochEndResponse("a", 2, -1, -1))]


def test_a_follower_with_only_an_older_epoch_starts_over_from_the_snapshot() -> None:
    """c holds epoch 0 with an unconfirmed tail the others never had; a and b move on in epochs 1 and 2 and trim:
    c has no epoch in the leader's cache, truncates to 0 and installs the snapshot (no divergent record kept)."""
    p = Pump(("a", "b", "c"), Settings())
    a, b, c = (p.replicas[n] for n in "abc")
    for i in range(3):
        p.run("a", a.publish(f"m{i}"))
    p.rounds()
    c.role = "none"  # c is away; only c will get a's next record (delivered by hand below)
    a.isr.discard("c")
    b.role = "none"
    p.run("a", a.publish("lost"))
    p.queue.clear()
    c.log.append(Record(3, 0, "lost"))  # c fetched it just before a died
    c.flushed = 4
    b.role = "follower"
    p.replicas = {"a": a, "b": b}  # a dies as leader of epoch 0 before b fetched "lost"
    p.move_leader("b")
    p.rounds()
    for i in range(3, 8):
        p.run("b", b.publish(f"n{i}"))
    p.rounds()
    p.move_leader("a")
    p.rounds()
    p.run("a", a.publish("n8"))
    p.rounds()
    assert p.trim("a") and a.log_start == 9 and a.epochs == [(2, 9)]
    p.replicas["c"] = c
    p.run("c", c.become_follower("a", p.epoch))
    p.rounds()
    assert p.installs == 1 and c.leo == a.leo and c.log_start == 9
    assert p.hosts["c"].applied == p.hosts["a"].applied
    assert "lost" not in p.hosts["c"].applied


def test_crash_image_and_recovery_keep_the_snapshot() -> None:
    p = Pump(("a", "b"), Settings(flush="unsynced"))
    a = p.replicas["a"]
    for i in range(6):
        p.run("a", a.publish(f"m{i}"))
    p.rounds()
    assert a.flushed == 0 and a.hw == 6
    assert p.trim("a") and a.flushed == 6  # the snapshot is durable
    p.run("a", a.publish("m6"))
    image = a.crash_image()
    assert image.snapshot == a.snapshot and image.log == () and image.epochs == ((0, 6),)
    back = Replica.recover("a", a.settings, image, 0)
    assert back.log_start == 6 and back.leo == 6 and back.hw == 6  # the HW checkpoint (0) is below the snapshot
    assert back.epochs == [(0, 6)] and back.snapshot == a.snapshot
    assert back.end_offset_for(0) == (0, 6)


def test_hw_truncation_never_cuts_below_the_snapshot() -> None:
    p = Pump(("a", "b"), Settings(truncation="hw"))
    a = p.replicas["a"]
    for i in range(4):
        p.run("a", a.publish(f"m{i}"))
    p.rounds()
    assert p.trim("a")
    back = Replica.recover("a", a.settings, a.crash_image(), 0)
    assert back.hw == 4
    assert back.become_follower("b", 1) == []  # truncates to its HW = the log start: nothing to cut


def _on_disk(directory: pathlib.Path) -> ReplicaStore:
    store = ReplicaStore(directory)
    store.load()
    return store


def test_files_follow_a_truncation_below_the_snapshot(tmp_path: pathlib.Path) -> None:
    """A replica whose whole log is in its snapshot is cut below it (a leader with a shorter log, as after an
    unclean election): it starts empty, and so do its files."""
    r = Replica("b", Settings(truncation="hw"))
    store = ReplicaStore(tmp_path)
    r.become_leader(0, frozenset({"b"}), 0)
    for i in range(3):
        r.publish(f"m{i}")
    assert r.trim(3, "state")
    store.persist(r)
    assert read_records(tmp_path) == [] and store.load().snapshot == Snapshot(3, 0, "state")
    store.persist(r, r.become_follower("a", 1))
    effects = r.handle(FetchResponse("a", 1, (), 0, True, 1), 0)
    assert effects == [Truncated("b", 3, 0, "out-of-range")] and r.snapshot is None and r.leo == 0
    store.persist(r, effects)
    reader = _on_disk(tmp_path)
    assert reader.load() == r.crash_image() and not (tmp_path / "snapshot").exists()
    reader.close()
    store.close()


@pytest.mark.parametrize("seed", range(40))
def test_random_run_stays_consistent_and_bounded(seed: int, tmp_path: pathlib.Path) -> None:
    """Two seeds also keep each replica's files (ReplicaStore) and check them against the core after
    every step; its crashes restart from the files."""
    rng = random.Random(seed)
    names = ("a", "b", "c")
    with_files = seed in (0, 7)
    settings = Settings(fetch_max_records=rng.choice((3, 100)), replica_lag_max_ms=500)
    p = Pump(names, settings, tmp_path if with_files else None)
    trim_every = rng.choice((4, 10))
    published = 0
    for step in range(200):
        op = rng.random()
        leader = p.replicas[p.leader]
        p.run(p.leader, leader.tick(step * 100))  # the lag check drops an isolated follower from the ISR
        if op < 0.4:
            p.run(p.leader, leader.publish(f"m{published}"))
            published += 1
        elif op < 0.75:
            p.poll_all()
            p.deliver(0.2, rng)
            p.deliver(0.2, rng)
        elif op < 0.85:
            name = rng.choice(names)
            r = p.replicas[name]
            if r.leo - r.log_start >= trim_every:
                p.trim(name)
        elif op < 0.88:  # a clean leader move to a follower that has everything
            p.rounds()
            p.move_leader(rng.choice([n for n in names if p.replicas[n].leo == leader.leo and n not in p.isolated]))
        elif op < 0.94:  # a follower is cut off (it falls behind the log start), or comes back
            name = rng.choice([n for n in names if n != p.leader])
            p.isolated ^= {name}
        else:  # a follower crashes (fsync: nothing lost) and comes back
            name = rng.choice([n for n in names if n != p.leader])
            image = p.replicas[name].crash_image()
            if with_files:
                p.stores[name].close()
                p.stores[name] = _on_disk(tmp_path / name)
                assert p.stores[name].load() == image
            p.replicas[name] = Replica.recover(name, p.settings, image, 0)
            p.hosts[name] = Host()
            if image.snapshot is not None:
                p.hosts[name].restore(image.snapshot.data)
            p.run(name, p.replicas[name].become_follower(p.leader, p.epoch))
        history = max((h.applied for h in p.hosts.values()), key=len)  # a new leader's HW may lag (KIP-101)
        for name, host in p.hosts.items():
            assert host.applied == history[: len(host.applied)], f"{name} diverged"
        for offset, msg in p.confirmed.items():
            assert offset < len(history) and history[offset] == msg
        if with_files:
            for name, r in p.replicas.items():
                reader = _on_disk(tmp_path / name)
                assert reader.load() == r.crash_image(), name
                reader.close()
                assert read_records(tmp_path / name) == [(x.offset, x.epoch, x.msg) for x in r.crash_image().log]
    p.isolated.clear()
    p.rounds(8)
    leader = p.replicas[p.leader]
    for name, r in p.replicas.items():
        p.trim(name)
        assert r.leo == leader.leo and p.hosts[name].applied == p.hosts[p.leader].applied
        assert len(r.log) == 0, f"{name} holds {len(r.log)} records after a trim at its HW"
        assert r.epochs and r.epochs[0][1] == r.log_start
        if with_files:
            assert (tmp_path / name / "log").stat().st_size == 0  # the file holds no more than the core
    for store in p.stores.values():
        store.close()
