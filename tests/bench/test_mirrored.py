"""`raftmq bench mirrored`'s pure parts: where a mirrored queue's leader and in-sync replicas are (raftmq's
management row, RabbitMQ's `rabbitmqctl eval` answer) and the table. The measurement itself needs two 3-node
clusters and is run by hand (docs/benchmarks.md)."""

from __future__ import annotations

import json

from bench.client import Endpoint
from bench.clusters import ClusterNode, Placement
from bench.mirrored import (
    Row,
    failover_timeline,
    format_table,
    metadata_leader_of,
    rabbit_mirror_placement,
    rabbit_mirror_query,
    raftmq_mirror_placement,
)
from bench.workloads import Measurement, RunSettings


def test_raftmq_mirror_placement_is_the_leader_and_the_isr() -> None:
    row = {"name": "bench-m-x", "mirror": {"leader": "rmq2", "epoch": 1, "replicas": ["rmq1", "rmq2", "rmq3"],
                                           "isr": ["rmq2", "rmq3"], "hw": 10}}
    assert raftmq_mirror_placement(json.dumps(row)) == Placement("rmq2", ("rmq2", "rmq3"))


def test_raftmq_mirror_placement_unknown_while_no_leader_or_no_mirror() -> None:
    assert raftmq_mirror_placement("not json") is None
    assert raftmq_mirror_placement(json.dumps({"name": "q"})) is None  # a classic queue: no mirror record
    assert raftmq_mirror_placement(json.dumps({"mirror": {"leader": None, "isr": []}})) is None


def test_rabbit_mirror_placement_from_eval_output() -> None:
    output = "{'b0n1@localhost',['b0n0@localhost','b0n2@localhost']}\n"
    assert rabbit_mirror_placement(output) == Placement("b0n1@localhost",
                                                        ("b0n1@localhost", "b0n0@localhost", "b0n2@localhost"))
    assert rabbit_mirror_placement("{'b0n1@localhost',[]}") == Placement("b0n1@localhost", ("b0n1@localhost",))
    assert rabbit_mirror_placement("none\n") is None
    assert rabbit_mirror_placement("") is None


def test_rabbit_mirror_query_quotes_the_names() -> None:
    query = rabbit_mirror_query('odd"name', vhost="/")
    assert '<<"odd\\"name">>' in query and '<<"/">>' in query and query.endswith(".")


def test_table_has_one_row_per_queue_with_failover_and_errors() -> None:
    flow = Measurement("mirrored/b", "mirrored", "raftmq", confirmed_msgs_per_s=1234.4, delivered_msgs_per_s=1200,
                       latency_p50_ms=5.25, latency_p99_ms=40.0)
    rows = [Row("raftmq mirrored", flow, (812.0,)), Row("raftmq quorum", flow, (300.0, 500.0, 400.0)),
            Row("RabbitMQ mirrored", None, error="cluster did not start")]
    text = format_table(rows, 20.5, 19.0, "2026-11-27 13:00 UTC", "3.10.8", RunSettings(duration_s=5, warmup_s=1))
    assert "load average (1 min) 20.5 at start, 19.0 at end" in text
    assert "| raftmq mirrored | 1,234 | 1,200 | 5.2 | 40.0 | 812 |" in text
    assert "| raftmq quorum | 1,234 | 1,200 | 5.2 | 40.0 | 300, 500, 400 (median 400) |" in text
    assert "| RabbitMQ mirrored | - | - | - | - | - |" in text
    assert "- RabbitMQ mirrored: cluster did not start" in text


def test_failover_timeline_takes_the_first_survivor_to_see_each_stage() -> None:
    lines = {
        "rmq2": [(100.150, b"... WARNING x: cluster: node rmq1 refuses connections (its process is gone): down"),
                 (100.900, b"... INFO x: cluster: mirrored queue //bench-m-failover: leader rmq2, epoch 1, ISR rmq2")],
        "rmq3": [(100.120, b"... WARNING x: cluster: node rmq1 refuses connections (its process is gone): down"),
                 (100.050, b"... INFO x: cluster: mirrored queue //bench-m-failover: leader rmq1, epoch 0, ISR x"),
                 (100.300, b"... INFO x: cluster: mirrored queue //bench-m-failover: leader -, epoch 0, ISR x"),
                 (101.000, b"... INFO x: cluster: mirrored queue //bench-m-failover: leader rmq2, epoch 1, ISR x")],
    }
    assert failover_timeline(lines, "rmq1", "bench-m-failover", 100.0) == "down +120 ms, new leader rmq2 +900 ms"
    assert failover_timeline({}, "rmq1", "bench-m-failover", 100.0) == ""


def test_failover_timeline_has_the_fast_path_and_trace_stages() -> None:
    lines = {
        "rmq2": [(100.050, b"... cluster: mirrored queues: node rmq1 refuses connections: reporting it down as the"
                           b" leader of 1 queue(s)"),
                 (100.051, b"... cluster: mirrored queue //bench-m-failover: reporting rmq1 down (epoch 0, refuses"
                           b" connections)"),
                 (100.090, b"... cluster: mirror trace: metadata leader -"),
                 (100.100, b"... cluster: mirror trace: metadata leader rmq2"),
                 (100.160, b"... cluster: mirror trace: //bench-m-failover: MirrorReplicaDown committed in 9 ms: ok"),
                 (100.150, b"... cluster: mirrored queue //bench-m-failover: leader rmq2, epoch 1, ISR rmq2,rmq3")],
    }
    assert failover_timeline(lines, "rmq1", "bench-m-failover", 100.0) == (
        "refused +50 ms, reported +51 ms, metadata leader +100 ms, committed +160 ms, new leader rmq2 +150 ms")


def test_metadata_leader_is_the_node_whose_metadata_port_leads() -> None:
    nodes = (ClusterNode("rmq1", Endpoint("127.0.0.1", 10301)), ClusterNode("rmq2", Endpoint("127.0.0.1", 10302)))
    rows = [{"name": "rmq1", "metadata": {"leader": "127.0.0.1:31302"}}, {"name": "rmq2", "running": True}]
    assert metadata_leader_of(json.dumps(rows), nodes) == "rmq2"
    assert metadata_leader_of(json.dumps([{"name": "rmq1", "metadata": {"leader": None}}]), nodes) is None
    assert metadata_leader_of("not json", nodes) is None
