"""`python -m chaos.sim --seed N [--chaos-ticks T] [--groups G] [--nodes K] [--bootstrap] [--refusals] [--quiet]`: replay one run
exactly, printing one line per event, then the verdict. `python -m chaos.sim --sweep START COUNT` runs many seeds.
`--queue` runs the replicated queue (queue_sim.py: the queue machine, clients, proposal tracking) on the group."""

from __future__ import annotations

import argparse
import sys

from chaos.sim.queue_sim import run_queue_seed
from chaos.sim.sim_types import SimConfig
from chaos.sim.simulator import run_seed
from chaos.sim.sweep import sweep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.sim", description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chaos-ticks", "--steps", type=int, default=300, dest="chaos_ticks")
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--no-quiesce", action="store_true")
    parser.add_argument("--membership", action="store_true", help="random single-server membership changes")
    parser.add_argument("--bootstrap", action="store_true",
                        help="groups start with a named first leader (raft.bootstrap_state)")
    parser.add_argument("--bootstrap-start", choices=["up", "down", "isolated"], default=None,
                        help="how the named leader starts (default: drawn from the seed)")
    parser.add_argument("--refusals", action="store_true",
                        help="play the transport's refusal detection: crashed nodes reported refusing (fast "
                        "elections), and false refusals of live nodes")
    parser.add_argument("--quiet", action="store_true", help="no trace, only the verdict")
    parser.add_argument("--queue", action="store_true", help="the group replicates a queue with clients on every node")
    parser.add_argument("--sweep", nargs=2, type=int, metavar=("START", "COUNT"))
    args = parser.parse_args(argv)
    if args.sweep:
        start, count = args.sweep
        failures = sweep(range(start, start + count), groups=args.groups, chaos_ticks=args.chaos_ticks,
                         membership=args.membership, bootstrap=args.bootstrap,
                         progress=lambda line: print(line, flush=True), queue=args.queue, refusals=args.refusals)
        print(f"{count} seeds, {len(failures)} failing: {[result.seed for result in failures]}")
        return 1 if failures else 0
    config = SimConfig(seed=args.seed, groups=args.groups, nodes=args.nodes, chaos_ticks=args.chaos_ticks,
                       quiesce=not args.no_quiesce, trace=not args.quiet, membership=args.membership,
                       bootstrap=args.bootstrap, bootstrap_start=args.bootstrap_start, refusals=args.refusals)
    result = run_queue_seed(config) if args.queue else run_seed(config)
    for line in result.trace:
        print(line)
    print(f"seed={result.seed} ok={result.ok} ticks={result.ticks} profile={result.profile}")
    print(f"stats={result.stats}")
    if result.violation:
        print(f"VIOLATION: {result.violation}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
