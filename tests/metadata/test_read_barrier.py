"""`SharedBarrier` (cluster/metadata/read_barrier.py) with a scripted round function, and `MetadataStore.caught_up`
on three real stores: concurrent readers share rounds, a reader never uses a round that started before it asked."""

from __future__ import annotations

import trio
import trio.testing

from cluster.metadata.model import PutVhost
from cluster.metadata.read_barrier import SharedBarrier
from tests.metadata.helpers import config, free_addresses, start_all, wait_until


class ScriptedRounds:
    """The round function: each round waits until the test lets it end (`finish`), with the given result."""

    def __init__(self) -> None:
        self.started = 0
        self.gates: list[trio.Event] = []
        self.results: list[bool] = []

    async def sync(self) -> bool:
        self.started += 1
        gate = trio.Event()
        self.gates.append(gate)
        await gate.wait()
        return self.results[self.started - 1] if self.started <= len(self.results) else True

    def finish(self, index: int) -> None:
        self.gates[index].set()


async def test_readers_during_a_round_share_the_next_one() -> None:
    rounds = ScriptedRounds()
    rounds.results = [True, False]
    barrier = SharedBarrier(rounds.sync)
    answers: dict[str, bool] = {}

    async def reader(name: str) -> None:
        answers[name] = await barrier.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, "first")
        await trio.testing.wait_all_tasks_blocked()
        assert rounds.started == 1
        for i in range(5):  # arrive while round 1 runs: they must not use it
            nursery.start_soon(reader, f"later-{i}")
        await trio.testing.wait_all_tasks_blocked()
        assert rounds.started == 1 and not answers
        rounds.finish(0)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == {"first": True} and rounds.started == 2  # one round for all five
        rounds.finish(1)
    assert answers == {"first": True, **{f"later-{i}": False for i in range(5)}}
    assert barrier.rounds == 2


async def test_a_reader_that_gives_up_does_not_cut_the_round_short_for_the_others() -> None:
    rounds = ScriptedRounds()
    barrier = SharedBarrier(rounds.sync)
    answers: list[str] = []

    async def reader(name: str) -> None:
        await barrier.wait()
        answers.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, "first")  # starts round 1
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as impatient:
            impatient.start_soon(reader, "impatient")  # joins round 2, then gives up
            nursery.start_soon(reader, "patient")  # joins round 2 too
            await trio.testing.wait_all_tasks_blocked()
            impatient.cancel_scope.cancel()
        rounds.finish(0)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == ["first"] and rounds.started == 2
        rounds.finish(1)
    assert answers == ["first", "patient"]


async def test_caught_up_on_a_follower_sees_every_earlier_write() -> None:
    addrs = free_addresses(3)
    stores = await start_all([config(i, addrs) for i in range(3)])
    try:
        follower = next(s for s in stores if s.leader() != s.config.address)
        writer = next(s for s in stores if s is not follower)
        for i in range(3):
            assert (await writer.apply(PutVhost(f"v{i}"))).ok
            seen: list[bool] = []

            async def read(seen: list[bool] = seen) -> None:
                seen.append(await follower.caught_up(10))

            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(read)
            assert seen == [True] * 20 and f"v{i}" in follower.state.vhosts
        assert follower._shared_barrier.rounds <= 6  # 60 readers, at most two rounds per burst
    finally:
        for s in stores:
            s.close()


async def test_caught_up_without_a_majority_answers_false_within_its_bound() -> None:
    addrs = free_addresses(3)
    stores = await start_all([config(i, addrs) for i in range(3)])
    try:
        stopping = [store.syncobj_for_shutdown() for store in stores[1:]]
        for store in stores[1:]:
            store.close()  # (pysyncobj stops at its next tick: until then they still answer)
        await wait_until(lambda: not any(s.tick_thread_alive() for s in stopping), what="two stores stopped")
        with trio.fail_after(5):  # (a guard against hanging; the bound under test is 0.5 s)
            assert await stores[0].caught_up(0.5) is False
    finally:
        for s in stores:
            s.close()
