"""One mirrored-queue replica as a process: the pure `Replica` over its files, the fetch transport and a timer.

What it is for: a replica as a process of its own (the model's real-process check): one that can be killed
with kill -9 and restarted, leading or following as the controller (the metadata group) says, so the model's
guarantees are checked on real sockets, files and processes. `python -m cluster.mirror_queues.runtime.node
CONFIG.json` runs one (see `NodeConfig`); tests/mirror/test_processes.py runs three.

How it works: every core call goes through `_run(effects)`: first the files are made equal to the core's crash
image (`ReplicaStore.persist`: with `flush="fsync"` that fsyncs the new records, so nothing is confirmed, and no
follower reports a LEO, before it is on disk), then the effects are carried out: `Send` over the transport,
`Confirmed`/`Nacked` answered to the publisher, `IsrChanged` sent to the controller as `AlterIsr`, `Truncated`
logged. On start the replica recovers from its files (if any) and says `Hello` to the controller (repeated every
second until the controller answers) with its log end, whether its crash may have lost acknowledged writes
(`flush="unsynced"`) and its incarnation (the start's wall clock in ns, one id per process start, so the
controller takes a repeat for a repeat and a restart for a restart); the controller's `LeaderAndIsr` makes it
leader or follower of a newer epoch, or updates a leader's ISR. A follower fetches again as soon as a reply
comes; a leader parks a fetch that would get nothing new for up to `fetch_max_wait_ms` and answers it when its log
or HW moves (Kafka's fetch.max.wait.ms), so a publish reaches the followers without a polling loop. A timer every `tick_ms` ticks the core (lag check, HW
checkpoint), answers parked fetches that waited long enough, resends a follower's request unanswered for
`fetch_timeout_ms`, and with `flush="unsynced"` writes the page cache back every `writeback_interval_ms` (`Replica.flush`).
"""

from __future__ import annotations

import json
import logging
import pathlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from cluster.mirror_queues.core.replica import Replica
from cluster.mirror_queues.core.types import (
    Confirmed,
    Effect,
    EpochEndResponse,
    FetchRequest,
    FetchResponse,
    IsrChanged,
    Nacked,
    Send,
    Settings,
    Truncated,
)
from cluster.mirror_queues.runtime.storage import ReplicaStore
from cluster.mirror_queues.runtime.telemetry import MirrorTelemetry
from cluster.mirror_queues.runtime.transport import MirrorTransport
from cluster.mirror_queues.runtime.wire import (
    AlterIsr,
    Forward,
    Hello,
    LeaderAndIsr,
    Publish,
    PublishResult,
    Routed,
    Status,
    StatusReply,
    WireMessage,
)

log = logging.getLogger(__name__)
HELLO_INTERVAL_MS = 1000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class NodeConfig:
    name: str
    directory: str
    host: str
    port: int
    peers: dict[str, tuple[str, int]]  # every other process, the controller and the clients included
    controller: str
    secret: str
    group: str = "mirror/%2F/q"
    settings: dict[str, Any] = field(default_factory=dict)  # Settings fields
    tick_ms: int = 10
    fetch_timeout_ms: int = 500
    # how long a leader parks a fetch that has nothing new: below fetch_timeout_ms and well below
    # replica_lag_max_ms (a parked follower's lag clock is refreshed only when its fetch is answered)
    fetch_max_wait_ms: int = 200
    writeback_interval_ms: int = 1000

    @classmethod
    def from_json(cls, text: str) -> NodeConfig:
        data = json.loads(text)
        data["peers"] = {name: (host, int(port)) for name, (host, port) in data["peers"].items()}
        return cls(**data)


class ReplicaNode:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.settings = Settings(**config.settings)
        directory = pathlib.Path(config.directory)
        self.store = ReplicaStore(directory / "replica")
        now = wall_ms()
        self.unclean = False
        if self.store.exists():
            self.replica = Replica.recover(config.name, self.settings, self.store.load(), now)
            self.unclean = self.settings.flush == "unsynced"
        else:
            self.replica = Replica(config.name, self.settings, now)
        self.store.persist(self.replica)
        self.telemetry = MirrorTelemetry(directory, config.name, wall_ms)
        self.transport = MirrorTransport(config.name, config.secret.encode(), config.peers, self._on_message)
        self.publishers: dict[str, str] = {}
        self.greeted = False
        self.awaiting_since: int | None = None  # a follower's request in flight since
        self.fetch_now = False
        self.parked: dict[str, tuple[FetchRequest, int]] = {}  # leader: fetches with nothing new, and since when
        self.hw_sent: dict[str, int] = {}  # leader: the HW each follower was last told
        self.last_hello_ms = 0
        self.incarnation = time.time_ns()  # this process start's id in every Hello
        self.last_writeback_ms = now

    # --- effects -----------------------------------------------------------------------------------------------

    def _run(self, effects: list[Effect]) -> None:
        self.telemetry.on_append(self.config.group, self.replica, self.store.persist(self.replica, effects))
        for effect in effects:
            if isinstance(effect, Send):
                if isinstance(effect.message, FetchResponse):
                    self.hw_sent[effect.dst] = effect.message.leader_hw
                self.transport.send(effect.dst, effect.message)
            elif isinstance(effect, Confirmed):
                client = self.publishers.pop(effect.msg, None)
                if client is not None:
                    self.transport.send(client, PublishResult(effect.msg, True, effect.offset))
            elif isinstance(effect, Nacked):
                client = self.publishers.pop(effect.msg, None)
                if client is not None:
                    self.transport.send(client, PublishResult(effect.msg, False, reason=effect.reason))
            elif isinstance(effect, IsrChanged):
                self.transport.send(self.config.controller, AlterIsr(effect.leader, effect.epoch,
                                                                     tuple(sorted(effect.isr))))
            elif isinstance(effect, Truncated):
                log.info("%s: truncated %d -> %d by %s", effect.replica, effect.from_leo, effect.to_leo, effect.how)
                self.telemetry.on_truncate(self.config.group, self.replica, effect)
        self.telemetry.after(self.config.group, self.replica)

    # --- messages ----------------------------------------------------------------------------------------------

    def _on_message(self, src: str, message: WireMessage) -> None:
        now = wall_ms()
        if isinstance(message, LeaderAndIsr):
            self.greeted = True
            self._on_leader_and_isr(message, now)
        elif isinstance(message, Publish):
            self.publishers[message.msg] = src
            self._run(self.replica.publish(message.msg))
        elif isinstance(message, Status):
            r = self.replica
            self.transport.send(src, StatusReply(r.name, r.role, r.epoch, r.leo, r.hw, tuple(sorted(r.isr)),
                                                 tuple(r.log) if message.with_log else ()))
        elif isinstance(message, AlterIsr | Hello | PublishResult | StatusReply | Routed | Forward):
            pass  # the controller's and the clients' messages (and the broker's, which this harness never gets)
        elif isinstance(message, FetchRequest) and self._parks(message):
            self.parked[src] = (message, now)
        else:
            if isinstance(message, FetchResponse | EpochEndResponse) and src == self.replica.leader:
                self.awaiting_since = None
                self.fetch_now = True  # the leader parks a fetch with nothing new: ask again at once
            self._run(self.replica.handle(message, now))
            if self.fetch_now:
                self._poll(now)
        self._release(now)

    def _parks(self, request: FetchRequest) -> bool:
        """A leader holds a fetch that tells it nothing new (the follower's LEO is known) and would get nothing new (no
        records, a HW the follower has) for up to
        `fetch_max_wait_ms`, as Kafka's fetch.max.wait.ms, so a follower hears of a publish at once without polling
        in a loop; it is answered (through the core, with the time of the answer) when the log or HW moves."""
        r = self.replica
        return (r.role == "leader" and request.epoch == r.epoch and request.fetch_offset == r.leo
                and r.follower_leo.get(request.src) == request.fetch_offset  # nothing new for the core either
                and self.hw_sent.get(request.src) == r.hw)

    def _release(self, now: int, expired_only: bool = False) -> None:
        r = self.replica
        for src, (request, since) in list(self.parked.items()):
            moved = r.role != "leader" or request.epoch != r.epoch or request.fetch_offset != r.leo or (
                self.hw_sent.get(src) != r.hw)
            if (moved and not expired_only) or now - since >= self.config.fetch_max_wait_ms:
                del self.parked[src]
                self._run(r.handle(request, now))
    def _on_leader_and_isr(self, message: LeaderAndIsr, now: int) -> None:
        r = self.replica
        if not message.leader:
            return  # no replica can lead: wait for the controller
        if message.epoch > r.epoch or r.role == "none":
            if message.leader == r.name:
                self._run(r.become_leader(message.epoch, frozenset(message.isr), now))
            else:
                self._run(r.become_follower(message.leader, message.epoch))
                self.awaiting_since = None
                self._poll(now)
        elif message.epoch == r.epoch and r.role == "leader" and message.leader == r.name:
            self._run(r.update_isr(frozenset(message.isr), now))

    def _poll(self, now: int) -> None:
        self.fetch_now = False
        effects = self.replica.poll()
        if effects:
            self.awaiting_since = now
            self._run(effects)

    # --- time --------------------------------------------------------------------------------------------------

    def _tick(self) -> None:
        now = wall_ms()
        if not self.greeted and now - self.last_hello_ms >= HELLO_INTERVAL_MS:
            self.last_hello_ms = now
            r = self.replica
            self.transport.send(self.config.controller,
                                Hello(r.name, self.unclean, r.latest_epoch(), r.leo, self.incarnation))
        if self.settings.flush == "unsynced" and now - self.last_writeback_ms >= self.config.writeback_interval_ms:
            self.last_writeback_ms = now
            self.replica.flush()
            self._run([])
        self._run(self.replica.tick(now))
        self._release(now)
        if self.replica.role == "follower" and (
                self.awaiting_since is None or now - self.awaiting_since >= self.config.fetch_timeout_ms):
            self._poll(now)
        self.telemetry.sample_replicas([(self.config.group, self.replica)])

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.transport.serve, self.config.host, self.config.port)
            task_status.started()
            while True:
                self._tick()
                await trio.sleep(self.config.tick_ms / 1000)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = NodeConfig.from_json(pathlib.Path(args[0]).read_text())
    trio.run(ReplicaNode(config).run)


if __name__ == "__main__":
    main()
