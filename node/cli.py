"""The `raftmq` console script: one dispatcher for every subcommand.

Each subcommand lives in its own module, exposing `main(argv: list[str]) -> int`; the table below maps the
subcommand name to that module so that importing the CLI stays cheap (nothing is imported until it is used).
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "node": ("node.runtime.main", "run one broker node"),
    "cluster": ("deploy.runner", "run a local cluster behind HAProxy (up, down, status)"),
    "ctl": ("node.ctl", "manage a node or cluster through its management API (rabbitmqctl's commands)"),
    "bench": ("bench.cli", "benchmarks side by side with RabbitMQ"),
    "chaos": ("chaos.cli", "Jepsen-style fault injection against real nodes"),
    "lag": ("spark_analytics.cli", "replication lag analysis on Spark"),
}


def usage() -> str:
    lines = ["usage: raftmq <command> [options]", "", "commands:"]
    for name, (_, summary) in sorted(SUBCOMMANDS.items()):
        lines.append(f"  {name:<10} {summary}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"raftmq: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    sys.exit(main())
