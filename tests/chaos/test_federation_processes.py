"""A short version of the federation chaos scenario `federation-kill-link-node` on real processes (chaos/federation.py):
one upstream node, a 3-node downstream cluster, one round of kill -9 of the node running the link and its restart.
Everything confirmed upstream to the federated exchange must be consumed downstream; republished copies are
counted, not failures; never two copies of the link at once. About 30-45 s: a file of its own so that CI can leave
it out (tests/federation/test_exchange_cluster.py also kills the link's node, without the chaos checker).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from chaos.federation import FederatedClusters, federation_environment
from chaos.history import Fault
from chaos.report import report_json, report_text
from chaos.run import run_scenario
from chaos.scenario import load_scenario


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
