"""Durable log compaction: the snapshot and the journal rewrite survive a crash between any two steps.

A "crash" is a copy of the data dir taken inside the tick thread at the step in question (what a process killed
there leaves on disk); a new store started from that copy must have every acknowledged command and remember
their command ids.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cluster.metadata import durable
from cluster.metadata.durable import DurableFileJournal, DurableSnapshot, SnapshotError
from cluster.metadata.model import PutUser, PutVhost
from cluster.metadata.store import JOURNAL_NAME, SNAPSHOT_NAME, MetadataStore
from tests.metadata.helpers import config, free_addresses, start_all, wait_until
from tests.metadata.test_durable import _port_free


def journal_with(path: Path, n: int) -> DurableFileJournal:
    journal = DurableFileJournal(str(path))
    for i in range(1, n + 1):
        journal.add(f"cmd-{i}".encode(), i, 1 + i // 4)
    return journal


def test_compaction_rewrites_the_journal_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "j"
    journal = journal_with(path, 10)
    expected = [journal[i] for i in range(4, 10)]
    journal.deleteEntriesTo(4)
    assert [journal[i] for i in range(len(journal))] == expected
    journal.add(b"cmd-11", 11, 3)  # appending after the rewrite continues the new file
    journal._destroy()
    reopened = DurableFileJournal(str(path))
    assert [reopened[i] for i in range(len(reopened))] == [*expected, (b"cmd-11", 11, 3)]

    def crash(src: str, dst: str) -> None:
        raise OSError("power cut before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        reopened.deleteEntriesTo(3)
    monkeypatch.undo()
    after_crash = DurableFileJournal(str(path))  # the old journal is whole; the half-done one is ignored
    assert len(after_crash) == 7 and after_crash[0] == expected[0]
    after_crash._destroy()


def test_snapshot_round_trip_crc_and_roll_forward(tmp_path: Path) -> None:
    journal = journal_with(tmp_path / "j", 10)
    taken: list[bytes] = []
    snap = DurableSnapshot(str(tmp_path / "j"), lambda: b"state-bytes", taken.append)
    # pysyncobj passes (entry at last applied, the entry before it, cluster) and renames the tmp file itself
    last, prev = journal[5], journal[4]
    snap.serialize(str(tmp_path / "s.tmp"), (last, prev, set()))
    os.replace(tmp_path / "s.tmp", tmp_path / "s")
    # a crash before the journal was truncated: rolling forward keeps every entry after the snapshot
    assert snap.deserialize(str(tmp_path / "s")) == (last, prev, None)
    assert taken == [b"state-bytes"]
    assert len(journal) == 6 and journal[0][1] == 5 and journal[5][1] == 10
    assert not durable.roll_forward(journal, journal[1], journal[0])  # already compacted: nothing to do
    raw = bytearray((tmp_path / "s").read_bytes())
    raw[-1] ^= 0xFF
    (tmp_path / "s").write_bytes(bytes(raw))
    with pytest.raises(SnapshotError, match="crc"):
        snap.deserialize(str(tmp_path / "s"))
    journal._destroy()


CrashPoints = dict[str, Path]


def install_crash_points(monkeypatch: pytest.MonkeyPatch, data_dir: Path, images: Path) -> CrashPoints:
    """Copy the data dir at each step of a compaction (in the tick thread, so nothing moves meanwhile)."""
    points: CrashPoints = {}

    def image(name: str) -> None:
        if name not in points:
            points[name] = images / name
            shutil.copytree(data_dir, points[name])

    def wrap(owner: Any, attr: str, before: Callable[..., None] | None, after: Callable[..., None] | None) -> None:
        real = getattr(owner, attr)

        def wrapped(*args: Any) -> Any:
            if before:
                before(*args)
            result = real(*args)
            if after:
                after(*args)
            return result

        monkeypatch.setattr(owner, attr, wrapped)

    def before_replace(src: str, dst: str) -> None:
        if str(src).endswith(".compact"):
            image("journal-rewritten-not-renamed")

    wrap(DurableSnapshot, "serialize", None, lambda *_: image("snapshot-written-not-renamed"))
    wrap(DurableFileJournal, "deleteEntriesTo", lambda *_: image("snapshot-renamed-journal-whole"), None)
    wrap(os, "replace", before_replace, None)
    return points


async def test_a_crash_at_any_step_of_compaction_loses_nothing(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    addr = free_addresses(1)
    data_dir = tmp_path / "live"
    (tmp_path / "images").mkdir()
    points = install_crash_points(monkeypatch, data_dir, tmp_path / "images")  # before the store binds them
    store = MetadataStore(config(0, addr, data_dir=data_dir))
    await store.start()
    try:
        for i in range(12):
            assert (await store.apply(PutVhost(f"v{i}", cid=f"c{i}"))).ok
        expected = store.state.definitions()
        assert points == {}
        journal = durable._JOURNALS[str((data_dir / JOURNAL_NAME).resolve())]
        before = len(journal)
        assert store._syncobj is not None
        store._syncobj.forceLogCompaction()
        await wait_until(lambda: len(journal) < before and len(points) == 3, what=f"a compaction ({points})")
        assert (data_dir / SNAPSHOT_NAME).exists()
        assert (await store.apply(PutUser("after", "h", cid="late"))).ok  # the compacted journal keeps working
    finally:
        store.close()
    monkeypatch.undo()
    rolled: list[bool] = []
    real_roll = durable.roll_forward

    def roll_forward(*args: Any) -> bool:
        rolled.append(real_roll(*args))
        return rolled[-1]

    monkeypatch.setattr(durable, "roll_forward", roll_forward)
    images = {**points, "compacted": data_dir}
    for name, image in images.items():
        await wait_until(lambda: _port_free(addr[0]), what="the old store's port to close")
        again = MetadataStore(config(0, addr, data_dir=image))
        await again.start()
        try:
            got = again.state.definitions()
            if name == "compacted":
                assert "after" in {u["name"] for u in got["users"]}
                del got["users"]
                got_expected = {k: v for k, v in expected.items() if k != "users"}
                assert got == got_expected, name
            else:
                assert got == expected, name
            for i in range(12):
                assert (await again.apply(PutVhost(f"v{i}", cid=f"c{i}"))).duplicate, (name, i)
        finally:
            again.close()
    assert True in rolled  # the image with a renamed snapshot and a whole journal was rolled forward


async def test_a_lagging_follower_catches_up_from_the_leaders_snapshot(tmp_path: Path) -> None:
    addrs = free_addresses(3)
    stores = await start_all([config(i, addrs, data_dir=tmp_path / f"n{i}") for i in range(3)])
    try:
        await wait_until(lambda: all(len(s.state.nodes) == 3 for s in stores), what="three nodes registered")
        lagging = next(i for i, s in enumerate(stores) if s.leader() != addrs[i])
        stores[lagging].close()
        live = [s for i, s in enumerate(stores) if i != lagging]
        for i in range(10):
            assert (await live[i % 2].apply(PutVhost(f"v{i}", cid=f"c{i}"))).ok
        for s in live:
            journal = durable._JOURNALS[str((s.config.data_dir / JOURNAL_NAME).resolve())]  # type: ignore[operator]
            before = len(journal)
            assert s._syncobj is not None
            s._syncobj.forceLogCompaction()
            await wait_until(_shorter_than(journal, before), what="compaction on a live node")
        await wait_until(lambda: _listener_gone(addrs[lagging]), what="the closed store's port")
        stores[lagging] = MetadataStore(config(lagging, addrs, data_dir=tmp_path / f"n{lagging}"))
        await stores[lagging].start()
        await wait_until(lambda: stores[lagging].state.definitions() == live[0].state.definitions(),
                         what="the lagging node to catch up")
        assert (tmp_path / f"n{lagging}" / SNAPSHOT_NAME).exists()  # it got there through the leader's snapshot
        assert (await stores[lagging].apply(PutVhost("v3", cid="c3"))).duplicate
    finally:
        for s in stores:
            s.close()


def test_a_replaced_state_reaches_watchers_as_a_diff() -> None:
    from cluster.metadata import model
    from cluster.metadata.store import _Replica

    replica = _Replica()
    replica.state, _ = model.apply(model.MetadataState(), PutVhost("gone"))
    seen: list[tuple[int, model.Outcome]] = []
    replica.on_applied = lambda seq, outcome: seen.append((seq, outcome))
    target, _ = model.apply(model.MetadataState(), PutVhost("new"))
    replica.put_state(replica_bytes(target))
    assert replica.state == target
    predeclared = [name for name, _ in model.PREDECLARED_EXCHANGES]
    assert seen == [(1, model.Outcome((model.Change("vhost", ("gone",), "deleted"),
                                       model.Change("vhost", ("new",), "created"),
                                       *(model.Change("exchange", ("gone", n), "deleted") for n in predeclared),
                                       *(model.Change("exchange", ("new", n), "created") for n in predeclared))))]
    replica.put_state(replica_bytes(target))  # the same state again: nothing to tell
    assert len(seen) == 1


def replica_bytes(state: Any) -> bytes:
    import cbor2

    from cluster.metadata import model

    return cbor2.dumps(model.snapshot(state))


def _shorter_than(journal: DurableFileJournal, entries: int) -> Callable[[], bool]:
    return lambda: len(journal) < entries


def _listener_gone(address: str) -> bool:
    """No one listens on the port (connections of the closed node may linger in TIME_WAIT, hence SO_REUSEADDR)."""
    import socket

    host, port = address.split(":")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True
