"""The Raft port is never open without the secret; wrong secrets and incompatible versions are refused."""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import struct
import zlib
from pathlib import Path

import pytest
import trio
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.encryptor import getEncryptor

from cluster.metadata.model import PutVhost
from cluster.metadata.secret import ClusterSecretError, Probe, probe_peer
from cluster.metadata.store import IncompatibleVersionError, MetadataStore, _Replica
from tests.metadata.helpers import FAST, SECRET, config, free_addresses, start_all, wait_until


async def test_refuses_to_start_without_a_long_enough_secret() -> None:
    addrs = free_addresses(3)
    for bad in (None, "", "short"):
        with pytest.raises(ClusterSecretError, match="secret"):
            MetadataStore(config(0, addrs, secret=bad))  # type: ignore[arg-type]


async def test_refuses_a_wildcard_bind_address() -> None:
    addrs = free_addresses(3)
    addrs[0] = "0.0.0.0:" + addrs[0].split(":")[1]
    with pytest.raises(ValueError, match="wildcard"):
        MetadataStore(config(0, addrs))


class _Bomb:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))  # unpickling this would create the file


async def test_wrong_secret_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    addrs = free_addresses(3)
    good = await start_all([config(i, addrs) for i in range(2)])
    try:
        assert (await good[0].apply(PutVhost("/"))).ok
        await wait_until(lambda: good[0].state == good[1].state, what="equal replicas")
        before = good[0].state
        # 1. the node with the wrong secret gets a clear error and starts nothing
        bad = MetadataStore(config(2, addrs, secret="another-secret-of-enough-length"))
        with pytest.raises(ClusterSecretError, match="mismatch"):
            await bad.start()
        assert await trio.to_thread.run_sync(probe_peer, addrs[0], b"another-secret-of-enough-length") \
            is Probe.MISMATCH
        assert await trio.to_thread.run_sync(probe_peer, addrs[0], SECRET.encode()) is Probe.OK
        # 2. even bypassing that check, a pysyncobj node with the wrong password cannot change anything
        rogue_replica = _Replica()
        conf = SyncObjConf(password="another-secret-of-enough-length", appendEntriesPeriod=0.05,
                           raftMinTimeout=FAST["raft_min_timeout_s"], raftMaxTimeout=FAST["raft_max_timeout_s"])
        rogue = SyncObj(addrs[2], addrs[:2], conf, consumers=[rogue_replica])
        # 3. and a raw, unencrypted pickle sent to the port is never unpickled
        marker = tmp_path / "pwned"
        frame = zlib.compress(pickle.dumps(_Bomb(str(marker))), 3)
        host, port = addrs[0].split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(struct.pack("i", len(frame)) + frame)
        try:
            rogue_replica.apply_command(b"\xa0", callback=lambda *_: None)
            await trio.sleep(3.0)  # several election timeouts: the rogue would have campaigned by now
            assert rogue._getLeader() is None
        finally:
            rogue.destroy()
        assert not marker.exists()
        assert good[0].state == before and good[1].state == before
        await wait_until(lambda: good[0].leader() in addrs[:2], what="a leader among the good nodes")
        assert (await good[1].apply(PutVhost("still-works"))).ok
    finally:
        for s in good:
            s.close()


async def test_incompatible_version_is_refused_and_changes_nothing() -> None:
    addrs = free_addresses(3)
    good = await start_all([config(i, addrs) for i in range(2)])
    try:
        await wait_until(lambda: all(len(s.state.nodes) == 2 for s in good), what="two nodes registered on both")
        before = good[0].state.definitions()
        newer = MetadataStore(config(2, addrs, version=99))
        with pytest.raises(IncompatibleVersionError, match="version 99"):
            await newer.start()
        assert newer.leader() is None  # stopped
        await wait_until(lambda: good[1].state.definitions() == good[0].state.definitions(), what="replicas")
        assert good[0].state.definitions() == before
        assert sorted(good[0].state.nodes) == ["n0", "n1"]
    finally:
        for s in good:
            s.close()


async def test_frames_that_do_not_authenticate_are_dropped_logged_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    """pysyncobj drops such frames silently; the store's AuditedEncryptor counts and logs each, and the group keeps
    working. A raw pickle, a frame sealed with another secret, and a good frame with one byte altered."""
    caplog.set_level(logging.WARNING, logger="cluster.metadata.secret")
    addrs = free_addresses(2)
    stores = await start_all([config(i, addrs) for i in range(2)])
    try:
        good = getEncryptor(SECRET.encode()).encrypt_at_time(zlib.compress(pickle.dumps(b"k" * 32), 3), 0)
        altered = bytearray(good)
        altered[len(altered) // 2] ^= 0x01
        frames = [zlib.compress(pickle.dumps(b"k" * 32), 3),
                  getEncryptor(b"another-secret-of-enough-length").encrypt_at_time(b"x", 0), bytes(altered)]
        host, port = addrs[0].split(":")
        for frame in frames:
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(struct.pack("i", len(frame)) + frame)
                sock.settimeout(5)
                with contextlib.suppress(OSError):
                    while sock.recv(65536):  # pysyncobj sends its own key, then closes on our frame
                        pass
        await wait_until(lambda: stores[0].audit.rejected == 3, what="three frames rejected")
        warnings = [r.getMessage() for r in caplog.records if "does not authenticate" in r.getMessage()]
        assert len(warnings) == 3, warnings
        assert (await stores[1].apply(PutVhost("still-works"))).ok
        assert stores[1].audit.rejected == 0
    finally:
        for s in stores:
            s.close()
