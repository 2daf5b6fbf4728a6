"""The RabbitMQ node fixture of the link tests (a private RabbitMQ 3.10) for the federation interop tests."""

from tests.link.conftest import rabbitmq_broker

__all__ = ["rabbitmq_broker"]
