"""The short text report: the cluster summary, the followers that fell out of sync, the longest catch-ups, and for
mirrored queues each replica's time out of the ISR, lag and the queue's ISR shrinks/expands, and each replica's
log truncations (count, messages dropped, mode: an unsafe mode is marked).

Pure formatting of already-collected rows (dicts), so it is tested without Spark.
"""

from __future__ import annotations

from typing import Any

from spark_analytics.transforms import LagConfig

Row = dict[str, Any]


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value / 1000:.1f} s"


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def render_report(
    cluster: Row,
    followers: list[Row],
    episodes: list[Row],
    config: LagConfig,
    records: int,
    seconds: float,
    isr: list[Row] | None = None,
    truncations: list[Row] | None = None,
) -> str:
    """`followers` and `episodes` arrive sorted worst first and already limited to what is worth printing."""
    lines = [
        "raftmq replication lag report",
        f"input: {records:,} telemetry records in {seconds:.1f} s",
        f"out of sync when lag > {config.lag_threshold_entries:,} entries or > {_ms(config.lag_threshold_ms)};"
        f" windows of {_ms(config.window_ms)}",
        "",
        f"queues: {_num(cluster.get('groups'))}, followers: {_num(cluster.get('followers'))},"
        f" out of sync at some point: {_num(cluster.get('followers_out_of_sync'))}",
        f"lag (entries) p50/p99/max: {_num(cluster.get('lag_entries_p50'))} / {_num(cluster.get('lag_entries_p99'))}"
        f" / {_num(cluster.get('lag_entries_max'))}",
        f"append-to-persist p50/p99/max: {_num(cluster.get('persist_lag_ms_p50'))} /"
        f" {_num(cluster.get('persist_lag_ms_p99'))} / {_num(cluster.get('persist_lag_ms_max'))} ms",
        f"append-to-commit p50/p99/max: {_num(cluster.get('commit_lag_ms_p50'))} /"
        f" {_num(cluster.get('commit_lag_ms_p99'))} / {_num(cluster.get('commit_lag_ms_max'))} ms",
        f"time out of sync (all followers): {_ms(cluster.get('out_of_sync_ms'))};"
        f" episodes: {_num(cluster.get('episodes'))} (unrecovered: {_num(cluster.get('unrecovered_episodes'))}),"
        f" longest catch-up: {_ms(cluster.get('max_catch_up_ms'))}",
        "",
        "followers out of sync (worst first):",
    ]
    lagging = [row for row in followers if (row.get("out_of_sync_ms") or 0) > 0]
    lines += [
        f"  {row['group']} {row['follower']}: out of sync {_ms(row['out_of_sync_ms'])},"
        f" max lag {_num(row.get('lag_entries_max'))} entries / {_ms(row.get('lag_ms_max'))},"
        f" episodes {_num(row.get('episodes'))}, longest catch-up {_ms(row.get('max_catch_up_ms'))}"
        for row in lagging
    ] or ["  none"]
    lines += ["", "longest catch-ups:"]
    lines += [
        f"  {row['group']} {row['follower']}: {_ms(row.get('catch_up_ms'))}"
        f"{'' if row.get('recovered') else ' (not recovered)'}, max lag {_num(row.get('max_lag_entries'))} entries"
        for row in episodes
    ] or ["  none"]
    if isr:
        lines += ["", "mirrored queues, per replica (longest time out of the ISR first):"]
        for row in isr:
            away = f" ({row['unrecovered']} not back)" if row.get("unrecovered") else ""
            lines.append(
                f"  {row['group']} {row['replica']}: out of the ISR {_ms(row.get('out_of_isr_ms'))} in"
                f" {_num(row.get('out_of_isr_episodes'))} episode(s){away},"
                f" max lag {_num(row.get('lag_messages_max'))} messages / {_ms(row.get('lag_ms_max'))};"
                f" queue: {_num(row.get('shrinks'))} shrinks, {_num(row.get('expands'))} expands,"
                f" {_num(row.get('leader_changes'))} leader changes"
            )
    if truncations:
        lines += ["", "mirrored queues, truncations per replica and mode (unsafe modes first):"]
        lines += [
            f"  {row['group']} {row['replica']}: {_num(row.get('truncations'))} truncation(s) by {row['how']}"
            f"{' (UNSAFE)' if row.get('unsafe') else ''}, {_num(row.get('offsets_dropped'))} message(s) dropped"
            f" (largest cut {_num(row.get('max_dropped'))})"
            for row in truncations
        ]
    return "\n".join(lines) + "\n"
