"""`MirrorGroups` (node/runtime/cluster/mirror_groups.py) in one process, a single-replica queue: the files are
written by the writer task in a worker thread, records reach the host only once they are on disk, the log is
trimmed into the host's snapshot every `trim_records` applied records, and a new `MirrorGroups` over the same data
directory restores the snapshot and replays only the records above it. The host is a list of applied commands.
The replica's telemetry (<data_dir>/mirror/telemetry/) holds its appends, HW moves, ISR and state samples."""

from __future__ import annotations

import json
import pathlib

import trio

from cluster.metadata.mirror import MirrorRecord
from cluster.mirror_queues.runtime.storage import read_records, read_snapshot
from cluster.raft.core.types import Entry, GroupId, NodeId
from node.runtime.cluster.mirror_groups import MirrorGroups

GROUP = GroupId("q/%2F/ha.x/i1")
RECORD = MirrorRecord("/", "ha.x", ("n1",), leader="n1", epoch=0, isr=("n1",))


class Host:
    """The queue machine stand-in: the applied commands; its snapshot is them joined."""

    def __init__(self) -> None:
        self.applied: list[bytes] = []
        self.restored: list[bytes] = []

    def on_apply_many(self, _group: GroupId, entries: tuple[Entry, ...]) -> None:
        self.applied.extend(e.data for e in entries)

    def snapshot(self, _group: GroupId) -> bytes:
        return b",".join(self.applied)

    def restore(self, _group: GroupId, data: bytes) -> None:
        self.restored.append(data)
        self.applied = data.split(b",") if data else []


def _groups(tmp_path: pathlib.Path, host: Host) -> MirrorGroups:
    def nothing(*_args: object) -> None:
        return None

    def leader_change(_group: GroupId, _leader: NodeId | None) -> None:
        return None

    return MirrorGroups("n1", tmp_path, {}, b"secret", host.on_apply_many, leader_change, nothing,
                        snapshots=host, trim_records=5)


def test_writes_in_a_worker_thread_then_trim_then_restore(tmp_path: pathlib.Path) -> None:
    host = Host()

    async def main() -> None:
        groups = _groups(tmp_path, host)
        async with trio.open_nursery() as nursery:
            await nursery.start(groups.run, "127.0.0.1", 0)
            groups.add_group(GROUP, "/", "ha.x", ("n1",), "leader-epoch", RECORD)
            for i in range(12):
                assert groups.propose(GROUP, f"c{i}".encode())
                assert len(host.applied) == i  # appended, but not applied before the writer wrote it
                with trio.fail_after(30):  # (a fixed 50 ms was not enough on the loaded 2-core machine)
                    while len(host.applied) == i:
                        await trio.sleep(0.005)
            assert host.applied == [f"c{i}".encode() for i in range(12)]
            assert groups.stats["write_batches"] >= 12 and groups.stats["trims"] == 2  # each in a worker thread
            nursery.cancel_scope.cancel()
        for g in groups.groups.values():
            g.store.close()

    trio.run(main)
    telemetry = [json.loads(line) for path in (tmp_path / "mirror" / "telemetry").glob("replication-n1-*.jsonl")
                 for line in path.read_text().splitlines()]
    assert {(r["kind"], r["node"], r["group"]) for r in telemetry} == {("mirror", "n1", GROUP)}
    assert {"append", "commit", "isr", "state"} <= {r["type"] for r in telemetry}
    assert max(r["last_index"] for r in telemetry if r["type"] == "append") == 12  # every record, once durable
    assert max(r["commit_index"] for r in telemetry if r["type"] == "commit") == 12
    assert [r["isr"] for r in telemetry if r["type"] == "isr"] == [["n1"]]
    (directory,) = [d for d in (tmp_path / "mirror").iterdir() if d.name != "telemetry"]
    snapshot = read_snapshot(directory)
    assert snapshot is not None and snapshot.offset == 10
    assert [r[2] for r in read_records(directory)] == ["c10", "c11"]

    again = Host()
    groups = _groups(tmp_path, again)
    groups.add_group(GROUP, "/", "ha.x", ("n1",), "leader-epoch", RECORD)
    assert again.restored == [b",".join(f"c{i}".encode() for i in range(10))]
    assert again.applied == [f"c{i}".encode() for i in range(12)]  # the snapshot, then the two records above it
    for g in groups.groups.values():
        g.store.close()
    assert groups.telemetry is not None
    groups.telemetry.close()


def test_unsynced_flush_applies_from_the_page_cache_then_writes_back(tmp_path: pathlib.Path) -> None:
    """`mirror_flush = "unsynced"`: records are applied below the HW before they are on disk (the unsafe policy),
    and the writeback puts them on disk within about a second."""
    host = Host()
    seen: list[tuple[int, int]] = []  # (records applied, records on disk) at each apply

    async def main() -> None:
        groups = MirrorGroups("n1", tmp_path, {}, b"secret", host.on_apply_many, lambda *_: None, lambda *_: None,
                              flush="unsynced")
        applied = host.on_apply_many

        def on_apply_many(group: GroupId, entries: tuple[Entry, ...]) -> None:
            applied(group, entries)
            seen.append((len(host.applied), groups.groups[group].durable))

        groups.on_apply_many = on_apply_many
        async with trio.open_nursery() as nursery:
            await nursery.start(groups.run, "127.0.0.1", 0)
            groups.add_group(GROUP, "/", "ha.x", ("n1",), "leader-epoch", RECORD)
            assert groups.groups[GROUP].replica.settings.flush == "unsynced"
            for i in range(5):
                assert groups.propose(GROUP, f"c{i}".encode())
            with trio.fail_after(30):
                while groups.groups[GROUP].durable < 5:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        for g in groups.groups.values():
            g.store.close()

    trio.run(main)
    assert host.applied == [f"c{i}".encode() for i in range(5)]
    assert any(on_disk < applied for applied, on_disk in seen)  # applied from the "page cache"
    (directory,) = [d for d in (tmp_path / "mirror").iterdir() if d.name != "telemetry"]
    assert [r[2] for r in read_records(directory)] == [f"c{i}" for i in range(5)]  # written back

