"""`raftmq chaos`: run scenarios against real nodes, sweep random schedules, list scenarios, serve the fault proxy.

How it works: `run SCENARIO` loads a bundled scenario (or a .toml path), starts the scenario's nodes itself (in
network namespaces when it partitions, which needs root) unless --cluster-dir points at a running `raftmq cluster`,
runs it (`--target compose`: against the node containers of a running docker-compose project, chaos/compose.py:
docker kill/pause, partitions by `docker network disconnect`), writes the report (text, JSON, PNG timeline, history) to --out, and exits 0 only when nothing confirmed
was lost and nothing unexpected was delivered; --fault-proxy routes the workload through our Toxiproxy-compatible
proxy (one proxy "amqp-<node>" per node) so toxic steps apply to client traffic. `sweep --seeds N` runs N random schedules (seeds first-seed ..
first-seed+N-1; a 3-node cluster with a quorum queue unless --nodes says otherwise) and exits non-zero if any seed failed, naming it. `check HISTORY` re-checks a saved history.
A scenario with a `[mirror]` table runs on mirrored-queue replica processes (chaos/mirror_run.py; `--truncation`,
`--promote`, `--unsafe` choose its variant; exit 1 when its checker names lost or diverged messages), or with
`--via broker` through a 3-node raftmq cluster and AMQP (chaos/mirror_broker.py, its `[mirror.broker]` version).
`suite [SCENARIO...]` runs several (default: every bundled one this environment can carry out, skipping the
others with the reason, and the deliberately unsafe ones, which must fail) and writes a summary table (per scenario: confirmed, delivered, lost, duplicates,
unavailability) to --out/summary.md; exit 1 if any failed. A scenario with a `[shovel]` table starts its two clusters, the fault proxy and the
shovel itself (chaos/shovel.py); one with a `[federation]` table its two clusters, the fault proxy and the link
(chaos/federation.py). `list` names the bundled scenarios; `proxy --listen HOST:PORT` serves the Toxiproxy-compatible fault proxy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

from chaos.scenario import Scenario, ScenarioError, bundled_scenarios, load_scenario, random_scenario


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftmq chaos", description="Jepsen-style fault injection")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one scenario and check it")
    run.add_argument("scenario", help="bundled scenario name or path to a .toml file")
    _environment_options(run)
    run.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    run.add_argument("--truncation", choices=("leader-epoch", "hw", "leader-epoch-v0"),
                     help="mirrored-queue scenarios: how a follower truncates (default: the scenario's, leader-epoch)")
    run.add_argument("--promote", choices=("when-synced", "always"),
                     help="mirrored-queue scenarios: ha-promote-on-failure (always = unclean election)")
    run.add_argument("--unsafe", action="store_true",
                     help="mirrored-queue scenarios: the unsafe variant the scenario documents (it must fail)")
    run.add_argument("--via", choices=("replicas", "broker"), default="replicas",
                     help="mirrored-queue scenarios: on the harness's replica processes (default) or through the "
                     "broker (a 3-node raftmq cluster, AMQP publishes; hw-truncation-loss, unclean-election-loss)")
    sweep = commands.add_parser("sweep", help="run random schedules from consecutive seeds")
    sweep.add_argument("--seeds", type=int, required=True)
    sweep.add_argument("--first-seed", type=int, default=0)
    sweep.add_argument("--rounds", type=int, default=3)
    sweep.add_argument("--faults", default="kill,pause", help="comma-separated: kill, pause, restart, partition")
    sweep.add_argument("--messages", type=int, default=300, help="messages per publisher")
    _environment_options(sweep)
    suite = commands.add_parser("suite", help="run several scenarios and summarise them in one table")
    suite.add_argument("scenarios", nargs="*", help="names or paths (default: every bundled scenario that can run)")
    _environment_options(suite)
    commands.add_parser("list", help="name the bundled scenarios")
    check = commands.add_parser("check", help="check a saved history.jsonl")
    check.add_argument("history")
    proxy = commands.add_parser("proxy", help="serve the Toxiproxy-compatible fault proxy")
    proxy.add_argument("--listen", default="127.0.0.1:8474")
    proxy.add_argument("--seed", type=int, default=0)
    return parser


def _environment_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster-dir", help="use the running cluster recorded in DIR/cluster.json")
    parser.add_argument("--urls", help="comma-separated AMQP URLs for the workload "
                        "(default: the cluster's HAProxy if it has one, else every node)")
    parser.add_argument("--nodes", type=int, default=None, help="override the number of nodes started")
    parser.add_argument("--netns", action="store_true", help="start nodes in network namespaces (root)")
    parser.add_argument("--toxiproxy", help="Toxiproxy API URL for toxic steps, e.g. http://127.0.0.1:8474")
    parser.add_argument("--fault-proxy", action="store_true",
                        help="put our fault proxy (proxy amqp-<node>) between the workload and the nodes started")
    parser.add_argument("--target", choices=("local", "compose"), default="local",
                        help="local: nodes on this machine (started here, or --cluster-dir); compose: the node "
                        "containers of a running docker-compose project (--compose-project, --urls; docker on PATH)")
    parser.add_argument("--compose-project", default="raftmq", help="the compose project of --target compose")
    parser.add_argument("--out", default="chaos-reports", help="directory for reports")


@contextmanager
def environment(args: argparse.Namespace, scenario: Scenario) -> Iterator[object]:
    from chaos.nemesis import LocalCluster
    from chaos.run import Environment, fault_proxy_front, spawned_environment

    urls = tuple(args.urls.split(",")) if args.urls else None
    if scenario.shovel is not None:
        from chaos.shovel import shovel_environment

        queue = scenario.workload_config(()).queues[0]
        with shovel_environment(scenario.shovel, queue, scenario.seed, scenario.node_args()) as shovel_env:
            yield shovel_env
        return
    if scenario.federation is not None:
        from chaos.federation import federation_environment

        queue = scenario.workload_config(()).queues[0]
        with federation_environment(scenario.federation, queue, scenario.seed, scenario.node_args()) as fed_env:
            yield fed_env
        return
    if getattr(args, "target", "local") == "compose":
        from urllib.parse import unquote, urlsplit

        from chaos.compose import ComposeCluster, ComposePartitioner

        if not urls:
            raise ScenarioError("--target compose needs --urls (HAProxy's address, with a user that may log in "
                                "from there: guest is loopback-only)")
        parts = urlsplit(urls[0])
        compose = ComposeCluster(args.compose_project, urls[0], unquote(parts.username or "guest"),
                                 unquote(parts.password or "guest"))
        yield Environment(compose, urls, ComposePartitioner(compose), args.toxiproxy)
        return
    if args.cluster_dir:
        cluster = LocalCluster.from_state_file(Path(args.cluster_dir))
        haproxy = cluster.haproxy_url()
        default_urls = (haproxy,) if haproxy else tuple(cluster.url(n) for n in cluster.nodes())
        yield Environment(cluster, urls or default_urls, None, args.toxiproxy)
        return
    use_netns = args.netns or "netns" in scenario.needs()
    with spawned_environment(args.nodes or scenario.nodes, use_netns, args.toxiproxy,
                             node_args=scenario.node_args()) as env:
        if args.fault_proxy:
            assert isinstance(env.cluster, LocalCluster)
            addresses = {n: (env.cluster.spec(n).host, env.cluster.spec(n).port) for n in env.cluster.nodes()}
            with fault_proxy_front(env, addresses, scenario.seed) as proxied:
                yield proxied
        else:
            yield replace(env, urls=urls) if urls else env


def check_capabilities(args: argparse.Namespace, scenario: Scenario) -> None:
    """Refuse up front (before any node starts) a scenario this environment cannot carry out."""
    from chaos import netns

    needs = scenario.needs()
    if scenario.mirror is not None and (args.cluster_dir or args.urls or args.netns or args.fault_proxy
                                        or getattr(args, "target", "local") == "compose"):
        raise ScenarioError(f"scenario {scenario.name} starts its replica processes itself: run it without "
                            "--cluster-dir/--urls/--netns/--fault-proxy/--target compose")
    if scenario.two_clusters and (args.cluster_dir or args.urls or args.netns or args.fault_proxy):
        raise ScenarioError(f"scenario {scenario.name} starts its two clusters and its fault proxy itself: run it "
                            "without --cluster-dir/--urls/--netns/--fault-proxy")
    compose = getattr(args, "target", "local") == "compose"
    if compose and (scenario.two_clusters or args.cluster_dir or args.netns
                                     or args.fault_proxy):
        raise ScenarioError(f"scenario {scenario.name}: --target compose runs against the compose project's "
                            "containers only: no shovel scenarios, --cluster-dir, --netns or --fault-proxy")
    if scenario.node_settings and (args.cluster_dir or args.urls):
        raise ScenarioError(f"scenario {scenario.name} sets node settings {sorted(scenario.node_settings)}, which "
                            "only nodes the harness starts get: run it without --cluster-dir/--urls")
    if "toxiproxy" in needs and not (args.fault_proxy or args.toxiproxy):
        raise ScenarioError(f"scenario {scenario.name} has toxic steps: pass --fault-proxy or --toxiproxy URL")
    if ("netns" in needs or args.netns) and not (args.cluster_dir or compose) \
            and netns.available() is not None:
        raise ScenarioError(f"scenario {scenario.name} partitions the network, which {netns.available()}")


def run_one(args: argparse.Namespace, scenario: Scenario, out_dir: Path) -> bool:
    return bool(run_reported(args, scenario, out_dir)["valid"])


def run_reported(args: argparse.Namespace, scenario: Scenario, out_dir: Path) -> dict[str, Any]:
    """Run one scenario, write and print its report; the JSON report."""
    from chaos.report import report_text, write_report
    from chaos.run import Environment, run_scenario

    check_capabilities(args, scenario)
    if scenario.mirror is not None:
        return _run_mirror(args, scenario, out_dir)
    if scenario.federation_ring is not None:
        from chaos.federation_ring import run_ring_scenario

        return run_ring_scenario(scenario, out_dir)

    with environment(args, scenario) as env:
        assert isinstance(env, Environment)
        outcome = run_scenario(scenario, env)
    extra: dict[str, Any] = {
        "published_all": outcome.published_all, "drained": outcome.drained, "overflowed": outcome.overflowed,
        "duration_s": round(outcome.duration_s, 2), "seed": scenario.seed, "error": outcome.error}
    if scenario.node_settings:
        extra["node_settings"] = scenario.node_settings
        extra["expect_loss"] = scenario.expect_loss
    report = write_report(out_dir, scenario.name, outcome.result, outcome.records, extra)
    print(report_text(report), end="")
    print(f"  report: {out_dir}")
    return report


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except ScenarioError as error:
        print(f"raftmq chaos: {error}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "list":
        for name in bundled_scenarios():
            scenario = load_scenario(name)
            needs = f"  [needs {', '.join(sorted(scenario.needs()))}]" if scenario.needs() else ""
            if scenario.mirror is not None:
                via = "  [also --via broker]" if "broker" in scenario.mirror else ""
                print(f"{name:<24} {scenario.nodes} replicas  {scenario.description}{via}")
                continue
            if scenario.shovel is not None:
                src, dst = scenario.shovel.get("source_nodes", 3), scenario.shovel.get("dest_nodes", 3)
                print(f"{name:<24} {src}+{dst} nodes  {scenario.description}")
                continue
            if scenario.federation_ring is not None:
                sizes = "+".join(str(n) for n in scenario.federation_ring.get("nodes", [3, 3, 3]))
                print(f"{name:<24} {sizes} nodes  {scenario.description}")
                continue
            if scenario.federation is not None:
                up, down = scenario.federation.get("upstream_nodes", 1), scenario.federation.get("downstream_nodes", 3)
                print(f"{name:<24} {up}+{down} nodes  {scenario.description}")
                continue
            print(f"{name:<20} {scenario.nodes} node(s)  {scenario.description}{needs}")
        return 0
    if args.command == "check":
        return _check(Path(args.history))
    if args.command == "proxy":
        return _proxy(args.listen, args.seed)
    if args.command == "suite":
        return _suite(args)
    if args.command == "run":
        scenario = load_scenario(args.scenario)
        if args.seed is not None:
            scenario = replace(scenario, seed=args.seed)
        if scenario.mirror is None and (args.truncation or args.promote or args.unsafe or args.via == "broker"):
            raise ScenarioError(f"--truncation/--promote/--unsafe/--via are for mirrored-queue scenarios; "
                                f"{scenario.name} is not one")
        return 0 if run_one(args, scenario, Path(args.out) / scenario.name) else 1
    return _sweep(args)


def _run_mirror_broker(scenario: Scenario, out_dir: Path, unsafe: bool, overrides: dict[str, Any]) -> dict[str, Any]:
    """A `[mirror]` scenario through the broker (chaos/mirror_broker.py): its `[mirror.broker]` version."""
    from chaos.mirror_broker import (
        BrokerScenarioError,
        parse_broker,
        run_broker,
        variant_policy,
        write_report,
    )

    assert scenario.mirror is not None
    if "broker" not in scenario.mirror:
        why = scenario.mirror.get("broker_why_not", "")
        raise ScenarioError(f"scenario {scenario.name} has no version through the broker" + (f": {why}" if why else ""))
    label = "unsafe" if unsafe or overrides else "shipped"
    try:
        spec = parse_broker(dict(scenario.mirror["broker"]))
        result = run_broker(spec, out_dir / "nodes", {label: variant_policy(spec, unsafe, overrides)})
    except BrokerScenarioError as error:
        raise ScenarioError(f"scenario {scenario.name}: {error}") from None
    print(write_report(out_dir, scenario.name, result), end="")
    print(f"  report: {out_dir}")
    c = result.checks[label]
    summary = {"attempted": c.counts.get("published", 0), "confirmed": c.counts.get("confirmed", 0),
               "deliveries": 0, "lost": len(c.lost), "unexpected": 0, "duplicated": 0, "duplicate_deliveries": 0,
               "order_violations": 0}
    return {"scenario": scenario.name, "valid": c.valid, "summary": summary, "mirror": c.summary()}


def _run_mirror(args: argparse.Namespace, scenario: Scenario, out_dir: Path) -> dict[str, Any]:
    """A `[mirror]` scenario (chaos/mirror_run.py); the JSON report's essentials (`valid` decides the exit)."""
    from chaos.mirror_run import MirrorScenarioError, parse_mirror, run_mirror

    assert scenario.mirror is not None
    overrides: dict[str, Any] = {}
    if getattr(args, "truncation", None):
        overrides["truncation"] = args.truncation
    if getattr(args, "promote", None):
        overrides["promote_on_failure"] = args.promote
    if getattr(args, "via", "replicas") == "broker":
        return _run_mirror_broker(scenario, out_dir, bool(getattr(args, "unsafe", False)), overrides)
    try:
        spec = parse_mirror(scenario.mirror)
        run = run_mirror(scenario.name, spec, out_dir, bool(getattr(args, "unsafe", False)), overrides)
    except MirrorScenarioError as error:
        raise ScenarioError(f"scenario {scenario.name}: {error}") from None
    c = run.check  # the suite's table columns (chaos/report.py summary_row); divergence shows in the verdict
    summary = {"attempted": c.counts.get("published", 0), "confirmed": c.counts.get("confirmed", 0),
               "deliveries": 0, "lost": len(c.lost), "unexpected": 0, "duplicated": 0, "duplicate_deliveries": 0,
               "order_violations": 0}
    return {"scenario": scenario.name, "valid": c.valid, "summary": summary, "mirror": c.summary()}


SWEEP_NODES = 3
SWEEP_WORKLOAD = {"queue_type": "quorum", "publishers": 3, "consumers_per_queue": 2, "consumer_url_offset": 1}


def _sweep(args: argparse.Namespace) -> int:
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    failed = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        scenario = random_scenario(seed, args.rounds, args.nodes or SWEEP_NODES, faults,
                                   {**SWEEP_WORKLOAD, "messages_per_publisher": args.messages})
        if not run_one(args, scenario, Path(args.out) / scenario.name):
            failed.append(seed)
    print(f"sweep: {args.seeds - len(failed)}/{args.seeds} seeds passed" +
          (f"; failing seeds: {failed}" if failed else ""))
    return 1 if failed else 0


def _suite(args: argparse.Namespace) -> int:
    from chaos.report import summary_table

    names = args.scenarios or bundled_scenarios()
    reports, skipped = [], []
    for name in names:
        scenario = load_scenario(name)
        if scenario.expect_loss and not args.scenarios:
            skipped.append(f"{scenario.name}: deliberately unsafe (node settings {scenario.node_settings}); "
                           "it must fail: run it by name")
            continue
        try:
            check_capabilities(args, scenario)
        except ScenarioError as error:
            if args.scenarios:
                raise
            skipped.append(f"{scenario.name}: {error}")
            continue
        reports.append(run_reported(args, scenario, Path(args.out) / scenario.name))
    table = summary_table(reports)
    text = table + "".join(f"\nskipped {line}" for line in skipped) + "\n"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.md").write_text(text)
    print(text, end="")
    return 0 if all(report["valid"] for report in reports) else 1


def _check(path: Path) -> int:
    from chaos.checker import check
    from chaos.history import acks_of, read_history, split

    records = list(read_history(path))
    publishes, deliveries, faults = split(records)
    result = check(publishes, deliveries, acks_of(records), faults)
    print(json.dumps(result.summary(), indent=2))
    return 0 if result.valid else 1


def _proxy(listen: str, seed: int) -> int:
    import trio

    from chaos.faultproxy.api import run_fault_proxy
    from chaos.faultproxy.proxy import split_host_port

    host, port = split_host_port(listen)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            _server, bound = await nursery.start(run_fault_proxy, host, port, seed)
            print(f"raftmq chaos proxy: Toxiproxy API on http://{host}:{bound}", flush=True)

    with suppress(KeyboardInterrupt):
        trio.run(serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
