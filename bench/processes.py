"""Runs publisher and consumer specs in separate OS processes, starts them together and gathers their results.

Each worker process connects and sets up (channels, confirm mode, consumers), reports "ready", then waits for the
common start time the parent chooses once every worker is ready, runs its hot loop, closes its connection and
sends back a `WorkerResult` (errors travel as text in `WorkerResult.error`). Processes are spawned (no fork: the
parent may hold threads or sockets), and whatever happens the parent terminates and joins every one it started.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import time
import traceback
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any

from bench.loadgen import (
    ConsumerSpec,
    PublisherSpec,
    Timing,
    WorkerResult,
    run_consumer,
    run_publisher,
    setup_consumer,
    setup_publisher,
)

SETUP_TIMEOUT_S = 60.0
START_DELAY_S = 0.2
RESULT_GRACE_S = 30.0


class WorkerError(Exception):
    """A worker process failed to set up or run."""


def _worker_main(spec: PublisherSpec | ConsumerSpec, channel: Any, start_value: Any, start_event: Any) -> None:
    role = "publisher" if isinstance(spec, PublisherSpec) else "consumer"
    try:
        connection = setup_publisher(spec) if isinstance(spec, PublisherSpec) else setup_consumer(spec)
    except Exception as error:  # reported to the parent, which aborts the run
        channel.put(("error", f"{role} setup: {error!r}"))
        return
    channel.put(("ready", role))
    if not start_event.wait(SETUP_TIMEOUT_S):
        connection.close()
        return
    timing = Timing(start_value.value, start_value.warmup_ms / 1000.0, start_value.duration_ms / 1000.0)
    try:
        if isinstance(spec, PublisherSpec):
            result = run_publisher(spec, connection, timing)
        else:
            result = run_consumer(spec, connection, timing)
    except Exception as error:
        result = WorkerResult(role, error=f"{role}: {error!r}\n{traceback.format_exc(limit=3)}")
    connection.close()
    channel.put(("result", result))


def run_workers(
    specs: Sequence[PublisherSpec | ConsumerSpec], warmup_s: float, duration_s: float
) -> list[WorkerResult]:
    """Run every spec in its own process; returns their results (consumers' and publishers' alike)."""
    context = multiprocessing.get_context("spawn")
    channel = context.Queue()
    start_value = _StartValue(context, warmup_s, duration_s)
    start_event = context.Event()
    processes: list[BaseProcess] = []
    try:
        for spec in specs:
            process = context.Process(target=_worker_main, args=(spec, channel, start_value, start_event), daemon=True)
            process.start()
            processes.append(process)
        _wait_ready(channel, len(specs))
        start_value.value = time.monotonic_ns() + int(START_DELAY_S * 1e9)
        start_event.set()
        return _collect(channel, len(specs), warmup_s + duration_s + START_DELAY_S + RESULT_GRACE_S)
    finally:
        _stop(processes)


class _StartValue:
    """Picklable carrier of the shared start time plus the (fixed) warm-up and duration."""

    def __init__(self, context: Any, warmup_s: float, duration_s: float) -> None:
        self._value = context.Value("q", 0)
        self.warmup_ms = int(warmup_s * 1000)
        self.duration_ms = int(duration_s * 1000)

    @property
    def value(self) -> int:
        return int(self._value.value)

    @value.setter
    def value(self, start_ns: int) -> None:
        self._value.value = start_ns


def _wait_ready(channel: Any, expected: int) -> None:
    deadline = time.monotonic() + SETUP_TIMEOUT_S
    ready = 0
    while ready < expected:
        kind, payload = _get(channel, deadline, "workers to set up")
        if kind == "error":
            raise WorkerError(str(payload))
        ready += 1


def _collect(channel: Any, expected: int, timeout_s: float) -> list[WorkerResult]:
    deadline = time.monotonic() + timeout_s
    results: list[WorkerResult] = []
    while len(results) < expected:
        kind, payload = _get(channel, deadline, "worker results")
        if kind == "result":
            results.append(payload)
    return results


def _get(channel: Any, deadline: float, what: str) -> tuple[str, Any]:
    remaining_s = deadline - time.monotonic()
    if remaining_s <= 0:
        raise WorkerError(f"timed out waiting for {what}")
    try:
        item: tuple[str, Any] = channel.get(timeout=remaining_s)
    except queue_module.Empty:
        raise WorkerError(f"timed out waiting for {what}")
    return item


def _stop(processes: list[BaseProcess]) -> None:
    for process in processes:
        process.join(timeout=5.0)
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(timeout=5.0)
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
