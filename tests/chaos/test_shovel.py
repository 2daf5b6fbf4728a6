"""Shovel chaos scenarios (chaos/shovel.py, chaos/scenarios/shovel-*.toml): the checker's `copies` mode, the
bundled scenarios' shape, and a short version of `shovel-kill-runner` on real processes: a 3-node source cluster,
a dynamic on-confirm shovel to a destination (one node here, to keep CI short; the bundled scenarios use 3), kill -9
of the node running the shovel and restart, and a 9 s partition between the clusters. Everything confirmed to the source must be consumed at the
destination; republished copies are counted, not failures; never two copies of the shovel may run at once
(`count_copies`, from the source nodes' copy reports and kill times). The full scenarios run with `raftmq chaos run
shovel-kill-runner` etc.; docs/chaos.md has the verdicts of full runs.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from chaos.checker import check
from chaos.history import Ack, Delivery, Fault, Publish
from chaos.report import report_json, report_text
from chaos.run import RunOutcome, run_scenario
from chaos.scenario import Scenario, ScenarioError, load_scenario
from chaos.shovel import ShovelSettings, TwoClusters, count_copies, shovel_environment

SHOVEL_SCENARIOS = ("shovel-kill-runner", "shovel-kill-dest-leader", "shovel-partition", "shovel-restart-source")


def test_copies_mode_counts_republished_copies_but_still_fails_a_loss() -> None:
    publishes = [Publish("p", 0, "a", "q", "confirmed", 0, 1), Publish("p", 1, "b", "q", "confirmed", 1, 2)]
    # "a" arrives twice as two fresh messages (the shovel republished it), the second after the first was acked
    # and that consumer's connection closed cleanly
    deliveries = [Delivery("a", "c", "q", False, 3), Delivery("b", "c", "q", False, 4),
                  Delivery("a", "d", "q", False, 9)]
    acks = [Ack("a", "c", "q", 3.5), Ack("b", "c", "q", 4.5), Ack("a", "d", "q", 9.5)]
    faults = [Fault("closed", "c", 5.0)]
    strict = check(publishes, deliveries, acks, faults)
    assert not strict.valid and strict.unflagged_redeliveries and strict.redelivered_after_settled_ack
    shovelled = check(publishes, deliveries, acks, faults, copies=True)
    assert shovelled.valid and shovelled.duplicated == (("a", 2),)
    assert shovelled.summary()["copies_expected"] is True
    assert not check(publishes, deliveries[:1], copies=True).valid  # "b" confirmed, never consumed: lost


def _line(what: str, at_ms: int, name: str = "chaos-shovel") -> str:
    return f'INFO raftmq.shovel: shovel copy {what} {{"vhost": "/", "name": "{name}", "node": "x", "at_ms": {at_ms}}}\n'


def test_copies_are_counted_from_the_logs_and_kill_times() -> None:
    # rmq1 runs it, is killed at 50 (no stopped line), restarted, takes it back at 90; rmq2 ran it from 60 to 85
    logs = {"rmq1": _line("started", 10) + _line("started", 90, "other") + _line("started", 90),
            "rmq2": _line("started", 60) + _line("stopped", 85), "rmq3": ""}
    counted = count_copies(logs, {"rmq1": [50]}, "chaos-shovel")
    assert counted.most == 1
    assert counted.intervals == (("rmq1", 10, 50), ("rmq2", 60, 85), ("rmq1", 90, None))
    # without the kill time, rmq1's first copy would still run when rmq2's starts: two at once
    twice = count_copies(logs, {}, "chaos-shovel")
    assert twice.most == 2 and {i[0] for i in twice.overlap} == {"rmq1", "rmq2"}
    # a start at the very moment the other copy stopped is not an overlap
    assert count_copies({"a": _line("started", 1) + _line("stopped", 5), "b": _line("started", 5)}, {},
                        "chaos-shovel").most == 1


def test_bundled_shovel_scenarios_need_nothing_but_themselves() -> None:
    for name in SHOVEL_SCENARIOS:
        scenario = load_scenario(name)
        assert scenario.shovel is not None and scenario.needs() == set()  # the partition uses its own fault proxy
        assert scenario.workload["messages_per_publisher"] == 0  # sized by duration
    targets = {step.target for name in SHOVEL_SCENARIOS for step in load_scenario(name).steps
               if step.action == "kill"}
    assert targets == {"shovel-node", "dest-leader"}
    assert ShovelSettings.parse({"dest_nodes": 1}).ack_mode == "on-confirm"
    with pytest.raises(ScenarioError):
        ShovelSettings.parse({"dest_node": 1})  # misspelt keys are refused, not ignored


def shortened(name: str, fault_seconds_max: float) -> Scenario:
    """The bundled scenario, one round, fewer confirms before the fault, shorter waits, one destination node."""
    scenario = load_scenario(name)
    steps = tuple(replace(step, more_confirmed=min(step.more_confirmed, 60)) if step.more_confirmed
                  else replace(step, seconds=min(step.seconds, fault_seconds_max)) if step.action == "wait" else step
                  for step in scenario.steps)
    return replace(scenario, loop=1, steps=steps, shovel={**(scenario.shovel or {}), "dest_nodes": 1},
                   publish_timeout_s=60.0)


def run_short(scenario: Scenario) -> tuple[RunOutcome, str | None]:
    """Run it on its own two clusters; the outcome and the node that ran the shovel before the faults."""
    queue = scenario.workload_config(()).queues[0]
    with tempfile.TemporaryDirectory(prefix="raftmq-shovel-chaos-") as root, \
            shovel_environment(scenario.shovel or {}, queue, scenario.seed, data_dir=Path(root)) as env:
        assert isinstance(env.cluster, TwoClusters)
        runner = env.cluster.shovel_node()
        outcome = run_scenario(scenario, env)
        copies = env.cluster.copies
    print(report_text(report_json(scenario.name, outcome.result, outcome.records, {"drained": outcome.drained})))
    print(f"duplicates (republished copies): {sum(count - 1 for _, count in outcome.result.duplicated)}")
    print(f"copies of the shovel: {copies}")
    assert copies is not None and copies.most == 1 and copies.intervals  # never two copies at once
    assert outcome.error is None and outcome.published_all and outcome.drained and not outcome.overflowed
    result = outcome.result
    assert result.lost == () and result.unexpected == () and result.valid
    assert result.confirmed >= 60
    return outcome, runner


def test_kill_9_of_the_shovels_node_loses_nothing_confirmed() -> None:
    scenario = shortened("shovel-kill-runner", 2.0)
    assert [step.action for step in scenario.steps] == ["wait", "kill", "wait", "restart"]
    outcome, runner = run_short(scenario)
    [kill] = [r for r in outcome.records if isinstance(r, Fault) and r.kind == "kill"]
    assert runner is not None and kill.target == f"src.{runner}"  # the node running the shovel, not a fallback


def test_a_partition_between_the_clusters_loses_nothing_confirmed() -> None:
    # 9 s: longer than two of the shovel link's 4 s heartbeats, so the shovel notices and reconnects after the heal
    scenario = shortened("shovel-partition", 9.0)
    steps = tuple(replace(step, proxy="shovel-dest-rmq1") if step.action.startswith("toxic") else step
                  for step in scenario.steps)  # one destination node here, so one proxy
    outcome, _ = run_short(replace(scenario, steps=steps))
    cut = [r.target for r in outcome.records if isinstance(r, Fault) and r.kind == "toxic-add"]
    assert cut == ["shovel-dest-rmq1", "shovel-dest-rmq1"]  # both directions of the one destination node's proxy
