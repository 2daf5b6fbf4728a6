"""The closing figures of issue 16 as one Markdown table, from the measurements of one `raftmq bench` run
(`raftmq bench --report issue16`). Pure: measurements in, text out.

Rows, raftmq and RabbitMQ side by side in every cell ("raftmq / RabbitMQ"):
- flows of (a) a durable classic queue on one node and (b) a 3-replica quorum queue on a 3-node cluster, at
  saturation (b: clients on two followers, and on the leader's node) and at each fixed rate ("a@1000/s" ...; (e)'s
  rates count as (a)'s when (a) has none): confirmed/s, delivered/s, end-to-end p50/p99, confirm p99, and a
  BACKLOG mark where delivered/s is more than 5% below confirmed/s;
- the first message on a new queue of each type: declare-ok, first confirm and first delivery, p50 and p99 (with
  fewer than 100 trials the p99 is the largest);
- failover (`raftmq bench failover`): kill -9 of the quorum queue leader's node to the next confirm on a survivor;
- the issue's targets, each "met", "NOT met" or "n/a" (no figure), failover against RabbitMQ's too when measured.
With several rounds every cell is the median over the rounds that did not fail.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.measurement import FailoverFigures, Measurement, is_backlog
from bench.results import RABBITMQ, RAFTMQ
from bench.rounds import median

QUEUE_NAMES = {"a": "(a) durable classic queue, 1 node", "b": "(b) quorum queue, 3 replicas on 3 nodes"}
RATE_LABEL = re.compile(r"^([abe])@(\d+)/s$")
NEW_QUEUE_CONFIRM_TARGET_MS = 20.0  # issue 16, item 2: a new quorum queue's first publish confirmed in under 20 ms
DECLARE_OK_TARGET_MS = 50.0  # ... and its declare-ok in under 50 ms
FAILOVER_TARGET_MS = 300.0  # item 5: kill -9 of the leader's node to the next confirm, at most 0.3 s


def describe(label: str) -> tuple[str, str] | None:
    """(queue, load) of a flow label of the report: "a" -> ((a) ..., "saturation"), "b@5000/s" -> ((b) ...,
    "fixed 5,000 msg/s, clients on 2 followers"), "e@1000/s" -> ((a) ..., "fixed 1,000 msg/s"); None for others."""
    if label == "a":
        return QUEUE_NAMES["a"], "saturation"
    if label == "b":
        return QUEUE_NAMES["b"], "saturation, clients on 2 followers"
    if label == "b@leader":
        return QUEUE_NAMES["b"], "saturation, clients on the leader's node"
    matched = RATE_LABEL.match(label)
    if matched is None:
        return None
    workload, rate = matched.group(1), int(matched.group(2))
    where = ", clients on 2 followers" if workload == "b" else ""
    return QUEUE_NAMES["b" if workload == "b" else "a"], f"fixed {rate:,} msg/s{where}"


def flow_labels(measurements: Sequence[Measurement]) -> list[str]:
    """The report's flow labels present, in report order: (a) saturation then its rates by rate, then (b)'s; (e)'s
    rates stand in for (a)'s only when (a) has none."""
    present = {m.label for m in measurements if not m.is_new_queue}
    a_rates = _rates(present, "a")
    e_rates = [] if a_rates else _rates(present, "e")
    ordered = ["a", *a_rates, *e_rates, "b", "b@leader", *_rates(present, "b")]
    return [label for label in ordered if label in present]


def _rates(labels: set[str], workload: str) -> list[str]:
    found = [(int(m.group(2)), label) for label in labels if (m := RATE_LABEL.match(label)) and m.group(1) == workload]
    return [label for _, label in sorted(found)]


def median_figure(measurements: Sequence[Measurement], broker: str, label: str, name: str) -> float | None:
    """The median of a figure over a broker's rounds of `label` that did not fail and have it."""
    values = [getattr(m, name) for m in measurements
              if m.broker == broker and m.label == label and not m.error and getattr(m, name) is not None]
    return median(values) if values else None


def backlog_median(measurements: Sequence[Measurement], broker: str, label: str) -> float | None:
    """Median delivery shortfall (fraction below confirmed/s) over the rounds; see Measurement.delivery_shortfall."""
    values = [m.delivery_shortfall for m in measurements
              if m.broker == broker and m.label == label and m.delivery_shortfall is not None]
    return median(values) if values else None


def _cell(measurements: Sequence[Measurement], label: str, name: str, digits: int) -> str:
    return " / ".join(_one(measurements, broker, label, name, digits) for broker in (RAFTMQ, RABBITMQ))


def _one(measurements: Sequence[Measurement], broker: str, label: str, name: str, digits: int) -> str:
    taken = [m for m in measurements if m.broker == broker and m.label == label]
    if not taken:
        return "-"
    value = median_figure(measurements, broker, label, name)
    if value is None:
        return "error" if all(m.error for m in taken) else "-"
    return f"{value:,.{digits}f}"


def _backlog_note(measurements: Sequence[Measurement], label: str) -> str:
    notes = []
    for broker, name in ((RAFTMQ, "raftmq"), (RABBITMQ, "RabbitMQ")):
        shortfall = backlog_median(measurements, broker, label)
        if is_backlog(shortfall):
            notes.append(f"{name} BACKLOG: delivered {shortfall:.0%} below confirmed")
        errors = [m.error for m in measurements if m.broker == broker and m.label == label and m.error]
        if errors:
            notes.append(f"{name} error: {errors[0][:80]}")
    return "; ".join(notes)


def flow_table(measurements: Sequence[Measurement]) -> list[str]:
    lines = [
        "| queue | load | confirmed/s | delivered/s | e2e p50 ms | e2e p99 ms | confirm p99 ms | notes |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for label in flow_labels(measurements):
        described = describe(label)
        if described is None:
            continue
        queue, load = described
        lines.append(
            f"| {queue} | {load} | {_cell(measurements, label, 'confirmed_msgs_per_s', 0)} "
            f"| {_cell(measurements, label, 'delivered_msgs_per_s', 0)} | {_cell(measurements, label, 'latency_p50_ms', 1)} "
            f"| {_cell(measurements, label, 'latency_p99_ms', 1)} | {_cell(measurements, label, 'confirm_p99_ms', 1)} "
            f"| {_backlog_note(measurements, label)} |"
        )
    return lines


def new_queue_table(measurements: Sequence[Measurement]) -> list[str]:
    lines = [
        "| new queue | declare-ok p50 ms | declare-ok p99 ms | first confirm p50 ms | first confirm p99 ms "
        "| first delivery p50 ms | first delivery p99 ms | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for workload in ("a", "b"):
        label = f"{workload}/new-q"
        if not any(m.label == label for m in measurements):
            continue
        cells = " | ".join(_cell(measurements, label, name, 1) for name in (
            "declare_ok_p50_ms", "declare_ok_p99_ms", "confirm_p50_ms", "confirm_p99_ms", "latency_p50_ms",
            "latency_p99_ms"))
        lines.append(f"| {QUEUE_NAMES[workload]} | {cells} | {_backlog_note(measurements, label)} |")
    return lines


def failover_cell(figures: FailoverFigures | None) -> str:
    if figures is None:
        return "not measured"
    if figures.error or not figures.first_confirm_ms:
        return f"error: {figures.error or 'no runs'}"[:120]
    runs = figures.first_confirm_ms
    return f"median {statistics.median(runs):,.0f} ms, max {max(runs):,.0f} ms (n={len(runs)})"


@dataclass(frozen=True, slots=True)
class Target:
    what: str
    verdict: str  # "met", "NOT met" or "n/a"
    figures: str


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def targets(measurements: Sequence[Measurement], failover: Sequence[FailoverFigures] = ()) -> list[Target]:
    """The issue's targets, checked against the run's figures (medians over the rounds)."""
    found: list[Target] = []
    for label in ("b", "b@leader"):
        if not any(m.label == label for m in measurements):
            continue
        ours = median_figure(measurements, RAFTMQ, label, "delivered_msgs_per_s")
        theirs = median_figure(measurements, RABBITMQ, label, "delivered_msgs_per_s")
        found.append(Target(f"({label}) saturation: raftmq delivered/s at least RabbitMQ's",
                            _verdict(None if ours is None or theirs is None else ours >= theirs),
                            f"{_fmt(ours)} / {_fmt(theirs)}"))
        ours = median_figure(measurements, RAFTMQ, label, "latency_p99_ms")
        theirs = median_figure(measurements, RABBITMQ, label, "latency_p99_ms")
        found.append(Target(f"({label}) saturation: raftmq e2e p99 no higher than RabbitMQ's",
                            _verdict(None if ours is None or theirs is None else ours <= theirs),
                            f"{_fmt(ours, 1)} / {_fmt(theirs, 1)} ms"))
    flows = flow_labels(measurements)
    shortfalls = {label: backlog_median(measurements, RAFTMQ, label) for label in flows}
    known = {label: value for label, value in shortfalls.items() if value is not None}
    behind = [label for label, value in known.items() if is_backlog(value)]
    found.append(Target("raftmq delivered/s within 5% of confirmed/s in every flow",
                        _verdict(None if not known else not behind),
                        ("behind in " + ", ".join(behind)) if behind else f"{len(known)} flows"))
    if any(m.label == "b/new-q" for m in measurements):
        confirm = median_figure(measurements, RAFTMQ, "b/new-q", "confirm_p99_ms")
        declare = median_figure(measurements, RAFTMQ, "b/new-q", "declare_ok_p99_ms")
        found.append(Target(f"new quorum queue: first confirm under {NEW_QUEUE_CONFIRM_TARGET_MS:.0f} ms (p99)",
                            _verdict(None if confirm is None else confirm < NEW_QUEUE_CONFIRM_TARGET_MS),
                            f"{_fmt(confirm, 1)} ms"))
        found.append(Target(f"new quorum queue: declare-ok under {DECLARE_OK_TARGET_MS:.0f} ms (p99)",
                            _verdict(None if declare is None else declare < DECLARE_OK_TARGET_MS),
                            f"{_fmt(declare, 1)} ms"))
    ours_failover = next((f for f in failover if f.broker == RAFTMQ), None)
    theirs_failover = next((f for f in failover if f.broker == RABBITMQ), None)
    if ours_failover is not None:
        worst = max(ours_failover.first_confirm_ms) if ours_failover.first_confirm_ms else None
        found.append(Target(f"failover at most {FAILOVER_TARGET_MS:.0f} ms (every run)",
                            _verdict(None if worst is None or ours_failover.error else worst <= FAILOVER_TARGET_MS),
                            failover_cell(ours_failover)))
    if ours_failover is not None and theirs_failover is not None:
        ours, theirs = _failover_median(ours_failover), _failover_median(theirs_failover)
        found.append(Target("failover (median) no slower than RabbitMQ's",
                            _verdict(None if ours is None or theirs is None else ours <= theirs),
                            f"{_fmt(ours)} / {_fmt(theirs)} ms"))
    return found


def _failover_median(figures: FailoverFigures) -> float | None:
    if figures.error or not figures.first_confirm_ms:
        return None
    return statistics.median(figures.first_confirm_ms)


def format_issue16(
    measurements: Sequence[Measurement], failover: Sequence[FailoverFigures] = (), started_at: str = "",
    rabbitmq_version: str | None = None, rounds: int = 1,
) -> str:
    """The whole report: heading, the flow table, the new-queue table, failover and the targets (Markdown)."""
    version = f"RabbitMQ {rabbitmq_version}" if rabbitmq_version else "RabbitMQ"
    when = f", run started {started_at}" if started_at else ""
    medians = f"; each cell the median of {rounds} rounds" if rounds > 1 else ""
    lines = [f"Issue 16 figures: raftmq / {version} in every cell{when}{medians}", ""]
    lines += flow_table(measurements)
    lines += ["", *new_queue_table(measurements), ""]
    by_broker = {figures.broker: figures for figures in failover}
    lines += [
        "| failover: kill -9 of the quorum queue leader's node to the next confirm on a survivor | raftmq | RabbitMQ |",
        "|---|---|---|",
        f"| first confirm after the kill | {failover_cell(by_broker.get(RAFTMQ))} "
        f"| {failover_cell(by_broker.get(RABBITMQ))} |",
        "",
        "| issue 16 target | verdict | raftmq (/ RabbitMQ) |",
        "|---|---|---|",
    ]
    lines += [f"| {target.what} | {target.verdict} | {target.figures} |" for target in targets(measurements, failover)]
    lines += ["", "(e2e: publish to delivery at the consumer, from the timestamp in the message body; confirm: a"
              " publish write to its confirm; new-queue p99 over fewer than 100 trials is the largest)"]
    return "\n".join(lines)
