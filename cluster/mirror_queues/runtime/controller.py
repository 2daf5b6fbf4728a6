"""The controller side of one mirrored queue: replica reports in, metadata commands committed, LeaderAndIsr out.

What it is for: the replicas' link to the metadata group, where leader, epoch and ISR are committed
(cluster/metadata/mirror.py). A replica's `Hello` (it started) becomes `MirrorReplicaUp`: the first hello of an
incarnation (`Hello.incarnation`, one id per process start) only. A replica repeats its hello until a
`LeaderAndIsr` reaches it, so a repeat (a live replica, the same incarnation) commits nothing and is answered with
the record; a hello of a new incarnation from a replica still counted live (restarted before it was reported down)
is its old incarnation's `MirrorReplicaDown` first, then the new one's `MirrorReplicaUp`. A leader's `AlterIsr`
becomes `AlterMirrorIsr`, and the failure detector's verdict that a replica is gone (`replica_down`) becomes
`MirrorReplicaDown`; after each commit every live replica is told the committed record (`LeaderAndIsr`), so a
replica acts only on what the metadata group committed. A refused `AlterIsr` (a deposed leader, "fenced") is
answered the same way, also when its sender was reported down: the record tells it who leads now.

How it works: `commit` is how a command reaches the metadata group (`MetadataStore.apply`, which goes through the
pysyncobj log; or `model.apply` on a local state in a test) and `record()` reads the committed record. Events are
handled one at a time by `run()` (a trio task), so the epoch a report names is the one current when it is
committed. Which process hosts the controller is not decided here; in the broker it would be the metadata
group's leader node (as Kafka's active controller), which also runs the failure detection.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from cluster.metadata.mirror import AlterMirrorIsr, MirrorRecord, MirrorReplicaDown, MirrorReplicaUp
from cluster.metadata.model import Command, Outcome
from cluster.mirror_queues.runtime.wire import AlterIsr, Hello, LeaderAndIsr, WireMessage

log = logging.getLogger(__name__)

Event = tuple[str, WireMessage | None]  # (replica, message); None: the replica is down


class MirrorController:
    def __init__(self, vhost: str, name: str, commit: Callable[[Command], Awaitable[Outcome]],
                 record: Callable[[], MirrorRecord | None], send: Callable[[str, WireMessage], None]) -> None:
        self.vhost = vhost
        self.name = name
        self._commit = commit
        self._record = record
        self._send = send
        self.live: set[str] = set()
        self.log_ends: dict[str, list[int]] = {}
        self.incarnations: dict[str, int] = {}  # the incarnation of each replica's last hello
        self.repeats = 0  # hellos taken for repeats (answered with the record, nothing committed)
        self._events_in, self._events = trio.open_memory_channel[Event](1024)
        self.outcomes: list[tuple[str, Outcome]] = []  # (command type, outcome), for tests and diagnostics

    def on_message(self, src: str, message: WireMessage) -> None:
        if isinstance(message, Hello | AlterIsr):
            self._events_in.send_nowait((src, message))

    def replica_down(self, replica: str) -> None:
        self._events_in.send_nowait((replica, None))

    async def run(self) -> None:
        async for replica, message in self._events:
            await self._handle(replica, message)

    async def _handle(self, replica: str, message: WireMessage | None) -> None:
        current = self._record()
        if current is None:
            return
        command: Command
        if message is None:
            self.live.discard(replica)
            command = MirrorReplicaDown(self.vhost, self.name, replica, current.epoch, tuple(sorted(self.live)),
                                        dict(self.log_ends))
        elif isinstance(message, Hello):
            if replica in self.live and self.incarnations.get(replica) == message.incarnation:
                self.repeats += 1  # its LeaderAndIsr is on the way (or lost): once more, to it alone
                self._send(replica, LeaderAndIsr(current.leader, current.epoch, current.isr))
                return
            if replica in self.live:  # a new incarnation said hello before its old one was reported down
                await self._handle(replica, None)
                current = self._record() or current
            self.incarnations[replica] = message.incarnation
            self.live.add(replica)
            self.log_ends[replica] = [message.last_epoch, message.leo]
            command = MirrorReplicaUp(self.vhost, self.name, replica, current.epoch, tuple(sorted(self.live)),
                                      message.unclean, dict(self.log_ends))
        elif isinstance(message, AlterIsr):
            command = AlterMirrorIsr(self.vhost, self.name, message.leader, message.epoch, message.isr)
        else:
            return
        outcome = await self._commit(command)
        self.outcomes.append((type(command).__name__, outcome))
        if outcome.refused:
            log.info("%s refused: %s", type(command).__name__, outcome.refused)
        self.broadcast()
        if isinstance(message, AlterIsr) and replica not in self.live:
            self.broadcast(replica)  # a deposed leader reported down: the record tells it who leads now

    def broadcast(self, *also: str) -> None:
        record = self._record()
        if record is None:
            return
        for replica in sorted(self.live | set(also)):
            self._send(replica, LeaderAndIsr(record.leader, record.epoch, record.isr))
