"""Stands in for an upstream client suite's tests/docker_client.py (aiormq, aio-pika), copied over it.

Upstream starts a RabbitMQ container per session through the Docker API. Here the one "container" is the broker
under test, at RABBITMQ_HOST:RABBITMQ_5672_TCP (a raftmq node or HAProxy in front of a raftmq cluster). raftmq has
no TLS listener, so 5671/tcp names a port nothing listens on (the TLS tests are deselected). Stopping or removing
the container does nothing: the broker belongs to tests/clientsuites, which stops it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

NO_LISTENER_PORT = 1  # tcpmux: refused at once on loopback


class DockerNotAvailableError(Exception):
    """Never raised: the broker under test is always there."""


@dataclass
class DockerHostInfo:
    is_tcp: bool = False
    socket_path: str | None = None
    host: str | None = None
    port: int | None = None

    @property
    def container_host(self) -> str:
        return os.environ["RABBITMQ_HOST"]


def parse_docker_host(docker_host: str | None = None) -> DockerHostInfo:
    return DockerHostInfo()


def check_docker_available() -> DockerHostInfo:
    return DockerHostInfo()


@dataclass
class ContainerInfo:
    id: str
    ports: dict[str, int]
    host: str


class DockerClient:
    def __init__(self, docker_host_info: DockerHostInfo | None = None) -> None:
        self.docker_host_info = docker_host_info or DockerHostInfo()

    def run(self, image: str, ports: list[str], environment: dict[str, str] | None = None) -> ContainerInfo:
        amqp_port = int(os.environ["RABBITMQ_5672_TCP"])
        known = {"5672/tcp": amqp_port, "5671/tcp": NO_LISTENER_PORT}
        return ContainerInfo("raftmq-under-test", {p: known.get(p, NO_LISTENER_PORT) for p in ports},
                             self.docker_host_info.container_host)

    def kill(self, container_id: str) -> None:
        pass

    def remove(self, container_id: str) -> None:
        pass

    def stop(self, container_id: str, timeout: int = 10) -> None:
        pass
