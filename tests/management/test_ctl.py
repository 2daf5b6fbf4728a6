"""`raftmq ctl` against an in-process management server over a real Broker (the client runs in a worker thread)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from node import ctl
from tests.broker.harness import Client
from tests.management.helpers import served_broker


async def run_ctl(port: int, *argv: str) -> int:
    return await trio.to_thread.run_sync(ctl.main, ["--node", f"127.0.0.1:{port}", *argv])


async def test_list_queues_prints_an_aligned_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    async with served_broker() as s:
        client = Client(s.broker)
        client.open()
        client.declare("orders", durable=True, arguments={"x-queue-type": "quorum"})
        client.declare("q2")
        client.publish("", "orders", b"x")
        assert await run_ctl(s.port, "list_queues") == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split() == ["vhost", "name", "type", "messages_ready", "messages_unacknowledged",
                                    "consumers", "leader", "members"]
        assert lines[1].split() == ["/", "orders", "quorum", "1", "0", "0", "rabbit@test", "rabbit@test"]
        assert lines[0].index("type") == lines[1].index("quorum")  # aligned columns
        assert await run_ctl(s.port, "list_queues", "name", "messages") == 0
        assert capsys.readouterr().out.splitlines()[1:] == ["orders  1", "q2      0"]
        assert await run_ctl(s.port, "--json", "list_queues", "-p", "/") == 0
        rows = json.loads(capsys.readouterr().out)
        assert [r["name"] for r in rows] == ["orders", "q2"]
        assert await run_ctl(s.port, "list_consumers", "--json") == 0  # --json after the command works too
        assert json.loads(capsys.readouterr().out) == []


async def test_add_user_and_set_permissions_then_the_user_can_use_ctl(capsys: pytest.CaptureFixture[str]) -> None:
    async with served_broker() as s:
        assert await run_ctl(s.port, "add_user", "ops", "pw", "--tags", "administrator") == 0
        assert "Added user 'ops'" in capsys.readouterr().out
        assert await run_ctl(s.port, "add_vhost", "prod") == 0
        assert await run_ctl(s.port, "set_permissions", "-p", "prod", "ops", ".*", ".*", "^r") == 0
        capsys.readouterr()
        assert await run_ctl(s.port, "--user", "ops", "--password", "pw", "--json", "list_permissions", "-p",
                             "prod") == 0
        perms: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
        assert perms == [{"user": "ops", "vhost": "prod", "configure": ".*", "write": ".*", "read": "^r"}]
        assert await run_ctl(s.port, "list_users") == 0
        assert ["ops", "administrator"] in [line.split() for line in capsys.readouterr().out.splitlines()]


async def test_errors_have_clear_messages_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    async with served_broker() as s:
        assert await run_ctl(s.port, "--password", "bad", "list_users") == ctl.EXIT_NOPERM
        assert "authentication refused" in capsys.readouterr().err
        assert await run_ctl(s.port, "join_cluster", "rmq2") == ctl.EXIT_UNAVAILABLE
        assert "not in a cluster" in capsys.readouterr().err
        assert await run_ctl(s.port, "add_member", "q", "rmq2") == ctl.EXIT_UNAVAILABLE
        assert await run_ctl(s.port, "set_permissions", "-p", "nope", "guest", ".*", ".*", ".*") == ctl.EXIT_DATAERR
        assert "vhost_not_found" in capsys.readouterr().err
        assert await run_ctl(s.port, "add_user", "raftmq-internal-link", "pw") == ctl.EXIT_DATAERR
        assert "reserved" in capsys.readouterr().err
        assert await run_ctl(s.port, "set_policy", "p", ".*", "{not json") == ctl.EXIT_USAGE
        assert await run_ctl(s.port, "no_such_command") == ctl.EXIT_USAGE
        assert await run_ctl(s.port, "grow", "rmq2", "sideways") == ctl.EXIT_USAGE
    # nothing listens there any more
    assert await run_ctl(s.port, "cluster_status") == ctl.EXIT_UNAVAILABLE
    assert "could not reach the management API" in capsys.readouterr().err


async def test_cluster_status_on_a_single_node(capsys: pytest.CaptureFixture[str]) -> None:
    async with served_broker() as s:
        assert await run_ctl(s.port, "cluster_status") == 0
        out = capsys.readouterr().out
        assert out.startswith("Cluster status of node rabbit@test")
        assert await run_ctl(s.port, "--json", "cluster_status") == 0
        report = json.loads(capsys.readouterr().out)
        assert [n["name"] for n in report["nodes"]] == ["rabbit@test"]


def test_table_rendering_units() -> None:
    rows = [{"a": "x", "b": [1, 2], "c": {"k": True}, "d": None, "n": {"m": "deep"}}]
    assert ctl.render_table(rows, ("a", "b", "d", "n.m")).splitlines() == ["a  b    d  n.m", "x  1,2     deep"]
    assert ctl.cell(True) == "true" and ctl.cell({}) == "" and ctl.cell({"k": 1}) == '{"k": 1}'
    assert ctl.q("/") == "%2F"


def test_command_results_are_printed_as_tables_under_their_keys() -> None:
    result = {"moved": [{"vhost": "/", "queue": "qq1", "leader": "rmq2"}], "skipped": [], "total": 1}
    assert ctl.describe_result("rebalance", result).splitlines() == [
        "rebalance: done", "moved:", "vhost  queue  leader", "/      qq1    rmq2", "skipped: none", "total: 1"]
    assert ctl.describe_result("leave_cluster", {}) == "leave_cluster: done"
