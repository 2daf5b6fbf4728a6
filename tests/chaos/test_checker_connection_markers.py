"""The workload's consumer writes the markers the checker needs: "connection-lost" when a connection it had open
failed, "closed" after a clean close (fake channels, no broker)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from chaos import workload
from chaos.history import Ack, Delivery, Fault
from chaos.workload import Consumer, Recorder, WorkloadConfig


class FakeConnection:
    def __init__(self) -> None:
        self.is_closed = False

    def close(self) -> None:
        self.is_closed = True


class FakeChannel:
    """First connection: one delivery, acked, then the connection fails. Second: stop is set, nothing to read."""

    def __init__(self, number: int, stop: threading.Event) -> None:
        self.number, self.stop = number, stop
        self.connection = FakeConnection()

    def basic_qos(self, prefetch_count: int) -> None:
        pass

    def basic_ack(self, delivery_tag: int) -> None:
        pass

    def consume(self, queue: str, inactivity_timeout: float) -> Iterator[tuple[Any, Any, bytes]]:
        if self.number == 1:
            yield SimpleNamespace(redelivered=False, delivery_tag=1), None, b'{"id": "r-p0-0"}'
            raise ConnectionResetError("the node died")
        self.stop.set()
        yield None, None, b""


def test_a_consumer_marks_its_lost_connection_and_its_clean_close(monkeypatch: pytest.MonkeyPatch) -> None:
    stop = threading.Event()
    opened: list[int] = []

    @contextmanager
    def fake_open_channel(url: str, config: WorkloadConfig) -> Iterator[FakeChannel]:
        opened.append(len(opened) + 1)
        if len(opened) == 2:
            raise ConnectionRefusedError("still down")  # never connected: no marker
        yield FakeChannel(1 if len(opened) == 1 else 2, stop)

    monkeypatch.setattr(workload, "open_channel", fake_open_channel)
    config = WorkloadConfig(urls=("amqp://a", "amqp://b"), backoff_ms_min=1.0, backoff_ms_max=1.0)
    recorder = Recorder()
    consumer = Consumer("c0-0", 0, "q", config, recorder, stop)
    consumer.run()  # in this thread
    kinds = [(type(r).__name__, r.kind if isinstance(r, Fault) else r.payload_id) for r in recorder.records()]
    assert kinds == [("Delivery", "r-p0-0"), ("Ack", "r-p0-0"), ("Fault", "connection-lost"), ("Fault", "closed")]
    assert opened == [1, 2, 3] and consumer.connection_failures == 2
    lost = recorder.records()[2]
    assert isinstance(lost, Fault) and lost.target == "c0-0" and lost.detail == "ConnectionResetError"
    assert isinstance(recorder.records()[0], Delivery) and isinstance(recorder.records()[1], Ack)
