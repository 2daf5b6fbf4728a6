"""The cluster secret: the only thing standing between pysyncobj's pickled wire messages and the network.

What it is for: pysyncobj unpickles what it receives, so an open Raft port without authentication is remote code
execution. Every metadata node therefore runs pysyncobj with `password` set (Fernet: AES-128-CBC + HMAC-SHA256,
key derived by PBKDF2 from the secret); a frame that does not authenticate is dropped before it is unpickled. This
module checks the secret, checks the bind address, and gives a clear error when our secret differs from a peer's.

How it works:
- `check_secret` refuses secrets shorter than `SECRET_MIN_BYTES`; `check_bind_address` refuses wildcard hosts.
- `probe_peer` speaks the first step of pysyncobj's encrypted handshake to one peer: it sends a random key
  encrypted with our secret and waits for the peer's reply. A peer with the same secret answers with its own
  encrypted key (we only check that it authenticates; we never unpickle it); a peer with another secret cannot
  decrypt our frame and closes the connection, or answers with a frame we cannot authenticate. Either is a
  mismatch. A peer that is down is "unreachable" and says nothing about the secret.
- `AuditedEncryptor` is the Fernet encryptor pysyncobj's connections use (store.py hands it to them): the same
  key, but every received frame that does not authenticate (forged, altered, or sealed with another secret) is
  counted (`rejected`) and logged before pysyncobj drops it and closes the connection, which pysyncobj itself does
  silently. What it cannot see: a frame that authenticates but carries another connection's random key (pysyncobj
  drops that one silently too), and a frame replayed on the same connection within the same second (pysyncobj
  accepts it; Raft's messages tolerate duplicates; docs/configuration.md, "Cluster secret").
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
import zlib
from enum import Enum

from cryptography.fernet import Fernet, InvalidToken
from pysyncobj.encryptor import getEncryptor
from pysyncobj.pickle import dumps as _pysyncobj_dumps

log = logging.getLogger(__name__)
SECRET_MIN_BYTES = 16
FRAME_MAX_BYTES = 1 << 16  # the peer's first frame is a 32-byte key; anything bigger is not a pysyncobj peer


class ClusterSecretError(Exception):
    """The cluster secret is missing, too short, or differs from a peer's."""


class Probe(Enum):
    OK = "ok"
    MISMATCH = "mismatch"
    UNREACHABLE = "unreachable"


def secret_bytes(secret: str | bytes | None) -> bytes:
    if secret is None:
        raise ClusterSecretError("no cluster secret configured: the metadata (Raft) port is never opened without one")
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(raw) < SECRET_MIN_BYTES:
        raise ClusterSecretError(f"the cluster secret must be at least {SECRET_MIN_BYTES} bytes (got {len(raw)})")
    return raw


def check_bind_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::", "*"):
        raise ValueError(f"metadata address {address!r}: bind to the node's cluster address, not a wildcard")
    return host, int(port)


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def probe_peer(address: str, secret: bytes, timeout_s: float = 3.0) -> Probe:
    """One encrypted key exchange with the peer at host:port (blocking; run it in a thread)."""
    host, port = check_bind_address(address)
    fernet = getEncryptor(secret)
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return Probe.UNREACHABLE
    try:
        plain = zlib.compress(_pysyncobj_dumps(os.urandom(32)), 3)  # pysyncobj's framing of a bytes message
        token = fernet.encrypt_at_time(plain, int(time.monotonic()))
        sock.sendall(struct.pack("i", len(token)) + token)
        header = _read_exact(sock, 4)
        if header is None:
            return Probe.MISMATCH  # the peer could not authenticate our frame and hung up
        (size,) = struct.unpack("i", header)
        if not 0 < size <= FRAME_MAX_BYTES:
            return Probe.MISMATCH
        reply = _read_exact(sock, size)
        if reply is None:
            return Probe.MISMATCH
        fernet.decrypt(reply)
        return Probe.OK
    except InvalidToken:
        return Probe.MISMATCH
    except ConnectionError:
        return Probe.MISMATCH  # the peer reset the connection on our frame
    except OSError:  # timeouts included: a slow peer says nothing about the secret
        return Probe.UNREACHABLE
    finally:
        sock.close()


def check_peers(peers: list[str], secret: bytes, timeout_s: float = 3.0) -> dict[str, Probe]:
    """Probe every peer; raise ClusterSecretError naming the peers that refuse our secret."""
    results = {peer: probe_peer(peer, secret, timeout_s) for peer in peers}
    refused = sorted(p for p, r in results.items() if r is Probe.MISMATCH)
    if refused:
        raise ClusterSecretError(
            f"cluster secret mismatch: peer(s) {', '.join(refused)} refused this node's cluster secret; "
            "not starting the metadata store (check RAFTMQ cluster secret on every node)")
    return results


class AuditedEncryptor:
    """pysyncobj's Fernet encryptor for `secret`, counting and logging every received frame that does not
    authenticate. Called from pysyncobj's tick thread; `rejected` is read by others (an int: no lock needed)."""

    def __init__(self, secret: bytes) -> None:
        self._fernet: Fernet = getEncryptor(secret)
        self.rejected = 0

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        return self._fernet.encrypt_at_time(data, current_time)

    def extract_timestamp(self, token: bytes) -> int:
        """Checks the frame's tag too (Fernet verifies the HMAC before it returns the timestamp)."""
        try:
            return self._fernet.extract_timestamp(token)
        except InvalidToken:
            self._reject(token)
            raise

    def decrypt(self, token: bytes, ttl: int | None = None) -> bytes:
        try:
            return self._fernet.decrypt(token, ttl)
        except InvalidToken:
            self._reject(token)
            raise

    def _reject(self, token: bytes) -> None:
        self.rejected += 1
        log.warning("metadata: a frame of %d bytes from a peer does not authenticate (forged, altered, or another "
                    "cluster secret): dropped, and pysyncobj closes the connection (%d so far)", len(token),
                    self.rejected)
