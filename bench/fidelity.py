"""Load-generator fidelity: the same single-queue workload under different client settings, interleaved.

`raftmq bench fidelity [--target NAME=HOST:PORT ...] [--variants ...] [--rounds N]` (without targets it starts a
raftmq node and a RabbitMQ node and alternates between them) answers "is the load generator, or the
broker, the limit?" for workloads (a)/(b)'s layout (one durable queue, publishers in confirm mode, one consumer).
Each variant changes one client setting against the default (window, write batch, consumer ack pattern, prefetch,
number of publishers, no consumer, transient messages, queue arguments such as x-queue-version=2). Variants run
round-robin (round 1: every variant, round 2: every variant, ...) so that load from other jobs on a shared machine
hits them alike, each on a fresh queue that is deleted afterwards.

Besides the usual figures every run records the broker's CPU (utime+stime of the process listening on the target
port, read from /proc over the measured window, when that process is local) and the load generator's pattern:
messages per publish write, deliveries per read, deliveries per ack write. A broker near 1 core per queue process
with the generator far from it says "broker-bound"; the reverse says "generator-bound".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bench.brokers import rabbitmq_cluster, raftmq_node
from bench.client import Endpoint, parse_target
from bench.cpu import CpuWindow, local_listening_pid
from bench.loadgen import ConsumerSpec, PublisherSpec, PublishTarget, WorkerResult
from bench.processes import run_workers
from bench.stats import rate_per_s, summarize_latencies_ns
from bench.workloads import (
    BODY_SIZE,
    DEFAULT_CONFIRM_WINDOW,
    Topology,
    declare,
    delete,
    publish_batch_max,
    run_id,
)


@dataclass(frozen=True, slots=True)
class Variant:
    """One client setting set for the single-queue layout."""

    name: str
    window: int = DEFAULT_CONFIRM_WINDOW
    batch_max: int = publish_batch_max(DEFAULT_CONFIRM_WINDOW)
    publishers: int = 1
    consumer: bool = True
    prefetch: int = 1000
    ack_every: int = 0  # see ConsumerSpec.ack_every
    persistent: bool = True
    queue_arguments: dict[str, str | int | bool] = field(default_factory=dict)


BASELINE = Variant("default")  # what `raftmq bench` runs for (a): window 2048, 256 per write
VARIANTS: dict[str, Variant] = {
    variant.name: variant
    for variant in (
        BASELINE,
        Variant("window-256", window=256, batch_max=64),  # the default before 2026-11-23
        Variant("window-1024", window=1024, batch_max=256),
        Variant("window-4096", window=4096, batch_max=256),
        Variant("batch-32", batch_max=32),
        Variant("ack-every-250", ack_every=250, prefetch=2000),
        Variant("prefetch-100", prefetch=100),
        Variant("publishers-4", publishers=4, window=128, batch_max=32),  # 512 in flight in all
        Variant("publishers-4-window-512", publishers=4, window=512, batch_max=128),
        Variant("no-consumer", consumer=False),
        Variant("transient", persistent=False),
        Variant("cq-v2", queue_arguments={"x-queue-version": 2}),
        Variant("quorum", queue_arguments={"x-queue-type": "quorum"}),
        Variant("quorum-window-256", window=256, batch_max=64, queue_arguments={"x-queue-type": "quorum"}),
        Variant("quorum-publishers-4", publishers=4, window=512, batch_max=128,
                queue_arguments={"x-queue-type": "quorum"}),
    )
}


@dataclass(frozen=True, slots=True)
class FidelityRun:
    """One variant's figures in one round."""

    broker: str
    variant: str
    round_index: int
    confirmed_msgs_per_s: float
    delivered_msgs_per_s: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    confirm_p50_ms: float | None  # a publish write -> the confirm of its last message (first publisher channel)
    confirm_mean_ms: float | None
    broker_cpu_cores: float | None  # broker process CPU seconds per measured second (None: not local)
    gen_cpu_max_fraction: float  # busiest load-generator process
    msgs_per_publish_write: float
    deliveries_per_read: float
    deliveries_per_ack_write: float
    load_average_1m: float
    error: str | None = None


def variant_specs(endpoint: Endpoint, queue: str, variant: Variant) -> list[PublisherSpec | ConsumerSpec]:
    specs: list[PublisherSpec | ConsumerSpec] = []
    if variant.consumer:
        specs.append(ConsumerSpec(endpoint, (queue,), variant.prefetch, latency_sample_every=4, ack_every=variant.ack_every))
    publisher = PublisherSpec(
        endpoint, (PublishTarget("", queue),), BODY_SIZE, variant.window, variant.batch_max, variant.persistent
    )
    specs.extend([publisher] * variant.publishers)
    return specs


def summarize(broker: str, variant: str, round_index: int, results: Sequence[WorkerResult],
              broker_cpu_cores: float | None, load_average_1m: float) -> FidelityRun:
    """Pure: the figures of one run from its workers' results."""
    publishers = [result for result in results if result.role == "publisher"]
    consumers = [result for result in results if result.role == "consumer"]
    errors = [result.error for result in results if result.error]
    published = sum(result.published for result in publishers)
    delivered = sum(result.delivered for result in consumers)
    summary = summarize_latencies_ns([latency for result in consumers for latency in result.latencies_ns])
    confirm_samples = [latency for result in publishers for latency in result.confirm_latencies_ns]
    confirms = summarize_latencies_ns(confirm_samples)
    return FidelityRun(
        broker=broker,
        variant=variant,
        round_index=round_index,
        confirmed_msgs_per_s=sum(rate_per_s(result.confirmed, result.measured_s) for result in publishers),
        delivered_msgs_per_s=sum(rate_per_s(result.delivered, result.measured_s) for result in consumers),
        latency_p50_ms=summary.p50_ms,
        latency_p99_ms=summary.p99_ms,
        confirm_p50_ms=confirms.p50_ms,
        confirm_mean_ms=sum(confirm_samples) / len(confirm_samples) / 1e6 if confirm_samples else None,
        broker_cpu_cores=broker_cpu_cores,
        gen_cpu_max_fraction=max((r.cpu_s / r.measured_s for r in results if r.measured_s > 0), default=0.0),
        msgs_per_publish_write=_ratio(published, sum(result.writes for result in publishers)),
        deliveries_per_read=_ratio(delivered, sum(result.reads for result in consumers)),
        deliveries_per_ack_write=_ratio(delivered, sum(result.writes for result in consumers)),
        load_average_1m=load_average_1m,
        error="; ".join(errors) if errors else None,
    )


def _ratio(count: int, per: int) -> float:
    return count / per if per > 0 else 0.0


def run_variant(broker: str, endpoint: Endpoint, variant: Variant, round_index: int, warmup_s: float,
                duration_s: float, broker_pid: int | None) -> FidelityRun:
    queue = f"bench-fidelity-{run_id()}"
    topology = Topology((queue,), dict(variant.queue_arguments))
    load_average_1m = os.getloadavg()[0]
    try:
        declare(endpoint, topology)
        try:
            # The workers start START_DELAY_S after they are ready; the CPU window is late by their setup time.
            with CpuWindow([broker_pid], warmup_s + 0.5, duration_s - 1.0) as window:
                results = run_workers(variant_specs(endpoint, queue, variant), warmup_s, duration_s)
            return summarize(broker, variant.name, round_index, results, window.cores(), load_average_1m)
        finally:
            delete(endpoint, topology)
    except Exception as error:  # one failed variant must not lose the others
        return replace(summarize(broker, variant.name, round_index, [], None, load_average_1m), error=repr(error))


def run_rounds(brokers: Sequence[tuple[str, Endpoint]], variants: Sequence[Variant], rounds: int, warmup_s: float,
               duration_s: float, report: bool = True) -> list[FidelityRun]:
    """Round-robin: every round runs every variant on every broker, so machine load hits them alike."""
    pids = {name: local_listening_pid(endpoint.host, endpoint.port)
            for name, endpoint in brokers}
    runs = []
    for round_index in range(1, rounds + 1):
        for variant in variants:
            for name, endpoint in brokers:
                run = run_variant(name, endpoint, variant, round_index, warmup_s, duration_s, pids[name])
                runs.append(run)
                if report:
                    print(format_run(run), flush=True)
    return runs


HEADER = (f"{'broker':<9} {'variant':<24} {'rnd':>3} {'confirmed/s':>11} {'delivered/s':>11} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'conf50':>6} {'confavg':>7} {'broker':>6} {'gen':>4} {'msg/wr':>6} {'dlv/rd':>6} {'dlv/ack':>7} {'load':>5}")


def format_run(run: FidelityRun) -> str:
    if run.error:
        return f"{run.broker:<9} {run.variant:<24} {run.round_index:>3} ERROR {run.error[:120]}"
    cores = "-" if run.broker_cpu_cores is None else f"{run.broker_cpu_cores:.2f}"
    return (f"{run.broker:<9} {run.variant:<24} {run.round_index:>3} {run.confirmed_msgs_per_s:>11,.0f} "
            f"{run.delivered_msgs_per_s:>11,.0f} {_ms(run.latency_p50_ms):>7} {_ms(run.latency_p99_ms):>7} "
            f"{_ms(run.confirm_p50_ms):>6} {_ms(run.confirm_mean_ms):>7} {cores:>6} {run.gen_cpu_max_fraction:>4.0%} {run.msgs_per_publish_write:>6.1f} "
            f"{run.deliveries_per_read:>6.1f} {run.deliveries_per_ack_write:>7.1f} {run.load_average_1m:>5.1f}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftmq bench fidelity",
                                     description="One durable queue under different client settings, interleaved.")
    parser.add_argument("--target", action="append", default=[],
                        help="NAME=HOST:PORT of a running broker (repeatable); default: start RabbitMQ and raftmq")
    parser.add_argument("--variants", default="default,window-256,publishers-4,transient",
                        help=f"comma-separated, from: {', '.join(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--json", help="write every run to this file")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        variants = [VARIANTS[name.strip()] for name in args.variants.split(",") if name.strip()]
        targets = [_parse_named_target(text) for text in args.target]
    except (KeyError, ValueError) as error:
        print(f"raftmq bench fidelity: unknown variant or bad target: {error}", file=sys.stderr)
        return 2
    print(HEADER, flush=True)
    with contextlib.ExitStack() as stack:
        if not targets:
            targets = [("raftmq", stack.enter_context(raftmq_node())),
                       ("rabbitmq", stack.enter_context(rabbitmq_cluster(1)).endpoints[0])]
        runs = run_rounds(targets, variants, args.rounds, args.warmup, args.duration)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(run) for run in runs], indent=2))
    return 1 if any(run.error for run in runs) else 0


def _parse_named_target(text: str) -> tuple[str, Endpoint]:
    name, separator, address = text.partition("=")
    return (name, parse_target(address)) if separator else ("target", parse_target(text))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
