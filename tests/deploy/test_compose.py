"""Issue 20 item 1: deploy/docker-compose.yml brought up for real, from nothing, and faults injected into it.

A private Docker engine (tests/deploy/dockerhost.py: its own network namespace, so the host's iptables and bridge
settings stay as they were) builds the image from a debootstrapped Debian and wheels of this checkout, then runs
the checked-in compose file: three nodes, each its own container and data volume, and HAProxy. The override given
alongside it changes only what this machine needs: HAProxy from the same image (no registry here), its port also
published on the namespace's address, a generated secret, and a user that may log in through Docker's port
publishing (guest is loopback-only). Then pika publishes through HAProxy with confirms, the queue leader's container
is killed (`docker kill`), publishing goes on through HAProxy, the node is started again, and every confirmed message
is consumed; then `raftmq chaos run --target compose` pauses the leader's container (`docker pause`) and cuts it off
its network (`docker network disconnect`), and its checker must find nothing confirmed lost. The wall time of each
phase is printed (run with -s) and written to <tmp>/compose-phases.json. No timing is asserted.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from chaos.compose import ComposeCluster
from tests.deploy.dockerhost import REPO, DockerHost, missing_requirements

pytestmark = pytest.mark.timeout(900)

NODES = ("rmq1", "rmq2", "rmq3")
USER = "compose-ci"
QUEUE = "compose-kill"
RETRY_DEADLINE_S = 120.0
COUNT = 100  # confirmed messages published before the kill, and again while the leader's container is down
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
SCENARIO = Path(__file__).with_name("compose_nemeses.toml")


@dataclass(frozen=True)
class Deployment:
    host: DockerHost
    project: str
    password: str
    cluster: ComposeCluster

    @property
    def url(self) -> str:
        return f"amqp://{USER}:{self.password}@{self.host.address}:5672/%2F"

    def params(self) -> pika.ConnectionParameters:
        return pika.ConnectionParameters(self.host.address, 5672, credentials=pika.PlainCredentials(
            USER, self.password), connection_attempts=1, socket_timeout=10, blocked_connection_timeout=30)


def override(host: DockerHost, secret_file: Path, password: str) -> str:
    """The compose override for this machine (JSON is YAML)."""
    users = {"RAFTMQ_DEFAULT_USER": USER, "RAFTMQ_DEFAULT_PASS": password}
    services: dict[str, object] = {node: {"environment": users} for node in NODES}
    services["haproxy"] = {
        "image": "raftmq:latest", "healthcheck": {"disable": True},
        "entrypoint": ["haproxy", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"],
        "ports": [f"{host.address}:5672:5672", f"{host.address}:8404:8404"]}
    return json.dumps({"services": services, "secrets": {"cluster_secret": {"file": str(secret_file)}}}, indent=1)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    missing = missing_requirements()
    if missing:
        pytest.fail(f"the compose test cannot run here; missing: {', '.join(missing)}")
    work = tmp_path_factory.mktemp("compose")
    with DockerHost() as host:
        try:
            host.build_images()
            secret_file = work / "cluster_secret"
            secret_file.write_text(secrets.token_hex(32))
            secret_file.chmod(0o600)
            password = secrets.token_hex(12)
            override_file = work / "override.yml"
            override_file.write_text(override(host, secret_file, password))
            project = f"raftmqci{os.getpid()}"
            started = time.monotonic()
            host.compose(project, [COMPOSE_FILE, override_file], "up", "-d", "--no-build", *NODES, "haproxy")
            cluster = ComposeCluster(project, "", USER, password, env=host.env)
            cluster.wait_healthy(list(NODES))
            deployment = Deployment(host, project, password, cluster)
            wait_serving(deployment)
            host.phase("compose up (healthy, serving through HAProxy)", started)
            yield deployment
        finally:
            host.close()
            report = {"phases_s": host.phases, "host_state_error": host.host_state_error}
            (work / "compose-phases.json").write_text(json.dumps(report, indent=2))
            print(f"\ncompose test phases (wall s): {json.dumps(host.phases)}", file=sys.stderr)
        assert host.host_state_error is None, host.host_state_error


def wait_serving(deployment: Deployment) -> None:
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while True:
        try:
            pika.BlockingConnection(deployment.params()).close()
            return
        except pika.exceptions.AMQPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def publish_confirmed(deployment: Deployment, bodies: list[str]) -> None:
    """Publish each body with confirms through HAProxy, reconnecting (and publishing again what was not
    confirmed) until every one is confirmed."""
    pending = list(bodies)
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while pending:
        try:
            connection = pika.BlockingConnection(deployment.params())
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
                while pending:
                    channel.basic_publish("", QUEUE, pending[0].encode(), pika.BasicProperties(delivery_mode=2),
                                          mandatory=True)
                    pending.pop(0)
            finally:
                if connection.is_open:
                    connection.close()
        except (pika.exceptions.AMQPError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def drain(deployment: Deployment, wanted: set[str]) -> set[str]:
    """Consume (manual acks) until every wanted body has come, reconnecting on errors; the bodies seen."""
    got: set[str] = set()
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while not wanted <= got and time.monotonic() < deadline:
        try:
            connection = pika.BlockingConnection(deployment.params())
            channel = connection.channel()
            channel.basic_qos(prefetch_count=len(wanted))
            for method, _props, body in channel.consume(QUEUE, inactivity_timeout=2.0):
                if method is None:
                    break
                got.add(body.decode())
                channel.basic_ack(method.delivery_tag)
                if wanted <= got:
                    break
            channel.cancel()
            connection.close()
        except (pika.exceptions.AMQPError, OSError):
            time.sleep(0.5)
    return got


def leader(deployment: Deployment) -> str:
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while (name := deployment.cluster.leader_of(QUEUE)) is None:
        assert time.monotonic() < deadline, f"no leader of {QUEUE} named"
        time.sleep(0.5)
    return name


def test_kill_the_leaders_container_loses_nothing_confirmed(deployment: Deployment) -> None:
    host, started = deployment.host, time.monotonic()
    before = [f"before-{i}" for i in range(COUNT)]
    publish_confirmed(deployment, before)
    old_leader = leader(deployment)
    host.phase("kill test: confirmed, leader named", started)
    deployment.cluster.kill(old_leader)
    after = [f"after-{i}" for i in range(COUNT)]
    publish_confirmed(deployment, after)  # through HAProxy, while the old leader's container is down
    host.phase("kill test: killed, more confirmed", started)
    assert leader(deployment) != old_leader
    deployment.cluster.restart(old_leader)
    host.phase("kill test: killed node healthy again", started)
    got = drain(deployment, set(before) | set(after))
    assert set(before) | set(after) <= got, f"confirmed but lost: {sorted(set(before) | set(after) - got)[:10]}"
    host.phase("kill test: all drained", started)


def test_chaos_run_pauses_and_disconnects_the_leader(deployment: Deployment, tmp_path: Path) -> None:
    started = time.monotonic()
    out = tmp_path / "reports"
    done = subprocess.run(
        [sys.executable, "-m", "node.cli", "chaos", "run", str(SCENARIO), "--target", "compose",
         "--compose-project", deployment.project, "--urls", deployment.url, "--out", str(out)],
        env=deployment.host.env, capture_output=True, text=True, timeout=600, cwd=REPO)
    deployment.host.phase("test: chaos run --target compose", started)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((out / "compose-nemeses" / "report.json").read_text())
    assert report["valid"] and report["drained"]
    faults = done.stdout
    assert "pause rmq" in faults and "partition isolate rmq" in faults
