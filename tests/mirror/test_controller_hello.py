"""The controller (cluster/mirror_queues/runtime/controller.py) and a replica's hellos, in process: no sockets, the
metadata state through `model.apply`. A replica repeats its hello until a LeaderAndIsr reaches it; a repeat from the
same incarnation commits nothing and is answered with the record, a hello of a new incarnation from a replica still
counted live is a restart (reported down, then up: a leader is deposed)."""

from __future__ import annotations

import trio
import trio.testing

from cluster.metadata import model
from cluster.metadata.mirror import DeclareMirror, MirrorRecord
from cluster.metadata.model import Command, DeclareQueue, MetadataState, Outcome, PutVhost, QueueRecord
from cluster.mirror_queues.runtime.controller import MirrorController
from cluster.mirror_queues.runtime.wire import Hello, LeaderAndIsr, WireMessage

AB = ("a", "b")


class Host:
    def __init__(self) -> None:
        self.state = MetadataState()
        for command in (PutVhost("/"), DeclareQueue(QueueRecord("/", "q", type="mirrored", leader="a", members=AB)),
                        DeclareMirror("/", "q", AB)):
            self.state, outcome = model.apply(self.state, command)
            assert outcome.ok, outcome.refused
        self.sent: list[tuple[str, WireMessage]] = []
        self.controller = MirrorController("/", "q", self.commit, self.record, self.send)

    async def commit(self, command: Command) -> Outcome:
        self.state, outcome = model.apply(self.state, command)
        return outcome

    def record(self) -> MirrorRecord:
        return self.state.mirrors[("/", "q")]

    def send(self, dst: str, message: WireMessage) -> None:
        self.sent.append((dst, message))

    async def hello(self, replica: str, incarnation: int) -> None:
        self.controller.on_message(replica, Hello(replica, False, 0, 0, incarnation))
        await trio.testing.wait_all_tasks_blocked()


async def test_a_repeated_hello_changes_nothing_and_a_new_incarnation_is_a_restart() -> None:
    h = Host()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.controller.run)
        await h.hello("a", 1)
        await h.hello("b", 7)
        start = h.record()
        assert (start.leader, start.epoch, h.controller.live) == ("a", 0, {"a", "b"})
        committed = list(h.controller.outcomes)
        h.sent.clear()

        for _ in range(3):  # the LeaderAndIsr is slow to reach a: it says hello again, same start
            await h.hello("a", 1)
        assert h.record() == start and h.controller.outcomes == committed and h.controller.repeats == 3
        assert h.sent == [("a", LeaderAndIsr("a", 0, start.isr))] * 3  # answered, to a alone

        await h.hello("a", 2)  # a restarted before it was reported down: its old incarnation is gone
        after = h.record()
        assert [kind for kind, _ in h.controller.outcomes[len(committed):]] == ["MirrorReplicaDown",
                                                                                "MirrorReplicaUp"]
        assert after.leader == "b" and after.epoch == 1 and h.controller.incarnations == {"a": 2, "b": 7}
        await h.hello("a", 2)  # and its repeats are repeats again
        assert h.record() == after and h.controller.repeats == 4
        nursery.cancel_scope.cancel()
