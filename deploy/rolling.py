"""`raftmq cluster restart [NODE ...]`: a rolling restart of a local cluster, one node at a time.

How it works: for each named node (default: every node, in order) it stops the process cluster.json names (SIGTERM,
SIGKILL after the grace period; a node already stopped is simply started), starts it again with the very command
`up` used (`node_plan.node_command`: same name, ports, data directory and config file, so it rejoins as the same
member and catches up from its log), records the new pid, and waits until it answers AMQP and until its management
API reports every node of the cluster running. Only then does it go on to the next node, so a majority stays up
throughout; if a node does not come back, or does not see the others, the restart stops there (exit 1) and says
which node and where its log is.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from deploy import node_plan, runner

CLUSTER_SEES_ALL_TIMEOUT_S = 60.0


def stop_node(node: runner.NodeProcess, grace_s: float = runner.STOP_GRACE_S) -> None:
    if not runner.pid_alive(node.pid):
        return
    os.kill(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while runner.pid_alive(node.pid) and time.monotonic() < deadline:
        _reap(node.pid)
        time.sleep(0.1)
    if runner.pid_alive(node.pid):
        os.kill(node.pid, signal.SIGKILL)
    _reap(node.pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def start_node(node: runner.NodeProcess) -> runner.NodeProcess:
    """Start `node` again exactly as `up` did; returns it with its new pid."""
    cmd = node_plan.node_command(node.name, node.host, node.port, node.data_dir)
    with open(node.log, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return dataclasses.replace(node, pid=proc.pid)


def running_nodes(node: runner.NodeProcess, timeout_s: float = runner.MANAGEMENT_TIMEOUT_S) -> set[str] | None:
    """The nodes `node`'s management API reports running, or None when it does not answer."""
    from node.ctl import Client, CtlError

    try:
        rows = Client(f"{node.host}:{runner._management_port(node)}", "guest", "guest", timeout_s).call(
            "GET", "/api/nodes")
    except (CtlError, ValueError):
        return None
    if not isinstance(rows, list):
        return None
    return {str(r.get("name")) for r in rows if isinstance(r, dict) and r.get("running")}


def wait_sees_all(node: runner.NodeProcess, names: set[str],
                  timeout_s: float = CLUSTER_SEES_ALL_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = running_nodes(node)
        if seen is not None and names <= seen:
            return True
        time.sleep(0.5)
    return False


def restart(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    state = runner.load_state(data_dir)
    if state is None:
        print(f"raftmq cluster: nothing recorded in {data_dir}", file=sys.stderr)
        return 1
    by_name = {n.name: n for n in state.nodes}
    names = list(args.nodes) or list(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        print(f"raftmq cluster: unknown node(s) {', '.join(unknown)}; nodes: {', '.join(by_name)}", file=sys.stderr)
        return 64
    for name in names:
        fresh = start_node_after_stop(by_name[name])
        by_name[name] = fresh
        state = dataclasses.replace(state, nodes=[by_name[n.name] for n in state.nodes])
        runner._save_state(data_dir, state)
        if runner.wait_ready([fresh]):
            print(f"raftmq cluster: {name} did not come back; see {fresh.log}", file=sys.stderr)
            return 1
        if not wait_sees_all(fresh, set(by_name)):
            print(f"raftmq cluster: {name} is up but does not see every node running; stopping the rolling "
                  f"restart here (see {fresh.log})", file=sys.stderr)
            return 1
        print(f"{name}: restarted, pid {fresh.pid}, sees every node running")
    return 0


def start_node_after_stop(node: runner.NodeProcess) -> runner.NodeProcess:
    stop_node(node)
    return start_node(node)
