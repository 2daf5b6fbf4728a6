"""Workload (a) over TLS against plain AMQP: `python -m bench.tls [--rounds N] [--duration S] [--no-rabbitmq]`.

One raftmq node with both listeners (its amqps one from `ssl_port`, with a certificate from deploy/certs.py) and,
when RabbitMQ is installed, one private RabbitMQ node with `listeners.ssl.default` and the same certificate. Each
round measures (a) (bench.workloads: one publisher with a confirm window, one consumer, a durable classic queue)
on every broker over plain AMQP, then over TLS (the load generator wraps its sockets in TLS: bench.client), and
the report gives each broker's TLS throughput as a ratio of its plain throughput, and raftmq's TLS throughput as a
ratio of RabbitMQ's, per round and as the median over rounds. Client certificates are not used (verify_none).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.brokers import (
    _RabbitEnvironment,
    free_port,
    rabbitmq_available,
    raftmq_node,
    wait_serving,
)
from bench.client import Endpoint
from bench.clusters import plan_rabbit_nodes
from bench.workloads import RunSettings, run_workload
from deploy.certs import CertPaths, make_test_pki


class _TlsRabbitEnvironment(_RabbitEnvironment):
    """The bench's private RabbitMQ environment with a config file that opens an amqps listener."""

    def __init__(self, tls_port: int, node_cert: CertPaths, ca_file: Path) -> None:
        super().__init__()
        self.config = self.root / "tls.conf"
        self.config.write_text(
            f"listeners.ssl.default = {tls_port}\n"
            f"ssl_options.certfile = {node_cert.cert}\n"
            f"ssl_options.keyfile = {node_cert.key}\n"
            f"ssl_options.cacertfile = {ca_file}\n"
            "ssl_options.verify = verify_none\n"
            "ssl_options.fail_if_no_peer_cert = false\n"
        )

    def env(self) -> dict[str, str]:
        return dict(super().env(), RABBITMQ_CONFIG_FILE=str(self.config))


@contextlib.contextmanager
def rabbitmq_tls_node(node_cert: CertPaths, ca_file: Path) -> Iterator[tuple[Endpoint, Endpoint]]:
    """One private RabbitMQ node: (plain endpoint, amqps endpoint)."""
    tls_port = free_port()
    environment = _TlsRabbitEnvironment(tls_port, node_cert, ca_file)
    plan = plan_rabbit_nodes(environment.root, environment.tag, 1, free_port)[0]
    process: subprocess.Popen[bytes] | None = None
    try:
        process = environment.start_node(plan)
        tls = Endpoint("127.0.0.1", tls_port, tls_ca=str(ca_file))
        wait_serving(plan.endpoint, process, 120.0, plan.directory / "stdout.log")
        yield plan.endpoint, tls
    finally:
        if process is not None:
            environment.stop_node(plan.name, process)
        environment.close()


@contextlib.contextmanager
def raftmq_tls_node(node_cert: CertPaths, ca_file: Path) -> Iterator[tuple[Endpoint, Endpoint]]:
    """One raftmq node: (plain endpoint, amqps endpoint)."""
    tls_port = free_port()
    args = ("--ssl-port", str(tls_port), "--ssl-certfile", str(node_cert.cert), "--ssl-keyfile", str(node_cert.key))
    with raftmq_node(extra_args=args) as plain:
        yield plain, Endpoint(plain.host, tls_port, tls_ca=str(ca_file))


def _rate(broker: str, endpoint: Endpoint, settings: RunSettings) -> float:
    measurement = run_workload("a", broker, endpoint, settings)[0]
    if measurement.error:
        raise RuntimeError(f"{broker}: {measurement.error}")
    return measurement.confirmed_msgs_per_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tls", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rabbitmq", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    settings = RunSettings(duration_s=args.duration, warmup_s=args.warmup)
    with tempfile.TemporaryDirectory(prefix="raftmq-bench-tls-") as workdir:
        pki = make_test_pki(Path(workdir), {"node": "127.0.0.1"})
        with contextlib.ExitStack() as stack:
            brokers = {"raftmq": stack.enter_context(raftmq_tls_node(pki.nodes["node"], pki.ca.cert))}
            if args.rabbitmq and rabbitmq_available():
                brokers["rabbitmq"] = stack.enter_context(rabbitmq_tls_node(pki.nodes["node"], pki.ca.cert))
            rates: dict[tuple[str, str], list[float]] = {}
            for round_number in range(1, args.rounds + 1):
                for name, (plain, tls) in brokers.items():
                    for transport, endpoint in (("plain", plain), ("tls", tls)):
                        rate = _rate(name, endpoint, settings)
                        rates.setdefault((name, transport), []).append(rate)
                        print(f"round {round_number} {name:<8} {transport:<5} (a) {rate:>9,.0f} confirmed msg/s",
                              flush=True)
    print()
    for name in brokers:
        plain_rates, tls_rates = rates[(name, "plain")], rates[(name, "tls")]
        ratios = [t / p for t, p in zip(tls_rates, plain_rates, strict=True) if p]
        print(f"{name}: TLS / plain = {statistics.median(ratios):.2f} (rounds: "
              f"{', '.join(f'{r:.2f}' for r in ratios)}); median plain {statistics.median(plain_rates):,.0f}, "
              f"TLS {statistics.median(tls_rates):,.0f} msg/s")
    if "rabbitmq" in brokers:
        ratios = [r / q for r, q in zip(rates[("raftmq", "tls")], rates[("rabbitmq", "tls")], strict=True) if q]
        print(f"raftmq TLS / RabbitMQ TLS = {statistics.median(ratios):.2f} (rounds: "
              f"{', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
