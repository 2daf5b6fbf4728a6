"""deploy/portshard.py: n shards split the ports between them, and a node's derived ports stay in its node's shard."""

from __future__ import annotations

import pytest

from deploy import node_plan, portshard

DERIVED = (10_000, 20_000, 21_000, 22_000, node_plan.TLS_PORT_OFFSET, node_plan.TLS_PROXY_PORT_OFFSET,
           node_plan.MANAGEMENT_TLS_PORT_OFFSET)


def test_unset_owns_every_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(portshard.ENV, raising=False)
    assert portshard.shard() == (0, 1)
    assert all(portshard.owned(port) for port in range(2000, 33000, 7))


@pytest.mark.parametrize("count", [2, 3, 10])
def test_shards_partition_the_ports_and_keep_derived_ports_together(monkeypatch: pytest.MonkeyPatch,
                                                                   count: int) -> None:
    ports = range(2000, 12000, 13)  # every hundreds digit, many times
    owners: dict[int, int] = {}
    for index in range(count):
        monkeypatch.setenv(portshard.ENV, f"{index}/{count}")
        for port in ports:
            if portshard.owned(port):
                assert port not in owners, port
                owners[port] = index
                assert all(portshard.owned(port + offset) for offset in DERIVED), port
    assert len(owners) == len(ports)  # every port has exactly one owner
    assert set(owners.values()) == set(range(count))


@pytest.mark.parametrize("raw", ["2/2", "0/0", "0/11", "x/2"])
def test_a_bad_setting_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(portshard.ENV, raw)
    with pytest.raises(ValueError):
        portshard.owned(5000)
