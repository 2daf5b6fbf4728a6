"""pika's asynchronous SelectConnection: callback-driven declare, confirm-select, publish, consume and cancel."""

from __future__ import annotations

from typing import Any

import pika
from pika.adapters.select_connection import SelectConnection

from tests.integration.conftest import Target

MESSAGES = 50
TIMEOUT_S = 20.0


class Scenario:
    """Declare a queue, publish with confirms, consume everything back, cancel, close."""

    def __init__(self, target: Target) -> None:
        self.confirmed: list[int] = []
        self.received: list[bytes] = []
        self.cancelled = False
        self.failure: str | None = None
        self.channel: Any = None
        self.queue = ""
        self.connection = SelectConnection(
            target.params(), on_open_callback=self.on_open, on_open_error_callback=self.on_error,
        )
        self.connection.ioloop.call_later(TIMEOUT_S, self.on_timeout)

    def run(self) -> None:
        self.connection.ioloop.start()

    def on_error(self, _connection: Any, error: Any) -> None:
        self.failure = f"open failed: {error!r}"
        self.connection.ioloop.stop()

    def on_timeout(self) -> None:
        self.failure = "timed out"
        self.connection.close()

    def on_open(self, connection: Any) -> None:
        connection.add_on_close_callback(lambda *_: connection.ioloop.stop())
        connection.channel(on_open_callback=self.on_channel)

    def on_channel(self, channel: Any) -> None:
        self.channel = channel
        channel.queue_declare("", exclusive=True, callback=self.on_declared)

    def on_declared(self, frame: Any) -> None:
        self.queue = frame.method.queue
        self.channel.confirm_delivery(self.on_confirm, callback=self.on_confirm_selected)

    def on_confirm_selected(self, _frame: Any) -> None:
        for i in range(MESSAGES):
            self.channel.basic_publish("", self.queue, str(i).encode(), pika.BasicProperties(delivery_mode=1))

    def on_confirm(self, frame: Any) -> None:
        method = frame.method
        assert isinstance(method, pika.spec.Basic.Ack), method
        last = self.confirmed[-1] if self.confirmed else 0
        upto = method.delivery_tag
        self.confirmed.extend(range(last + 1, upto + 1) if method.multiple else [upto])
        if len(self.confirmed) == MESSAGES:
            self.channel.basic_consume(self.queue, self.on_message, consumer_tag="select-consumer")

    def on_message(self, channel: Any, method: Any, _props: Any, body: bytes) -> None:
        self.received.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(self.received) == MESSAGES:
            channel.basic_cancel("select-consumer", callback=self.on_cancelled)

    def on_cancelled(self, _frame: Any) -> None:
        self.cancelled = True
        self.connection.close()


def test_select_connection_round_trip(amqp_target: Target) -> None:
    scenario = Scenario(amqp_target)
    scenario.run()
    assert scenario.failure is None, scenario.failure
    assert scenario.confirmed == list(range(1, MESSAGES + 1))
    assert scenario.received == [str(i).encode() for i in range(MESSAGES)]
    assert scenario.cancelled
