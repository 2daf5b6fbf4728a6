"""The AMQP client libraries' OWN integration suites, run against raftmq: a single node and a 3-node cluster.

For the installed versions of py-amqp, kombu, aiormq and aio-pika this downloads their sdists (``pip download
--no-deps --no-binary <name>``: the sdist itself, its build backend may come as a wheel) into a cache directory --
``$RAFTMQ_CLIENTSUITES_CACHE`` or ``~/.cache/raftmq-clientsuites``, reused when the files are already there --
extracts their test trees into the pytest tmp dir and runs each suite in a pytest subprocess, once against a
`raftmq node` (`[single]`) and once against a 3-node cluster behind HAProxy (`[cluster]`,
tests/integration/clusterproc.py):

* py-amqp: ``t/integration/test_rmq.py`` (``test_integration.py`` is mocked, not a broker test); its TLS tests run
  against the single node's amqps listener and the cluster's HAProxy amqps frontend (TLS passed through to the
  nodes), with the ``t/certs/*.pem`` files written from deploy/certs.py;
* kombu: ``t/integration/test_py_amqp.py`` (with its ``common.py``);
* aiormq and aio-pika: their whole ``tests/`` tree (aiomisc-pytest runs them, as upstream).

py-amqp and kombu read ``RABBITMQ_HOST`` and ``RABBITMQ_5672_TCP``. aiormq and aio-pika start a RabbitMQ Docker
container through their ``tests/docker_client.py``; that file is replaced by ``suite_docker.py`` (next to this
module), whose one "container" is the broker under test, and a plugin (``suite_plugin.py``) gives aiormq the
session fixtures its conftest expects from elsewhere. The same plugin deselects the tests of ``DESELECT`` (they
cannot apply to raftmq, or fail against RabbitMQ 3.10 too; each has its reason) and of ``SUBSET`` (left out for CI
time only) and, in cluster mode only, marks those of ``CLUSTER_XFAIL`` xfail(strict=False): known cluster-mode
broker bugs, one entry each, to delete as the bugs are fixed.
Upstream ``flaky`` marks stay inert (rerunfailures is disabled on purpose, so a flaky test fails instead of being
retried into a pass). Only the test trees are extracted, so the tests import the INSTALLED libraries.

Without the network (and no cached sdists) the tests are skipped, with pip's message as the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

from deploy.certs import make_test_pki
from tests.integration.clusterproc import ClusterProcess
from tests.integration.nodeproc import DEFAULT_LIMITS_CONFIG_TOML, NodeProcess

HERE = Path(__file__).resolve().parent
CACHE_DIR = Path(os.environ.get("RAFTMQ_CLIENTSUITES_CACHE", Path.home() / ".cache" / "raftmq-clientsuites"))
DOWNLOAD_TIMEOUT_S = 600  # pip builds each sdist's metadata: minutes on a loaded machine
PER_TEST_TIMEOUT_S = 60
XFAIL_TIMEOUT_S = 20  # a known cluster bug that hangs a test costs this much, not PER_TEST_TIMEOUT_S
# aiormq's and aio-pika's tests carry their own limits (aiomisc.timeout, up to 60 s), which cancel the test cleanly;
# pytest-timeout's SIGALRM lands inside the event loop, where a test's `except Exception: continue` retry loop can
# swallow it and hang the whole suite, so for them it must never fire first (per test, xfail or not).
ASYNC_XFAIL_TIMEOUT_S = 90
# The suites hold timing limits tuned for a RabbitMQ container on an idle machine (1 s heartbeats, 50 ms consume
# timeouts, 5 s waits); on CI's 2 cores, with three nodes, HAProxy and the suite sharing them, one of ~200 tests
# now and then misses such a limit (stop 16's CI: one aio-pika test in the cluster run, after 2,144 passes). So the
# few tests that failed, up to MAX_RERUN of them, run once more, alone, and must pass then; both runs are printed,
# naming them. More failures than that, or a failure again, fails the test as before.
MAX_RERUN = 3


@dataclass(frozen=True)
class Suite:
    dist: str  # the distribution name, as pip and importlib.metadata know it
    tree: str  # the sdist's test directory, extracted alone
    paths: tuple[str, ...]  # what pytest runs, relative to the sdist's root
    timeout_s: int  # the whole suite


SUITES = {
    "amqp": Suite("amqp", "t", ("t/integration/test_rmq.py",), 240),
    "kombu": Suite("kombu", "t", ("t/integration/test_py_amqp.py",), 240),
    "aiormq": Suite("aiormq", "tests", ("tests",), 900),
    "aio-pika": Suite("aio-pika", "tests", ("tests",), 1200),
}

_TLS_ASYNC = ("needs an amqps listener as the container's 5671/tcp with the suite's certificates: raftmq has one "
              "(ssl_port) but suite_docker.py does not start or describe it yet")
_BADSSL = ("connects to tls-v1-2.badssl.com:1012, an external host, not the broker: it tests py-amqp's TLS "
           "transport only")
_RMQ43 = ("RabbitMQ 4.3's consumer-timeout handshake (capability accept_consumer_cancel_ok); raftmq answers as "
          "RabbitMQ 3.10, and the test skips itself on such a broker")
_RMQ43_ASYNC = ("RabbitMQ 4.3's consumer-timeout handshake (capability accept_consumer_cancel_ok): the test skips "
                "itself on a broker without it, as on RabbitMQ 3.10.8, which raftmq answers as")
_CLIENT_RACE = ("the broker never sees this publish (the test replaces the channel's write queue); whether the "
                "publish then raises ConnectionClosed or a bare Exception depends on which of aiormq's own close paths "
                "rejects its drain future first: it fails against RabbitMQ 3.10.8 too (both parametrisations)")
_RECONNECT_RACE = ("aio-pika's own reconnect race: a channel opened while the robust connection restores its channels "
                   "gets the closed connection (RuntimeError ... closed) or logs an error; run 25 times in a row it "
                   "failed 19 times against RabbitMQ 3.10.8 and 17 times against a raftmq node, the same two ways")
_GC_TIMING = ("counts the client's channel objects still alive after the connection closed and gc.collect(): "
              "client-side and intermittent; it failed against RabbitMQ 3.10.8 too (once in one run)")
_CLOSE_RACE = ("closing the connection with an error, the test expects that error from the `closing` future; "
               "which of aiormq's own close paths completes it first is a race: intermittent against RabbitMQ "
               "3.10.8 too (3 of the 4 connection-True parametrisations failed there in one run)")
_CONFIRM_WITHIN_200MS = ("a timing assert (10 publishes confirmed within 200 ms, repeated 10 times), not a behaviour: "
                         "with other suites running alongside (load average 9-16 on 2 cores) it failed against "
                         "RabbitMQ 3.10.8 in all 3 parametrisations and once against a raftmq node")
_CONTAINER = ("stops and restarts the broker's Docker container (rabbitmqctl stop_app / docker kill and start): "
              "here the broker under test is shared by the whole suite and is not a container; aio-pika's "
              "recovery after a broker restart is tested in both modes by tests/integration/test_aio_pika.py::"
              "test_robust_connection_recovers_after_node_restart")

# Tests that cannot apply to raftmq, or that fail against RabbitMQ 3.10.8 as well (client-side races, a timing
# assert), by node-id regular expression (re.search), with the reason. Everything else in the suites must pass.
DESELECT: dict[str, dict[str, str]] = {
    "amqp": {
        r"^t/integration/test_rmq\.py::test_tls_default_certs": _BADSSL,
        r"^t/integration/test_rmq\.py::test_tls_no_default_certs_fails": _BADSSL,
    },
    "kombu": {},
    "aiormq": {
        r"\[(.*-)?amqps(-client)?(-.*)?\]$": _TLS_ASYNC,  # the amqps parametrisations of the amqp_url fixture
        r"^tests/test_connection\.py::test_auth_external": _TLS_ASYNC,
        r"^tests/test_connection\.py::test_ssl_verification_fails_without_trusted_ca": _TLS_ASYNC,
        r"^tests/test_connection\.py::test_ssl_context\b": _TLS_ASYNC,
        r"^tests/test_channel\.py::test_consumer_timeout_allows_the_same_consumer_tag": _RMQ43,
        r"^tests/test_connection_futures\.py::test_connection_close_during_publish_drain\[": _CLIENT_RACE,
        r"^tests/test_connection\.py::test_closing_waiter_cancellation\[.*-connection-True\]$": _CLOSE_RACE,
        r"^tests/test_channel\.py::test_confirm_multiple\[": _CONFIRM_WITHIN_200MS,
    },
    "aio-pika": {
        r"^tests/test_amqps\.py::": _TLS_ASYNC,
        r"^tests/test_robust_recovery\.py::test_restore_topology_and_consumers\[(stop_app|kill)\]": _CONTAINER,
        r"^tests/test_robust_recovery\.py::test_pool_consumer_survives_broker_restart$": _CONTAINER,
        r"^tests/test_consumer_cancel_recovery\.py::test_consumer_timeout_restores_same_tag$": _RMQ43_ASYNC,
        r"^tests/test_reconnect_channel_snapshot\.py::test_create_channels_during_reconnect$": _RECONNECT_RACE,
        r"^tests/test_memory_leak\.py::test_leak_unclosed_channel\[": _GC_TIMING,
    },
}

# A subset, for CI time only (not a claim that these cannot pass): aiormq runs each connection test once per
# amqp_url parametrisation, and `amqp-named` differs from `amqp` only by ?name=pytest in the URL (one more client
# property, connection_name). Outside test_connection.py, where both stay, the named run is left out: it took about
# half of aiormq's time in each mode.
SUBSET: dict[str, dict[str, str]] = {
    "amqp": {},
    "kombu": {},
    "aiormq": {
        r"^(?!tests/test_connection\.py::).*\[(.*-)?amqp-named(-.*)?\]$":
            "the same test as its [amqp] parametrisation with ?name=pytest in the URL: left out for CI time",
    },
    "aio-pika": {},
}

# Cluster mode only: tests that fail on a known cluster-mode broker bug, by node-id regular expression -> the bug.
# They run as xfail(strict=False); delete an entry when its bug is fixed.
CLUSTER_XFAIL: dict[str, dict[str, str]] = {
    "amqp": {},
    "kombu": {},
    "aiormq": {},
    "aio-pika": {},
}

# aiormq's and aio-pika's conftests wrap every test in `memory_tracer`, a tracemalloc check that the CLIENT
# library leaks no allocations. It says nothing about the broker and makes each test many times slower (a snapshot
# comparison per test), so it is made an ordinary fixture (used by no test) when the suite is extracted.
LEAK_CHECK = "@pytest.fixture(autouse=True)\ndef memory_tracer("

PYTEST_INI = f"""[pytest]
python_classes = test_*
timeout = {PER_TEST_TIMEOUT_S}
addopts = -p no:asyncio
filterwarnings =
    ignore::pytest.PytestUnknownMarkWarning
"""


def _sdist(dist: str, ver: str) -> Path | None:
    for name in {dist, dist.replace("-", "_")}:
        path = CACHE_DIR / f"{name}-{ver}.tar.gz"
        if path.exists():
            return path
    return None


def _download(dists: list[str]) -> dict[str, Path]:
    versions = {dist: version(dist) for dist in dists}
    missing = [dist for dist in dists if _sdist(dist, versions[dist]) is None]
    if missing:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        # --no-binary names the suites only: with :all: pip would build their build backends from source too
        # (uv_build needs a Rust toolchain).
        args = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ",".join(missing),
                "--timeout", "15", "--retries", "1", "--disable-pip-version-check", "-d", str(CACHE_DIR),
                *(f"{dist}=={versions[dist]}" for dist in missing)]
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.skip(f"pip download of {missing} timed out (network unavailable?)")
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            pytest.skip(f"cannot download the {missing} sdists (network unavailable?): {' | '.join(tail)}")
    paths = {dist: _sdist(dist, versions[dist]) for dist in dists}
    absent = [dist for dist, path in paths.items() if path is None]
    if absent:
        pytest.skip(f"pip download did not produce the sdists of {absent} in {CACHE_DIR}")
    return {dist: path for dist, path in paths.items() if path is not None}


def _extract_tests(sdist: Path, suite: Suite, dest: Path, mode: str, name: str) -> Path:
    """Extract only the sdist's test tree (so the installed library is the one under test), with our pytest.ini,
    plugin and configuration, and the Docker stand-in where the suite has a Docker helper."""
    with tarfile.open(sdist) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/{suite.tree}/")]
        tar.extractall(dest, members=members, filter="data")
    root = dest / top
    ini = PYTEST_INI if suite.tree != "tests" else PYTEST_INI.replace(f"timeout = {PER_TEST_TIMEOUT_S}\n",
                                                                      f"timeout = {ASYNC_XFAIL_TIMEOUT_S}\n")
    (root / "pytest.ini").write_text(ini)
    shutil.copy(HERE / "suite_plugin.py", root / "raftmq_suite_plugin.py")
    if (root / suite.tree / "docker_client.py").exists():
        shutil.copy(HERE / "suite_docker.py", root / suite.tree / "docker_client.py")
    conftest = root / suite.tree / "conftest.py"
    if conftest.exists():  # see LEAK_CHECK
        conftest.write_text(conftest.read_text().replace(LEAK_CHECK, LEAK_CHECK.replace("(autouse=True)", "")))
    config = {"deselect": DESELECT[name] | SUBSET[name], "xfail": CLUSTER_XFAIL[name] if mode == "cluster" else {},
              "xfail_timeout_s": ASYNC_XFAIL_TIMEOUT_S if suite.tree == "tests" else XFAIL_TIMEOUT_S}
    (root / "raftmq_suite.json").write_text(json.dumps(config, indent=2))
    return root


@pytest.fixture(scope="module")
def sdists() -> dict[str, Path]:
    return _download([suite.dist for suite in SUITES.values()])


@dataclass(frozen=True)
class Broker:
    mode: str
    host: str
    port: int
    process: NodeProcess | ClusterProcess
    tls_port: int | None = None  # the amqps listener (single) or HAProxy's amqps frontend (cluster)
    certs: dict[str, Path] | None = None  # py-amqp's t/certs/<name> -> the generated file


TLS_LINE = re.compile(rb"amqps listener on port (\d+)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _suite_certs(workdir: Path, ca: Path, client_cert: Path, client_key: Path) -> dict[str, Path]:
    """The certificates py-amqp's suite reads from t/certs (upstream CI generates them; the sdist does not ship
    them): the CA, a client certificate, and a "broken" one (from another CA, which the broker refuses)."""
    other = make_test_pki(workdir / "other-pki", {}, ("broken",), ca_name="another CA")
    return {"ca_certificate.pem": ca, "client_certificate.pem": client_cert, "client_key.pem": client_key,
            "client_certificate_broken.pem": other.clients["broken"].cert,
            "client_key_broken.pem": other.clients["broken"].key}


def _tls_node_config(workdir: Path) -> tuple[str, dict[str, Path]]:
    """A single node's amqps settings (client certificates required), and the suite's certificates."""
    pki = make_test_pki(workdir / "pki", {"node": "127.0.0.1"}, ("client",))
    node = pki.nodes["node"]
    settings = (f"ssl_port = {_free_port()}\nssl_certfile = \"{node.cert}\"\nssl_keyfile = \"{node.key}\"\n"
                f"ssl_cacertfile = \"{pki.ca.cert}\"\nssl_verify = \"verify_peer\"\nssl_fail_if_no_peer_cert = true\n")
    return settings, _suite_certs(workdir, pki.ca.cert, pki.clients["client"].cert, pki.clients["client"].key)


def _tls_port(node: NodeProcess) -> int:
    found = TLS_LINE.findall(node.log_path.read_bytes())
    assert found, node.log_tail()
    return int(found[-1])


@pytest.fixture(scope="module", params=["single", "cluster"])
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    workdir = tmp_path_factory.mktemp(f"clientsuites-{request.param}")
    if request.param == "cluster":
        cluster = ClusterProcess(workdir, config_toml=DEFAULT_LIMITS_CONFIG_TOML, tls=True).start()
        # The cluster offers EXTERNAL (as `raftmq cluster up --tls`) and py-amqp picks it whenever it is offered, so
        # its client certificate is guest's: it logs in as guest with it.
        certs = _suite_certs(workdir, cluster.tls_dir / "ca.pem", cluster.tls_dir / "guest.pem",
                             cluster.tls_dir / "guest.key")
        try:
            yield Broker("cluster", cluster.host, cluster.port, cluster, cluster.tls_port, certs)
        finally:
            cluster.shutdown()
        return
    settings, certs = _tls_node_config(workdir)
    node = NodeProcess(workdir, config_toml=settings + DEFAULT_LIMITS_CONFIG_TOML).start()
    try:
        yield Broker("single", node.host, node.port, node, _tls_port(node), certs)
    finally:
        node.stop()


def _counts(junit: Path, report: str) -> dict[str, int]:
    """Totals from the junit report; xfailed tests (junit calls them skipped) are counted apart."""
    root = ET.parse(junit).getroot()
    suite_el = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite_el is not None, report
    counts = {k: int(suite_el.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    xfailed = sum(1 for el in suite_el.iter("skipped") if el.get("type") == "pytest.xfail")
    counts["xfailed"] = xfailed
    counts["skipped"] -= xfailed
    return counts


def _run_suite(args: list[str], root: Path, env: dict[str, str], output: Path,
               timeout_s: int) -> tuple[int | None, str]:
    """Run a suite's pytest in `root`; its return code (None: timed out) and its whole output."""
    with output.open("wb") as out:
        try:
            returncode: int | None = subprocess.run(args, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                    timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            returncode = None
    return returncode, output.read_text(errors="replace")


def _failed_tests(junit: Path) -> str:
    """The failed and errored tests of the junit report, one line each with the first line of its message: first in
    the assertion message, so that a report cut to its head still names them."""
    lines = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        for bad in (*case.findall("failure"), *case.findall("error")):
            message = (bad.get("message") or "").strip().splitlines()
            lines.append(f"{bad.tag.upper()} {case.get('classname')}::{case.get('name')}: "
                         f"{message[0][:200] if message else ''}")
    return "\n".join(lines) or "(no failed test case in the junit report)"


@pytest.mark.timeout(max(suite.timeout_s for suite in SUITES.values()) + 120)
@pytest.mark.parametrize("name", sorted(SUITES))
def test_upstream_integration_suite_passes(name: str, sdists: dict[str, Path], broker: Broker,
                                           tmp_path: Path) -> None:
    suite = SUITES[name]
    root = _extract_tests(sdists[suite.dist], suite, tmp_path, broker.mode, name)
    junit = tmp_path / "junit.xml"
    # --tb=native: pytest's own traceback formatting parses the failing test's source (ast.parse), which failed on
    # CPython 3.11.7 for some aiormq and aio-pika failures ("SystemError: AST constructor recursion depth mismatch")
    # and ended the run with INTERNALERROR, losing the rest of the suite and its report.
    args = [sys.executable, "-m", "pytest", "-q", "-rfEsxX", "--tb=native", "-p", "no:cacheprovider",
            "-p", "no:rerunfailures", "-p", "raftmq_suite_plugin", f"--junitxml={junit}", *suite.paths]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAFTMQ_", "PYTEST_", "TOX_", "RABBITMQ_", "DOCKER_"))}
    env.update(RABBITMQ_HOST=broker.host, RABBITMQ_5672_TCP=str(broker.port), PYTHONPATH=str(root))
    if broker.tls_port is not None and broker.certs is not None and name == "amqp":
        (root / "t" / "certs").mkdir(exist_ok=True)
        for target, source in broker.certs.items():
            shutil.copy(source, root / "t" / "certs" / target)
        env["RABBITMQ_5671_TCP"] = str(broker.tls_port)
    output = tmp_path / "output.txt"  # kept whole in the tmp dir; the report quotes its tail
    returncode, text = _run_suite(args, root, env, output, suite.timeout_s)
    report = f"{' '.join(args)}\n(output: {output})\n{text[-30000:]}\nbroker log:\n{broker.process.log_tail()}"
    assert returncode is not None, f"the suite did not finish in {suite.timeout_s} s\n{report}"
    print(text.strip().splitlines()[-1] if text.strip() else "(no output)")
    assert junit.exists(), report
    counts = _counts(junit, report)
    failed = sorted(set((root / "raftmq_failed.txt").read_text().split("\n")) - {""}) \
        if (root / "raftmq_failed.txt").exists() else []
    if counts["failures"] + counts["errors"] > 0 and 0 < len(failed) <= MAX_RERUN:
        # One rerun of the few tests that failed: see MAX_RERUN. They must all pass now, and they are named.
        print(f"rerun once after a failure: {failed}\n{_failed_tests(junit)}")
        (root / "raftmq_failed.txt").unlink()
        rerun_junit = tmp_path / "junit-rerun.xml"
        rerun_args = [*args[:-len(suite.paths)], *failed]
        rerun_args[rerun_args.index(f"--junitxml={junit}")] = f"--junitxml={rerun_junit}"
        rerun_output = tmp_path / "output-rerun.txt"
        returncode, text = _run_suite(rerun_args, root, env, rerun_output, suite.timeout_s)
        report = (f"first run:\n{_failed_tests(junit)}\nrerun: {' '.join(rerun_args)}\n(output: {rerun_output})\n"
                  f"{text[-30000:]}\nbroker log:\n{broker.process.log_tail()}")
        assert returncode is not None, f"the rerun did not finish in {suite.timeout_s} s\n{report}"
        assert rerun_junit.exists(), report
        rerun_counts = _counts(rerun_junit, report)
        assert rerun_counts["failures"] == rerun_counts["errors"] == 0, f"{_failed_tests(rerun_junit)}\n{report}"
        assert rerun_counts["tests"] == len(failed), report
    else:
        assert counts["failures"] == counts["errors"] == 0, f"{_failed_tests(junit)}\n{report}"
    assert returncode == 0, report
    assert counts["tests"] - counts["skipped"] - counts["xfailed"] > 0, report  # something actually ran
    assert counts["skipped"] == 0, report  # a skip upstream would hide a test we claim to pass
