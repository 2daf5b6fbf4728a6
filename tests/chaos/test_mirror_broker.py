"""The mirrored-queue scenario `hw-truncation-loss` through the broker (chaos/mirror_broker.py, `--via broker`).

One 3-node raftmq cluster, one fault schedule, two queues side by side: the scenario as shipped (`ha-truncation:
leader-epoch`) and its unsafe variant (`ha-truncation: hw`), both mirrored on rmq1 and rmq2 by their policies,
published to with confirms through rmq3 (pika). The checker, reading each replica's log from its files, must find
nothing lost or diverged in the first and name the lost m0, m1 and the divergence at offset 0 in the second.
`unclean-election-loss` has a broker version too; it is run by hand (docs/mirrored_queues.md has its verdicts), to
keep CI short. Plus the checker and the parser on hand-built values.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.mirror_broker import (
    BrokerScenarioError,
    BrokerSpec,
    check_broker,
    parse_broker,
    report_text,
    run_broker,
    variant_policy,
)
from chaos.scenario import ScenarioError, load_scenario
from cluster.mirror_queues.core.types import Record


def _spec(name: str) -> BrokerSpec:
    mirror = load_scenario(name).mirror
    assert mirror is not None and "broker" in mirror
    return parse_broker(dict(mirror["broker"]))


def test_hw_truncation_loss_through_the_broker_fails_under_hw_only(tmp_path: Path) -> None:
    spec = _spec("hw-truncation-loss")
    result = run_broker(spec, tmp_path / "nodes", {"shipped": variant_policy(spec, False, {}),
                                                   "unsafe": variant_policy(spec, True, {})})
    print(report_text("hw-truncation-loss", result))
    shipped, unsafe = result.checks["shipped"], result.checks["unsafe"]
    assert shipped.valid, shipped.summary()
    # (the HW counts log records: a publish retried across the failover may sit twice, the machine drops the copy)
    assert shipped.counts["confirmed"] == 3 and shipped.hw >= 3 and shipped.leader == "rmq2"
    assert not unsafe.valid and not unsafe.problems, unsafe.summary()
    assert {item.split("@")[0].split(" ")[0] for item in unsafe.lost} == {"m0", "m1"}
    assert any(item.startswith("offset 0: rmq1 has m0, rmq2 has m2") for item in unsafe.diverged), unsafe.diverged


def test_the_checker_names_lost_and_diverged_messages() -> None:
    logs = {"rmq1": [Record(0, 0, "m0"), Record(1, 0, "m1")], "rmq2": [Record(0, 1, "m2"), Record(1, 1, "m3")]}
    check = check_broker(["m0", "m1", "m2"], logs, "rmq2", 2, [], {})
    assert check.lost == ("m0@0 (leader rmq2 has m2 there)", "m1@1 (leader rmq2 has m3 there)")
    assert check.diverged == ("offset 0: rmq1 has m0, rmq2 has m2", "offset 1: rmq1 has m1, rmq2 has m3")
    same = {"rmq1": logs["rmq2"], "rmq2": logs["rmq2"]}
    assert check_broker(["m2", "m3"], same, "rmq2", 2, [], {}).valid
    assert check_broker(["m9"], same, "rmq2", 2, [], {}).lost == ("m9 (no replica holds it)",)
    above = check_broker(["m3"], same, "rmq2", 1, [], {})  # held, but not below the HW
    assert not above.valid


def test_every_broker_version_parses_and_bad_steps_are_refused() -> None:
    assert _spec("unclean-election-loss").unsafe == {"ha-promote-on-failure": "always"}
    assert variant_policy(_spec("hw-truncation-loss"), False, {"truncation": "hw"})["ha-truncation"] == "hw"
    with pytest.raises(BrokerScenarioError, match="unknown broker step"):
        parse_broker({"policy": {"ha-mode": "all"}, "steps": [{"action": "isolate", "target": "b"}]})
    with pytest.raises(BrokerScenarioError, match="unknown replica"):
        parse_broker({"policy": {"ha-mode": "all"}, "steps": [{"action": "kill", "target": "d"}]})
    with pytest.raises(BrokerScenarioError, match="ha-mode"):
        parse_broker({"policy": {}, "steps": []})


def test_a_bad_broker_version_is_refused_when_the_scenario_loads(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\nnodes = 2\n[mirror]\nreplicas = ["a", "b"]\n'
                    '[mirror.broker]\npolicy = { "ha-mode" = "all" }\n'
                    '[[mirror.broker.steps]]\naction = "transfer"\ntarget = "b"\n')
    with pytest.raises(ScenarioError, match=r"\[mirror.broker\]: unknown broker step 'transfer'"):
        load_scenario(str(path))
