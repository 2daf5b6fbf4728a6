"""Disk full on a real single node: the disk alarm blocks publishers, space comes back, nothing is corrupted.

The node's data directory is on a small tmpfs (mounted here; skipped when mount is not permitted), with a filler
file beside it on the same tmpfs. A confirmed publisher (pika, one message in flight, 4 KiB persistent bodies)
fills the disk until free space falls under `disk_free_limit_bytes`: the alarm fires (node log), the publisher
gets connection.blocked and no more confirms, and a second, reckless publisher that keeps publishing without
confirms while blocked is simply not read. Deleting the filler clears the alarm, both resume (connection.unblocked),
then the node is killed with SIGKILL and restarted: it recovers with no error, and a drain finds every confirmed
message, in order, nothing it did not publish, every confirmed one exactly once.

The second test takes the alarm away (limit 0) so the writes really hit ENOSPC: no confirm may leave for what
was not written, and after the filler is deleted every confirmed message is still there. Two outcomes are allowed
(docs/INTERFACES.md, cluster/log): a failed WAL write keeps its batch and retries (publishing resumes), a failed
segment write or fsync breaks the log (`LogBrokenError`) and the node exits; then it is restarted. As measured,
it is the second: the node logs "store: disk full ... retrying", then exits with a LogBrokenError traceback.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from chaos.nemesis import LocalCluster
from chaos.workload import CONNECTION_ERRORS

QUEUE = "durability-disk-full"
BODY_PAD = b"x" * 4096
RECKLESS_MESSAGES_MAX = 2000
MIB = 1024 * 1024
WAIT_S = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def tmpfs(mountpoint: Path, size_mib: int) -> Iterator[Path]:
    mountpoint.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mountpoint)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the disk-full test (needs root/CAP_SYS_ADMIN): "
                    f"{mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def write_filler(path: Path, size_bytes: int) -> None:
    with path.open("wb") as out:
        chunk = b"\xff" * MIB
        for _ in range(size_bytes // MIB):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())


def params(url: str) -> pika.URLParameters:
    parameters = pika.URLParameters(url)
    parameters.heartbeat = 30
    parameters.blocked_connection_timeout = None
    parameters.socket_timeout = 5
    parameters.connection_attempts = 1
    return parameters


class ConfirmedPublisher(threading.Thread):
    """One persistent message in flight under confirms; body "<n>:" + 4 KiB; records confirmed numbers and
    connection.blocked/unblocked (pika dispatches those between publishes)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="confirmed-publisher", daemon=True)
        self.url = url
        self.stop_event = threading.Event()
        self.confirmed: list[int] = []
        self.events: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(params(self.url))
            connection.add_on_connection_blocked_callback(lambda _c, _m: self.events.append("blocked"))
            connection.add_on_connection_unblocked_callback(lambda _c, _m: self.events.append("unblocked"))
            channel = connection.channel()
            channel.queue_declare(QUEUE, durable=True)
            channel.confirm_delivery()
            number = 0
            while not self.stop_event.is_set():
                channel.basic_publish("", QUEUE, f"{number}:".encode() + BODY_PAD,
                                      pika.BasicProperties(delivery_mode=2))
                self.confirmed.append(number)
                number += 1
                connection.process_data_events(0)
            connection.close()
        except CONNECTION_ERRORS as error:
            self.error = error


class RecklessPublisher(threading.Thread):
    """Publishes small persistent messages ("r<n>") without confirms and ignores connection.blocked."""

    def __init__(self, url: str) -> None:
        super().__init__(name="reckless-publisher", daemon=True)
        self.url = url
        self.stop_event = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(params(self.url))
            channel = connection.channel()
            channel.queue_declare(QUEUE, durable=True)
            while not self.stop_event.is_set() and self.sent < RECKLESS_MESSAGES_MAX:
                channel.basic_publish("", QUEUE, f"r{self.sent}".encode(), pika.BasicProperties(delivery_mode=2))
                self.sent += 1
            connection.close()
        except CONNECTION_ERRORS as error:
            self.error = error


def wait_for(condition: object, what: str, timeout_s: float = WAIT_S) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def node_log(cluster: LocalCluster) -> str:
    return Path(cluster.spec("rmq1").log).read_text(errors="replace")


def queue_depth(url: str) -> int:
    """Ready messages, seen by a connection that never publishes (so is never blocked)."""
    connection = pika.BlockingConnection(params(url))
    try:
        return int(connection.channel().queue_declare(QUEUE, passive=True).method.message_count)
    finally:
        connection.close()


def drain(url: str) -> list[bytes]:
    """Consume (auto-ack) until the queue is empty; the bodies in queue order."""
    connection = pika.BlockingConnection(params(url))
    try:
        channel = connection.channel()
        expected = int(channel.queue_declare(QUEUE, passive=True).method.message_count)
        bodies: list[bytes] = []
        for method, _props, body in channel.consume(QUEUE, auto_ack=True, inactivity_timeout=1.0):
            if method is None:
                break
            bodies.append(body)
        channel.cancel()
        assert len(bodies) == expected, f"queue reported {expected} messages, {len(bodies)} delivered"
        return bodies
    finally:
        connection.close()


def split_bodies(bodies: list[bytes]) -> tuple[list[int], list[int]]:
    """(confirmed-publisher numbers, reckless numbers) in delivery order; anything else fails the test."""
    numbers: list[int] = []
    reckless: list[int] = []
    for body in bodies:
        if body.startswith(b"r"):
            reckless.append(int(body[1:]))
        else:
            head, _, pad = body.partition(b":")
            assert pad == BODY_PAD, f"corrupted body {body[:40]!r}"
            numbers.append(int(head))
    return numbers, reckless


def assert_recovered(cluster: LocalCluster, confirmed: list[int]) -> list[int]:
    """Kill -9, restart; the node must come up without errors and hold every confirmed message once, in order."""
    log_offset = len(node_log(cluster))
    cluster.kill("rmq1")
    cluster.restart("rmq1")
    after_restart = node_log(cluster)[log_offset:]
    assert "Traceback" not in after_restart and " ERROR " not in after_restart, after_restart[-3000:]
    numbers, reckless = split_bodies(drain(cluster.url("rmq1")))
    assert numbers == sorted(numbers), "confirmed publisher's messages out of order"
    assert len(set(numbers)) == len(numbers), "a message recovered twice"
    missing = sorted(set(confirmed) - set(numbers))
    assert missing == [], f"{len(missing)} confirmed messages lost: {missing[:20]}"
    assert reckless == sorted(set(reckless)), "reckless publisher's messages out of order or twice"
    return numbers


def test_disk_alarm_blocks_publishers_and_nothing_confirmed_is_lost(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", 24) as disk:
        (disk / "data").mkdir()
        (tmp_path / "cluster").mkdir()
        os.symlink(disk / "data", tmp_path / "cluster" / "rmq1")  # node data on the tmpfs, its log outside
        filler = disk / "filler"
        write_filler(filler, 8 * MIB)
        extra = ("--disk-free-limit-bytes", str(8 * MIB), "--resource-probe-interval-ms", "100")
        cluster = LocalCluster.spawn(tmp_path / "cluster", 1, free_port() - 1, extra)
        publisher = ConfirmedPublisher(cluster.url("rmq1"))
        reckless = RecklessPublisher(cluster.url("rmq1"))
        try:
            publisher.start()
            wait_for(lambda: "alarm disk set" in node_log(cluster), "the disk alarm")
            reckless.start()
            wait_for(lambda: reckless.sent >= RECKLESS_MESSAGES_MAX // 2, "the reckless publisher to write")
            time.sleep(0.5)  # let what was read before the block settle; then nothing may move while it holds
            confirmed_while_blocked = len(publisher.confirmed)
            depth_while_blocked = queue_depth(cluster.url("rmq1"))
            time.sleep(1.0)
            assert len(publisher.confirmed) == confirmed_while_blocked, "confirms went on during the disk alarm"
            assert queue_depth(cluster.url("rmq1")) == depth_while_blocked, "a blocked publisher was read"
            filler.unlink()
            wait_for(lambda: "alarm disk cleared" in node_log(cluster), "the disk alarm to clear")
            wait_for(lambda: len(publisher.confirmed) >= confirmed_while_blocked + 50, "publishing to resume")
            wait_for(lambda: not reckless.is_alive(), "the reckless publisher to finish")
            publisher.stop_event.set()
            publisher.join(WAIT_S)
            assert publisher.error is None and reckless.error is None, (publisher.error, reckless.error)
            assert "blocked" in publisher.events and publisher.events[-1] == "unblocked", publisher.events
            assert confirmed_while_blocked > 100
            numbers = assert_recovered(cluster, publisher.confirmed)
            assert len(numbers) >= len(publisher.confirmed)
        finally:
            publisher.stop_event.set()
            reckless.stop_event.set()
            cluster.stop_all()


def test_writes_that_hit_enospc_lose_nothing_confirmed(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", 16) as disk:
        (disk / "data").mkdir()
        (tmp_path / "cluster").mkdir()
        os.symlink(disk / "data", tmp_path / "cluster" / "rmq1")
        filler = disk / "filler"
        write_filler(filler, 10 * MIB)
        extra = ("--disk-free-limit-bytes", "0")  # no alarm: the log's writes themselves run out of space
        cluster = LocalCluster.spawn(tmp_path / "cluster", 1, free_port() - 1, extra)
        publisher = ConfirmedPublisher(cluster.url("rmq1"))
        try:
            publisher.start()
            wait_for(lambda: "disk full" in node_log(cluster) or cluster.pid("rmq1") is None, "ENOSPC")
            confirmed_when_full = len(publisher.confirmed)
            filler.unlink()
            if cluster.pid("rmq1") is not None:  # storage kept its batch and retries: publishing resumes
                wait_for(lambda: len(publisher.confirmed) >= confirmed_when_full + 20 or publisher.error is not None,
                         "publishing to resume after space was freed")
            publisher.stop_event.set()
            if cluster.pid("rmq1") is None:
                cluster.restart("rmq1")
            publisher.join(WAIT_S)
            assert not publisher.is_alive()
            assert confirmed_when_full > 100
            assert_recovered(cluster, publisher.confirmed)
        finally:
            publisher.stop_event.set()
            cluster.stop_all()
