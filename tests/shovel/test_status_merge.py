"""`merge_shovel_rows` (pure): what every cluster node lists for GET /api/shovels from its own rows and its peers'."""

from __future__ import annotations

from typing import Any

from node.runtime.management_shovels import ELSEWHERE, merge_shovel_rows


def _row(name: str, node: str, state: str, kind: str = "dynamic", **more: Any) -> dict[str, Any]:
    return {"name": name, "vhost": "/", "type": kind, "node": node, "state": state, **more}


def test_the_row_of_the_node_that_runs_it_replaces_running_elsewhere() -> None:
    local = [_row("a", "n2", ELSEWHERE), _row("b", "n1", "running", forwarded=5)]
    peers = [_row("a", "n2", "running", forwarded=7, src_uri="amqp://guest@h"), _row("b", "n1", ELSEWHERE),
             _row("a", "n2", ELSEWHERE), _row("b", "n1", ELSEWHERE)]
    assert merge_shovel_rows(local, peers) == [_row("a", "n2", "running", forwarded=7, src_uri="amqp://guest@h"),
                                               _row("b", "n1", "running", forwarded=5)]


def test_an_owner_that_does_not_answer_leaves_the_local_row() -> None:
    local = [_row("a", "n3", ELSEWHERE)]
    assert merge_shovel_rows(local, [_row("a", "n3", ELSEWHERE)]) == local
    assert merge_shovel_rows(local, []) == local


def test_during_a_hand_over_the_owner_named_here_wins_then_any_runner() -> None:
    local = [_row("a", "n2", ELSEWHERE)]
    stopping, starting = _row("a", "n3", "running"), _row("a", "n2", "starting")
    assert merge_shovel_rows(local, [stopping, starting]) == [starting]
    assert merge_shovel_rows(local, [stopping]) == [stopping]


def test_static_shovels_of_other_nodes_files_are_added_and_kept_apart_from_dynamic_ones() -> None:
    local = [_row("s", "n1", "running")]
    peers = [_row("s", "n2", "running", kind="static"), _row("s", "n3", ELSEWHERE, kind="static"),
             _row("r", "n3", "terminated", termination_reason="x")]
    assert merge_shovel_rows(local, peers) == [_row("s", "n1", "running"),
                                               _row("r", "n3", "terminated", termination_reason="x"),
                                               _row("s", "n2", "running", kind="static")]
