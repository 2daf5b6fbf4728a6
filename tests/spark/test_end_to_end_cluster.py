"""End to end on a real cluster: 3 raftmq nodes in cluster mode, a quorum queue under publish load, one follower of
the queue paused (SIGSTOP) for longer than the lag threshold and resumed, then the lag job over the 3 data dirs.

How it works: `raftmq cluster up --detach --no-haproxy` starts 3 cluster-mode nodes on free ports in a temporary
dir. A quorum queue is declared and warmed up through node 1; its Raft leader is read from the nodes' replication
telemetry (the node writing `state` records as leader of the queue's group), and a publisher thread (pika, confirms
on) then loads the queue through the leader. One follower of the queue is SIGSTOPped for `PAUSE_S` seconds (well
past the 10 s lag threshold) while the load goes on (the leader and the other follower keep committing), then
SIGCONTed; the load goes on briefly while it catches up, then the cluster is stopped and the job runs, in this test
session's SparkSession, on exactly the inputs `raftmq lag --input <node data dir> ...` would get. The checks are
on what the pause must cause, not on timings: the paused follower, and no other follower of any queue, has lag
above the thresholds, out-of-sync time and exactly one recovered catch-up episode that starts after the pause began
and ends after it was resumed. The measured lags are printed (run with -s) and quoted in docs/spark.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pika = pytest.importorskip("pika")

from pyspark.sql import SparkSession  # noqa: E402

from spark_analytics.job import JobResult, JobSpec, run_job  # noqa: E402
from spark_analytics.transforms import LagConfig  # noqa: E402

# Cluster start, ~40 s of load with a 20 s pause, then the job (JVM start included when this runs first).
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

CONFIG = LagConfig()  # documented defaults: out of sync beyond 10 s or 10,000 entries
QUEUE = "lag-e2e"
# cluster.queue.queue_group_id("/", QUEUE), spelled out: spark_analytics and its tests never import cluster/. The
# queue's Raft group id is this plus "/i<hex incarnation>" (docs/cluster.md, "Ids"); the run finds it in the telemetry.
GROUP = "q/%2F/lag-e2e"
NODES = 3
PAUSE_S = 20.0  # twice the time threshold: the oldest entry the follower lacks ages past it during the pause
WARM_UP_MESSAGES = 50
LOAD_BEFORE_PAUSE_S = 4.0
LOAD_AFTER_RESUME_S = 8.0
SETTLE_S = 2.0  # after the load: the leaders' next state samples (every second while a group changes)
COMMAND_TIMEOUT_S = 180.0
LEADER_WAIT_S = 60.0
DERIVED_PORT_OFFSETS = (0, 10_000, 20_000, 21_000)  # AMQP, management, Raft, metadata (docs/cluster.md)
MESSAGE_BODY = b"x" * 256


@dataclass(frozen=True, slots=True)
class ClusterNode:
    name: str
    port: int
    pid: int
    data_dir: Path


@dataclass(frozen=True, slots=True)
class PauseRun:
    """What the cluster run did: who was paused and when (wall clock ms, as in the telemetry)."""

    group: str  # the queue's Raft group id (GROUP + its incarnation)
    leader: str
    victim: str
    other_follower: str
    pause_start_ms: int
    resume_ms: int
    confirmed_total: int
    confirmed_during_pause: int
    data_dirs: tuple[str, ...]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_base_port() -> int:
    """A base port P such that P+1..P+NODES and their derived ports are all free (scanned from the pid)."""
    for attempt in range(200):
        base = 22_000 + (os.getpid() * 7 + attempt * 13) % 9_000
        ports = [base + i + offset for i in range(1, NODES + 1) for offset in DERIVED_PORT_OFFSETS]
        if all(_port_free(port) for port in ports):
            return base
    raise RuntimeError("no free port range for the cluster")


def _raftmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


def _log_tails(cluster_dir: Path) -> str:
    return "\n".join(
        f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        for log in sorted(cluster_dir.glob("*.log"))
    )


@contextlib.contextmanager
def running_cluster(cluster_dir: Path) -> Iterator[list[ClusterNode]]:
    """`raftmq cluster up --detach` in `cluster_dir`; always `down` (after resuming any paused node) on exit."""
    up = _raftmq(
        "cluster", "up", "--detach", "--no-haproxy", "--nodes", str(NODES),
        "--base-port", str(_free_base_port()), "--data-dir", str(cluster_dir),
    )  # fmt: skip
    try:
        assert up.returncode == 0, f"cluster up failed:\n{up.stdout}{up.stderr}\n{_log_tails(cluster_dir)}"
        state = json.loads((cluster_dir / "cluster.json").read_text())
        yield [
            ClusterNode(node["name"], node["port"], node["pid"], Path(node["data_dir"]))
            for node in state["nodes"]
        ]
    finally:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            for node in json.loads((cluster_dir / "cluster.json").read_text())["nodes"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node["pid"], signal.SIGCONT)  # a stopped node would not see SIGTERM
        _raftmq("cluster", "down", "--data-dir", str(cluster_dir))


def _connect(port: int) -> Any:
    parameters = pika.ConnectionParameters(
        "127.0.0.1",
        port,
        connection_attempts=5,
        retry_delay=1,
        socket_timeout=30,
        blocked_connection_timeout=60,
    )
    return pika.BlockingConnection(parameters)


def declare_and_warm_up(port: int) -> None:
    connection = _connect(port)
    try:
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        for _ in range(WARM_UP_MESSAGES):
            channel.basic_publish("", QUEUE, MESSAGE_BODY, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def _telemetry_records(data_dir: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(data_dir.glob("*/telemetry/*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                record = json.loads(line)
                if isinstance(record, dict):
                    yield record


def _is_queue_group(group: object) -> bool:
    return group == GROUP or (isinstance(group, str) and group.startswith(GROUP + "/i"))


def queue_leader(nodes: list[ClusterNode]) -> tuple[str, str, list[str]]:
    """The queue's group, current leader and followers, from the latest leader `state` record in the telemetry."""
    deadline = time.monotonic() + LEADER_WAIT_S
    while time.monotonic() < deadline:
        latest: dict[str, Any] | None = None
        for node in nodes:
            for record in _telemetry_records(node.data_dir):
                is_leader_state = record.get("type") == "state" and record.get("role") == "leader"
                if is_leader_state and _is_queue_group(record.get("group")) and record.get("followers"):
                    key = (record["term"], record["ts_ms"])
                    if latest is None or key > (latest["term"], latest["ts_ms"]):
                        latest = record
        if latest is not None:
            return latest["group"], latest["node"], sorted(latest["followers"])
        time.sleep(0.5)
    raise AssertionError(f"no leader of {GROUP} in the telemetry after {LEADER_WAIT_S} s")


class Publisher(threading.Thread):
    """Publishes persistent messages with confirms through one node until stopped; counts confirmed publishes."""

    def __init__(self, port: int) -> None:
        super().__init__(name="lag-e2e-publisher", daemon=True)
        self.port = port
        self.confirmed = 0
        self.error: BaseException | None = None
        self._stop_requested = threading.Event()

    def run(self) -> None:
        try:
            connection = _connect(self.port)
            channel = connection.channel()
            channel.confirm_delivery()
            while not self._stop_requested.is_set():
                channel.basic_publish("", QUEUE, MESSAGE_BODY, pika.BasicProperties(delivery_mode=2))
                self.confirmed += 1
            connection.close()
        except BaseException as error:  # reported by stop(); the thread must not die silently
            self.error = error

    def stop(self) -> None:
        self._stop_requested.set()
        self.join(timeout=COMMAND_TIMEOUT_S)
        assert not self.is_alive(), "publisher did not stop"
        assert self.error is None, f"publisher failed: {self.error!r}"


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def run_with_paused_follower(cluster_dir: Path) -> PauseRun:
    with running_cluster(cluster_dir) as nodes:
        by_name = {node.name: node for node in nodes}
        declare_and_warm_up(nodes[0].port)
        group, leader, followers = queue_leader(nodes)
        victim, other_follower = followers
        publisher = Publisher(by_name[leader].port)
        publisher.start()
        time.sleep(LOAD_BEFORE_PAUSE_S)
        pause_start_ms = wall_ms()
        os.kill(by_name[victim].pid, signal.SIGSTOP)
        confirmed_at_pause = publisher.confirmed
        try:
            time.sleep(PAUSE_S)
        finally:
            confirmed_during_pause = publisher.confirmed - confirmed_at_pause
            resume_ms = wall_ms()
            os.kill(by_name[victim].pid, signal.SIGCONT)
        time.sleep(LOAD_AFTER_RESUME_S)
        publisher.stop()
        time.sleep(SETTLE_S)
    return PauseRun(
        group=group,
        leader=leader,
        victim=victim,
        other_follower=other_follower,
        pause_start_ms=pause_start_ms,
        resume_ms=resume_ms,
        confirmed_total=publisher.confirmed,
        confirmed_during_pause=confirmed_during_pause,
        data_dirs=tuple(str(node.data_dir) for node in nodes),
    )


@pytest.fixture(scope="module")
def pause_run(tmp_path_factory: pytest.TempPathFactory) -> PauseRun:
    return run_with_paused_follower(tmp_path_factory.mktemp("cluster"))


@pytest.fixture(scope="module")
def job(spark: SparkSession, pause_run: PauseRun, tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    output = tmp_path_factory.mktemp("lag") / "out"
    return run_job(spark, JobSpec(inputs=pause_run.data_dirs, output=str(output), config=CONFIG))


def table_rows(spark: SparkSession, job: JobResult, name: str) -> list[dict[str, Any]]:
    table = next(path for path in job.tables if path.endswith("/" + name))
    return [row.asDict() for row in spark.read.parquet(table).collect()]


def test_the_majority_kept_committing_while_the_follower_was_paused(pause_run: PauseRun) -> None:
    print(f"\nlag-e2e run: {pause_run}")
    assert pause_run.confirmed_during_pause > 0
    assert pause_run.victim not in (pause_run.leader, pause_run.other_follower)


def test_only_the_paused_follower_lags_and_falls_out_of_sync(
    spark: SparkSession, job: JobResult, pause_run: PauseRun
) -> None:
    followers = {(row["group"], row["follower"]): row for row in table_rows(spark, job, "follower_summary")}
    victim = followers.pop((pause_run.group, pause_run.victim))
    print(f"\npaused follower {pause_run.victim}: {victim}")
    assert victim["lag_entries_max"] > 0
    assert victim["lag_ms_max"] > CONFIG.lag_threshold_ms
    assert victim["persist_lag_ms_max"] > CONFIG.lag_threshold_ms
    assert victim["out_of_sync_ms"] > 0
    assert victim["episodes"] == 1
    assert (pause_run.group, pause_run.other_follower) in followers
    for key, healthy in followers.items():
        print(f"healthy follower {key}: {healthy}")
        assert healthy["out_of_sync_ms"] == 0, key
        assert healthy["episodes"] == 0, key
        assert healthy["lag_ms_max"] <= CONFIG.lag_threshold_ms, key
        assert healthy["lag_entries_max"] <= CONFIG.lag_threshold_entries, key


def test_the_one_catch_up_episode_spans_the_pause(
    spark: SparkSession, job: JobResult, pause_run: PauseRun
) -> None:
    (episode,) = table_rows(spark, job, "catch_up_episodes")
    print(f"\nepisode: {episode}; pause {pause_run.pause_start_ms}..{pause_run.resume_ms}")
    assert (episode["group"], episode["follower"]) == (pause_run.group, pause_run.victim)
    assert episode["recovered"]
    assert pause_run.pause_start_ms <= episode["start_ts_ms"] < pause_run.resume_ms <= episode["end_ts_ms"]


def test_the_report_names_only_the_paused_follower(job: JobResult, pause_run: PauseRun) -> None:
    print("\n" + job.report)
    assert f"{pause_run.group} {pause_run.victim}: out of sync" in job.report
    assert f"{pause_run.group} {pause_run.other_follower}: out of sync" not in job.report
