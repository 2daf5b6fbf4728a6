"""Three metadata nodes as real processes: replication, kill -9 of the leader, restart and catch-up, retries."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cluster.metadata import model
from cluster.metadata.model import PREDECLARED_EXCHANGES, PutVhost
from tests.metadata.helpers import SECRET, free_addresses

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 40.0


class NodeProc:
    def __init__(self, name: str, address: str, peers: list[str], data_dir: Path, secret: str = SECRET) -> None:
        self.name, self.address, self.peers, self.data_dir = name, address, peers, data_dir
        self.secret = secret
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()

    def start(self) -> None:
        env = {**os.environ, "RAFTMQ_CLUSTER_SECRET": self.secret, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.metadata.node_proc", "--name", self.name, "--address", self.address,
             "--peers", ",".join(self.peers), "--data-dir", str(self.data_dir)],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        out = self.proc.stdout
        assert out is not None
        threading.Thread(target=self._pump, args=(out,), daemon=True).start()

    def _pump(self, out: Any) -> None:
        for line in out:
            self.lines.put(line)

    def wait_ready(self) -> None:
        assert json.loads(self.lines.get(timeout=START_TIMEOUT_S)) == {"ready": True}

    def request(self, req: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply: dict[str, Any] = json.loads(self.lines.get(timeout=timeout_s))
        return reply

    def apply(self, cmd: model.Command) -> dict[str, Any]:
        reply = self.request({"op": "apply", "cmd": model.command_to_dict(cmd), "timeout_s": 20.0})
        assert "outcome" in reply, reply
        outcome: dict[str, Any] = reply["outcome"]
        return outcome

    def vhosts(self) -> set[str]:
        return {v["name"] for v in self.request({"op": "state"})["definitions"]["vhosts"]}

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill9()


def wait_for(pred: Any, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_three_processes_kill_the_leader_restart_and_catch_up(tmp_path: Path) -> None:
    addrs = free_addresses(3)
    nodes = [NodeProc(f"n{i}", a, [b for b in addrs if b != a], tmp_path / f"n{i}") for i, a in enumerate(addrs)]
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            n.wait_ready()
        first = nodes[0].apply(PutVhost("/", cid="put-root"))
        assert first["changes"] == [["vhost", ["/"], "created"],
                                    *(["exchange", ["/", name], "created"] for name, _ in PREDECLARED_EXCHANGES)]
        wait_for(lambda: all("/" in n.vhosts() for n in nodes), what="'/' on every node")

        leader_addr = nodes[0].request({"op": "status"})["status"]["leader"]
        leader = next(n for n in nodes if n.address == leader_addr)
        survivors = [n for n in nodes if n is not leader]
        leader.kill9()
        after = survivors[0].apply(PutVhost("after-kill", cid="put-after"))
        assert after["refused"] == "" and after["changes"]
        wait_for(lambda: "after-kill" in survivors[1].vhosts(), what="the survivors' write on both survivors")

        leader.start()
        leader.wait_ready()
        wait_for(lambda: leader.vhosts() == {"/", "after-kill"}, what="the restarted node to catch up")
        # retries of commands that already committed are duplicates with the first outcome, from any node
        again = leader.apply(PutVhost("/", cid="put-root"))
        assert again["duplicate"] and again["changes"] == first["changes"]
        assert survivors[1].apply(PutVhost("after-kill", cid="put-after"))["duplicate"]
        wait_for(lambda: len({json.dumps(n.request({"op": "state"})["definitions"], sort_keys=True)
                              for n in nodes}) == 1, what="identical definitions")
        final = nodes[0].request({"op": "state"})["definitions"]
        assert sorted(n["name"] for n in final["nodes"]) == ["n0", "n1", "n2"]
    finally:
        for n in nodes:
            n.stop()


def test_a_process_with_the_wrong_secret_exits_with_a_clear_error(tmp_path: Path) -> None:
    addrs = free_addresses(3)
    peers = [[b for b in addrs if b != a] for a in addrs]
    good = [NodeProc(f"n{i}", addrs[i], peers[i], tmp_path / f"n{i}") for i in range(2)]
    bad = NodeProc("n2", addrs[2], peers[2], tmp_path / "n2", secret="not-the-cluster-secret-at-all")
    try:
        for n in good:
            n.start()
        for n in good:
            n.wait_ready()
        good[0].apply(PutVhost("/"))
        wait_for(lambda: all(n.vhosts() == {"/"} for n in good), what="'/' on both good nodes")
        before = [json.dumps(n.request({"op": "state"})["definitions"], sort_keys=True) for n in good]
        bad.start()
        reply = json.loads(bad.lines.get(timeout=START_TIMEOUT_S))
        assert "ClusterSecretError" in reply["error"] and "mismatch" in reply["error"]
        assert bad.proc is not None and bad.proc.wait(timeout=10) == 2
        after = [json.dumps(n.request({"op": "state"})["definitions"], sort_keys=True) for n in good]
        assert after == before and before[0] == before[1]
    finally:
        for n in [*good, bad]:
            n.stop()
