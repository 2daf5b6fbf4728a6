"""Workload (b) on a real cluster: persistent 100 B messages through a 3-replica quorum queue, 1 publisher (confirm
window) + 1 consumer (prefetch, multiple acks), in two client layouts.

For each layout a fresh quorum queue (x-queue-type=quorum) is declared through the cluster's first node; the run
waits until the cluster reports the queue's leader (and its members: anything but `replicas_wanted` is an error,
so a figure never comes from an unreplicated queue), then places the clients relative to that leader:
- "b": the publisher on one follower and the consumer on the other follower (every node works: see
  `bench.clusters.spread_layout`);
- "b@leader": publisher and consumer both on the leader's node;
- "b@<rate>/s" (with `RunSettings.rates_for` containing "b"): the "b" layout with the publisher paced at a fixed rate,
  every message timed.
Before them, with `RunSettings.new_queue_trials`, "b/new-q" times the first message on new quorum queues, declared
round-robin on the cluster's nodes (`bench.newqueue`).
Each Measurement's `note` says which node got which client and where the leader was (and whether the leader had
moved by the end of the run: under CPU starvation an election may move it, and the layout no longer holds). The same code measures
raftmq (`bench.brokers.RaftmqCluster`) and RabbitMQ (`bench.brokers.RabbitCluster`), so the labels pair up and
the results table shows both ratios.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence

from bench.clusters import ClientNodes, ClusterNode, Placement, QueueCluster, leader_layout, spread_layout
from bench.cpu import CpuWindow, local_listening_pid
from bench.processes import run_workers
from bench.workloads import (
    CPU_WINDOW_MARGIN_S,
    Measurement,
    RunSettings,
    Topology,
    declare,
    delete,
    measure,
    new_queue_trials,
    rate_label,
    run_id,
    single_queue_layout,
)

QUORUM_ARGUMENTS: dict[str, str | int | bool] = {"x-queue-type": "quorum"}
PLACEMENT_TIMEOUT_S = 60.0
PLACEMENT_POLL_S = 0.5
LAYOUTS: dict[str, Callable[[Sequence[ClusterNode], Placement], ClientNodes]] = {
    "b": spread_layout,
    "b@leader": leader_layout,
}


class PlacementError(Exception):
    """The queue's leader or replicas could not be established."""


def wait_placement(
    cluster: QueueCluster, queue: str, replicas_wanted: int, timeout_s: float = PLACEMENT_TIMEOUT_S,
    sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
) -> Placement:
    """Poll the cluster until the queue has a leader and `replicas_wanted` members (members unknown -- an empty
    tuple -- is accepted only when nothing better shows up before the deadline)."""
    deadline = clock() + timeout_s
    best: Placement | None = None
    while True:
        placement = cluster.placement(queue)
        if placement is not None:
            if len(placement.members) == replicas_wanted:
                return placement
            best = placement
        if clock() >= deadline:
            break
        sleep(PLACEMENT_POLL_S)
    if best is None:
        raise PlacementError(f"no leader known for queue {queue!r} after {timeout_s:.0f}s")
    if best.members:
        raise PlacementError(f"queue {queue!r} has {len(best.members)} replicas {best.members}, wanted"
                             f" {replicas_wanted}")
    return best


def leader_moved(before: Placement, after: Placement | None) -> str:
    """A note when the queue's leader changed during the run (an election: the layout no longer held)."""
    if after is None:
        return "; leader unknown after the run"
    return "" if after.leader == before.leader else f"; LEADER MOVED to {after.leader} during the run"


def run_quorum_workload(
    broker: str, cluster: QueueCluster, settings: RunSettings, labels: Sequence[str] = tuple(LAYOUTS),
    arguments: Mapping[str, str | int | bool] = QUORUM_ARGUMENTS, queue_prefix: str = "bench-b",
) -> list[Measurement]:
    """Workload (b): first the new-queue trials when `settings.new_queue_trials` asks (round-robin over the nodes,
    "b/new-q"), then each layout of `labels` at saturation, then, when "b" is in `settings.rates_for`, the "b"
    layout at each fixed rate ("b@<rate>/s"); a failed measurement becomes a Measurement with `error` set.
    `arguments` and `queue_prefix` declare another replicated queue the same way (`bench.mirrored`: a classic
    queue named to match an ha-mode policy)."""
    found = new_queue_trials("b", broker, [(node.name, node.endpoint) for node in cluster.nodes], settings,
                             dict(arguments))
    runs: list[tuple[str, str, float | None]] = [(label, label, None) for label in labels]
    if "b" in settings.rates_for:
        runs += [(rate_label("b", rate), "b", float(rate)) for rate in settings.latency_rates_msgs_per_s]
    for label, layout, rate in runs:
        try:
            found.append(_run_layout(broker, cluster, settings, label, layout, rate, arguments, queue_prefix))
        except Exception as error:  # one broken layout must not lose the other's figure
            found.append(Measurement(label=label, workload="b", broker=broker, error=repr(error),
                                     target_rate_msgs_per_s=rate))
    return found


def _run_layout(
    broker: str, cluster: QueueCluster, settings: RunSettings, label: str, layout: str, rate: float | None = None,
    arguments: Mapping[str, str | int | bool] = QUORUM_ARGUMENTS, queue_prefix: str = "bench-b",
) -> Measurement:
    queue = f"{queue_prefix}-{label.replace('@', '-').replace('/', '')}-{run_id()}"
    topology = Topology((queue,), dict(arguments))
    control = cluster.nodes[0].endpoint
    declare(control, topology)
    try:
        placement = wait_placement(cluster, queue, replicas_wanted=min(3, len(cluster.nodes)))
        clients = LAYOUTS[layout](cluster.nodes, placement)
        print(f"  {label}: {clients.description}", flush=True)
        load = os.getloadavg()[0]
        specs = single_queue_layout(clients.publisher.endpoint, queue, settings, rate_msgs_per_s=rate,
                                    sample_every=4 if rate is None else 1,
                                    consumer_endpoint=clients.consumer.endpoint, workload="b")
        pids = [local_listening_pid(node.endpoint.host, node.endpoint.port) for node in cluster.nodes]
        with CpuWindow(pids, settings.warmup_s + CPU_WINDOW_MARGIN_S, settings.duration_s - CPU_WINDOW_MARGIN_S) as cpu:
            results = run_workers(specs, settings.warmup_s, settings.duration_s)
        measured = dataclasses.replace(measure(label, "b", broker, results, rate), broker_cpu_cores=cpu.cores(),
                                       load_average_1m=load)
        note = f"{clients.description}{leader_moved(placement, cluster.placement(queue))}; load average {load:.1f} at start"
        return dataclasses.replace(measured, note=note)
    finally:
        delete(control, topology)
