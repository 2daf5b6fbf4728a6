"""A replica's files (cluster/mirror_queues/runtime/storage.py) hold exactly what the pure core's crash leaves.

The deterministic simulator's random runs drive real `Replica` objects; every replica's effects are also persisted
to real files, and after every step a fresh reader of each replica's directory must give the replica's
`crash_image()` (or, for a crashed replica, the image the simulator keeps). Then a torn tail is cut off on load.
"""

from __future__ import annotations

import pathlib
import random

import pytest

from chaos.sim.mirror_sim import MirrorSim
from cluster.mirror_queues.core.replica import DurableImage, Replica
from cluster.mirror_queues.core.types import Effect, Record, Settings
from cluster.mirror_queues.runtime.storage import ReplicaStore


class PersistingSim(MirrorSim):
    """The simulator, with each replica's files kept by a ReplicaStore after every core call."""

    def __init__(self, directory: pathlib.Path, replicas: tuple[str, ...], settings: Settings) -> None:
        self.stores = {r: ReplicaStore(directory / r) for r in replicas}
        self.directory = directory
        super().__init__(replicas, settings)

    def _apply(self, node: str, effects: list[Effect]) -> None:
        super()._apply(node, effects)
        if node in self.nodes:
            self.stores[node].persist(self.nodes[node], effects)

    def flush(self, node: str) -> None:
        super().flush(node)
        if node in self.nodes:
            self.stores[node].persist(self.nodes[node])

    def restart(self, node: str) -> None:
        super().restart(node)
        self.stores[node].persist(self.nodes[node])  # the runtime writes the recovered (trimmed) state back

    def expected(self, name: str) -> DurableImage:
        return self.nodes[name].crash_image() if name in self.nodes else self.images[name]

    def on_disk(self, name: str) -> DurableImage:
        reader = ReplicaStore(self.directory / name)
        try:
            return reader.load()
        finally:
            reader.close()


def _drive(sim: PersistingSim, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    counter = 0
    for _ in range(steps):
        op = rng.random()
        name = rng.choice(sim.names)
        if op < 0.30:
            counter += 1
            sim.publish(f"m{counter}")
        elif op < 0.60:
            sim.round(name)
        elif op < 0.75:
            sim.advance(rng.choice((100, 1_000, 6_000)))
        elif op < 0.83:
            if name in sim.nodes and len(sim.nodes) > 1:
                sim.crash(name)
        elif op < 0.93:
            if name not in sim.nodes:
                sim.restart(name)
        else:
            sim.flush(name)
        for replica in sim.names:
            assert sim.on_disk(replica) == sim.expected(replica), (seed, replica, sim.result.trace[-5:])


@pytest.mark.parametrize("settings", [
    Settings(flush="fsync", hw_checkpoint_interval_ms=1_000),
    Settings(flush="unsynced", min_insync=2, hw_checkpoint_interval_ms=1_000),
    Settings(flush="unsynced", truncation="hw", eligible_leader_replicas=False, hw_checkpoint_interval_ms=1_000),
], ids=["fsync", "unsynced", "hw-truncation"])
def test_files_equal_the_crash_image_after_every_step(tmp_path: pathlib.Path, settings: Settings) -> None:
    for seed in range(3):
        sim = PersistingSim(tmp_path / str(seed), ("a", "b", "c"), settings)
        _drive(sim, seed, 120)
        for store in sim.stores.values():
            store.close()


def test_recovery_from_files_equals_recover_from_the_image(tmp_path: pathlib.Path) -> None:
    settings = Settings(flush="unsynced", hw_checkpoint_interval_ms=1)
    replica = Replica("a", settings)
    store = ReplicaStore(tmp_path)
    replica.become_leader(1, frozenset({"a"}), 0)
    for i in range(5):
        store.persist(replica, replica.publish(f"m{i}"))
    replica.flush()
    replica.publish("unflushed")
    replica.tick(10)
    store.persist(replica)
    store.close()
    reader = ReplicaStore(tmp_path)
    image = reader.load()
    reader.close()
    assert image == replica.crash_image()
    assert [r.msg for r in image.log] == [f"m{i}" for i in range(5)] and image.hw_checkpoint == 6
    recovered = Replica.recover("a", settings, image, 20)
    assert (recovered.leo, recovered.hw, recovered.epochs) == (5, 5, [(1, 0)])


def test_a_torn_tail_is_cut_off_on_load(tmp_path: pathlib.Path) -> None:
    replica = Replica("a", Settings())
    store = ReplicaStore(tmp_path)
    replica.become_leader(0, frozenset({"a"}), 0)
    for i in range(3):
        store.persist(replica, replica.publish(f"m{i}"))
    store.close()
    with (tmp_path / "log").open("ab") as f:
        f.write(b"\x00\x00\x00\x10\x00\x00")  # a crash in the middle of the next record's header
    reader = ReplicaStore(tmp_path)
    assert reader.load().log == tuple(Record(i, 0, f"m{i}") for i in range(3))
    reader.close()
    size = (tmp_path / "log").stat().st_size
    again = ReplicaStore(tmp_path)
    assert len(again.load().log) == 3 and (tmp_path / "log").stat().st_size == size
    again.close()


def test_the_written_hw_checkpoint_moves_when_the_file_is_written(tmp_path: pathlib.Path) -> None:
    """What `status` shows (and the broker scenarios wait for) is the file's checkpoint, not the planned one."""
    replica = Replica("a", Settings(hw_checkpoint_interval_ms=1))
    store = ReplicaStore(tmp_path)
    replica.become_leader(1, frozenset({"a"}), 0)
    store.persist(replica, replica.publish("m0"))
    replica.tick(10)
    plan = store.plan(replica)
    assert replica.hw_checkpoint == 1 and store.hw_checkpoint_written == 0  # planned, not written yet
    store.execute(plan)
    assert store.hw_checkpoint_written == 1
    store.close()
    reader = ReplicaStore(tmp_path)
    reader.load()
    assert reader.hw_checkpoint_written == 1
    reader.close()
