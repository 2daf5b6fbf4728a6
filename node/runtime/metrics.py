"""Prometheus metrics in the text exposition format (0.0.4): `GET /metrics` and `GET /metrics/per-object`.

What it is for: RabbitMQ's rabbitmq_prometheus plugin serves these on port 15692; raftmq serves them on
`prometheus_port` (15692 by default, 0: off) and on the management port, with RabbitMQ's metric names where one
exists. `/metrics` aggregates (one sample per metric, summed over queues, as RabbitMQ's default does);
`/metrics/per-object` adds `vhost`/`queue` labels per queue. Ours, for what RabbitMQ lacks:
`raftmq_raft_follower_lag_entries{queue,vhost,follower}` (per object only; on a queue's Raft leader: its last
index minus the follower's match index), and for mirrored queues (docs/mirrored_queues.md)
`raftmq_mirror_isr_size{queue,vhost}` and `raftmq_mirror_high_watermark{queue,vhost}` (per object only; as this
node knows them: the committed ISR, its replica's HW), and in `/metrics` the counts over them:
`raftmq_mirror_queues`, `raftmq_mirror_queues_under_replicated` (ISR smaller than the replicas),
`raftmq_mirror_queues_below_min_insync` (ISR below `ha-min-insync`: publishes are held, then nacked) and
`raftmq_mirror_queues_without_leader` (no replica may lead: unavailable).

How it works: `render(view, counters, per_object)` reads the broker's tables on the trio thread (queue machines'
counts, connections, channels, consumers), the node's counters (`messages_received`, `messages_delivered`,
counted by node/runtime/dispatch.py as publishes arrive and deliveries leave, so they are monotonic whatever the
channels do), the broker's own counters (`messages_confirmed`, `messages_routed`, `messages_unroutable_*`,
node/broker/state.py, counted where publishes are routed and confirms sent), the resource probe (memory limit, RSS, free disk) and, in cluster mode, `view.raft_groups()` (each
hosted queue group's Raft status). One pass per table; no per-queue JSON rows are built.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str,
               samples: Iterable[tuple[dict[str, str], float]]) -> None:
        self.lines.append(f"# TYPE {name} {kind}")
        self.lines.append(f"# HELP {name} {help_text}")
        for labels, value in samples:
            if labels:
                text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                self.lines.append(f"{name}{{{text}}} {value:g}" if isinstance(value, float)
                                  else f"{name}{{{text}}} {value}")
            else:
                self.lines.append(f"{name} {value}")

    def rendered(self, name: str, help_text: str, samples: Iterable[tuple[str, int]]) -> None:
        """A gauge whose label sets come rendered (`{vhost="..",queue=".."}`), shared by several metrics."""
        self.lines.append(f"# TYPE {name} gauge")
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.extend(f"{name}{labels} {value}" for labels, value in samples)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


QUEUE_METRICS = (
    ("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth"),
    ("rabbitmq_queue_consumers", "Consumers on a queue"),
)
RAFT_METRICS = (
    ("rabbitmq_raft_term_total", "counter", "The current Raft term number", "term"),
    ("rabbitmq_raft_log_commit_index", "gauge", "Raft log commit index", "commit"),
    ("rabbitmq_raft_log_last_applied_index", "gauge", "Raft log last applied index", "applied"),
    ("rabbitmq_raft_log_last_written_index", "gauge", "Raft log last written index", "last_index"),
)


def render(view: Any, counters: Any, probe: Any, per_object: bool) -> str:
    broker = view.broker
    out = _Out()
    queue_rows: list[tuple[str, tuple[int, int, int, int]]] = []
    totals = [0, 0, 0, 0]
    for vhost_name, vhost in broker.vhosts.items():
        for name, queue in vhost.queues.items():
            machine = queue.machine
            ready, unacked, consumers = machine.ready_count, machine.unacked_count, machine.consumer_count
            values = (ready, unacked, ready + unacked, consumers)
            for i, v in enumerate(values):
                totals[i] += v
            if per_object:
                queue_rows.append((f'{{vhost="{_escape(vhost_name)}",queue="{_escape(name)}"}}', values))
    node_label = {"rabbitmq_node": view.node_name, "rabbitmq_cluster": view.cluster_name}
    out.metric("rabbitmq_identity_info", "untyped", "RabbitMQ node & cluster identity info", [(node_label, 1)])
    out.metric("rabbitmq_queues", "gauge", "Queues available", [({}, sum(len(v.queues) for v in
                                                                        broker.vhosts.values()))])
    for i, (name, help_text) in enumerate(QUEUE_METRICS):
        if per_object:  # the label text of each queue is rendered once for all four metrics
            out.rendered(name, help_text, [(labels, values[i]) for labels, values in queue_rows])
        else:
            out.metric(name, "gauge", help_text, [({}, totals[i])])
    conns = broker.conns.values()
    out.metric("rabbitmq_connections", "gauge", "Connections currently open", [({}, len(broker.conns))])
    out.metric("rabbitmq_channels", "gauge", "Channels currently open",
               [({}, sum(len(c.channels) for c in conns))])
    out.metric("rabbitmq_consumers", "gauge", "Consumers currently connected", [({}, len(broker.consumers))])
    out.metric("rabbitmq_global_messages_received_total", "counter",
               "Total number of messages received from publishers",
               [({}, getattr(counters, "messages_received", 0))])
    out.metric("rabbitmq_global_messages_delivered_total", "counter",
               "Total number of messages delivered to consumers (deliveries and basic.get)",
               [({}, getattr(counters, "messages_delivered", 0))])
    for name, help_text, value in (
            ("rabbitmq_global_messages_confirmed_total", "Total number of messages confirmed to publishers",
             broker.messages_confirmed),
            ("rabbitmq_global_messages_routed_total", "Total number of messages routed to queues",
             broker.messages_routed),
            ("rabbitmq_global_messages_unroutable_dropped_total",
             "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
             broker.messages_unroutable_dropped),
            ("rabbitmq_global_messages_unroutable_returned_total",
             "Total number of messages published as mandatory into an exchange and returned to the publisher as "
             "unroutable", broker.messages_unroutable_returned)):
        out.metric(name, "counter", help_text, [({}, value)])
    if probe is not None:
        from node.runtime.probes import disk_free_bytes, rss_bytes

        out.metric("rabbitmq_resident_memory_limit_bytes", "gauge",
                   "Memory high watermark in bytes", [({}, probe.memory_limit_bytes)])
        out.metric("rabbitmq_process_resident_memory_bytes", "gauge", "Memory used in bytes", [({}, rss_bytes())])
        free = disk_free_bytes(probe.data_dir)
        if free is not None:
            out.metric("rabbitmq_disk_space_available_bytes", "gauge", "Disk space available in bytes",
                       [({}, free)])
    out.metric("rabbitmq_alarms_memory_used_watermark", "gauge",
               "1 if the memory alarm is in effect", [({}, int("memory" in broker.alarms))])
    out.metric("rabbitmq_alarms_free_disk_space_watermark", "gauge",
               "1 if the free disk space alarm is in effect", [({}, int("disk" in broker.alarms))])
    _raft(out, view.raft_groups(), per_object)
    mirrors = getattr(view, "mirror_statuses", None)
    if mirrors is not None:
        (_mirrors if per_object else _mirror_totals)(out, mirrors())
    return out.text()


def _mirrors(out: _Out, rows: list[tuple[str, str, dict[str, Any]]]) -> None:
    if not rows:
        return
    out.metric("raftmq_mirror_isr_size", "gauge", "A mirrored queue's in-sync replicas (the committed ISR)",
               [({"vhost": vhost, "queue": queue}, len(status["isr"])) for vhost, queue, status in rows])
    out.metric("raftmq_mirror_high_watermark", "gauge", "A mirrored queue's high watermark on this node's replica",
               [({"vhost": vhost, "queue": queue}, int(status["hw"])) for vhost, queue, status in rows])


MIRROR_TOTALS = (
    ("raftmq_mirror_queues", "Mirrored queues with a replica on this node"),
    ("raftmq_mirror_queues_under_replicated", "Mirrored queues whose ISR is smaller than their replicas"),
    ("raftmq_mirror_queues_below_min_insync", "Mirrored queues whose ISR is below ha-min-insync (publishes held)"),
    ("raftmq_mirror_queues_without_leader", "Mirrored queues that no replica may lead (unavailable)"),
)


def _mirror_totals(out: _Out, rows: list[tuple[str, str, dict[str, Any]]]) -> None:
    """Counts over every mirrored queue this node knows (zeros included: an alert needs the series)."""
    statuses = [status for _, _, status in rows]
    counts = (
        len(statuses),
        sum(len(s["isr"]) < len(s["replicas"]) for s in statuses),
        sum(len(s["isr"]) < int(s["min_insync"]) for s in statuses),
        sum(not s["leader"] for s in statuses),
    )
    for (name, help_text), count in zip(MIRROR_TOTALS, counts, strict=True):
        out.metric(name, "gauge", help_text, [({}, count)])


def _raft(out: _Out, groups: list[tuple[str, str, dict[str, Any]]], per_object: bool) -> None:
    if not groups:
        return
    for name, kind, help_text, key in RAFT_METRICS:
        if per_object:
            samples = [({"vhost": vhost, "queue": queue}, int(status.get(key, 0))) for vhost, queue, status in groups]
        else:
            samples = [({}, sum(int(status.get(key, 0)) for _, _, status in groups))]
        out.metric(name, kind, help_text, samples)
    if per_object:
        lag: list[tuple[dict[str, str], float]] = []
        for vhost, queue, status in groups:
            last = int(status.get("last_index", 0))
            for follower, match in (status.get("match") or {}).items():
                if follower != status.get("leader"):
                    lag.append(({"vhost": vhost, "queue": queue, "follower": str(follower)}, last - int(match)))
        out.metric("raftmq_raft_follower_lag_entries", "gauge",
                   "On a queue's Raft leader: log entries a follower has yet to replicate", lag)
