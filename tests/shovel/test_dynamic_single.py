"""Dynamic shovels on real single-node processes: `raftmq ctl set_parameter shovel ...` on one node moves
messages to another node's queue; status, validation, persistence across a restart, clear, delete-after."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.nodeproc import NodeProcess
from tests.shovel.helpers import count, ctl_call, drain, publish, start_node, uri, wait_until


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[tuple[NodeProcess, int], tuple[NodeProcess, int]]]:
    a = start_node(tmp_path / "a")
    try:
        b = start_node(tmp_path / "b")
        try:
            yield a, b
        finally:
            b[0].stop()
    finally:
        a[0].stop()


def _status(mport: int) -> list[dict[str, object]]:
    code, rows = ctl_call(mport, "shovel_status")
    if code == 69:  # the node is (re)starting
        return [{"state": "unreachable"}]
    assert code == 0, rows
    assert isinstance(rows, list)
    return rows


def test_queue_to_queue_shovel_moves_everything_and_survives_a_restart(two_nodes) -> None:  # type: ignore[no-untyped-def]
    (a, amport), (b, _bmport) = two_nodes
    publish(a.port, "src-q", 300)
    value = {"src-uri": uri(a.port), "src-queue": "src-q", "dest-uri": uri(b.port), "dest-queue": "dst-q",
             "dest-add-forward-headers": True}
    code, out = ctl_call(amport, "set_parameter", "shovel", "s1", json.dumps(value))
    assert code == 0, out
    wait_until(lambda: count(b.port, "dst-q") == 300, 60, "300 messages in the destination")
    assert count(a.port, "src-q") == 0
    [row] = _status(amport)
    assert row["name"] == "s1" and row["state"] == "running" and row["node"] == "it"
    assert row["failures"] == 0 and row["forwarded"] == 300  # (the missing dest-queue was declared in set-up)
    code, params = ctl_call(amport, "list_parameters")
    assert code == 0 and params[0]["value"]["src-queue"] == "src-q"
    a.restart()  # the definition is stored with the node's definitions
    wait_until(lambda: [r["state"] for r in _status(amport)] == ["running"], 60, "the shovel running again")
    publish(a.port, "src-q", 50, prefix="after")
    wait_until(lambda: count(b.port, "dst-q") == 350, 60, "350 messages in the destination")
    messages = drain(b.port, "dst-q")
    bodies = sorted(body for body, _ in messages)
    assert bodies == sorted([f"m{n}".encode() for n in range(300)] + [f"after{n}".encode() for n in range(50)])
    [shovelled] = messages[0][1]["x-shovelled"]
    assert shovelled["shovel-name"] == "s1" and shovelled["src-queue"] == "src-q"
    code, out = ctl_call(amport, "clear_parameter", "shovel", "s1")
    assert code == 0, out
    wait_until(lambda: _status(amport) == [], 10, "no shovel after clear_parameter")


def test_invalid_definitions_are_refused_and_change_nothing(two_nodes) -> None:  # type: ignore[no-untyped-def]
    (a, amport), (b, _) = two_nodes
    bad = {"src-uri": uri(a.port), "src-queue": "q", "src-exchange": "x", "dest-uri": uri(b.port)}
    code, out = ctl_call(amport, "set_parameter", "shovel", "bad", json.dumps(bad))
    assert code == 65 and "Cannot specify 'src-exchange' and 'src-queue'" in out
    numeric_no_ack = {"src-uri": uri(a.port), "src-queue": "q", "dest-uri": uri(b.port), "ack-mode": "no-ack",
                      "src-delete-after": 5}
    code, out = ctl_call(amport, "set_parameter", "shovel", "bad", json.dumps(numeric_no_ack))
    assert code == 65 and "Cannot specify 'no-ack' and numerical 'delete-after'" in out
    code, out = ctl_call(amport, "set_parameter", "no-such-component", "u", "{}")
    assert code == 65 and "component_not_found" in out
    code, out = ctl_call(amport, "set_parameter", "federation-upstream", "u", "{}")  # (built now: issue 19)
    assert code == 65 and 'Key "uri" not found in federation-upstream' in out
    assert ctl_call(amport, "list_parameters") == (0, []) and _status(amport) == []


def test_numeric_delete_after_moves_that_many_then_removes_itself(two_nodes) -> None:  # type: ignore[no-untyped-def]
    (a, amport), (b, _) = two_nodes
    publish(a.port, "da-src", 30)
    value = {"src-uri": uri(a.port), "src-queue": "da-src", "dest-uri": uri(b.port), "dest-queue": "da-dst",
             "src-delete-after": 10, "src-prefetch-count": 4}
    assert ctl_call(amport, "set_parameter", "shovel", "once", json.dumps(value))[0] == 0
    wait_until(lambda: ctl_call(amport, "list_parameters") == (0, []), 60, "the completed shovel removed")
    assert count(b.port, "da-dst") == 10
    wait_until(lambda: count(a.port, "da-src") == 20, 10, "20 messages left at the source")


def test_exchange_source_keeps_messages_routed_while_the_destination_is_down(two_nodes) -> None:  # type: ignore[no-untyped-def]
    (a, amport), (b, _) = two_nodes
    value = {"src-uri": uri(a.port), "src-exchange": "amq.direct", "src-exchange-key": "k",
             "dest-uri": uri(b.port), "dest-queue": "ex-dst", "reconnect-delay": 1}
    assert ctl_call(amport, "set_parameter", "shovel", "ex", json.dumps(value))[0] == 0
    wait_until(lambda: [r["state"] for r in _status(amport)] == ["running"], 30, "the shovel running")
    import pika

    def send(n: int, prefix: str) -> None:
        from tests.shovel.helpers import connect

        with connect(a.port) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(n):
                ch.basic_publish("amq.direct", "k", f"{prefix}{i}".encode(), pika.BasicProperties(delivery_mode=2))

    send(20, "up")
    wait_until(lambda: count(b.port, "ex-dst") == 20, 30, "20 messages shovelled")
    b.stop()
    wait_until(lambda: [r["state"] for r in _status(amport)] == ["starting"], 30, "the shovel reconnecting")
    send(25, "down")  # routed while the shovel cannot reach its destination
    b.start()
    wait_until(lambda: count(b.port, "ex-dst") == 45, 60, "the 25 messages routed meanwhile shovelled")
    assert ctl_call(amport, "clear_parameter", "shovel", "ex")[0] == 0
    from tests.shovel.helpers import connect

    def source_queue_gone() -> bool:
        with connect(a.port) as conn:
            try:
                conn.channel().queue_declare("shovel./.ex", passive=True)
            except Exception:
                return True
            return False

    wait_until(source_queue_gone, 30, "the exchange source's queue deleted with the shovel")
