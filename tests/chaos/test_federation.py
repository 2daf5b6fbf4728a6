"""Federation chaos scenarios (chaos/federation.py, chaos/scenarios/federation-*.toml): the bundled scenarios' shape,
copies of a link counted from the `federation link copy` log lines, and a short version of
`federation-kill-link-node` on real processes (one upstream node, a 3-node downstream cluster, kill -9 of the node
running the link and restart): everything confirmed upstream to the federated exchange must be consumed
downstream; republished copies are counted, not failures; never two copies of the link at once. The full scenarios
run with `raftmq chaos run federation-kill-link-node` etc.; docs/chaos.md has the verdicts of full runs.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from chaos.federation import COPY_LINE, FederatedClusters, FederationSettings, federation_environment
from chaos.history import Fault
from chaos.report import report_json, report_text
from chaos.run import run_scenario
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


def test_kill_9_of_the_links_node_loses_nothing_confirmed() -> None:
    scenario = load_scenario("federation-kill-link-node")
    steps = tuple(replace(step, more_confirmed=min(step.more_confirmed, 60)) if step.more_confirmed
                  else replace(step, seconds=min(step.seconds, 2.0)) if step.action == "wait" else step
                  for step in scenario.steps)
    scenario = replace(scenario, loop=1, steps=steps, publish_timeout_s=60.0)
    queue = scenario.workload_config(()).queues[0]
    with tempfile.TemporaryDirectory(prefix="raftmq-fed-chaos-") as root, \
            federation_environment(scenario.federation or {}, queue, scenario.seed, data_dir=Path(root)) as env:
        assert isinstance(env.cluster, FederatedClusters)
        runner = env.cluster.link_node()
        outcome = run_scenario(scenario, env)
        copies = env.cluster.copies
    print(report_text(report_json(scenario.name, outcome.result, outcome.records, {"drained": outcome.drained})))
    print(f"duplicates (republished copies): {sum(count - 1 for _, count in outcome.result.duplicated)}")
    print(f"copies of the link: {copies}")
    [kill] = [r for r in outcome.records if isinstance(r, Fault) and r.kind == "kill"]
    assert runner is not None and kill.target == f"down.{runner}"  # the node running the link, not a fallback
    assert copies is not None and copies.most == 1 and copies.intervals  # never two copies at once
    assert outcome.error is None and outcome.published_all and outcome.drained and not outcome.overflowed
    result = outcome.result
    assert result.lost == () and result.unexpected == () and result.valid
    assert result.confirmed >= 60
