"""`raftmq bench recovery`: how long a node takes to come back with N persistent messages on disk.

How it works: start one `raftmq node` on a free port and a data directory (temporary unless --data-dir), declare
a durable queue, fill it with N persistent messages of S bytes from one raw-socket publisher in confirm mode
(pipelined, a window of unconfirmed messages, every message confirmed before the fill counts as done), check the
queue reports N ready, then kill the node with SIGKILL (no clean shutdown, no final checkpoint) and start the same
command again. Two times are taken from the moment the new process is spawned: until it answers AMQP (a full
handshake succeeds) and until a passive queue.declare reports all N messages ready. The resident memory (VmRSS)
of the recovered node is reported too. The pieces (`NodeUnderTest`, `fill_queue`, `queue_message_count`,
`rss_bytes`) are shared with `bench/memory.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import frames
from bench.brokers import free_port
from bench.client import BenchConnection, Endpoint, probe
from bench.confirms import ConfirmTracker
from bench.frames import ProtocolError

QUEUE = "bench-recovery"
START_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 3600.0
POLL_S = 0.05
_FRAME_HEAD_SIZE = 7
_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_IDS = struct.Struct(">HH")


class NodeUnderTest:
    """One `raftmq node` process on a fixed port and data dir: start, kill -9, start again, stop."""

    def __init__(self, data_dir: Path, log_path: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.data_dir, self.log_path, self.extra_args = data_dir, log_path, extra_args
        self.endpoint = Endpoint("127.0.0.1", free_port())
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def spawn(self) -> None:
        command = [sys.executable, "-m", "node.cli", "node", "--port", str(self.endpoint.port),
                   "--listen-address", "127.0.0.1", "--data-dir", str(self.data_dir), *self.extra_args]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    def wait_answers(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not probe(self.endpoint, timeout_s=2.0):
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"node exited with {self.process.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"node not serving after {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(POLL_S)

    def kill9(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill9()


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def queue_declare_passive(channel: int, name: str) -> bytes:
    flags = frames.bits(True, False, False, False, False)  # passive, durable, exclusive, auto-delete, no-wait
    return frames.method_frame(channel, 50, 10, b"\x00\x00" + frames.encode_shortstr(name) + flags
                               + frames.encode_table({}))


def queue_message_count(endpoint: Endpoint, queue: str) -> int:
    """Ready messages of `queue` (passive queue.declare over a fresh connection)."""
    connection = BenchConnection(endpoint)
    try:
        connection.open_channel(1)
        reply = connection.call(1, queue_declare_passive(1, queue), frames.QUEUE_DECLARE_OK)
        return frames.parse_queue_declare_ok(reply.payload)[1]
    finally:
        connection.close()


def declare_queue(endpoint: Endpoint, queue: str) -> None:
    connection = BenchConnection(endpoint)
    try:
        connection.open_channel(1)
        connection.call(1, frames.queue_declare(1, queue, True, {}), frames.QUEUE_DECLARE_OK)
    finally:
        connection.close()


def fill_queue(endpoint: Endpoint, queue: str, count: int, body_size: int, window: int = 2000,
               batch_max: int = 200, progress: bool = False) -> float:
    """Publish `count` persistent messages of `body_size` bytes to `queue` through the default exchange, under
    confirms, keeping at most `window` unconfirmed; returns the seconds it took until the last confirm."""
    connection = BenchConnection(endpoint)
    try:
        connection.open_channel(1)
        connection.call(1, frames.confirm_select(1), frames.CONFIRM_SELECT_OK)
        message = frames.publish_prefix(1, "", queue, body_size, frames.PERSISTENT) + b"m" * body_size + frames.FRAME_END
        tracker = ConfirmTracker()
        sock, buffer = connection.sock, bytearray()
        started = time.monotonic()
        next_report = started + 10
        settled = 0
        while settled < count:
            room = min(window - tracker.outstanding, batch_max, count - tracker.published)
            if room > 0:
                sock.sendall(message * room)
                tracker.on_published(room)
            settled += _read_acks(sock, buffer, tracker, block=room <= 0)
            if progress and time.monotonic() >= next_report:
                next_report += 10
                print(f"  filled {settled:,} / {count:,}", flush=True)
        return time.monotonic() - started
    finally:
        connection.close()


def _read_acks(sock: socket.socket, buffer: bytearray, tracker: ConfirmTracker, block: bool) -> int:
    """Read what has arrived (waiting up to 1 s when `block`), settle acks; returns how many newly settled."""
    try:
        sock.settimeout(1.0 if block else 0.0)
        data = sock.recv(1 << 20)
    except (BlockingIOError, TimeoutError):
        return 0
    finally:
        sock.settimeout(None)
    if not data:
        raise ProtocolError("broker closed the publisher's connection")
    buffer += data
    newly, position = 0, 0
    while len(buffer) - position >= _FRAME_HEAD_SIZE + 1:
        frame_type, _channel, size = _FRAME_HEAD.unpack_from(buffer, position)
        end = position + _FRAME_HEAD_SIZE + size
        if end >= len(buffer):
            break
        if frame_type == frames.FRAME_METHOD:
            method_id = _METHOD_IDS.unpack_from(buffer, position + _FRAME_HEAD_SIZE)
            if method_id == frames.BASIC_ACK:
                newly += tracker.settle(*frames.parse_ack(buffer, position + _FRAME_HEAD_SIZE))
            elif method_id == frames.BASIC_NACK:
                raise ProtocolError("broker nacked a publish")
            elif method_id in (frames.CONNECTION_CLOSE, frames.CHANNEL_CLOSE):
                code, text = frames.parse_close(bytes(buffer[position + _FRAME_HEAD_SIZE:end]))
                raise ProtocolError(f"publisher closed by broker: {code} {text}")
        position = end + 1
    del buffer[:position]
    return newly


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    messages: int
    body_size_bytes: int
    fill_s: float
    fill_msgs_per_s: float
    data_dir_bytes: int
    rss_before_kill_bytes: int
    restart_to_amqp_s: float
    restart_to_all_ready_s: float
    rss_after_recovery_bytes: int


def directory_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


def measure_recovery(node: NodeUnderTest, messages: int, body_size: int, window: int) -> RecoveryResult:
    node.spawn()
    node.wait_answers()
    declare_queue(node.endpoint, QUEUE)
    print(f"filling {QUEUE} with {messages:,} x {body_size} B persistent messages ...", flush=True)
    fill_s = fill_queue(node.endpoint, QUEUE, messages, body_size, window, progress=True)
    ready = queue_message_count(node.endpoint, QUEUE)
    if ready != messages:
        raise RuntimeError(f"queue reports {ready} ready after confirming {messages}")
    rss_before_kill = rss_bytes(node.pid)
    node.kill9()
    data_bytes = directory_bytes(node.data_dir)
    print(f"filled in {fill_s:.1f} s; killed with SIGKILL; {data_bytes / 1e6:.0f} MB on disk; restarting ...",
          flush=True)
    started = time.monotonic()
    node.spawn()
    node.wait_answers(READY_TIMEOUT_S)  # the node listens only once recovery has rebuilt every queue
    to_amqp_s = time.monotonic() - started
    deadline = started + READY_TIMEOUT_S
    while queue_message_count(node.endpoint, QUEUE) != messages:
        if time.monotonic() > deadline:
            raise RuntimeError("recovered queue never reported every message")
        time.sleep(POLL_S)
    to_ready_s = time.monotonic() - started
    return RecoveryResult(messages, body_size, fill_s, messages / fill_s, data_bytes, rss_before_kill, to_amqp_s,
                          to_ready_s, rss_bytes(node.pid))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftmq bench recovery", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="persistent messages to recover")
    parser.add_argument("--body-size", type=int, default=100, help="body bytes per message")
    parser.add_argument("--window", type=int, default=2000, help="unconfirmed messages while filling")
    parser.add_argument("--data-dir", help="node data directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--json", help="also write the result as JSON to this file")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    workdir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="raftmq-bench-recovery-"))
    workdir.mkdir(parents=True, exist_ok=True)
    node = NodeUnderTest(workdir / "data", workdir / "node.log")
    try:
        result = measure_recovery(node, args.messages, args.body_size, args.window)
    except (OSError, ProtocolError, RuntimeError) as error:
        print(f"raftmq bench recovery: {error}", file=sys.stderr)
        return 1
    finally:
        node.stop()
        if not args.data_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"recovery of {result.messages:,} x {result.body_size_bytes} B: answers AMQP after "
          f"{result.restart_to_amqp_s:.2f} s, all {result.messages:,} ready after {result.restart_to_all_ready_s:.2f} s"
          f"; fill {result.fill_msgs_per_s:,.0f} msg/s; data dir {result.data_dir_bytes / 1e6:.0f} MB; "
          f"RSS before the kill {result.rss_before_kill_bytes / 1e6:.0f} MB, after recovery "
          f"{result.rss_after_recovery_bytes / 1e6:.0f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
