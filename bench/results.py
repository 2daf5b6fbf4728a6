"""Benchmark results: the side-by-side table, the JSON file and the PNG chart.

A run is a `RunReport`: when and where it ran (machine, command, broker versions), its settings and every
`Measurement`. `comparisons` pairs raftmq's figures with RabbitMQ's per label and computes the ratios (raftmq over
RabbitMQ). `write_json`/`read_json` round-trip a report (schema 1) and `write_chart` draws throughput and p99
latency per label and broker, so that files from successive runs in one output directory can be compared.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import format_ratio, ratio
from bench.workloads import Measurement

SCHEMA_VERSION = 1
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


@dataclass(frozen=True, slots=True)
class Comparison:
    label: str
    raftmq: Measurement | None
    rabbitmq: Measurement | None

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
    labels: list[str] = []
    for measurement in measurements:
        if measurement.label not in labels:
            labels.append(measurement.label)
    found = {(m.broker, m.label): m for m in measurements}
    return [Comparison(label, found.get((RAFTMQ, label)), found.get((RABBITMQ, label))) for label in labels]


# --- table --------------------------------------------------------------------------------------------------


def _figure(measurement: Measurement | None) -> str:
    if measurement is None:
        return "-"
    if measurement.error:
        return "error"
    p99 = "-" if measurement.latency_p99_ms is None else f"{measurement.latency_p99_ms:.1f}"
    return f"{measurement.confirmed_msgs_per_s:,.0f}/s p99 {p99}ms"


def format_table(measurements: list[Measurement]) -> str:
    """One line per measurement, then raftmq vs RabbitMQ per label with ratios."""
    lines = [
        f"{'label':<10} {'broker':<9} {'confirmed/s':>12} {'delivered/s':>12} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'p99.9 ms':>9} {'gen cpu':>7} {'broker':>6} {'us/msg':>6} {'load':>5}  status"
    ]
    for m in measurements:
        status = f"ERROR {m.error}" if m.error else (m.note or "ok")
        lines.append(
            f"{m.label:<10} {m.broker:<9} {m.confirmed_msgs_per_s:>12,.0f} {m.delivered_msgs_per_s:>12,.0f} "
            f"{_ms(m.latency_p50_ms):>8} {_ms(m.latency_p99_ms):>8} {_ms(m.latency_p999_ms):>9} "
            f"{m.loadgen_cpu_max_fraction:>7.0%} {_number(m.broker_cpu_cores, 2):>6} "
            f"{_number(m.broker_cpu_us_per_msg, 0):>6} {_number(m.load_average_1m, 1):>5}  {status[:200]}"
        )
    pairs = [pair for pair in comparisons(measurements) if pair.raftmq is not None and pair.rabbitmq is not None]
    if pairs:
        lines += ["", f"{'label':<10} {'raftmq':>24} {'rabbitmq':>24} {'throughput':>11} {'p99':>7} {'cpu/msg':>8}"]
        for pair in pairs:
            lines.append(
                f"{pair.label:<10} {_figure(pair.raftmq):>24} {_figure(pair.rabbitmq):>24} "
                f"{format_ratio(pair.throughput_ratio):>11} {format_ratio(pair.p99_ratio):>7} "
                f"{format_ratio(pair.cpu_per_msg_ratio):>8}"
            )
        lines.append("(ratios are raftmq / RabbitMQ: throughput above 1x, p99 and cpu/msg below 1x favour raftmq)")
    lines.append("(gen cpu: busiest load-generator process; near 100% it, not the broker, may be the limit)")
    lines.append("(broker: cores the broker process used; us/msg: its CPU per confirmed message; load: 1-min average)")
    return "\n".join(lines)


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# --- JSON ---------------------------------------------------------------------------------------------------


def report_to_dict(report: RunReport) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "started_at": report.started_at,
        "command": report.command,
        "machine": report.machine,
        "settings": report.settings,
        "notes": report.notes,
        "measurements": [dataclasses.asdict(m) for m in report.measurements],
        "comparisons": [
            {"label": pair.label, "throughput_ratio": pair.throughput_ratio, "p99_ratio": pair.p99_ratio,
             "cpu_per_msg_ratio": pair.cpu_per_msg_ratio}
            for pair in comparisons(report.measurements)
        ],
    }


def report_from_dict(data: dict[str, Any]) -> RunReport:
    if data.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"unsupported results schema {data.get('schema')!r}")
    fields = {f.name for f in dataclasses.fields(Measurement)}
    measurements = [Measurement(**{k: v for k, v in m.items() if k in fields}) for m in data["measurements"]]
    return RunReport(
        data["started_at"], list(data["command"]), dict(data["machine"]), dict(data["settings"]),
        measurements, list(data.get("notes", [])),
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
        pairs = {pair.label: pair for pair in comparisons(report.measurements)}
        for m in report.measurements:
            figure = "error" if m.error else f"{m.confirmed_msgs_per_s:,.0f}"
            pair = pairs.get(m.label)
            shown = format_ratio(pair.throughput_ratio) if pair and m.broker == RAFTMQ else ""
            lines.append(f"{report.started_at:<22} {m.label:<10} {m.broker:<9} {figure:>12} "
                         f"{_ms(m.latency_p99_ms):>9} {_number(m.broker_cpu_us_per_msg, 0):>6}  {shown}")
    return "\n".join(lines)


def format_markdown(history: list[tuple[Path, RunReport]]) -> str:
    """A Markdown table of the raftmq/RabbitMQ pairs of every run, for docs/benchmarks.md."""
    lines = [
        "| run (UTC) | workload | raftmq confirmed/s | RabbitMQ confirmed/s | throughput ratio | p99 ms raftmq / RabbitMQ "
        "| p99 ratio | broker CPU us/msg raftmq / RabbitMQ | CPU/msg ratio | load raftmq / RabbitMQ |",
        "|---|---|---:|---:|---:|---|---:|---|---:|---|",
    ]
    for _, report in history:
        for pair in comparisons(report.measurements):
            ours, theirs = pair.raftmq, pair.rabbitmq
            if ours is None or theirs is None:
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


def _markdown_rate(m: Measurement) -> str:
    """Confirmed/s; deliveries too when they differ from what the workload should deliver (a backlog grew)."""
    if m.error:
        return "error"
    expected = m.confirmed_msgs_per_s * (10 if m.workload == "c" else 1)
    differs = abs(m.delivered_msgs_per_s - expected) > 0.05 * max(1.0, expected)
    return f"{m.confirmed_msgs_per_s:,.0f}" + (f" ({m.delivered_msgs_per_s:,.0f} delivered)" if differs else "")


# --- chart --------------------------------------------------------------------------------------------------


def write_chart(report: RunReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [m for m in report.measurements if not m.error]
    labels = sorted(dict.fromkeys(m.label for m in ok), key=lambda label: _label_order(label, ok))
    brokers = list(dict.fromkeys(m.broker for m in ok))
    found = {(m.broker, m.label): m for m in ok}
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 1.4 * len(labels) + 2), 7))
    width = 0.8 / max(1, len(brokers))
    for index, broker in enumerate(brokers):
        xs = [position + index * width for position in range(len(labels))]
        rates = [found[(broker, label)].confirmed_msgs_per_s if (broker, label) in found else 0 for label in labels]
        p99s = [_or_zero(found.get((broker, label))) for label in labels]
        top.bar(xs, rates, width, label=broker)
        bottom.bar(xs, p99s, width, label=broker)
    if any(m.latency_p99_ms for m in ok):
        bottom.set_yscale("log")  # latencies span milliseconds to seconds
    for axis, title in ((top, "confirmed msg/s (higher is better)"), (bottom, "p99 latency ms, log scale (lower is better)")):
        axis.set_xticks([position + width * (len(brokers) - 1) / 2 for position in range(len(labels))], labels)
        axis.set_title(title)
        axis.legend()
    figure.suptitle(f"raftmq bench {report.started_at}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _label_order(label: str, measurements: list[Measurement]) -> tuple[str, float]:
    rates = [m.target_rate_msgs_per_s or 0.0 for m in measurements if m.label == label]
    return (label[:1], max(rates, default=0.0))


def _or_zero(measurement: Measurement | None) -> float:
    if measurement is None or measurement.latency_p99_ms is None:
        return 0.0
    return measurement.latency_p99_ms
