"""The checkers catch figure 8's broken commit rule in a directed scenario, and stay silent on the correct one."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.sim.checkers import GroupChecker, SafetyViolation
from cluster.raft.core.types import NodeId
from tests.raft.interaction import Env, parse_script

TESTDATA = Path(__file__).parent.parent / "raft" / "testdata"


def _replay_with_checker(script: str) -> None:
    env = Env()
    checker = GroupChecker("g0")  # type: ignore[arg-type]
    for command, _ in parse_script((TESTDATA / script).read_text()):
        env.run(command)
        cores = {NodeId(n): node.core for n, node in env.nodes.items() if node.core is not None}
        for node_id, core in cores.items():
            checker.check_core(node_id, core)
        checker.check_electable(cores)


def test_figure8_correct_rule_passes_every_checker() -> None:
    _replay_with_checker("figure8.txt")


def test_figure8_broken_rule_is_caught() -> None:
    with pytest.raises(SafetyViolation) as caught:
        _replay_with_checker("figure8_broken.txt")
    assert caught.value.kind in {"commit-durability", "leader-completeness", "committed-changed"}


def test_figure7_passes_every_checker() -> None:
    _replay_with_checker("figure7.txt")
