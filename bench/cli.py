"""`raftmq bench`: run the workloads against raftmq and RabbitMQ, print the figures and ratios, save JSON + PNG.

Without --target it starts what it needs, afresh for every workload, and stops it afterwards: a raftmq node
(`raftmq node` on a free port, temporary data dir) and Debian's RabbitMQ, one node for workloads (a), (c), (d), (e);
for (b) a 3-node raftmq cluster (`raftmq cluster up`) and a 3-node RabbitMQ cluster on loopback, each measured in
two client layouts by `bench.quorum` ("b": publisher and consumer on the two followers, "b@leader": both on the
queue's leader). With --target host:port it measures that one broker, already running, and starts nothing.
With --rounds N (N > 1) each workload's brokers are started once and measured N times, alternately in ABBA order
(`bench.interleaved`); the table and the JSON then give each round's ratios and their median and range.
Every flow reports confirmed/s and delivered/s (BACKLOG when deliveries fall more than 5% behind), end-to-end
latency (publish to delivery) and confirm latency; (a) and (b) first time the first message on new queues
(`bench.newqueue`, --new-queue-trials). `--report issue16` runs what issue 16's closing note needs in one command
(a and b at saturation and at fixed 1,000 and 5,000 msg/s, new queues, failover) and prints its table
(`bench.issue16`); `--history --report issue16` prints that table again from the last results file.
Ctrl-C or SIGTERM stops the run; every broker and worker process it started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from bench.brokers import (
    BrokerStartError,
    rabbitmq_available,
    rabbitmq_cluster,
    rabbitmq_version,
    raftmq_cluster,
    raftmq_node,
)
from bench.client import Endpoint, parse_target
from bench.clusters import QueueCluster
from bench.interleaved import BrokerUnderTest, MeasureOnce, run_in_rounds
from bench.issue16 import format_issue16
from bench.measurement import FailoverFigures
from bench.quorum import run_quorum_workload
from bench.results import (
    RABBITMQ,
    RAFTMQ,
    RunReport,
    backlog_flag,
    format_history,
    format_markdown,
    format_table,
    load_history,
    load_warning,
    machine_info,
    write_chart,
    write_json,
)
from bench.rounds import ROUNDS_MAX
from bench.workloads import (
    ALL_WORKLOADS,
    DEFAULT_CONFIRM_WINDOWS,
    DEFAULT_LATENCY_RATES,
    Measurement,
    RunSettings,
    run_workload,
)

# `raftmq bench <name> [options]`: further benchmarks, one module each with `main(argv) -> int` (one line each).
SUBCOMMANDS: dict[str, str] = {
    "recovery": "bench.recovery",  # restart time with N persistent messages on disk
    "memory": "bench.memory",  # resident memory with a backlog of N messages
    "failover": "bench.failover",  # kill -9 of a quorum queue leader to the next confirm (3-node cluster)
    "profile": "bench.profile",  # py-spy of the 3 raftmq nodes under workload (b)
    "fidelity": "bench.fidelity",
    "mirrored": "bench.mirrored",  # issue 17: mirrored and quorum queues, raftmq and RabbitMQ, flow + failover  # one queue under different client settings: is the load generator the limit?
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftmq bench", description="Benchmark raftmq side by side with RabbitMQ.",
        epilog="Issue 16's closing table in one command: raftmq bench --report issue16 (10 s per figure; add"
        " --rounds 3 for ABBA rounds and medians when other jobs share the machine). Also: "
        + ", ".join(f"raftmq bench {name} --help" for name in SUBCOMMANDS))
    parser.add_argument("--workloads", default=None,
                        help="comma-separated subset of a,b,c,d,e (default: all; with --report issue16: a,b)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per workload (and per rate)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each measurement")
    parser.add_argument("--target", help="host:port of a running broker to measure instead of starting brokers")
    parser.add_argument("--target-name", default="target", help="name of the --target broker in the results")
    parser.add_argument("--rabbitmq", action=argparse.BooleanOptionalAction, default=True, help="measure RabbitMQ")
    parser.add_argument("--raftmq", action=argparse.BooleanOptionalAction, default=True, help="measure raftmq")
    parser.add_argument("--raftmq-cluster", action="store_true",
                        help="no effect (kept for old command lines): (b) always runs on a 3-node raftmq cluster")
    parser.add_argument("--output", default="bench-results", help="directory for the JSON and PNG results")
    parser.add_argument("--history", action="store_true",
                        help="print the figures of every earlier run in --output and exit (measures nothing)")
    parser.add_argument("--markdown", action="store_true",
                        help="with --history: a Markdown table of the raftmq/RabbitMQ pairs (for docs/benchmarks.md)")
    parser.add_argument("--rates", default=None,
                        help="fixed publish rates (msg/s) for workload (e) and --rates-for (default: " +
                        ",".join(str(rate) for rate in DEFAULT_LATENCY_RATES) + "; with --report issue16: " +
                        ",".join(str(rate) for rate in ISSUE16_RATES) + ")")
    parser.add_argument("--rates-for", default=None,
                        help="also measure these of a,b at each --rates rate after their saturation run (labels"
                        " a@1000/s, b@1000/s, ...; (b) with its clients on two followers; default: none; with"
                        " --report issue16: a,b)")
    parser.add_argument("--new-queue-trials", type=int, default=DEFAULT_NEW_QUEUE_TRIALS,
                        help="(a)/(b): before the flow, declare this many new queues one after the other and time"
                        " declare-ok and the confirm and delivery of one message to each (labels a/new-q, b/new-q;"
                        f" 0: skip; default {DEFAULT_NEW_QUEUE_TRIALS})")
    parser.add_argument("--report", choices=("table", "issue16"), default="table",
                        help="issue16: run a,b at saturation and at fixed 1,000 and 5,000 msg/s, the new-queue"
                        " trials and --failover-runs kills, and print issue 16's closing table (Markdown, also"
                        " written next to the JSON); with --history: that table of the last run in --output")
    parser.add_argument("--failover-runs", type=int, default=None,
                        help="with --report issue16: `raftmq bench failover` runs per broker (default 3; 0: skip)")
    parser.add_argument("--window", type=int, default=None,
                        help="unconfirmed messages per publisher in (a)/(b) (default: " +
                        ", ".join(f"{window} for ({name})" for name, window in DEFAULT_CONFIRM_WINDOWS.items()) + ")")
    parser.add_argument("--prefetch", type=int, default=1000, help="consumer prefetch, (a)/(b)/(e)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure each workload N times on brokers started once, raftmq and RabbitMQ alternately"
                        " in ABBA order; report each round's ratios and their median and range (default 1: each"
                        " broker started and measured once)")
    return parser


ISSUE16_RATES = (1000, 5000)
ISSUE16_WORKLOADS = ("a", "b")
ISSUE16_FAILOVER_RUNS = 3
DEFAULT_NEW_QUEUE_TRIALS = 5


def parse_workloads(text: str) -> list[str]:
    chosen = [item.strip().lower() for item in text.split(",") if item.strip()]
    unknown = [item for item in chosen if item not in ALL_WORKLOADS]
    if unknown or not chosen:
        raise ValueError(f"unknown workloads {unknown} (choose from {','.join(ALL_WORKLOADS)})")
    return [workload for workload in ALL_WORKLOADS if workload in chosen]


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        subcommand: int = importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
        return subcommand
    args = build_parser().parse_args(argv)
    issue16 = args.report == "issue16"
    try:
        workloads = parse_workloads(args.workloads or ",".join(ISSUE16_WORKLOADS if issue16 else ALL_WORKLOADS))
        rates = parse_rates(args.rates) if args.rates else (ISSUE16_RATES if issue16 else DEFAULT_LATENCY_RATES)
        rates_for = parse_rates_for(args.rates_for if args.rates_for is not None else
                                    ",".join(ISSUE16_WORKLOADS if issue16 else ()))
        if not 1 <= args.rounds <= ROUNDS_MAX:
            raise ValueError(f"--rounds must be in 1..{ROUNDS_MAX}, got {args.rounds}")
        if args.new_queue_trials < 0 or (args.failover_runs or 0) < 0:
            raise ValueError("--new-queue-trials and --failover-runs must not be negative")
    except ValueError as error:
        print(f"raftmq bench: {error}", file=sys.stderr)
        return 2
    if args.history:
        return _print_history(Path(args.output), args.markdown, issue16)
    settings = RunSettings(args.duration, args.warmup, rates, args.window, args.prefetch, rates_for,
                           args.new_queue_trials)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    load_at_start = os.getloadavg()[0]
    notes: list[str] = []
    measurements: list[Measurement] = []
    try:
        if args.rounds > 1:
            measurements += _measure_in_rounds(args, workloads, settings, notes)
        elif args.target:
            measurements += _run_all(args.target_name, parse_target(args.target), workloads, settings)
        else:
            if args.raftmq:
                measurements += _measure_raftmq(workloads, settings)
            if args.rabbitmq:
                measurements += _measure_rabbitmq(workloads, settings, notes)
        failover_runs = (ISSUE16_FAILOVER_RUNS if args.failover_runs is None else args.failover_runs) if issue16 else 0
        failover = () if not failover_runs or args.target else tuple(
            _measure_failover(failover_runs, broker) for broker, wanted in ((RAFTMQ, args.raftmq),
                                                                          (RABBITMQ, args.rabbitmq)) if wanted)
    except KeyboardInterrupt:
        print("raftmq bench: interrupted; brokers stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = RunReport(started_at, ["raftmq", "bench", *argv], _machine(load_at_start), _settings_dict(args, settings),
                       measurements, notes, failover)
    _publish(report, Path(args.output), issue16)
    return 1 if any(m.error for m in measurements) or any(f.error for f in failover) else 0


def parse_rates(text: str) -> tuple[int, ...]:
    rates = tuple(int(rate) for rate in text.split(",") if rate.strip())
    if not rates or any(rate <= 0 for rate in rates):
        raise ValueError(f"--rates wants positive msg/s values, got {text!r}")
    return rates


def parse_rates_for(text: str) -> tuple[str, ...]:
    chosen = tuple(item.strip().lower() for item in text.split(",") if item.strip())
    unknown = [item for item in chosen if item not in ISSUE16_WORKLOADS]
    if unknown:
        raise ValueError(f"--rates-for takes a and/or b, got {unknown}")
    return chosen


def _print_history(output: Path, markdown: bool, issue16: bool) -> int:
    history = load_history(output)
    if not issue16:
        print(format_markdown(history) if markdown else format_history(history))
        return 0
    if not history:
        print(f"raftmq bench: no results in {output}", file=sys.stderr)
        return 1
    path, report = history[-1]
    print(f"from {path}")
    print(_issue16_text(report))
    return 0


def _measure_failover(runs: int, broker: str) -> FailoverFigures:
    """`raftmq bench failover --broker B --runs N` (a fresh 3-node cluster per run), as figures for the report."""
    from bench import failover  # pika: only when failover is asked for

    print(f"[{broker}] failover: {runs} kill -9 runs of a quorum queue leader's node ...", flush=True)
    try:
        results = failover.run_failover(runs, broker=broker)
    except Exception as error:  # the report keeps the other figures
        print(f"[{broker}] failover failed: {error}", flush=True)
        return FailoverFigures(broker, (), str(error))
    return FailoverFigures(broker, tuple(result.first_confirm_ms for result in results))


def _issue16_text(report: RunReport) -> str:
    return format_issue16(report.measurements, report.failover, report.started_at,
                          report.machine.get("rabbitmq_version"), int(report.settings.get("rounds", 1)))


def _run_all(broker: str, endpoint: Endpoint, workloads: list[str], settings: RunSettings) -> list[Measurement]:
    found: list[Measurement] = []
    for workload in workloads:
        print(f"[{broker}] workload ({workload}) on {endpoint.address} ...", flush=True)
        for measurement in run_workload(workload, broker, endpoint, settings):
            _print_one(measurement)
            found.append(measurement)
    return found


def _print_one(m: Measurement) -> None:
    warning = load_warning(m)
    if warning:
        print(f"  {warning}", flush=True)
    if m.error:
        print(f"  {m.label}: ERROR {m.error[:300]}", flush=True)
        return
    note = f" [{m.note}]" if m.note else ""
    if m.is_new_queue:
        print(f"  {m.label}: declare-ok p50 {_ms(m.declare_ok_p50_ms)} / p99 {_ms(m.declare_ok_p99_ms)} ms, first"
              f" confirm p50 {_ms(m.confirm_p50_ms)} / p99 {_ms(m.confirm_p99_ms)} ms, first delivery p50"
              f" {_ms(m.latency_p50_ms)} / p99 {_ms(m.latency_p99_ms)} ms{note}", flush=True)
        return
    cpu = "" if m.broker_cpu_cores is None else f", broker {m.broker_cpu_cores:.2f} cores"
    backlog = f", {backlog_flag(m)}" if backlog_flag(m) else ""
    print(f"  {m.label}: confirmed {m.confirmed_msgs_per_s:,.0f} msg/s, delivered {m.delivered_msgs_per_s:,.0f}"
          f" msg/s{backlog}, e2e p50 {_ms(m.latency_p50_ms)} / p99 {_ms(m.latency_p99_ms)} ms, confirm p50"
          f" {_ms(m.confirm_p50_ms)} / p99 {_ms(m.confirm_p99_ms)} ms{cpu}{note}", flush=True)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _with_broker(
    broker: str, workloads: list[str], settings: RunSettings, start: Callable[[], contextlib.AbstractContextManager[Endpoint]]
) -> list[Measurement]:
    """Each workload gets a freshly started broker, so that no backlog or slow clean-up of one run (deleting a
    thousand queues, say) weighs on the next."""
    found: list[Measurement] = []
    for workload in workloads:
        print(f"[{broker}] starting for workload ({workload}) ...", flush=True)
        try:
            with start() as endpoint:
                found += _run_all(broker, endpoint, [workload], settings)
        except BrokerStartError as error:
            print(f"[{broker}] could not start: {error}", flush=True)
            found.append(Measurement(workload, workload, broker, error=f"broker did not start: {error}"))
    return found


def _measure_raftmq(workloads: list[str], settings: RunSettings) -> list[Measurement]:
    found: list[Measurement] = []
    for workload in workloads:
        if workload == "b":
            found += _on_cluster(RAFTMQ, settings, functools.partial(raftmq_cluster, 3))
        else:
            found += _with_broker(RAFTMQ, [workload], settings, raftmq_node)
    return found


def _on_cluster(
    broker: str, settings: RunSettings, start: Callable[[], contextlib.AbstractContextManager[QueueCluster]]
) -> list[Measurement]:
    """Workload (b) on a freshly started 3-node cluster, in both client layouts."""
    print(f"[{broker}] starting a 3-node cluster for workload (b) ...", flush=True)
    try:
        with start() as cluster:
            print(f"[{broker}] workload (b) on {', '.join(n.endpoint.address for n in cluster.nodes)} ...", flush=True)
            found = run_quorum_workload(broker, cluster, settings)
    except BrokerStartError as error:
        print(f"[{broker}] could not start: {error}", flush=True)
        return [Measurement("b", "b", broker, error=f"cluster did not start: {error}")]
    for measurement in found:
        _print_one(measurement)
    return found


@contextlib.contextmanager
def _rabbit_nodes(count: int) -> Iterator[Endpoint]:
    with rabbitmq_cluster(count) as cluster:
        yield cluster.endpoints[0]


def _measure_rabbitmq(workloads: list[str], settings: RunSettings, notes: list[str]) -> list[Measurement]:
    if not rabbitmq_available() and not _install_rabbitmq(notes):
        return [Measurement(w, w, RABBITMQ, error="RabbitMQ is not installed") for w in workloads]
    found: list[Measurement] = []
    for workload in workloads:
        if workload == "b":
            found += _on_cluster(RABBITMQ, settings, functools.partial(rabbitmq_cluster, 3))
        else:
            found += _with_broker(RABBITMQ, [workload], settings, functools.partial(_rabbit_nodes, 1))
    return found


def _measure_in_rounds(
    args: argparse.Namespace, workloads: list[str], settings: RunSettings, notes: list[str]
) -> list[Measurement]:
    """--rounds N: every workload's brokers started once, measured N times alternately (bench.interleaved)."""
    brokers: list[BrokerUnderTest] = []
    found: list[Measurement] = []
    if args.target:
        target = parse_target(args.target)
        brokers.append(BrokerUnderTest(args.target_name, functools.partial(_open_target, args.target_name, target)))
    if not args.target and args.raftmq:
        brokers.append(BrokerUnderTest(RAFTMQ, functools.partial(
            _open_broker, RAFTMQ, raftmq_node, functools.partial(raftmq_cluster, 3))))
    if not args.target and args.rabbitmq:
        if rabbitmq_available() or _install_rabbitmq(notes):
            brokers.append(BrokerUnderTest(RABBITMQ, functools.partial(
                _open_broker, RABBITMQ, functools.partial(_rabbit_nodes, 1), functools.partial(rabbitmq_cluster, 3))))
        else:
            found += [Measurement(w, w, RABBITMQ, error="RabbitMQ is not installed") for w in workloads]
    return run_in_rounds(brokers, workloads, settings, args.rounds, _print_one) + found


@contextlib.contextmanager
def _open_broker(
    broker: str, start_node: Callable[[], contextlib.AbstractContextManager[Endpoint]],
    start_cluster: Callable[[], contextlib.AbstractContextManager[QueueCluster]], workload: str,
) -> Iterator[MeasureOnce]:
    """The broker started for `workload` (a 3-node cluster for (b)), as a function that measures it once."""
    if workload == "b":
        with start_cluster() as cluster:
            print(f"[{broker}] 3-node cluster on {', '.join(n.endpoint.address for n in cluster.nodes)}", flush=True)
            yield functools.partial(run_quorum_workload, broker, cluster)
    else:
        with start_node() as endpoint:
            yield functools.partial(run_workload, workload, broker, endpoint)


@contextlib.contextmanager
def _open_target(name: str, endpoint: Endpoint, workload: str) -> Iterator[MeasureOnce]:
    yield functools.partial(run_workload, workload, name, endpoint)


def _install_rabbitmq(notes: list[str]) -> bool:
    """apt-get install rabbitmq-server; stop the Debian service it may start on 5672 (the bench runs its own)."""
    if shutil.which("apt-get") is None:
        return False
    print("installing rabbitmq-server with apt-get ...", flush=True)
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "rabbitmq-server"]):
        if subprocess.run(command, capture_output=True, timeout=900).returncode != 0:
            return False
    subprocess.run(["service", "rabbitmq-server", "stop"], capture_output=True, timeout=120)
    notes.append("installed rabbitmq-server with apt-get during this run")
    return rabbitmq_available()


def _machine(load_at_start: float) -> dict[str, object]:
    info = machine_info()
    info["load_average_1m_at_start"] = load_at_start
    info["rabbitmq_version"] = rabbitmq_version()
    return info


def _settings_dict(args: argparse.Namespace, settings: RunSettings) -> dict[str, object]:
    return {
        "workloads": args.workloads, "duration_s": settings.duration_s, "warmup_s": settings.warmup_s,
        "latency_rates_msgs_per_s": list(settings.latency_rates_msgs_per_s),
        "confirm_window": settings.confirm_window or DEFAULT_CONFIRM_WINDOWS,
        "prefetch": settings.prefetch, "target": args.target, "body_size_bytes": 100, "rounds": args.rounds,
        "rates_for": list(settings.rates_for), "new_queue_trials": settings.new_queue_trials, "report": args.report,
    }


def _publish(report: RunReport, output: Path, issue16: bool = False) -> None:
    print()
    print(format_table(report.measurements))
    for note in report.notes:
        print(f"note: {note}")
    output.mkdir(parents=True, exist_ok=True)
    stem = "bench-" + report.started_at.replace(":", "").replace("-", "")
    write_json(report, output / f"{stem}.json")
    if report.measurements:
        write_chart(report, output / f"{stem}.png")
    print(f"results: {output / stem}.json (+ .png)")
    if issue16:
        text = _issue16_text(report)
        (output / f"{stem}-issue16.md").write_text(text + "\n")
        print()
        print(text)
        print(f"issue 16 table: {output / stem}-issue16.md")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
