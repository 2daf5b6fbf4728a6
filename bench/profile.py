"""`raftmq bench profile`: py-spy profile of every node of a 3-node raftmq cluster under workload (b).

It starts a cluster (`raftmq cluster up`, as `raftmq bench` does for (b)), declares a quorum queue, waits for its
leader and three replicas, puts the publisher and consumer in the chosen layout ("b": on the two followers,
"b@leader": both on the leader), lets the load warm up, then runs `py-spy record --format raw --nolineno
--nonblocking` against each node's process at once for `--duration` seconds. The raw files (one line per distinct
stack: "frame;frame;...;frame count") are kept in --output, and for each node it prints the functions with the most
samples, by self time and inclusive of callees, as a percentage of that node's samples (py-spy counts only
non-idle samples by default, of every thread). Caution: on a loaded machine py-spy's idle detection counts threads
blocked in poll/epoll/fsync as busy; `--gil` keeps only samples holding the GIL (Python work: waits in syscalls
release it). `aggregate_raw` and `top_functions` are pure and unit-tested.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.brokers import BrokerStartError, RaftmqCluster, raftmq_cluster
from bench.loadgen import WorkerResult
from bench.processes import run_workers
from bench.quorum import LAYOUTS, QUORUM_ARGUMENTS, leader_moved, wait_placement
from bench.workloads import RunSettings, Topology, declare, delete, measure, run_id, single_queue_layout


@dataclass(frozen=True, slots=True)
class Profile:
    """Sample counts of one process: total stacks sampled, per function self and inclusive counts."""

    samples: int
    self_counts: Counter[str]
    inclusive_counts: Counter[str]


def aggregate_raw(text: str) -> Profile:
    """py-spy's raw (collapsed) format -> per-function counts. A function appearing twice in one stack (recursion)
    counts once for that stack's inclusive figure."""
    samples = 0
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        samples += count
        self_counts[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return Profile(samples, self_counts, inclusive)


def top_functions(profile: Profile, count: int, inclusive: bool = False) -> list[tuple[str, float]]:
    """The `count` functions with the most samples, with their share of all samples in percent."""
    counts = profile.inclusive_counts if inclusive else profile.self_counts
    if profile.samples == 0:
        return []
    return [(name, 100.0 * samples / profile.samples) for name, samples in counts.most_common(count)]


# Frames at the root of every stack of a thread (interpreter start-up, the trio run loop, thread bootstrap): their
# inclusive share is just "this thread was busy", so the inclusive ranking leaves them out.
ROOT_FRAMES = ("_run_module_as_main (", "_run_code (", "<module> (", "main (node/cli.py)", "main (node/runtime/main.py)",
               "run (trio/_core/_run.py)", "unrolled_run (trio/_core/_run.py)", "Thread._bootstrap", "Thread.run (")


def format_profile(node: str, role: str, profile: Profile, count: int) -> str:
    lines = [f"== {node} ({role}): {profile.samples} samples"]
    for title, inclusive in (("self", False), ("inclusive (thread roots left out)", True)):
        lines.append(f"  top by {title}:")
        ranked = top_functions(profile, count + len(ROOT_FRAMES) + 4, inclusive)
        shown = [(name, share) for name, share in ranked if not (inclusive and name.startswith(ROOT_FRAMES))]
        lines += [f"    {share:5.1f}%  {name}" for name, share in shown[:count]]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftmq bench profile",
                                     description="py-spy profile of a 3-node raftmq cluster under workload (b).")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of py-spy sampling")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before sampling")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="b", help="where the clients connect")
    parser.add_argument("--gil", action="store_true",
                        help="only samples holding the GIL (py-spy --gil): Python CPU work, without waits in syscalls")
    parser.add_argument("--top", type=int, default=15, help="functions shown per node and ranking")
    parser.add_argument("--window", type=int, default=256, help="publisher confirm window")
    parser.add_argument("--prefetch", type=int, default=1000, help="consumer prefetch")
    parser.add_argument("--output", default="bench-results/profile", help="directory for the raw py-spy files")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("raftmq bench profile: py-spy not found (pip install py-spy)", file=sys.stderr)
        return 2
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    try:
        with raftmq_cluster(3) as cluster:
            return _profile(args, py_spy, output, cluster)
    except BrokerStartError as error:
        print(f"raftmq bench profile: cluster did not start: {error}", file=sys.stderr)
        return 1


def _profile(args: argparse.Namespace, py_spy: str, output: Path, cluster: RaftmqCluster) -> int:
    queue = f"bench-profile-{run_id()}"
    topology = Topology((queue,), QUORUM_ARGUMENTS)
    declare(cluster.nodes[0].endpoint, topology)
    try:
        placement = wait_placement(cluster, queue, replicas_wanted=3)
        clients = LAYOUTS[args.layout](cluster.nodes, placement)
        print(f"layout {args.layout}: {clients.description}", flush=True)
        settings = RunSettings(args.duration + 4.0, args.warmup, confirm_window=args.window, prefetch=args.prefetch)
        specs = single_queue_layout(clients.publisher.endpoint, queue, settings,
                                    consumer_endpoint=clients.consumer.endpoint)
        results: list[WorkerResult] = []
        load = threading.Thread(target=lambda: results.extend(
            run_workers(specs, settings.warmup_s, settings.duration_s)))
        load.start()
        time.sleep(args.warmup + 3.0)  # worker set-up, then the warm-up
        raw_files = _record(py_spy, cluster.pids(), args, output)
        load.join()
        moved = leader_moved(placement, cluster.placement(queue))
    finally:
        delete(cluster.nodes[0].endpoint, topology)
    figure = measure(args.layout, "b", "raftmq", results)
    print(f"load during the profile: confirmed {figure.confirmed_msgs_per_s:,.0f} msg/s, p99"
          f" {figure.latency_p99_ms} ms, error {figure.error}{moved}")
    summary = {}
    for node, path in raw_files.items():
        role = "leader" if node == placement.leader else "follower"
        role += ", publisher" if node == clients.publisher.name else ""
        role += ", consumer" if node == clients.consumer.name else ""
        profile = aggregate_raw(path.read_text(errors="replace"))
        print(format_profile(node, role, profile, args.top))
        summary[node] = {"role": role, "samples": profile.samples,
                         "self": top_functions(profile, args.top), "inclusive": top_functions(profile, args.top, True)}
    layout = clients.description + moved
    (output / "summary.json").write_text(json.dumps({"layout": layout, "nodes": summary}, indent=1))
    print(f"raw py-spy files and summary.json in {output}")
    return 0


def _record(py_spy: str, pids: dict[str, int], args: argparse.Namespace, output: Path) -> dict[str, Path]:
    files = {node: output / f"{node}.raw.txt" for node in pids}
    spies = [
        subprocess.Popen([py_spy, "record", "--pid", str(pid), "--duration", str(int(args.duration)), "--rate",
                          str(args.rate), "--format", "raw", "--nolineno", "--nonblocking", "--output",
                          str(files[node]), *(["--gil"] if args.gil else [])],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for node, pid in pids.items()
    ]
    for spy in spies:
        spy.wait(timeout=args.duration + 60)
    return {node: path for node, path in files.items() if path.exists()}
