"""Benchmark results: the side-by-side table, the JSON file and the PNG chart.

A run is a `RunReport`: when and where it ran (machine, command, broker versions), its settings and every
`Measurement`. `comparisons` pairs raftmq's figures with RabbitMQ's per label and round and computes the ratios
(raftmq over RabbitMQ); `ratio_summaries` gives each label's median ratios with their range over the rounds of a
`--rounds N` run (`bench.rounds`; one round: the median is that round's ratio). `write_json`/`read_json`
round-trip a report (schema 1; minor version 1 added each measurement's round, the per-round comparisons and the
summaries, and files without them read as one round; minor 2 added each measurement's kind, confirm latency and
declare-ok latency, which older files read as "flow" and None, and "failover") and `write_chart` draws throughput and p99 latency
per label and broker (medians over the rounds; flows only), so that files from successive runs in one output
directory can be compared. `format_table` prints every measurement, then raftmq and RabbitMQ side by side per
label (confirmed/s, delivered/s, end-to-end and confirm latency, a BACKLOG flag), and the new-queue trials apart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.measurement import FailoverFigures
from bench.rounds import Spread, format_spread, median, spread
from bench.stats import format_ratio, ratio
from bench.workloads import Measurement

SCHEMA_VERSION = 1
SCHEMA_MINOR_VERSION = 2  # 1: round_number, round_comparisons, ratio_summaries; 2: kind, confirm_*, declare_ok_*
LOAD_AVERAGE_WARNING_1M = 1.5  # above this at the start of a measurement, other jobs share the CPU (a warning)
RAFTMQ = "raftmq"
RABBITMQ = "rabbitmq"


@dataclass(frozen=True, slots=True)
class RunReport:
    started_at: str  # ISO 8601, UTC
    command: list[str]
    machine: dict[str, Any]
    settings: dict[str, Any]
    measurements: list[Measurement]
    notes: list[str]
    failover: tuple[FailoverFigures, ...] = ()  # `--report issue16`: failover runs made in the same command


@dataclass(frozen=True, slots=True)
class Comparison:
    label: str
    raftmq: Measurement | None
    rabbitmq: Measurement | None
    round_number: int = 1

    @property
    def throughput_ratio(self) -> float | None:
        if self.raftmq is None or self.rabbitmq is None or self.raftmq.error or self.rabbitmq.error:
            return None
        return ratio(self.raftmq.confirmed_msgs_per_s, self.rabbitmq.confirmed_msgs_per_s)

    @property
    def p99_ratio(self) -> float | None:
        if self.raftmq is None or self.rabbitmq is None:
            return None
        return ratio(self.raftmq.latency_p99_ms, self.rabbitmq.latency_p99_ms)

    @property
    def cpu_per_msg_ratio(self) -> float | None:
        """raftmq's broker CPU per confirmed message over RabbitMQ's (below 1x: raftmq is cheaper per message)."""
        if self.raftmq is None or self.rabbitmq is None:
            return None
        return ratio(self.raftmq.broker_cpu_us_per_msg, self.rabbitmq.broker_cpu_us_per_msg)


def machine_info() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_average_1m": os.getloadavg()[0],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def comparisons(measurements: list[Measurement]) -> list[Comparison]:
    """One raftmq/RabbitMQ pair per label and round: labels in the order first measured, each label's rounds in
    order (one round: one pair per label)."""
    labels = _labels(measurements)
    found = {(m.broker, m.label, m.round_number): m for m in measurements}
    pairs = []
    for label in labels:
        for number in sorted({m.round_number for m in measurements if m.label == label}):
            pairs.append(Comparison(label, found.get((RAFTMQ, label, number)), found.get((RABBITMQ, label, number)),
                                    number))
    return pairs


def _labels(measurements: list[Measurement]) -> list[str]:
    return list(dict.fromkeys(m.label for m in measurements))


def rounds_in(measurements: list[Measurement]) -> int:
    """How many rounds the run had (1 for runs without --rounds and for files written before it)."""
    return max((m.round_number for m in measurements), default=1)


@dataclass(frozen=True, slots=True)
class RatioSummary:
    """A label's ratios over the rounds: median and range of each figure (None when no round had it)."""

    label: str
    rounds: int  # rounds with a pair for this label
    throughput: Spread | None
    p99: Spread | None
    cpu_per_msg: Spread | None


def ratio_summaries(measurements: list[Measurement]) -> list[RatioSummary]:
    by_label: dict[str, list[Comparison]] = {}
    for pair in comparisons(measurements):
        by_label.setdefault(pair.label, []).append(pair)
    return [
        RatioSummary(
            label, len(pairs), spread(p.throughput_ratio for p in pairs), spread(p.p99_ratio for p in pairs),
            spread(p.cpu_per_msg_ratio for p in pairs),
        )
        for label, pairs in by_label.items()
    ]


def load_warning(m: Measurement) -> str | None:
    """A warning line when the machine was busy as the measurement started (its figures then carry less weight)."""
    if m.load_average_1m is None or m.load_average_1m <= LOAD_AVERAGE_WARNING_1M:
        return None
    return (f"warning: 1-minute load average {m.load_average_1m:.1f} (above {LOAD_AVERAGE_WARNING_1M}) at the start"
            f" of {m.label} on {m.broker}: other jobs share the CPU; compare ratios over --rounds")


# --- table --------------------------------------------------------------------------------------------------


def _pair_cell(ours: Measurement | None, theirs: Measurement | None, name: str, digits: int) -> str:
    """"raftmq / RabbitMQ" of one figure; "-" for a missing broker or figure, "error" for a failed one."""
    return f"{_value(ours, name, digits)} / {_value(theirs, name, digits)}"


def _value(m: Measurement | None, name: str, digits: int) -> str:
    if m is None:
        return "-"
    if m.error:
        return "error"
    value: float | None = getattr(m, name)
    return _number(value, digits)


def backlog_flag(m: Measurement) -> str:
    """"BACKLOG (delivered 12% below confirmed)" when deliveries fall more than 5% behind; "" otherwise."""
    if not m.backlog_growing or m.delivery_shortfall is None:
        return ""
    return f"BACKLOG (delivered {m.delivery_shortfall:.0%} below confirmed)"


def _status(m: Measurement) -> str:
    if m.error:
        return f"ERROR {m.error}"
    parts = [part for part in (backlog_flag(m), m.note) if part]
    return "; ".join(parts) or "ok"


def format_table(measurements: list[Measurement]) -> str:
    """One line per measurement, then raftmq vs RabbitMQ per label (and round), side by side, with ratios; for a
    run of several rounds, then each label's median ratios with their range. New-queue trials get their own
    blocks."""
    multi = rounds_in(measurements) > 1
    rnd = "rnd " if multi else ""
    flows = [m for m in measurements if not m.is_new_queue]
    fresh = [m for m in measurements if m.is_new_queue]
    lines = [
        f"{'label':<10} {'broker':<9} {rnd}{'confirmed/s':>12} {'delivered/s':>12} {'e2e p50':>8} {'e2e p99':>8} "
        f"{'e2e p99.9':>9} {'conf p50':>8} {'conf p99':>8} {'gen cpu':>7} {'broker':>6} {'us/msg':>6} {'load':>5}"
        "  status"
    ]
    for m in flows:
        lines.append(
            f"{m.label:<10} {m.broker:<9} " + (f"{m.round_number:>3} " if multi else "") +
            f"{m.confirmed_msgs_per_s:>12,.0f} {m.delivered_msgs_per_s:>12,.0f} "
            f"{_ms(m.latency_p50_ms):>8} {_ms(m.latency_p99_ms):>8} {_ms(m.latency_p999_ms):>9} "
            f"{_ms(m.confirm_p50_ms):>8} {_ms(m.confirm_p99_ms):>8} "
            f"{m.loadgen_cpu_max_fraction:>7.0%} {_number(m.broker_cpu_cores, 2):>6} "
            f"{_number(m.broker_cpu_us_per_msg, 0):>6} {_number(m.load_average_1m, 1):>5}  {_status(m)[:200]}"
        )
    if fresh:
        lines += ["", f"{'label':<10} {'broker':<9} {rnd}{'declare-ok p50':>14} {'p99':>8} {'1st confirm p50':>15} "
                  f"{'p99':>8} {'1st delivery p50':>16} {'p99':>8}  status"]
        for m in fresh:
            lines.append(
                f"{m.label:<10} {m.broker:<9} " + (f"{m.round_number:>3} " if multi else "") +
                f"{_ms(m.declare_ok_p50_ms):>14} {_ms(m.declare_ok_p99_ms):>8} {_ms(m.confirm_p50_ms):>15} "
                f"{_ms(m.confirm_p99_ms):>8} {_ms(m.latency_p50_ms):>16} {_ms(m.latency_p99_ms):>8}  {_status(m)[:200]}"
            )
    everything = [pair for pair in comparisons(measurements) if pair.raftmq is not None and pair.rabbitmq is not None]
    pairs = [pair for pair in everything if pair.label not in {m.label for m in fresh}]
    if pairs:
        lines += ["", "raftmq / RabbitMQ side by side (latency in ms; e2e: publish to delivery, conf: publish to"
                  " confirm)",
                  f"{'label':<10} {rnd}{'confirmed/s':>17} {'delivered/s':>17} {'e2e p50':>15} {'e2e p99':>17} "
                  f"{'conf p99':>17} {'throughput':>10} {'p99':>6} {'cpu/msg':>7}"]
        for pair in pairs:
            ours, theirs = pair.raftmq, pair.rabbitmq
            lines.append(
                f"{pair.label:<10} " + (f"{pair.round_number:>3} " if multi else "") +
                f"{_pair_cell(ours, theirs, 'confirmed_msgs_per_s', 0):>17} "
                f"{_pair_cell(ours, theirs, 'delivered_msgs_per_s', 0):>17} "
                f"{_pair_cell(ours, theirs, 'latency_p50_ms', 1):>15} {_pair_cell(ours, theirs, 'latency_p99_ms', 1):>17} "
                f"{_pair_cell(ours, theirs, 'confirm_p99_ms', 1):>17} {format_ratio(pair.throughput_ratio):>10} "
                f"{format_ratio(pair.p99_ratio):>6} {format_ratio(pair.cpu_per_msg_ratio):>7}"
                + "".join(f"  {broker} {backlog_flag(m)}" for broker, m in ((RAFTMQ, ours), (RABBITMQ, theirs))
                          if m is not None and backlog_flag(m))
            )
    fresh_pairs = [pair for pair in everything if pair.label in {m.label for m in fresh}]
    if fresh_pairs:
        lines += ["", "first message on a new queue, raftmq / RabbitMQ (ms, p50 and p99 over the trials)",
                  f"{'label':<10} {rnd}{'declare-ok p50':>17} {'p99':>17} {'1st confirm p50':>17} {'p99':>17} "
                  f"{'1st delivery p50':>17} {'p99':>17}"]
        for pair in fresh_pairs:
            ours, theirs = pair.raftmq, pair.rabbitmq
            lines.append(
                f"{pair.label:<10} " + (f"{pair.round_number:>3} " if multi else "") + " ".join(
                    f"{_pair_cell(ours, theirs, name, 1):>17}" for name in (
                        "declare_ok_p50_ms", "declare_ok_p99_ms", "confirm_p50_ms", "confirm_p99_ms",
                        "latency_p50_ms", "latency_p99_ms"))
            )
    if everything:
        if multi:
            lines += ["", *_summary_lines(measurements)]
        lines.append("(ratios are raftmq / RabbitMQ: throughput above 1x, p99 and cpu/msg below 1x favour raftmq)")
    lines.append("(e2e: publish to delivery at the consumer, from the timestamp in the message; conf: publish to"
                 " confirm; BACKLOG: delivered/s more than 5% below confirmed/s)")
    lines.append("(gen cpu: busiest load-generator process; near 100% it, not the broker, may be the limit)")
    lines.append("(broker: cores the broker process used; us/msg: its CPU per confirmed message; load: 1-min average)")
    return "\n".join(lines)


def _summary_lines(measurements: list[Measurement]) -> list[str]:
    lines = [f"{'label':<10} {'rounds':>6}  {'throughput median (min-max)':<28} {'p99 median (min-max)':<28} "
             "cpu/msg median (min-max)"]
    for summary in ratio_summaries(measurements):
        if summary.throughput is None and summary.p99 is None and summary.cpu_per_msg is None:
            continue
        lines.append(f"{summary.label:<10} {summary.rounds:>6}  {format_spread(summary.throughput):<28} "
                     f"{format_spread(summary.p99):<28} {format_spread(summary.cpu_per_msg)}")
    lines.append("(over rounds in ABBA order: the median of the per-round ratios, with their min-max)")
    return lines


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# --- JSON ---------------------------------------------------------------------------------------------------


def report_to_dict(report: RunReport) -> dict[str, Any]:
    """Schema 1 as before ("comparisons": one entry per label, now the median ratios over the rounds), plus
    (minor 1) "rounds", "round_comparisons" (one entry per label and round) and "ratio_summaries"."""
    summaries = ratio_summaries(report.measurements)
    return {
        "schema": SCHEMA_VERSION,
        "schema_minor": SCHEMA_MINOR_VERSION,
        "started_at": report.started_at,
        "command": report.command,
        "machine": report.machine,
        "settings": report.settings,
        "notes": report.notes,
        "measurements": [dataclasses.asdict(m) for m in report.measurements],
        "comparisons": [
            {"label": s.label, "throughput_ratio": _median_of(s.throughput), "p99_ratio": _median_of(s.p99),
             "cpu_per_msg_ratio": _median_of(s.cpu_per_msg)}
            for s in summaries
        ],
        "rounds": rounds_in(report.measurements),
        "round_comparisons": [
            {"label": pair.label, "round": pair.round_number, "throughput_ratio": pair.throughput_ratio,
             "p99_ratio": pair.p99_ratio, "cpu_per_msg_ratio": pair.cpu_per_msg_ratio}
            for pair in comparisons(report.measurements)
        ],
        "ratio_summaries": [
            {"label": s.label, "rounds": s.rounds, "throughput_ratio": _spread_dict(s.throughput),
             "p99_ratio": _spread_dict(s.p99), "cpu_per_msg_ratio": _spread_dict(s.cpu_per_msg)}
            for s in summaries
        ],
        "failover": [dataclasses.asdict(figures) for figures in report.failover],
    }


def _median_of(value: Spread | None) -> float | None:
    return None if value is None else value.median


def _spread_dict(value: Spread | None) -> dict[str, float | int] | None:
    if value is None:
        return None
    return {"median": value.median, "min": value.low, "max": value.high, "rounds": value.count}


def report_from_dict(data: dict[str, Any]) -> RunReport:
    if data.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"unsupported results schema {data.get('schema')!r}")
    fields = {f.name for f in dataclasses.fields(Measurement)}
    measurements = [Measurement(**{k: v for k, v in m.items() if k in fields}) for m in data["measurements"]]
    failover = tuple(FailoverFigures(str(f["broker"]), tuple(float(ms) for ms in f.get("first_confirm_ms", ())),
                                     f.get("error")) for f in data.get("failover", []))
    return RunReport(
        data["started_at"], list(data["command"]), dict(data["machine"]), dict(data["settings"]),
        measurements, list(data.get("notes", [])), failover,
    )


def write_json(report: RunReport, path: Path) -> None:
    path.write_text(json.dumps(report_to_dict(report), indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> RunReport:
    data: dict[str, Any] = json.loads(path.read_text())
    return report_from_dict(data)


# --- history ------------------------------------------------------------------------------------------------


def load_history(directory: Path) -> list[tuple[Path, RunReport]]:
    """Every readable results file in `directory`, oldest first (file names carry the UTC start time)."""
    found: list[tuple[Path, RunReport]] = []
    for path in sorted(directory.glob("bench-*.json")):
        try:
            found.append((path, read_json(path)))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def format_history(history: list[tuple[Path, RunReport]]) -> str:
    """One line per run and broker/label: confirmed msg/s, p99 and broker CPU per message, so that a regression
    stands out."""
    lines = [f"{'started (UTC)':<22} {'label':<10} {'broker':<9} {'confirmed/s':>12} {'p99 ms':>9} {'us/msg':>6}  ratio"]
    for _, report in history:
        multi = rounds_in(report.measurements) > 1
        pairs = {(pair.label, pair.round_number): pair for pair in comparisons(report.measurements)}
        for m in report.measurements:
            figure = "error" if m.error else ("new queue" if m.is_new_queue else f"{m.confirmed_msgs_per_s:,.0f}")
            pair = pairs.get((m.label, m.round_number))
            shown = format_ratio(pair.throughput_ratio) if pair and m.broker == RAFTMQ else ""
            label = f"{m.label}#{m.round_number}" if multi else m.label
            lines.append(f"{report.started_at:<22} {label:<10} {m.broker:<9} {figure:>12} "
                         f"{_ms(m.latency_p99_ms):>9} {_number(m.broker_cpu_us_per_msg, 0):>6}  {shown}")
        if multi:
            for summary in ratio_summaries(report.measurements):
                lines.append(f"{report.started_at:<22} {summary.label:<10} {'median':<9} over {summary.rounds} rounds:"
                             f" throughput {format_spread(summary.throughput)}, p99 {format_spread(summary.p99)},"
                             f" cpu/msg {format_spread(summary.cpu_per_msg)}")
    return "\n".join(lines)


def format_markdown(history: list[tuple[Path, RunReport]]) -> str:
    """A Markdown table of the raftmq/RabbitMQ pairs of every run, for docs/benchmarks.md (flows only: the
    new-queue trials are in the table of `raftmq bench` and in `bench.issue16`)."""
    lines = [
        "| run (UTC) | workload | raftmq confirmed/s | RabbitMQ confirmed/s | throughput ratio | p99 ms raftmq / RabbitMQ "
        "| p99 ratio | broker CPU us/msg raftmq / RabbitMQ | CPU/msg ratio | load raftmq / RabbitMQ |",
        "|---|---|---:|---:|---:|---|---:|---|---:|---|",
    ]
    for _, report in history:
        if rounds_in(report.measurements) > 1:
            lines += _markdown_rounds_rows(report)
            continue
        for pair in comparisons(report.measurements):
            ours, theirs = pair.raftmq, pair.rabbitmq
            if ours is None or theirs is None or ours.is_new_queue:
                continue
            lines.append(
                f"| {report.started_at[:16].replace('T', ' ')} | {pair.label} | {_markdown_rate(ours)} "
                f"| {_markdown_rate(theirs)} | {format_ratio(pair.throughput_ratio)} "
                f"| {_number(ours.latency_p99_ms, 1)} / {_number(theirs.latency_p99_ms, 1)} "
                f"| {format_ratio(pair.p99_ratio)} "
                f"| {_number(ours.broker_cpu_us_per_msg, 0)} / {_number(theirs.broker_cpu_us_per_msg, 0)} "
                f"| {format_ratio(pair.cpu_per_msg_ratio)} "
                f"| {_number(ours.load_average_1m, 1)} / {_number(theirs.load_average_1m, 1)} |"
            )
    return "\n".join(lines)


def _markdown_rounds_rows(report: RunReport) -> list[str]:
    """One row per label of a run of several rounds: each cell the median over the rounds, with the range."""
    rows = []
    for summary in ratio_summaries(report.measurements):
        ours = [m for m in report.measurements if m.label == summary.label and m.broker == RAFTMQ]
        theirs = [m for m in report.measurements if m.label == summary.label and m.broker == RABBITMQ]
        if not ours or not theirs or ours[0].is_new_queue:
            continue
        rows.append(
            f"| {report.started_at[:16].replace('T', ' ')} | {summary.label} ({summary.rounds} rounds) "
            f"| {_markdown_rates(ours)} | {_markdown_rates(theirs)} | {format_spread(summary.throughput)} "
            f"| {_median_figure(ours, 'latency_p99_ms', 1)} / {_median_figure(theirs, 'latency_p99_ms', 1)} "
            f"| {format_spread(summary.p99)} "
            f"| {_median_figure(ours, 'broker_cpu_us_per_msg', 0)} / {_median_figure(theirs, 'broker_cpu_us_per_msg', 0)} "
            f"| {format_spread(summary.cpu_per_msg)} "
            f"| {_load_range(ours)} / {_load_range(theirs)} |"
        )
    return rows


def _figures(measurements: list[Measurement], name: str) -> list[float | None]:
    return [getattr(m, name) for m in measurements if not m.error]


def _median_figure(measurements: list[Measurement], name: str, digits: int) -> str:
    found = spread(_figures(measurements, name))
    return "-" if found is None else f"{found.median:,.{digits}f}"


def _load_range(measurements: list[Measurement]) -> str:
    found = spread(m.load_average_1m for m in measurements)
    if found is None:
        return "-"
    return f"{found.low:.1f}" if found.low == found.high else f"{found.low:.1f}-{found.high:.1f}"


def _markdown_rates(measurements: list[Measurement]) -> str:
    """Median confirmed/s (min-max) over the rounds that did not fail; the median deliveries too when a round's
    differ from what the workload should deliver."""
    confirmed = spread(_figures(measurements, "confirmed_msgs_per_s"))
    if confirmed is None:
        return "error"
    shown = format_spread(confirmed, 0, "")
    failed = sum(1 for m in measurements if m.error)
    if any(_delivery_differs(m) for m in measurements if not m.error):
        shown += f" ({median([m.delivered_msgs_per_s for m in measurements if not m.error]):,.0f} delivered)"
    return shown + (f" ({failed} failed)" if failed else "")


def _delivery_differs(m: Measurement) -> bool:
    expected = m.confirmed_msgs_per_s * (10 if m.workload == "c" else 1)
    return abs(m.delivered_msgs_per_s - expected) > 0.05 * max(1.0, expected)


def _markdown_rate(m: Measurement) -> str:
    """Confirmed/s; deliveries too when they differ from what the workload should deliver (a backlog grew)."""
    if m.error:
        return "error"
    differs = _delivery_differs(m)
    return f"{m.confirmed_msgs_per_s:,.0f}" + (f" ({m.delivered_msgs_per_s:,.0f} delivered)" if differs else "")


# --- chart --------------------------------------------------------------------------------------------------


def write_chart(report: RunReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [m for m in report.measurements if not m.error and not m.is_new_queue]
    labels = sorted(dict.fromkeys(m.label for m in ok), key=lambda label: _label_order(label, ok))
    brokers = list(dict.fromkeys(m.broker for m in ok))
    grouped: dict[tuple[str, str], list[Measurement]] = {}
    for m in ok:
        grouped.setdefault((m.broker, m.label), []).append(m)
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 1.4 * len(labels) + 2), 7))
    width = 0.8 / max(1, len(brokers))
    for index, broker in enumerate(brokers):
        xs = [position + index * width for position in range(len(labels))]
        rates = [_median_or_zero(grouped.get((broker, label), []), "confirmed_msgs_per_s") for label in labels]
        p99s = [_median_or_zero(grouped.get((broker, label), []), "latency_p99_ms") for label in labels]
        top.bar(xs, rates, width, label=broker)
        bottom.bar(xs, p99s, width, label=broker)
    if any(m.latency_p99_ms for m in ok):
        bottom.set_yscale("log")  # latencies span milliseconds to seconds
    for axis, title in ((top, "confirmed msg/s (higher is better)"), (bottom, "p99 latency ms, log scale (lower is better)")):
        axis.set_xticks([position + width * (len(brokers) - 1) / 2 for position in range(len(labels))], labels)
        axis.set_title(title)
        axis.legend()
    rounds = rounds_in(report.measurements)
    figure.suptitle(f"raftmq bench {report.started_at}" + (f" (medians of {rounds} rounds)" if rounds > 1 else ""))
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _label_order(label: str, measurements: list[Measurement]) -> tuple[str, float]:
    rates = [m.target_rate_msgs_per_s or 0.0 for m in measurements if m.label == label]
    return (label[:1], max(rates, default=0.0))


def _median_or_zero(measurements: list[Measurement], name: str) -> float:
    """The median of a figure over a broker's rounds of one label; 0 (no bar) when no round has it."""
    found = spread(_figures(measurements, name))
    return 0.0 if found is None else found.median
