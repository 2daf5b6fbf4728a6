"""A pytest plugin that tests/clientsuites copies next to an upstream client suite and loads with -p.

It reads raftmq_suite.json beside it (written by test_upstream_suites.py): `deselect` (node-id regular expression ->
reason: tests that cannot apply to raftmq, reported as deselected) and `xfail` (cluster mode: node-id regular
expression -> known broker bug; such a test runs as xfail(strict=False) with a shorter timeout, so a hang costs
little). It also gives a suite the session fixtures `rabbitmq_container` and `amqp_direct_url` where its conftest
expects them from elsewhere (aiormq); a conftest that defines them (aio-pika) wins. The "container" is the broker
under test, from docker_client.py, which test_upstream_suites.py replaces with suite_docker.py. Every test that
fails (in any phase) is appended by node id to raftmq_failed.txt beside it, for test_upstream_suites.py's one rerun.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).resolve().parent
_CONFIG = json.loads((_HERE / "raftmq_suite.json").read_text())
FAILED_FILE = _HERE / "raftmq_failed.txt"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselect = [re.compile(pattern) for pattern in _CONFIG["deselect"]]
    xfail = [(re.compile(pattern), reason) for pattern, reason in _CONFIG["xfail"].items()]
    kept, dropped = [], []
    for item in items:
        if any(pattern.search(item.nodeid) for pattern in deselect):
            dropped.append(item)
            continue
        for pattern, reason in xfail:
            if pattern.search(item.nodeid):
                item.add_marker(pytest.mark.xfail(strict=False, reason=f"cluster mode: {reason}"))
                item.add_marker(pytest.mark.timeout(_CONFIG["xfail_timeout_s"]), append=False)
                break
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        with FAILED_FILE.open("a") as out:
            out.write(report.nodeid + "\n")


@pytest.fixture(scope="session")
def rabbitmq_container() -> Any:
    from tests.docker_client import DockerClient  # the suite's, i.e. suite_docker.py

    return DockerClient().run("raftmq", ["5672/tcp", "5671/tcp"])


@pytest.fixture(scope="session")
def amqp_direct_url(rabbitmq_container: Any) -> Any:
    from yarl import URL

    return URL.build(scheme="amqp", user="guest", password="guest", path="//", host=rabbitmq_container.host,
                     port=rabbitmq_container.ports["5672/tcp"])
