"""How the suite runs on several pytest-xdist workers (`./dev test` passes `-n 2 --dist loadgroup`).

Each test FILE is one unit of work, so its module fixtures (a cluster, a broker) start once, on one worker; the files
that change host-wide state are one unit, `hostwide`, run by one worker one after another: the network-namespace
partitions (tests/chaos: nftables inside namespaces on a host bridge) and the compose test (its Docker engine sets
the FORWARD policy and bridge-nf-call-iptables, which would drop the partition tests' bridged traffic while it runs).
Units are handed out in collection order and each worker reorders its collection the same way, longest files first
(`SLOWEST_FIRST`, from CI's durations), so no long file starts last and stretches the tail; the units of `APART`
(the timing-bound client suites, the image-building hostwide unit) are not run beside each other while some other unit
can run instead. Each worker gets its own
share of the fixed ports the fixtures pick at random (deploy/portshard.py, through RAFTMQ_PORT_SHARD). Without
xdist (or with `-n 0`) none of this applies: the suite runs in file order, as before.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from deploy import portshard

HOSTWIDE_GROUP = "hostwide"
INTEGRATION = "tests/integration/"
HOSTWIDE_FILES = (
    "tests/deploy/test_compose.py",
    "tests/chaos/test_netns.py",
    "tests/chaos/test_cli.py",
    "tests/chaos/test_quorum_cluster.py",
)
# Units never run beside each other while another unit can run instead: the upstream client suites hold timing
# limits tuned for an idle machine, and the hostwide unit's compose test builds Docker images on every core.
APART = frozenset({"tests/clientsuites/test_upstream_suites.py", HOSTWIDE_GROUP})
# The files that take longest (CI's --durations), longest first; every other file follows in collection order.
SLOWEST_FIRST = (
    "tests/clientsuites/test_upstream_suites.py",
    "tests/deploy/test_compose.py",  # the hostwide unit starts here
    "tests/spark/test_end_to_end_cluster.py",
    "tests/shovel/test_dynamic_cluster.py",
    "tests/durability/test_crash_loop.py",
    "tests/chaos/test_quorum_unsafe.py",
    "tests/chaos/test_shovel.py",
    "tests/spark/test_job.py",
    "tests/cluster/test_metadata_membership.py",
    "tests/chaos/test_federation_processes.py",
    "tests/chaos/test_mirror_scenarios.py",
    "tests/mirror/test_mirror_cluster.py",
    "tests/chaos/test_mirror_broker.py",
)


def _worker() -> tuple[int, int] | None:
    """(index, count) in an xdist worker, None otherwise."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not name.startswith("gw"):
        return None
    return int(name[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def pytest_configure(config: pytest.Config) -> None:
    worker = _worker()
    if worker is not None and worker[1] > 1:
        index, count = worker
        if count > portshard.MAX_SHARDS:
            raise pytest.UsageError(f"at most {portshard.MAX_SHARDS} xdist workers (-n): they split the node ports")
        os.environ[portshard.ENV] = f"{index}/{count}"
        config.pluginmanager.register(_SlowestFirst(), "raftmq-slowest-first")
    if getattr(config.option, "dist", "no") in ("loadfile", "loadgroup") and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Scheduling(), "raftmq-xdist-scheduling")


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


class _SlowestFirst:
    """In an xdist worker: the slowest files first, after every other hook has ordered the items (a stable sort, so
    the order inside a file, and of the other files, stays as collected)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        _sort_slowest_first(items)


def _sort_slowest_first(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    hostwide_rank = min(rank.get(path, len(rank)) for path in HOSTWIDE_FILES)
    items.sort(key=lambda item: hostwide_rank if _file(item) in HOSTWIDE_FILES else rank.get(_file(item), len(rank)))


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, the hostwide group, or for tests/integration its file and mode
    (the session's amqp_target is parametrized single/cluster: a worker that ran one file's [single] and [cluster]
    tests together would switch the session fixture, restarting the shared single node, at every file)."""
    path = nodeid.split("::", 1)[0]
    if path in HOSTWIDE_FILES:
        return HOSTWIDE_GROUP
    if path.startswith(INTEGRATION) and nodeid.endswith("]") and "[" in nodeid:
        modes = set(nodeid[nodeid.rindex("[") + 1:-1].split("-")) & {"single", "cluster"}
        if len(modes) == 1:
            return f"{path}[{modes.pop()}]"
    return path


class _Scheduling:
    """The scheduler for `--dist loadgroup` (and loadfile): xdist's by file, with HOSTWIDE_FILES as one unit, and the
    units in collection order (xdist's puts the units with most tests first). The group is decided here from the
    file names, not by xdist_group marks: xdist 3.8 marks a test by renaming its nodeid, which pytest 9 ignores."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        from xdist.scheduler import LoadScopeScheduling

        class FileOrHostwideScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return _unit(nodeid)

            def _assign_work_unit(self, node: Any) -> None:
                """xdist's, but while another worker runs one of APART, the next unit that is not one of them."""
                busy = {scope for other, work in self.assigned_work.items() if other is not node
                        for scope, tests in work.items() if not all(tests.values())}
                if busy & APART:
                    fits = next((scope for scope in self.workqueue if scope not in APART), None)
                    if fits is not None:
                        self.workqueue.move_to_end(fits, last=False)
                super()._assign_work_unit(node)

        config.option.loadscopereorder = False
        return FileOrHostwideScheduling(config, log)
