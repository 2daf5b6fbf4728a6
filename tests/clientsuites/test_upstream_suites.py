"""The AMQP client libraries' OWN integration suites, run against a real `raftmq node`.

For the installed versions of py-amqp and kombu this downloads their sdists (``pip download --no-deps
--no-binary :all:``) into a cache directory -- ``$RAFTMQ_CLIENTSUITES_CACHE`` or ``~/.cache/raftmq-clientsuites``,
reused when the files are already there -- extracts their ``t/`` test trees into the pytest tmp dir, starts a
node and runs in a pytest subprocess:

* py-amqp: ``t/integration/test_rmq.py`` (``test_integration.py`` is mocked, not a broker test);
* kombu: ``t/integration/test_py_amqp.py`` (with its ``common.py``).

Both suites read ``RABBITMQ_HOST`` and ``RABBITMQ_5672_TCP``. Their ``env``/``flaky`` marks come from plugins
(pytest-celery's env marker, pytest-rerunfailures) that are not needed here: the marks are inert, and
rerunfailures is disabled on purpose, so a flaky test fails instead of being retried into a pass. Only the
tree under ``t/`` is extracted, so the tests import the INSTALLED amqp and kombu, not the sdists' copies.

Without the network (and no cached sdists) the tests are skipped, with pip's message as the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.integration.nodeproc import NodeProcess

CACHE_DIR = Path(os.environ.get("RAFTMQ_CLIENTSUITES_CACHE", Path.home() / ".cache" / "raftmq-clientsuites"))
DOWNLOAD_TIMEOUT_S = 120
SUITE_TIMEOUT_S = 240  # kombu's suite takes ~40 s, most of it its own sleeps and drain timeouts
PER_TEST_TIMEOUT_S = 60

_TLS = ("needs an amqps (TLS) listener on RABBITMQ_5671_TCP, which raftmq does not have, and t/certs/*.pem, "
        "which upstream CI generates and the sdist does not ship")
_BADSSL = ("connects to tls-v1-2.badssl.com:1012, an external host, not the broker: it tests py-amqp's TLS "
           "transport only")

# Test ids (pytest --deselect matches them as node-id PREFIXES) that cannot apply to raftmq, with the reason.
# Everything else in the suites must pass.
DESELECT: dict[str, dict[str, str]] = {
    "amqp": {
        "t/integration/test_rmq.py::test_connect[tls]": _TLS,
        "t/integration/test_rmq.py::test_tls_connect_fails": _TLS,
        "t/integration/test_rmq.py::test_tls_default_certs": _BADSSL,
        "t/integration/test_rmq.py::test_tls_no_default_certs_fails": _BADSSL,
        # the 'tls' parametrisation of the connection fixture, for every test of the class
        "t/integration/test_rmq.py::test_rabbitmq_operations::test_publish_consume[tls-": _TLS,
        "t/integration/test_rmq.py::test_rabbitmq_operations::test_publish_get[tls]": _TLS,
        "t/integration/test_rmq.py::test_rabbitmq_operations::test_publish_get__short_int_header[tls]": _TLS,
        "t/integration/test_rmq.py::test_rabbitmq_operations::test_publish_get__short_short_int_header[tls]": _TLS,
    },
    "kombu": {},
}

SUITES = {
    "amqp": ["t/integration/test_rmq.py"],
    "kombu": ["t/integration/test_py_amqp.py"],
}

PYTEST_INI = f"""[pytest]
python_classes = test_*
timeout = {PER_TEST_TIMEOUT_S}
filterwarnings =
    ignore::pytest.PytestUnknownMarkWarning
"""


def _sdist(name: str, ver: str) -> Path:
    return CACHE_DIR / f"{name}-{ver}.tar.gz"


def _download(names: list[str]) -> dict[str, Path]:
    versions = {name: version(name) for name in names}
    missing = [name for name in names if not _sdist(name, versions[name]).exists()]
    if missing:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--timeout", "15",
                "--retries", "1", "--disable-pip-version-check", "-d", str(CACHE_DIR),
                *(f"{name}=={versions[name]}" for name in missing)]
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.skip(f"pip download of {missing} timed out (network unavailable?)")
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            pytest.skip(f"cannot download the {missing} sdists (network unavailable?): {' | '.join(tail)}")
    paths = {name: _sdist(name, versions[name]) for name in names}
    absent = [str(p) for p in paths.values() if not p.exists()]
    if absent:
        pytest.skip(f"pip download did not produce {absent}")
    return paths


def _extract_tests(sdist: Path, dest: Path) -> Path:
    """Extract only the sdist's t/ tree (so the installed library is the one under test)."""
    with tarfile.open(sdist) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/t/")]
        tar.extractall(dest, members=members, filter="data")
    root = dest / top
    (root / "pytest.ini").write_text(PYTEST_INI)
    return root


@pytest.fixture(scope="module")
def sdists() -> dict[str, Path]:
    return _download(list(SUITES))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    proc = NodeProcess(tmp_path_factory.mktemp("clientsuites-node")).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_upstream_integration_suite_passes(suite: str, sdists: dict[str, Path], node: NodeProcess,
                                           tmp_path: Path) -> None:
    root = _extract_tests(sdists[suite], tmp_path)
    junit = tmp_path / "junit.xml"
    args = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "-p", "no:rerunfailures",
            f"--junitxml={junit}", *SUITES[suite]]
    for test_id in DESELECT[suite]:
        args += ["--deselect", test_id]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAFTMQ_", "PYTEST_", "TOX_", "RABBITMQ_"))}
    env.update(RABBITMQ_HOST=node.host, RABBITMQ_5672_TCP=str(node.port))
    done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S)
    report = f"{' '.join(args)}\n{done.stdout[-20000:]}\n{done.stderr[-4000:]}\nnode log:\n{node.log_tail()}"
    print(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, report
    junit_root = ET.parse(junit).getroot()
    suite_el = junit_root if junit_root.tag == "testsuite" else junit_root.find("testsuite")
    assert suite_el is not None, report
    counts = {k: int(suite_el.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == 0, report
    assert counts["tests"] - counts["skipped"] > 0, report  # something actually ran against the node
    assert counts["skipped"] == 0, report  # a skip upstream would hide a test we claim to pass
