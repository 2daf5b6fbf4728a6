"""The benchmark's workloads (a)-(e): topology, load-generator layout and how a run becomes a `Measurement`.

(a) persistent 100 B messages through a durable classic queue, 1 publisher + 1 consumer;
(b) the same through a quorum queue (x-queue-type=quorum; 3 replicas when the broker is a 3-node cluster);
(c) fanout: one publisher to a durable fanout exchange bound to 10 queues, consumed by 2 processes;
(d) 1,000 queues, each with its own publishing channel and consumer, multiplexed over 2+2 processes (warm-up at
    least 5 s: a thousand consumers take a while to reach a steady state);
(e) latency at fixed publish rates, (a)'s topology, every message timed.
With `RunSettings.rates_for` containing "a", (a) is also measured at those fixed rates (as (e), labelled "a@<rate>/s";
(b)'s are in `bench.quorum`), and with `new_queue_trials` (a) and (b) first time the first message on that many new
queues of their type ("a/new-q", `bench.newqueue`), on the idle broker before the flow.
`Measurement` and BODY_SIZE/FANOUT_QUEUES live in `bench.measurement` and are re-exported here for older imports.
A control connection declares the topology (names carry a run id so runs never collide), and deletes it afterwards.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench import frames
from bench.client import BenchConnection, Endpoint
from bench.cpu import CpuWindow, local_listening_pid
from bench.loadgen import ConsumerSpec, PublisherSpec, PublishTarget, WorkerResult
from bench.measurement import BODY_SIZE as BODY_SIZE
from bench.measurement import FANOUT_QUEUES as FANOUT_QUEUES
from bench.measurement import NEW_QUEUE
from bench.measurement import Measurement as Measurement
from bench.newqueue import run_trials, summarize
from bench.processes import run_workers
from bench.stats import rate_per_s, summarize_latencies_ns

ALL_WORKLOADS = ("a", "b", "c", "d", "e")
DEFAULT_LATENCY_RATES = (1000, 2000, 5000)
MANY_QUEUES = 1000
# RabbitMQ confirms persistent messages once its message store has synced them, about 20 ms after the write here;
# raftmq after its fsync (and, in (b), replication). A window of 256 capped RabbitMQ's (a) near 256 / 20 ms
# (docs/benchmarks.md, "Load generator fidelity"); 2048 lets both brokers reach their CPU limit on (a). On (b),
# 2048 starved raftmq's deliveries (a growing backlog) while RabbitMQ did the same at 256 and 2048: (b) keeps 256.
DEFAULT_CONFIRM_WINDOW = 2048
DEFAULT_CONFIRM_WINDOWS = {"a": DEFAULT_CONFIRM_WINDOW, "b": 256}
MANY_QUEUES_WARMUP_S_MIN = 5.0
CPU_WINDOW_MARGIN_S = 0.5  # a thousand consumers and channels take seconds to reach a steady state


@dataclass(frozen=True, slots=True)
class Topology:
    queues: tuple[str, ...]
    queue_arguments: dict[str, str | int | bool]
    fanout_exchange: str | None = None


@dataclass(frozen=True, slots=True)
class RunSettings:
    duration_s: float = 10.0
    warmup_s: float = 2.0
    latency_rates_msgs_per_s: tuple[int, ...] = DEFAULT_LATENCY_RATES
    confirm_window: int | None = None  # unconfirmed messages per publisher in (a)/(b); None: DEFAULT_CONFIRM_WINDOWS
    prefetch: int = 1000  # per consumer, workloads (a), (b) and (e)
    rates_for: tuple[str, ...] = ()  # workloads ("a", "b") also measured at each of latency_rates_msgs_per_s
    new_queue_trials: int = 0  # (a)/(b): first message on this many new queues before the flow (bench.newqueue)

    def window_for(self, workload: str) -> int:
        """The confirm window of an unpaced publisher in `workload` ("a" or "b")."""
        if self.confirm_window is not None:
            return self.confirm_window
        return DEFAULT_CONFIRM_WINDOWS.get(workload, DEFAULT_CONFIRM_WINDOW)


def run_id() -> str:
    return f"{os.getpid()}-{int(time.time() * 1000) % 100_000_000}"


# --- topology -----------------------------------------------------------------------------------------------


def declare(endpoint: Endpoint, topology: Topology) -> None:
    connection = BenchConnection(endpoint)
    try:
        connection.open_channel(1)
        if topology.fanout_exchange:
            connection.call(1, frames.exchange_declare(1, topology.fanout_exchange, "fanout", True), frames.EXCHANGE_DECLARE_OK)
        declares = [frames.queue_declare(1, queue, True, topology.queue_arguments) for queue in topology.queues]
        connection.call_many(1, declares, frames.QUEUE_DECLARE_OK)
        if topology.fanout_exchange:
            binds = [frames.queue_bind(1, queue, topology.fanout_exchange, "") for queue in topology.queues]
            connection.call_many(1, binds, frames.QUEUE_BIND_OK)
    finally:
        connection.close()


def delete(endpoint: Endpoint, topology: Topology) -> None:
    """Delete what `declare` made; best effort (a broken broker must not hide the run's real error)."""
    try:
        connection = BenchConnection(endpoint)
    except (OSError, frames.ProtocolError):
        return
    try:
        connection.open_channel(1)
        connection.call_many(1, [frames.queue_delete(1, queue) for queue in topology.queues], frames.QUEUE_DELETE_OK)
        if topology.fanout_exchange:
            connection.call(1, frames.exchange_delete(1, topology.fanout_exchange), (40, 21))
    except (OSError, frames.ProtocolError):
        pass
    finally:
        connection.close()


# --- layouts ------------------------------------------------------------------------------------------------


def _split(items: Sequence[str], parts: int) -> list[tuple[str, ...]]:
    size = -(-len(items) // parts)
    return [tuple(items[start : start + size]) for start in range(0, len(items), size)]


def publish_batch_max(window: int) -> int:
    """Messages per publish write for a window: a quarter of it, at most 256 (about 40 KiB per write)."""
    return max(1, min(window // 4, 256))


def single_queue_layout(
    endpoint: Endpoint, queue: str, settings: RunSettings, rate_msgs_per_s: float | None = None, sample_every: int = 4,
    consumer_endpoint: Endpoint | None = None, workload: str = "a",
) -> list[PublisherSpec | ConsumerSpec]:
    """1 publisher on `endpoint` + 1 consumer (on `consumer_endpoint`, default the same node)."""
    window = settings.window_for(workload) if rate_msgs_per_s is None else 4096
    batch_max = publish_batch_max(window)
    consumer_at = endpoint if consumer_endpoint is None else consumer_endpoint
    return [
        ConsumerSpec(consumer_at, (queue,), prefetch=settings.prefetch, latency_sample_every=sample_every),
        PublisherSpec(
            endpoint, (PublishTarget("", queue),), BODY_SIZE, window, batch_max, rate_msgs_per_s=rate_msgs_per_s
        ),
    ]


def fanout_layout(endpoint: Endpoint, exchange: str, queues: Sequence[str]) -> list[PublisherSpec | ConsumerSpec]:
    specs: list[PublisherSpec | ConsumerSpec] = [
        ConsumerSpec(endpoint, part, prefetch=500, latency_sample_every=8) for part in _split(queues, 2)
    ]
    specs.append(PublisherSpec(endpoint, (PublishTarget(exchange, ""),), BODY_SIZE, window_per_channel=128))
    return specs


def many_queues_layout(endpoint: Endpoint, queues: Sequence[str]) -> list[PublisherSpec | ConsumerSpec]:
    parts = _split(queues, 2)
    specs: list[PublisherSpec | ConsumerSpec] = [
        ConsumerSpec(endpoint, part, prefetch=50, latency_sample_every=4) for part in parts
    ]
    for part in parts:
        targets = tuple(PublishTarget("", queue) for queue in part)
        specs.append(PublisherSpec(endpoint, targets, BODY_SIZE, window_per_channel=8, batch_max=8))
    return specs


# --- running ------------------------------------------------------------------------------------------------


def measure(
    label: str, workload: str, broker: str, results: Sequence[WorkerResult], target_rate: float | None = None
) -> Measurement:
    errors = [result.error for result in results if result.error]
    publishers = [result for result in results if result.role == "publisher"]
    consumers = [result for result in results if result.role == "consumer"]
    latencies = [latency for result in consumers for latency in result.latencies_ns]
    summary = summarize_latencies_ns(latencies)
    confirms = summarize_latencies_ns([latency for result in publishers for latency in result.confirm_latencies_ns])
    return Measurement(
        label=label,
        workload=workload,
        broker=broker,
        confirmed_msgs_per_s=sum(rate_per_s(result.confirmed, result.measured_s) for result in publishers),
        delivered_msgs_per_s=sum(rate_per_s(result.delivered, result.measured_s) for result in consumers),
        published_msgs=sum(result.published for result in publishers),
        confirmed_msgs=sum(result.confirmed for result in publishers),
        nacked_msgs=sum(result.nacked for result in publishers),
        delivered_msgs=sum(result.delivered for result in consumers),
        measured_s=max((result.measured_s for result in results), default=0.0),
        latency_samples=summary.samples,
        latency_p50_ms=summary.p50_ms,
        latency_p99_ms=summary.p99_ms,
        latency_p999_ms=summary.p999_ms,
        latency_max_ms=summary.max_ms,
        target_rate_msgs_per_s=target_rate,
        loadgen_cpu_max_fraction=max((r.cpu_s / r.measured_s for r in results if r.measured_s > 0), default=0.0),
        error="; ".join(errors) if errors else None,
        confirm_p50_ms=confirms.p50_ms,
        confirm_p99_ms=confirms.p99_ms,
    )


def _run(
    endpoint: Endpoint,
    topology: Topology,
    specs: Sequence[PublisherSpec | ConsumerSpec],
    settings: RunSettings,
    finish: Callable[[list[WorkerResult]], Measurement],
    warmup_s_min: float = 0.0,
) -> Measurement:
    warmup_s = max(settings.warmup_s, warmup_s_min)
    load_average_1m = os.getloadavg()[0]
    broker_pid = local_listening_pid(endpoint.host, endpoint.port)
    declare(endpoint, topology)
    try:
        # The workers start after their setup (a few hundred ms); sample inside the measured window.
        with CpuWindow([broker_pid], warmup_s + CPU_WINDOW_MARGIN_S, settings.duration_s - CPU_WINDOW_MARGIN_S) as cpu:
            results = run_workers(specs, warmup_s, settings.duration_s)
        return dataclasses.replace(finish(results), broker_cpu_cores=cpu.cores(), load_average_1m=load_average_1m)
    finally:
        delete(endpoint, topology)


def _measure_rate(label: str, workload: str, broker: str, rate: float, results: list[WorkerResult]) -> Measurement:
    return measure(label, workload, broker, results, rate)


def rate_label(workload: str, rate: int) -> str:
    """The label of `workload` measured at a fixed publish rate: "e@1000/s", "a@5000/s", "b@1000/s"."""
    return f"{workload}@{rate}/s"


def new_queue_label(workload: str) -> str:
    """The label of the first-message-on-a-new-queue trials of `workload`'s queue type: "a/new-q", "b/new-q"."""
    return f"{workload}/new-q"


def run_workload(workload: str, broker: str, endpoint: Endpoint, settings: RunSettings) -> list[Measurement]:
    """Run one workload against one broker; failures become a Measurement with `error` set."""
    try:
        return _run_workload(workload, broker, endpoint, settings)
    except Exception as error:  # one broken workload must not lose the others' figures
        return [Measurement(label=workload, workload=workload, broker=broker, error=repr(error))]


def _at_fixed_rates(workload: str, broker: str, endpoint: Endpoint, settings: RunSettings, prefix: str,
                    arguments: dict[str, str | int | bool] | None = None) -> list[Measurement]:
    """(a)'s topology at each fixed rate, every message timed: (e), or (a) (or (b) on one node) with `rates_for`."""
    measurements = []
    for rate in settings.latency_rates_msgs_per_s:
        topology = Topology((f"{prefix}-{rate}",), arguments or {})
        specs = single_queue_layout(endpoint, topology.queues[0], settings, float(rate), sample_every=1)
        finish = functools.partial(_measure_rate, rate_label(workload, rate), workload, broker, float(rate))
        measurements.append(_run(endpoint, topology, specs, settings, finish))
    return measurements


def new_queue_trials(
    workload: str, broker: str, nodes: Sequence[tuple[str, Endpoint]], settings: RunSettings,
    arguments: dict[str, str | int | bool],
) -> list[Measurement]:
    """`settings.new_queue_trials` first messages on new queues of `workload`'s type ([] when 0); never raises."""
    if settings.new_queue_trials <= 0:
        return []
    label = new_queue_label(workload)
    try:
        trials = run_trials(nodes, settings.new_queue_trials, arguments, f"bench-new-{workload}-{run_id()}")
        return [summarize(label, workload, broker, trials)]
    except Exception as error:  # the flow figures must not be lost to it
        return [Measurement(label=label, workload=workload, broker=broker, kind=NEW_QUEUE, error=repr(error))]


def _run_workload(workload: str, broker: str, endpoint: Endpoint, settings: RunSettings) -> list[Measurement]:
    prefix = f"bench-{workload}-{run_id()}"
    if workload in ("a", "b"):
        arguments: dict[str, str | int | bool] = {"x-queue-type": "quorum"} if workload == "b" else {}
        found = new_queue_trials(workload, broker, [(broker, endpoint)], settings, arguments)
        topology = Topology((prefix,), arguments)
        specs = single_queue_layout(endpoint, prefix, settings, workload=workload)
        found.append(_run(endpoint, topology, specs, settings, lambda r: measure(workload, workload, broker, r)))
        if workload in settings.rates_for:
            found += _at_fixed_rates(workload, broker, endpoint, settings, prefix, arguments)
        return found
    if workload == "c":
        queues = tuple(f"{prefix}-{index}" for index in range(FANOUT_QUEUES))
        topology = Topology(queues, {}, fanout_exchange=prefix)
        specs = fanout_layout(endpoint, prefix, queues)
        return [_run(endpoint, topology, specs, settings, lambda r: measure("c", "c", broker, r))]
    if workload == "d":
        queues = tuple(f"{prefix}-{index}" for index in range(MANY_QUEUES))
        topology = Topology(queues, {})
        specs = many_queues_layout(endpoint, queues)
        finish = functools.partial(measure, "d", "d", broker)
        return [_run(endpoint, topology, specs, settings, finish, MANY_QUEUES_WARMUP_S_MIN)]
    if workload == "e":
        return _at_fixed_rates("e", broker, endpoint, settings, prefix)
    raise ValueError(f"unknown workload {workload!r} (known: {', '.join(ALL_WORKLOADS)})")
