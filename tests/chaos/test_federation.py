"""Federation chaos scenarios (chaos/federation.py, chaos/scenarios/federation-*.toml), pure parts: the bundled
scenarios' shape and copies of a link counted from the `federation link copy` log lines. A short run on real
processes is in test_federation_processes.py; the full scenarios run with `raftmq chaos run
federation-kill-link-node` etc.; docs/chaos.md has the verdicts of full runs.
"""

from __future__ import annotations

import pytest

from chaos.federation import COPY_LINE, FederationSettings
from chaos.scenario import ScenarioError, load_scenario
from chaos.shovel import count_copies

SCENARIOS = ("federation-kill-link-node", "federation-partition", "federation-restart-upstream")


def test_bundled_federation_scenarios_need_nothing_but_themselves() -> None:
    for name in SCENARIOS:
        scenario = load_scenario(name)
        assert scenario.federation is not None and scenario.two_clusters and scenario.needs() == set()
        config = scenario.workload_config(())
        assert config.publish_exchange == "chaos-fx" and scenario.workload["messages_per_publisher"] == 0
    kinds = {(step.action, step.target) for name in SCENARIOS for step in load_scenario(name).steps
             if step.action in ("kill", "restart")}
    assert kinds == {("kill", "link-node"), ("restart", "down"), ("restart", "upstream")}
    assert FederationSettings.parse({"downstream_nodes": 1}).ack_mode == "on-confirm"
    with pytest.raises(ScenarioError):
        FederationSettings.parse({"downstream_node": 1})  # misspelt keys are refused, not ignored


def _line(what: str, at_ms: int, name: str = "abcd1234") -> str:
    return (f'INFO raftmq.federation: federation link copy {what} {{"name": "{name}", "link": "x", "node": "n", '
            f'"at_ms": {at_ms}}}\n')


def test_copies_of_a_link_are_counted_from_its_log_lines() -> None:
    logs = {"rmq1": _line("started", 10) + _line("started", 12, "other"),
            "rmq2": _line("started", 60) + _line("stopped", 85), "rmq3": _line("started", 80)}
    counted = count_copies(logs, {"rmq1": [50]}, "abcd1234", COPY_LINE)
    assert counted.intervals == (("rmq1", 10, 50), ("rmq2", 60, 85), ("rmq3", 80, None))
    assert counted.most == 2 and {i[0] for i in counted.overlap} == {"rmq2", "rmq3"}


def test_the_queue_federation_scenario_federates_the_workload_queue() -> None:
    scenario = load_scenario("federation-queue-kill-link-node")
    assert scenario.federation is not None and scenario.needs() == set()
    settings = FederationSettings.parse(scenario.federation)
    assert settings.kind == "queue" and settings.ack_mode == "on-confirm"
    assert scenario.workload_config(()).publish_exchange == ""  # publishers on the upstream queue itself
    assert {(s.action, s.target) for s in scenario.steps if s.action in ("kill", "restart")} == {
        ("kill", "link-node"), ("restart", "down")}
    with pytest.raises(ScenarioError):
        FederationSettings.parse({"kind": "stream"})
