"""Three mirrored-queue replicas in three processes (cluster/mirror_queues/runtime/node.py) over real sockets and
files, with the controller committing leader, epoch and ISR in a real three-node metadata group (pysyncobj).

The test process is the controller's host and the publishing client. It publishes, kills a follower with kill -9
and restarts it, kills the leader with kill -9 (the metadata group elects a new one from the recorded ISR),
restarts the old leader (it truncates by leader epoch and follows), and checks that every confirmed message is in
the leader's log at its offset below the HW and that the replicas hold the same messages below the HW (the old
leader comes back with a tail of publishes its paused followers never fetched, and truncates it). Plus the
transport's authentication: a peer without the secret gets nothing delivered.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import trio

from cluster.metadata.mirror import DeclareMirror, MirrorRecord
from cluster.metadata.model import DeclareQueue, PutVhost, QueueRecord
from cluster.metadata.store import MetadataStore
from cluster.mirror_queues.core.types import FetchRequest
from cluster.mirror_queues.runtime.controller import MirrorController
from cluster.mirror_queues.runtime.transport import MirrorTransport
from cluster.mirror_queues.runtime.wire import (
    Hello,
    Publish,
    PublishResult,
    Status,
    StatusReply,
    WireMessage,
)
from tests.metadata.helpers import SECRET, config, free_addresses, start_all, wait_until

REPLICAS = ("a", "b", "c")
SETTINGS = {"min_insync": 2, "replica_lag_max_ms": 1000, "hw_checkpoint_interval_ms": 500, "flush": "fsync",
            "truncation": "leader-epoch"}


def _hostport(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


class Harness:
    def __init__(self, tmp: pathlib.Path, stores: list[MetadataStore]) -> None:
        self.tmp = tmp
        self.stores = stores
        addresses = free_addresses(4)
        self.peers = {name: _hostport(addr) for name, addr in zip(("ctl", *REPLICAS), addresses, strict=True)}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.results: dict[str, PublishResult] = {}
        self.statuses: dict[str, StatusReply] = {}
        self.controller = MirrorController("/", "q", self.commit, self.record, self.send)
        self.transport = MirrorTransport("ctl", SECRET.encode(), self.peers, self.on_message)

    async def commit(self, command: object) -> object:
        return await self.stores[0].apply(command)  # type: ignore[arg-type]

    def record(self) -> MirrorRecord | None:
        return self.stores[0].state.mirrors.get(("/", "q"))

    def send(self, dst: str, message: WireMessage) -> None:
        self.transport.send(dst, message)

    def on_message(self, src: str, message: WireMessage) -> None:
        if isinstance(message, PublishResult):
            self.results[message.msg] = message
        elif isinstance(message, StatusReply):
            self.statuses[src] = message
        else:
            self.controller.on_message(src, message)

    def start(self, name: str) -> None:
        cfg = {"name": name, "directory": str(self.tmp / name), "host": "127.0.0.1", "port": self.peers[name][1],
               "peers": {p: list(a) for p, a in self.peers.items() if p != name}, "controller": "ctl",
               "secret": SECRET, "settings": SETTINGS}
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(cfg))
        log = (self.tmp / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "cluster.mirror_queues.runtime.node", str(path)],
                                            stdout=log, stderr=log, cwd=os.getcwd())

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.controller.replica_down(name)  # the failure detector's verdict

    async def status(self, name: str) -> StatusReply:
        self.statuses.pop(name, None)
        with trio.fail_after(20):
            while name not in self.statuses:
                self.send(name, Status(with_log=True))
                with trio.move_on_after(0.5):
                    while name not in self.statuses:
                        await trio.sleep(0.02)
        return self.statuses[name]

    async def publish(self, msg: str, timeout_s: float = 5.0) -> PublishResult | None:
        """Publish to the committed leader; None if no answer in time (the outcome is unknown)."""
        record = self.record()
        if record is None or not record.leader:
            return None
        self.send(record.leader, Publish(msg))
        with trio.move_on_after(timeout_s):
            while msg not in self.results:
                await trio.sleep(0.005)
        return self.results.get(msg)


@pytest.fixture
async def harness(tmp_path: pathlib.Path) -> AsyncIterator[Harness]:
    addrs = free_addresses(3)
    stores = await start_all([config(i, addrs) for i in range(3)])
    h = Harness(tmp_path, stores)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(h.transport.serve, "127.0.0.1", h.peers["ctl"][1])
            nursery.start_soon(h.controller.run)
            assert (await stores[0].apply(PutVhost("/"))).ok
            queue = QueueRecord("/", "q", type="mirrored", leader="a", members=REPLICAS)
            assert (await stores[0].apply(DeclareQueue(queue))).ok
            assert (await stores[0].apply(DeclareMirror("/", "q", REPLICAS, min_insync=2))).ok
            for name in REPLICAS:
                h.start(name)
            yield h
            nursery.cancel_scope.cancel()
    finally:
        for proc in h.procs.values():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        for store in stores:
            store.close()


async def _publish_many(h: Harness, prefix: str, count: int, confirmed: dict[str, int]) -> None:
    for i in range(count):
        result = await h.publish(f"{prefix}{i}")
        if result is not None and result.ok:
            confirmed[result.msg] = result.offset


async def _caught_up(h: Harness, names: tuple[str, ...]) -> bool:
    leader = h.record()
    if leader is None or not leader.leader:
        return False
    top = await h.status(leader.leader)
    if top.role != "leader" or top.epoch != leader.epoch or set(names) - set(top.isr):
        return False
    leos = [(await h.status(n)).leo for n in names]
    return all(leo == top.leo for leo in leos)


async def _wait_caught_up(h: Harness, names: tuple[str, ...]) -> None:
    with trio.fail_after(30):
        while not await _caught_up(h, names):
            await trio.sleep(0.1)


async def test_kill_a_follower_then_the_leader_and_nothing_confirmed_is_lost(harness: Harness) -> None:
    h = harness
    await wait_until(lambda: len(h.controller.live) == 3, timeout_s=30, what="three replicas said hello")
    await _wait_caught_up(h, REPLICAS)
    confirmed: dict[str, int] = {}
    await _publish_many(h, "first-", 10, confirmed)
    assert len(confirmed) == 10

    h.kill("b")  # a follower; the leader's lag check drops it from the ISR, the rest goes on (min ISR 2)
    await _publish_many(h, "without-b-", 10, confirmed)
    await wait_until(lambda: (r := h.record()) is not None and "b" not in r.isr, what="b out of the ISR")
    h.start("b")
    await _wait_caught_up(h, REPLICAS)

    before = h.record()
    assert before is not None and before.leader == "a"
    # With both followers paused, a burst goes into a's log only (still uncommitted); then a dies.
    for name in ("b", "c"):
        h.procs[name].send_signal(signal.SIGSTOP)
    top = await h.status("a")
    for i in range(20):
        h.send("a", Publish(f"burst-{i}"))
    with trio.fail_after(20):
        while (await h.status("a")).leo < top.leo + 20:
            await trio.sleep(0.01)
    h.kill("a")  # the leader: the metadata group elects from the recorded ISR (or ELR) and bumps the epoch
    for name in ("b", "c"):
        h.procs[name].send_signal(signal.SIGCONT)
    await wait_until(lambda: (r := h.record()) is not None and r.leader in ("b", "c") and r.epoch > before.epoch,
                     what="a new leader from the ISR")
    await _publish_many(h, "after-a-", 10, confirmed)
    h.start("a")
    await _wait_caught_up(h, REPLICAS)

    record = h.record()
    assert record is not None
    leader = await h.status(record.leader)
    logs = {name: (await h.status(name)).log for name in REPLICAS}
    held = {rec.offset: rec.msg for rec in leader.log[: leader.hw]}
    lost = [f"{msg}@{offset}" for msg, offset in confirmed.items() if held.get(offset) != msg]
    assert not lost, f"confirmed messages lost: {lost}"
    for name, log in logs.items():
        diverged = [o for o in range(leader.hw) if log[o] != leader.log[o]]
        assert not diverged, f"{name} differs from the leader at offsets {diverged[:5]}"
    assert len(confirmed) >= 20
    # the controller's record went through the metadata group: every store holds it
    await wait_until(lambda: len({repr(s.state.mirrors) for s in h.stores}) == 1, what="equal metadata")
    assert any(kind == "AlterMirrorIsr" and outcome.ok for kind, outcome in h.controller.outcomes)
    telemetry = list((h.tmp / record.leader / "mirror" / "telemetry").glob("replication-*.jsonl"))
    kinds = {json.loads(line)["type"] for path in telemetry for line in path.read_text().splitlines()}
    assert {"append", "commit", "isr"} <= kinds
    truncations = [json.loads(line) for path in (h.tmp / "a" / "mirror" / "telemetry").glob("*.jsonl")
                   for line in path.read_text().splitlines() if '"truncate"' in line]
    assert [(t["from_index"], t["how"]) for t in truncations] == [(top.leo + 20, "leader-epoch")]


async def test_a_peer_without_the_secret_gets_nothing_delivered() -> None:
    ports = [_hostport(a) for a in free_addresses(2)]
    peers = {"x": ports[0], "y": ports[1]}
    got: list[tuple[str, WireMessage]] = []
    good = MirrorTransport("x", b"right", peers, lambda src, m: got.append((src, m)))
    forger = MirrorTransport("y", b"wrong", peers, lambda src, m: None)
    friend = MirrorTransport("y", b"right", peers, lambda src, m: None)
    async with trio.open_nursery() as nursery:
        await nursery.start(good.serve, *ports[0])
        await nursery.start(forger.serve, *ports[1])
        forger.send("x", Hello("y", False, 0, 0))
        await wait_until(lambda: good.stats.auth_failures > 0, what="the forger refused")
        assert not got
        forger_nursery_scope = nursery.cancel_scope
        async with trio.open_nursery() as inner:
            await inner.start(friend.serve, "127.0.0.1", 0)
            friend.send("x", FetchRequest("y", 3, 7))
            await wait_until(lambda: bool(got), what="the friend's fetch delivered")
            inner.cancel_scope.cancel()
        assert got == [("y", FetchRequest("y", 3, 7))]
        forger_nursery_scope.cancel()
