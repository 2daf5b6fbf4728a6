"""`raftmq bench --rounds N` (N > 1): for each workload, start every broker once, then measure them alternately in
ABBA order on the running brokers, so that the two measurements of a round see the same machine load.

For each workload every broker under test is opened (`BrokerUnderTest.open(workload)`: a context manager that
starts the broker, or the 3-node cluster for (b), and yields the function that measures that workload on it once).
Both stay up for the whole workload (for (b) both 3-node clusters at once), and round r measures them in
`bench.rounds.broker_order` order (round 1: raftmq then RabbitMQ, round 2: RabbitMQ then raftmq, ...). Every
measurement declares its own fresh queues (their names carry a new run id) and deletes them afterwards, as the
single-round run does. A broker that does not start yields one error Measurement; the others are still measured
every round. Leaving the block (normally, on an error or on Ctrl-C) stops every broker it started.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.brokers import BrokerStartError
from bench.rounds import measurement_schedule
from bench.workloads import Measurement, RunSettings

MeasureOnce = Callable[[RunSettings], list[Measurement]]


@dataclass(frozen=True, slots=True)
class BrokerUnderTest:
    """A broker by name and how to bring it up for one workload."""

    name: str
    open: Callable[[str], contextlib.AbstractContextManager[MeasureOnce]]


def run_in_rounds(
    brokers: Sequence[BrokerUnderTest], workloads: Sequence[str], settings: RunSettings, rounds: int,
    show: Callable[[Measurement], None],
) -> list[Measurement]:
    """Every workload on every broker, `rounds` times each in ABBA order; measurements in the order taken, each
    with its round_number."""
    found: list[Measurement] = []
    for workload in workloads:
        found += _workload_in_rounds(brokers, workload, settings, rounds, show)
    return found


def _workload_in_rounds(
    brokers: Sequence[BrokerUnderTest], workload: str, settings: RunSettings, rounds: int,
    show: Callable[[Measurement], None],
) -> list[Measurement]:
    found: list[Measurement] = []
    with contextlib.ExitStack() as stack:
        running: dict[str, MeasureOnce] = {}
        for broker in brokers:
            print(f"[{broker.name}] starting for workload ({workload}) ...", flush=True)
            try:
                running[broker.name] = stack.enter_context(broker.open(workload))
            except BrokerStartError as error:
                print(f"[{broker.name}] could not start: {error}", flush=True)
                failed = Measurement(workload, workload, broker.name, error=f"broker did not start: {error}")
                show(failed)
                found.append(failed)
        for number, name in measurement_schedule(list(running), rounds):
            print(f"[{name}] round {number}/{rounds}: workload ({workload}) ...", flush=True)
            for measurement in running[name](settings):
                taken = dataclasses.replace(measurement, round_number=number)
                show(taken)
                found.append(taken)
    return found
