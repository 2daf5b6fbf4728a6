"""`raftmq bench`: run the workloads against raftmq and RabbitMQ, print the figures and ratios, save JSON + PNG.

Without --target it starts what it needs, afresh for every workload, and stops it afterwards: a raftmq node
(`raftmq node` on a free port, temporary data dir) and Debian's RabbitMQ, one node for workloads (a), (c), (d), (e);
for (b) a 3-node raftmq cluster (`raftmq cluster up`) and a 3-node RabbitMQ cluster on loopback, each measured in
two client layouts by `bench.quorum` ("b": publisher and consumer on the two followers, "b@leader": both on the
queue's leader). With --target host:port it measures that one broker, already running, and starts nothing.
With --rounds N (N > 1) each workload's brokers are started once and measured N times, alternately in ABBA order
(`bench.interleaved`); the table and the JSON then give each round's ratios and their median and range.
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
from bench.quorum import run_quorum_workload
from bench.results import (
    RABBITMQ,
    RAFTMQ,
    RunReport,
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
    "fidelity": "bench.fidelity",  # one queue under different client settings: is the load generator the limit?
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftmq bench", description="Benchmark raftmq side by side with RabbitMQ.",
                                     epilog="Also: " + ", ".join(f"raftmq bench {name} --help" for name in SUBCOMMANDS))
    parser.add_argument("--workloads", default=",".join(ALL_WORKLOADS), help="comma-separated subset of a,b,c,d,e")
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
    parser.add_argument("--rates", default=",".join(str(rate) for rate in DEFAULT_LATENCY_RATES),
                        help="fixed publish rates (msg/s) for workload (e)")
    parser.add_argument("--window", type=int, default=None,
                        help="unconfirmed messages per publisher in (a)/(b) (default: " +
                        ", ".join(f"{window} for ({name})" for name, window in DEFAULT_CONFIRM_WINDOWS.items()) + ")")
    parser.add_argument("--prefetch", type=int, default=1000, help="consumer prefetch, (a)/(b)/(e)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure each workload N times on brokers started once, raftmq and RabbitMQ alternately"
                        " in ABBA order; report each round's ratios and their median and range (default 1: each"
                        " broker started and measured once)")
    return parser


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
    try:
        workloads = parse_workloads(args.workloads)
        rates = tuple(int(rate) for rate in args.rates.split(",") if rate.strip())
        if not 1 <= args.rounds <= ROUNDS_MAX:
            raise ValueError(f"--rounds must be in 1..{ROUNDS_MAX}, got {args.rounds}")
    except ValueError as error:
        print(f"raftmq bench: {error}", file=sys.stderr)
        return 2
    if args.history:
        history = load_history(Path(args.output))
        print(format_markdown(history) if args.markdown else format_history(history))
        return 0
    settings = RunSettings(args.duration, args.warmup, rates, args.window, args.prefetch)
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
    except KeyboardInterrupt:
        print("raftmq bench: interrupted; brokers stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = RunReport(started_at, ["raftmq", "bench", *argv], _machine(load_at_start), _settings_dict(args, settings),
                       measurements, notes)
    _publish(report, Path(args.output))
    return 1 if any(m.error for m in measurements) else 0


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
    p99 = "-" if m.latency_p99_ms is None else f"{m.latency_p99_ms:.2f}"
    cpu = "" if m.broker_cpu_cores is None else f", broker {m.broker_cpu_cores:.2f} cores"
    print(f"  {m.label}: confirmed {m.confirmed_msgs_per_s:,.0f} msg/s, delivered {m.delivered_msgs_per_s:,.0f}"
          f" msg/s, p99 {p99} ms{cpu}" + (f" [{m.note}]" if m.note else ""), flush=True)


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
    }


def _publish(report: RunReport, output: Path) -> None:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
