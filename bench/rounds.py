"""Repeated, interleaved measurements (`raftmq bench --rounds N`): the ABBA order of the brokers in each round and
the median and range of the per-round raftmq/RabbitMQ ratios. Pure functions, no I/O.

On a shared machine a broker's throughput follows the CPU share it gets, and that share drifts over minutes. With
--rounds N the brokers of a workload are started once and measured alternately in ABBA order (round 1: raftmq then
RabbitMQ, round 2: RabbitMQ then raftmq, round 3 as round 1, ...): the two measurements of one round see about the
same machine load, and over two rounds a steady drift in load weighs on both brokers alike (each is measured once
first and once second). Each round gives its own ratios (raftmq over RabbitMQ, from that round's two
measurements); a figure's summary is the median of those per-round ratios with their minimum and maximum. The
median of an even count is the mean of the two middle values (so with 2 rounds it is the mean of both).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ROUNDS_MAX = 100  # a bound on the loop; 100 rounds of 5 workloads at 12 s each is already more than 3 hours


@dataclass(frozen=True, slots=True)
class Spread:
    """The median, minimum and maximum of a figure over the rounds that produced it (`count` of them)."""

    median: float
    low: float
    high: float
    count: int


def broker_order(brokers: Sequence[str], round_number: int) -> list[str]:
    """The brokers in the order they are measured in round `round_number` (1-based): as given in odd rounds,
    reversed in even ones (ABBA)."""
    if round_number < 1:
        raise ValueError(f"rounds are numbered from 1, got {round_number}")
    return list(brokers) if round_number % 2 == 1 else list(reversed(brokers))


def measurement_schedule(brokers: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """Every (round, broker) measurement of one workload, in the order they are taken."""
    if not 1 <= rounds <= ROUNDS_MAX:
        raise ValueError(f"rounds must be in 1..{ROUNDS_MAX}, got {rounds}")
    return [(number, broker) for number in range(1, rounds + 1) for broker in broker_order(brokers, number)]


def median(values: Sequence[float]) -> float:
    """The middle value of `values` (the mean of the two middle ones for an even count)."""
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2.0


def spread(values: Iterable[float | None]) -> Spread | None:
    """Median and range of the values that are known (None: the figure was missing in that round); None when no
    round had it."""
    known = [value for value in values if value is not None]
    if not known:
        return None
    return Spread(median(known), min(known), max(known), len(known))


def format_spread(value: Spread | None, digits: int = 2, unit: str = "x") -> str:
    """'0.85x (0.80-0.90x)'; just '0.85x' for a single round; 'n/a' when there is none."""
    if value is None:
        return "n/a"
    middle = f"{value.median:,.{digits}f}{unit}"
    if value.count == 1:
        return middle
    return f"{middle} ({value.low:,.{digits}f}-{value.high:,.{digits}f}{unit})"
