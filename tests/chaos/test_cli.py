"""`raftmq chaos` end to end: list, check, and runs on real nodes (process faults and toxics through our fault
proxy; partitions between nodes in network namespaces when root)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos import netns
from chaos.cli import main
from chaos.history import Delivery, Fault, Publish, write_history

# Every process fault and two toxics on one node, the workload going through our fault proxy.
MIXED = """
name = "cli-mixed"
nodes = 1
seed = 11
[workload]
queues = ["cli-mixed"]
publishers = 2
messages_per_publisher = 100
drain_idle_s = 0.5
[[steps]]
action = "wait"
confirmed = 20
[[steps]]
action = "toxic-add"
proxy = "amqp-rmq1"
toxic = { type = "latency", attributes = { latency = 50, jitter = 10 } }
[[steps]]
action = "pause"
target = "random"
[[steps]]
action = "wait"
seconds = 0.5
[[steps]]
action = "resume"
target = "paused"
[[steps]]
action = "toxic-remove"
proxy = "amqp-rmq1"
name = "latency_downstream"
[[steps]]
action = "kill"
target = "leader-of-queue"
[[steps]]
action = "restart"
target = "down"
[[steps]]
action = "toxic-add"
proxy = "amqp-rmq1"
toxic = { type = "reset_peer", name = "reset", attributes = { timeout = 50 } }
[[steps]]
action = "wait"
seconds = 0.3
"""

PARTITION = """
name = "cli-partition"
nodes = 2
[workload]
queues = ["cli-partition"]
publishers = 1
messages_per_publisher = 60
drain_idle_s = 0.5
[[steps]]
action = "wait"
confirmed = 10
[[steps]]
action = "partition"
shape = "isolate"
[[steps]]
action = "wait"
seconds = 0.3
[[steps]]
action = "heal"
"""


def test_list_names_the_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    assert "kill-9-loop" in capsys.readouterr().out


def test_unknown_scenario_or_missing_capability_is_exit_2() -> None:
    assert main(["run", "no-such-scenario"]) == 2
    assert main(["run", "latency-toxic"]) == 2  # toxic steps without --fault-proxy/--toxiproxy


def test_compose_target_refusals_are_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before any container is looked for (the compose target itself runs in tests/deploy/test_compose.py)."""
    assert main(["run", "qq-leader-pause", "--target", "compose"]) == 2
    assert "--target compose needs --urls" in capsys.readouterr().err
    assert main(["run", "qq-leader-pause", "--target", "compose", "--fault-proxy"]) == 2
    assert main(["run", "qq-unsafe-confirm-before-commit", "--target", "compose", "--urls", "amqp://x"]) == 2


def test_check_a_saved_history(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    write_history(path, [Publish("p", 0, "a", "q", "confirmed", 0, 1), Delivery("a", "c", "q", False, 2)])
    assert main(["check", str(path)]) == 0
    write_history(path, [Publish("p", 0, "a", "q", "confirmed", 0, 1)])
    assert main(["check", str(path)]) == 1


def test_run_process_faults_and_toxics_through_the_fault_proxy(tmp_path: Path) -> None:
    scenario = tmp_path / "mixed.toml"
    scenario.write_text(MIXED)
    assert main(["run", str(scenario), "--fault-proxy", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "cli-mixed" / "report.json").read_text())
    assert report["valid"] and report["summary"]["lost"] == 0 and report["summary"]["attempted"] == 200
    kinds = [fault["kind"] for fault in report["faults"]]
    assert kinds[:4] == ["toxic-add", "pause", "kill", "toxic-add"]
    assert (tmp_path / "out" / "cli-mixed" / "timeline.png").exists()


@pytest.mark.skipif(netns.available() is not None, reason=f"network namespaces: {netns.available()}")
def test_run_partition_between_nodes_in_namespaces(tmp_path: Path) -> None:
    from dataclasses import replace

    from chaos.run import run_scenario, spawned_environment
    from chaos.scenario import parse_scenario

    with spawned_environment(2, use_netns=True, data_dir=tmp_path / "nodes") as env:
        assert env.urls[0].startswith("amqp://guest:guest@10.")
        # Only rmq1: a classic queue lives on the node that declared it; rmq2 is cut off from it.
        outcome = run_scenario(parse_scenario(PARTITION), replace(env, urls=env.urls[:1]))
    assert outcome.valid and outcome.result.confirmed == 60
    faults = [r for r in outcome.records if isinstance(r, Fault) and r.kind != "purge"]
    assert [f.kind for f in faults][:2] == ["partition", "heal"] and faults[0].detail == "rmq1|rmq2"


KILL_RESTART = """
name = "cli-runner"
[workload]
queues = ["cli-runner"]
publishers = 1
messages_per_publisher = 80
drain_idle_s = 0.5
[[steps]]
action = "wait"
confirmed = 20
[[steps]]
action = "kill"
target = "leader-of-queue"
[[steps]]
action = "restart"
target = "down"
"""


def leave_a_stray_message(url: str, queue: str) -> None:
    """As an aborted earlier run would: without the purge it would be delivered and count as unexpected."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()  # in cluster mode an unconfirmed publish may still be in flight at close
        channel.basic_publish("", queue, b'{"id": "aborted-run-p0-0"}')
    finally:
        connection.close()


def test_run_against_a_cluster_started_by_raftmq_cluster_up(tmp_path: Path) -> None:
    from chaos.run import free_base_port
    from deploy.runner import load_state

    data_dir = tmp_path / "cluster"
    cluster_cli = [sys.executable, "-m", "node.cli", "cluster"]
    up = [*cluster_cli, "up", "--no-haproxy", "--detach", "--nodes", "1", "--base-port", str(free_base_port(1)),
          "--data-dir", str(data_dir)]
    subprocess.run(up, check=True, capture_output=True, timeout=120)
    try:
        state = load_state(data_dir)
        assert state is not None
        pid_before = state.nodes[0].pid
        leave_a_stray_message(f"amqp://guest:guest@{state.nodes[0].host}:{state.nodes[0].port}/%2F", "cli-runner")
        scenario = tmp_path / "runner.toml"
        scenario.write_text(KILL_RESTART)
        assert main(["run", str(scenario), "--cluster-dir", str(data_dir), "--out", str(tmp_path / "out")]) == 0
        history = (tmp_path / "out" / "cli-runner" / "history.jsonl").read_text()
        assert '"kind":"purge","target":"cli-runner"' in history and "1 messages" in history
        state = load_state(data_dir)
        assert state is not None and state.nodes[0].pid != pid_before  # the restarted node is recorded
    finally:
        subprocess.run([*cluster_cli, "down", "--data-dir", str(data_dir)], capture_output=True, timeout=60)


def test_proxy_command_serves_the_toxiproxy_api(tmp_path: Path) -> None:
    from toxiproxy import Toxiproxy

    from chaos.run import free_base_port

    port = free_base_port(1) + 1
    server = subprocess.Popen([sys.executable, "-m", "chaos.cli", "proxy", "--listen", f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and "Toxiproxy API" in server.stdout.readline()
        client = Toxiproxy()
        client.update_api_consumer("127.0.0.1", port)
        proxy = client.create(upstream="127.0.0.1:9", name="via-cli")
        proxy.add_toxic(type="slicer", attributes={"average_size": 8})
        assert list(proxy.toxics()) == ["slicer_downstream"]
    finally:
        server.terminate()
        server.wait(10)
