"""Start, signal and stop a real `raftmq node` process for the integration tests.

The node runs as `python -m node.cli node` with a TOML file written here (the test users and vhosts below), a
temporary data directory and port 0; the fixture reads the chosen port from the "listening on port" line the node
prints on stderr (which goes to a log file, so the pipe never fills). `RAFTMQ_TEST_TARGET=host:port` points the
suite at an already-running broker instead (e.g. RabbitMQ set up with `rabbitmq_setup.sh`); tests that need to
control the node process are then skipped.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
PORT_LINE = re.compile(rb"listening on port (\d+)")

# The users/vhosts every target must have (rabbitmq_setup.sh creates the same on RabbitMQ).
LIMITED_USER = ("it-limited", "it-limited-pw")  # on "/": configure ^it-limited-.*, write ^it-limited-.*, read .*
PRIVATE_VHOST = "it-private"  # guest has no access; it-private-owner has full access
PRIVATE_USER = ("it-private-owner", "it-private-pw")

TEST_CONFIG_TOML = f"""
heartbeat_s = 60
prometheus_port = 0
test_signal_alarms = true
resource_probe_interval_ms = 200
broker_tick_ms = 50
max_message_size_bytes = 1048576
shutdown_timeout_ms = 3000

[[users]]
name = "{LIMITED_USER[0]}"
password = "{LIMITED_USER[1]}"
tags = []
vhost = "/"
configure = "^it-limited-.*"
write = "^it-limited-.*"
read = ".*"

[[users]]
name = "{PRIVATE_USER[0]}"
password = "{PRIVATE_USER[1]}"
tags = []
vhost = "{PRIVATE_VHOST}"
"""
MAX_MESSAGE_SIZE_BYTES = 1048576
# The same, with raftmq's default message size limit (128 MiB, RabbitMQ 3.10's): for the client libraries' own
# suites, which publish bigger messages than the integration tests' limit.
DEFAULT_LIMITS_CONFIG_TOML = TEST_CONFIG_TOML.replace(f"max_message_size_bytes = {MAX_MESSAGE_SIZE_BYTES}\n", "")


def external_target() -> tuple[str, int] | None:
    target = os.environ.get("RAFTMQ_TEST_TARGET")
    if not target:
        return None
    host, _, port = target.rpartition(":")
    return host or "127.0.0.1", int(port)


def port_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


@dataclass
class NodeProcess:
    """A `raftmq node` child process; `start()` blocks until its port accepts connections."""

    workdir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"
    preexec: Callable[[], None] | None = None  # runs in the child before exec (e.g. lower RLIMIT_NOFILE)
    extra_args: tuple[str, ...] = ()  # more `raftmq node` flags
    config_toml: str = TEST_CONFIG_TOML

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "node.log"

    def start(self) -> NodeProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "node.toml"
        config_path.write_text(self.config_toml)
        args = [
            sys.executable, "-m", "node.cli", "node", "--config", str(config_path),
            "--data-dir", str(self.data_dir), "--port", str(self.port), "--listen-address", "127.0.0.1",
            "--node-name", "it", *self.extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=log_file, stderr=log_file,
                                            preexec_fn=self.preexec)
        self.port = self._wait_for_port()
        return self

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"raftmq node exited with {self.process.returncode}:\n{self.log_tail()}")
            found = PORT_LINE.findall(self.log_path.read_bytes())
            if found:
                port = int(found[-1])
                if port_accepts(self.host, port):
                    return port
            time.sleep(0.05)
        raise RuntimeError(f"raftmq node did not start in {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def logged_port(self, pattern: re.Pattern[bytes], timeout_s: float = 30.0) -> int:
        """The port the node's log last names with `pattern` (one group: the port), waiting until it does."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = pattern.findall(self.log_path.read_bytes())
            if found:
                return int(found[-1])
            time.sleep(0.05)
        raise RuntimeError(f"no {pattern.pattern!r} in the node's log:\n{self.log_tail()}")

    def log_tail(self, size_bytes: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-size_bytes:].decode(errors="replace")
        except OSError:
            return ""

    def send_signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal the node and wait for it to exit; returns the exit code (kills it if it hangs)."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        code = self.process.returncode
        self.process = None
        return code

    def wait_exit(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Wait for the node to exit on its own; returns the exit code."""
        assert self.process is not None
        code = self.process.wait(timeout_s)
        self.process = None
        return code

    def restart(self) -> NodeProcess:
        """Stop gracefully and start again on the same port and data directory."""
        self.stop()
        return self.start()
