"""tests/deploy: the compose test (test_compose.py) runs after everything else in the session, so that whatever it
does to the machine (its own Docker engine, in its own network namespace) cannot disturb a test that runs later. On
xdist workers (tests/conftest.py) it runs last of the `hostwide` unit, after the partition tests, and no other
host-wide test runs beside it."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    last = [item for item in items if item.nodeid.startswith("tests/deploy/test_compose.py")]
    if last:
        items[:] = [item for item in items if item not in last] + last
