"""bench.fidelity's pure parts: variant layouts, the run summary, the pid in `ss -p` output; the consumer's ack
threshold in bench.loadgen."""

from __future__ import annotations

from bench.client import Endpoint
from bench.cpu import parse_ss_pid
from bench.fidelity import BASELINE, VARIANTS, Variant, summarize, variant_specs
from bench.loadgen import ConsumerSpec, PublisherSpec, WorkerResult, _ack_threshold
from bench.workloads import RunSettings

ENDPOINT = Endpoint("127.0.0.1", 5672)


def test_baseline_matches_the_bench_defaults_for_a() -> None:
    consumer, publisher = variant_specs(ENDPOINT, "q", BASELINE)
    assert isinstance(consumer, ConsumerSpec) and isinstance(publisher, PublisherSpec)
    assert (publisher.window_per_channel, publisher.batch_max, publisher.persistent) == (2048, 256, True)
    assert RunSettings().window_for("a") == publisher.window_per_channel
    assert (RunSettings().window_for("b"), RunSettings(confirm_window=100).window_for("b")) == (256, 100)
    assert (consumer.prefetch, consumer.ack_every) == (1000, 0)


def test_variants_change_the_layout() -> None:
    specs = variant_specs(ENDPOINT, "q", VARIANTS["publishers-4"])
    assert [type(spec) for spec in specs] == [ConsumerSpec] + [PublisherSpec] * 4
    assert all(isinstance(spec, PublisherSpec) for spec in variant_specs(ENDPOINT, "q", VARIANTS["no-consumer"]))
    transient = variant_specs(ENDPOINT, "q", Variant("t", persistent=False))[1]
    assert isinstance(transient, PublisherSpec) and not transient.persistent


def test_summarize_rates_and_patterns() -> None:
    results = [
        WorkerResult("publisher", published=1000, confirmed=900, measured_s=2.0, cpu_s=0.2, writes=10, reads=5),
        WorkerResult("consumer", delivered=800, measured_s=2.0, cpu_s=0.1, latencies_ns=[1_000_000], writes=40, reads=80),
    ]
    run = summarize("rabbitmq", "default", 1, results, 0.5, 3.0)
    assert (run.confirmed_msgs_per_s, run.delivered_msgs_per_s) == (450.0, 400.0)
    assert (run.msgs_per_publish_write, run.deliveries_per_read, run.deliveries_per_ack_write) == (100.0, 10.0, 20.0)
    assert (run.gen_cpu_max_fraction, run.broker_cpu_cores, run.error) == (0.1, 0.5, None)
    assert summarize("b", "x", 1, [], None, 0.0).msgs_per_publish_write == 0.0


def test_parse_ss_pid() -> None:
    line = 'LISTEN 0 128 127.0.0.1:5672 0.0.0.0:* users:(("beam.smp",pid=4242,fd=77))\n'
    assert parse_ss_pid(line) == 4242
    assert parse_ss_pid("") is None


def test_ack_threshold_stays_below_half_the_prefetch() -> None:
    assert _ack_threshold(ConsumerSpec(ENDPOINT, ("q",), prefetch=1000)) == 1
    assert _ack_threshold(ConsumerSpec(ENDPOINT, ("q",), prefetch=1000, ack_every=100)) == 100
    assert _ack_threshold(ConsumerSpec(ENDPOINT, ("q",), prefetch=100, ack_every=100)) == 50
    assert _ack_threshold(ConsumerSpec(ENDPOINT, ("q",), prefetch=0, ack_every=100)) == 100


def test_publisher_keeps_its_whole_window_in_flight() -> None:
    """Regression: with a socket timeout left from setup, each 'non-blocking' read waited for a confirm, so a
    publisher never had more than about one batch outstanding. A broker that confirms nothing must see the window."""
    import socket
    import time
    from types import SimpleNamespace

    from bench.loadgen import PublishTarget, Timing, run_publisher

    ours, broker_side = socket.socketpair()
    with ours, broker_side:
        ours.settimeout(30.0)  # what BenchConnection leaves on the socket
        spec = PublisherSpec(ENDPOINT, (PublishTarget("", "q"),), 100, window_per_channel=256, batch_max=64)
        timing = Timing(time.monotonic_ns(), 0.0, 0.3)
        result = run_publisher(spec, SimpleNamespace(sock=ours), timing)  # type: ignore[arg-type]
    assert result.published == 256
    assert result.confirmed == 0


def test_broker_cpu_per_message() -> None:
    from bench.workloads import Measurement

    measurement = Measurement("a", "a", "rabbitmq", confirmed_msgs_per_s=10_000.0, broker_cpu_cores=0.5)
    assert measurement.broker_cpu_us_per_msg == 50.0
    assert Measurement("a", "a", "rabbitmq", confirmed_msgs_per_s=10_000.0).broker_cpu_us_per_msg is None
    assert Measurement("a", "a", "rabbitmq", broker_cpu_cores=0.5).broker_cpu_us_per_msg is None


def test_cpu_window_of_this_process() -> None:
    import os

    from bench.cpu import CpuWindow, process_cpu_s

    assert process_cpu_s(os.getpid()) is not None
    window = CpuWindow([os.getpid()], 0.0, 0.0)
    window._sample()
    window._sample()
    assert len(window._samples) == 2
    assert CpuWindow([None], 0.0, 0.0).cores() is None


def test_cpu_per_message_ratio_in_comparisons() -> None:
    from bench.results import comparisons, format_table
    from bench.workloads import Measurement

    ours = Measurement("a", "a", "raftmq", confirmed_msgs_per_s=5_000.0, broker_cpu_cores=0.5)
    theirs = Measurement("a", "a", "rabbitmq", confirmed_msgs_per_s=10_000.0, broker_cpu_cores=0.5)
    (pair,) = comparisons([ours, theirs])
    assert pair.cpu_per_msg_ratio == 2.0
    assert "2.00x" in format_table([ours, theirs])


def test_markdown_history_table() -> None:
    from pathlib import Path

    from bench.results import RunReport, format_markdown
    from bench.workloads import Measurement

    ours = Measurement("c", "c", "raftmq", confirmed_msgs_per_s=1_000.0, delivered_msgs_per_s=5_000.0,
                       latency_p99_ms=20.0, broker_cpu_cores=0.5, load_average_1m=3.0)
    theirs = Measurement("c", "c", "rabbitmq", confirmed_msgs_per_s=2_000.0, delivered_msgs_per_s=20_000.0,
                         latency_p99_ms=10.0, broker_cpu_cores=0.5, load_average_1m=4.0)
    report = RunReport("2026-11-23T03:00:00Z", ["raftmq", "bench"], {}, {}, [ours, theirs], [])
    table = format_markdown([(Path("x.json"), report)])
    row = table.splitlines()[-1]
    assert row.startswith("| 2026-11-23 03:00 | c | 1,000 (5,000 delivered) | 2,000 | 0.50x | 20.0 / 10.0 | 2.00x")
    assert "| 500 / 250 | 2.00x | 3.0 / 4.0 |" in row
