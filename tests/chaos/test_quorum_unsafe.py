"""The checker catches the deliberately unsafe cluster mode (issue 8): confirm before Raft commit.

chaos/scenarios/qq-unsafe-confirm-before-commit.toml on a real 3-node cluster, twice: with the test-only node setting
`test_unsafe_confirm_before_commit` on every node, and with the same schedule and no setting. The publisher is on
rmq1; rmq2 and rmq3 (the quorum queue's other members) are killed, so no commit is possible while rmq1 is alone;
rmq1 is killed in turn; rmq2 and rmq3 come back and elect a leader, then rmq1; every queue is drained.

Unsafe: rmq1 confirms its publishes while alone (its replica applies them before any commit); they are in no
majority's log and rmq1's memory dies with it, so the checker must count confirmed messages lost and the report
must fail the run. Safe: the publish rmq1 holds while alone is never confirmed, and nothing confirmed is lost.
Deterministic by construction: nothing can commit while two of three members are dead, and rmq1, the only node
that could hold the unsafe entries, rejoins only after the other two elected a leader that overwrites its log.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from chaos.history import Fault, Publish
from chaos.report import report_json, report_text
from chaos.run import RunOutcome, run_scenario, spawned_environment
from chaos.scenario import Scenario, load_scenario

SCENARIO = "qq-unsafe-confirm-before-commit"


def run_on_fresh_cluster(scenario: Scenario) -> tuple[RunOutcome, str]:
    # Its own temp dir: pytest's numbered base dirs are pruned by any other pytest session started meanwhile.
    with tempfile.TemporaryDirectory(prefix="raftmq-unsafe-") as root, \
            spawned_environment(scenario.nodes, data_dir=Path(root), node_args=scenario.node_args()) as env:
        outcome = run_scenario(scenario, env)
        unsafe_warned = "TEST-ONLY UNSAFE MODE test_unsafe_confirm_before_commit" in (
            Path(root) / "rmq1.log").read_text(errors="replace")
    extra = {"drained": outcome.drained, "node_settings": scenario.node_settings,
             "expect_loss": scenario.expect_loss}
    text = report_text(report_json(scenario.name, outcome.result, outcome.records, extra))
    print(text)
    assert unsafe_warned == scenario.expect_loss
    return outcome, text


def confirmed_while_rmq1_alone(outcome: RunOutcome) -> list[Publish]:
    """Publishes sent after the kill of rmq3 (rmq2 already dead) and confirmed before the kill of rmq1."""
    kills = {f.target: f.at_ms for f in outcome.records if isinstance(f, Fault) and f.kind == "kill"}
    assert sorted(kills) == ["rmq1", "rmq2", "rmq3"] and kills["rmq2"] <= kills["rmq3"] < kills["rmq1"]
    return [p for p in outcome.records if isinstance(p, Publish) and p.outcome == "confirmed"
            and p.sent_ms >= kills["rmq3"] and p.settled_ms is not None and p.settled_ms <= kills["rmq1"]]


def test_the_scenario_is_marked_unsafe() -> None:
    scenario = load_scenario(SCENARIO)
    assert scenario.expect_loss and scenario.nodes == 3
    assert scenario.node_args() == ("--test-unsafe-confirm-before-commit", "true")
    assert not replace(scenario, node_settings={}).expect_loss


def test_confirm_before_commit_loses_confirmed_messages_and_the_checker_fails_the_run() -> None:
    outcome, text = run_on_fresh_cluster(load_scenario(SCENARIO))
    result = outcome.result
    alone = confirmed_while_rmq1_alone(outcome)
    assert outcome.error is None and outcome.drained and outcome.published_all
    assert len(alone) > 0  # the unsafe node confirmed without a majority
    assert len(result.lost) > 0
    # All but (at most) a publish that caught rmq3 in the instant between its kill being recorded and its death.
    assert len([p for p in alone if p.payload_id not in set(result.lost)]) <= 1
    assert result.unexpected == ()
    assert not result.valid and not outcome.valid
    assert text.startswith(f"scenario {SCENARIO}: FAIL") and "DELIBERATELY UNSAFE" in text


def test_the_same_schedule_without_the_setting_loses_nothing_confirmed() -> None:
    scenario = replace(load_scenario(SCENARIO), name="qq-safe-same-schedule", node_settings={})
    outcome, text = run_on_fresh_cluster(scenario)
    result = outcome.result
    assert outcome.error is None and outcome.drained and outcome.published_all
    assert len(confirmed_while_rmq1_alone(outcome)) <= 1  # (the same instant as above); then rmq1 waits
    assert result.lost == () and result.unexpected == ()
    assert result.confirmed >= 30
    assert result.valid and outcome.valid
    assert text.startswith("scenario qq-safe-same-schedule: PASS") and "UNSAFE" not in text
