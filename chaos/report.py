"""The report of one run: text for people, JSON for machines, and a PNG timeline of faults against throughput
and latency.

How it works: everything is derived from the run's history and the checker's result. Throughput is counted per
`bin_ms` bin (confirms by their settle time, deliveries by their receive time); confirm latency is the p50 and max
of `settled_ms - sent_ms` per bin. Faults are drawn as spans from the fault to its undo (kill or restart until
the node is up again, pause/resume, partition/heal, toxic-add/toxic-remove) or as lines when they have no undo. Lists of payload ids in
the JSON are cut at `IDS_MAX` (the counts are always complete). The history itself is written as JSON lines.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chaos.availability import availability
from chaos.checker import CheckResult
from chaos.history import Delivery, Fault, Publish, Record, split, write_history

IDS_MAX = 100
HIDDEN_MARKERS = {"purge", "closed", "connection-lost"}
UNDONE_BY_NOTHING = {"error"}  # in the history, not on the timeline
UNDO = {"kill": "up", "restart": "up", "pause": "resume", "partition": "heal", "toxic-add": "toxic-remove"}


@dataclass(frozen=True, slots=True)
class Series:
    bin_ms: float
    confirmed_per_s: list[float]
    delivered_per_s: list[float]
    latency_p50_ms: list[float | None]
    latency_max_ms: list[float | None]


@dataclass(frozen=True, slots=True)
class FaultSpan:
    kind: str
    target: str
    start_ms: float
    end_ms: float | None


def series(records: list[Record], bin_ms: float = 250.0) -> Series:
    publishes = [r for r in records if isinstance(r, Publish) and r.settled_ms is not None]
    deliveries = [r for r in records if isinstance(r, Delivery)]
    end_ms = max([0.0, *(r.settled_ms or 0.0 for r in publishes), *(d.received_ms for d in deliveries)])
    bins = int(end_ms // bin_ms) + 1
    confirmed, delivered = [0] * bins, [0] * bins
    latencies: list[list[float]] = [[] for _ in range(bins)]
    for publish in publishes:
        assert publish.settled_ms is not None
        index = int(publish.settled_ms // bin_ms)
        if publish.outcome == "confirmed":
            confirmed[index] += 1
        latencies[index].append(publish.settled_ms - publish.sent_ms)
    for delivery in deliveries:
        delivered[int(delivery.received_ms // bin_ms)] += 1
    per_s = 1000.0 / bin_ms
    return Series(bin_ms, [c * per_s for c in confirmed], [d * per_s for d in delivered],
                  [sorted(values)[len(values) // 2] if values else None for values in latencies],
                  [max(values) if values else None for values in latencies])


def fault_spans(records: list[Record]) -> list[FaultSpan]:
    spans: list[FaultSpan] = []
    open_spans: dict[tuple[str, str], int] = {}
    for fault in (r for r in records if isinstance(r, Fault) and r.kind not in HIDDEN_MARKERS):
        undone = [key for key in open_spans if UNDO[key[0]] == fault.kind
                  and (key[1] == fault.target or fault.kind in ("heal", "toxic-remove"))]
        for key in undone:
            index = open_spans.pop(key)
            start = spans[index]
            spans[index] = FaultSpan(start.kind, start.target, start.start_ms, fault.at_ms)
        if fault.kind in UNDO:
            open_spans[(fault.kind, fault.target)] = len(spans)
            spans.append(FaultSpan(fault.kind, fault.target, fault.at_ms, None))
        elif not undone:
            spans.append(FaultSpan(fault.kind, fault.target, fault.at_ms, None))
    return spans


def report_json(name: str, result: CheckResult, records: list[Record], extra: dict[str, Any]) -> dict[str, Any]:
    publishes, _, faults = split(records)
    return {
        "scenario": name, **extra,
        "valid": (result.valid and extra.get("drained", True) and not extra.get("overflowed", False)
                  and not extra.get("error")),
        "summary": result.summary(),
        "lost": list(result.lost[:IDS_MAX]), "unexpected": list(result.unexpected[:IDS_MAX]),
        "recovered": list(result.recovered[:IDS_MAX]),
        "duplicated": [list(d) for d in result.duplicated[:IDS_MAX]],
        "order_violations": [asdict(v) for v in result.order_violations[:IDS_MAX]],
        "faults": [asdict(span) for span in fault_spans(records)],
        "availability": availability(publishes, faults).as_dict(),
        "redelivered_after_settled_ack": list(result.redelivered_after_settled_ack[:IDS_MAX]),
        "unflagged_redeliveries": [list(u) for u in result.unflagged_redeliveries[:IDS_MAX]],
    }


def report_text(report: dict[str, Any]) -> str:
    summary = report["summary"]
    verdict = "PASS" if report["valid"] else "FAIL"
    lines = [
        f"scenario {report['scenario']}: {verdict}",
        f"  published {summary['attempted']}: confirmed {summary['confirmed']}, nacked {summary['nacked']}, "
        f"unknown {summary['unknown']}",
        f"  delivered {summary['deliveries']} times: ok {summary['ok']}, recovered {summary['recovered']}, "
        f"duplicated {summary['duplicated']} ({summary['duplicate_deliveries']} extra deliveries)",
        f"  LOST {summary['lost']}   UNEXPECTED {summary['unexpected']}   "
        f"order violations {summary['order_violations']}   unconfirmed and absent {summary['unconfirmed_absent']}",
    ]
    lines.append(f"  at-least-once: unflagged redeliveries {summary.get('unflagged_redeliveries', 0)}, "
                 f"redelivered after ack {summary.get('redelivered_after_ack', 0)}, "
                 f"after a settled ack {summary.get('redelivered_after_settled_ack', 0)}"
                 + (" (shovel: republished copies, counted, not failures)" if summary.get("copies_expected") else ""))
    lines.extend(_availability_lines(report.get("availability")))
    if report.get("node_settings"):
        unsafe = "DELIBERATELY UNSAFE, " if report.get("expect_loss") else ""
        lines.append(f"  node settings ({unsafe}tests only): {report['node_settings']}")
    for key in ("error", "published_all", "drained", "overflowed", "duration_s"):
        if key in report and (key != "error" or report[key]):
            lines.append(f"  {key}: {report[key]}")
    if report["lost"]:
        lines.append(f"  first lost: {', '.join(report['lost'][:10])}")
    if report["unexpected"]:
        lines.append(f"  first unexpected: {', '.join(report['unexpected'][:10])}")
    lines.append("  faults:")
    for span in report["faults"]:
        end = f"{span['end_ms']:.0f}" if span["end_ms"] is not None else "-"
        lines.append(f"    {span['start_ms']:>9.0f} .. {end:>9} ms  {span['kind']} {span['target']}")
    return "\n".join(lines) + "\n"


SUMMARY_COLUMNS = ("scenario", "verdict", "published", "confirmed", "delivered", "lost", "unexpected",
                   "duplicates", "unflagged redeliveries", "undone settled acks", "order violations",
                   "longest confirm gap ms", "longest confirm wait ms", "slowest first confirm after a fault ms")


def summary_row(report: dict[str, Any]) -> list[str]:
    summary, found = report["summary"], report.get("availability") or {}
    recoveries = [f["first_confirm_after_ms"] for f in found.get("faults", []) if f.get("sent_after", True)]
    slowest = "never" if None in recoveries else f"{max(recoveries):.0f}" if recoveries else "-"
    return [report["scenario"], "PASS" if report["valid"] else "FAIL", str(summary["attempted"]),
            str(summary["confirmed"]), str(summary["deliveries"]), str(summary["lost"]), str(summary["unexpected"]),
            f"{summary['duplicated']} ({summary['duplicate_deliveries']} extra)",
            str(summary.get("unflagged_redeliveries", 0)), str(summary.get("redelivered_after_settled_ack", 0)),
            str(summary["order_violations"]), f"{found.get('confirm_gap_ms_max', 0):.0f}",
            f"{found.get('confirm_latency_ms_max', 0):.0f}", slowest]


def summary_table(reports: list[dict[str, Any]]) -> str:
    """One markdown table row per run report."""
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    lines += ["| " + " | ".join(summary_row(report)) + " |" for report in reports]
    return "\n".join(lines) + "\n"


def _availability_lines(found: dict[str, Any] | None) -> list[str]:
    if not found:
        return []
    lines = [f"  unavailability: longest gap between confirms {found['confirm_gap_ms_max']:.0f} ms, longest wait "
             f"for one confirm {found.get('confirm_latency_ms_max', 0):.0f} ms"]
    for fault in found["faults"]:
        after = fault["first_confirm_after_ms"]
        waited = f"{after:.0f} ms later" if after is not None else "never"
        if not fault.get("sent_after", True):
            waited = "- (nothing was sent after it)"
        lines.append(f"    {fault['kind']} {fault['target']} at {fault['at_ms']:.0f} ms: first confirm of a publish "
                     f"sent after it {waited}")
    return lines


def plot_timeline(path: Path, title: str, records: list[Record]) -> None:
    from matplotlib.figure import Figure  # the object API: no pyplot, no global state, no GUI backend

    data = series(records)
    times_s = [i * data.bin_ms / 1000.0 for i in range(len(data.confirmed_per_s))]
    figure = Figure(figsize=(11, 6))
    rate_axes, latency_axes = figure.subplots(2, 1, sharex=True)
    rate_axes.plot(times_s, data.confirmed_per_s, label="confirmed/s")
    rate_axes.plot(times_s, data.delivered_per_s, label="delivered/s")
    rate_axes.set_ylabel("messages/s")
    rate_axes.legend(loc="upper right")
    latency_axes.plot(times_s, [v if v is not None else float("nan") for v in data.latency_p50_ms], label="p50")
    latency_axes.plot(times_s, [v if v is not None else float("nan") for v in data.latency_max_ms], label="max")
    latency_axes.set_ylabel("confirm latency ms")
    latency_axes.set_xlabel("time s")
    latency_axes.legend(loc="upper right")
    end_s = times_s[-1] if times_s else 1.0
    for span in fault_spans(records):
        start_s = span.start_ms / 1000.0
        for axes in (rate_axes, latency_axes):
            if span.end_ms is None:
                axes.axvline(start_s, color="grey", linestyle="--", linewidth=0.8)
            else:
                axes.axvspan(start_s, min(span.end_ms / 1000.0, end_s), color="red", alpha=0.15)
        rate_axes.annotate(f"{span.kind} {span.target}", (start_s, 1.0), xycoords=("data", "axes fraction"),
                           fontsize=7, rotation=90, va="top")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def write_report(out_dir: Path, name: str, result: CheckResult, records: list[Record],
                 extra: dict[str, Any]) -> dict[str, Any]:
    """report.txt, report.json, timeline.png and history.jsonl in out_dir; returns the JSON report."""
    out_dir.mkdir(parents=True, exist_ok=True)
    report = report_json(name, result, records, extra)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    (out_dir / "report.txt").write_text(report_text(report))
    write_history(out_dir / "history.jsonl", records)
    plot_timeline(out_dir / "timeline.png", f"{name}: {'PASS' if report['valid'] else 'FAIL'}", records)
    return report
