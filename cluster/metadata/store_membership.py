"""The metadata store's membership half (`StoreMembership`, a base class of `MetadataStore`).

What it is for: online membership of the metadata group (docs/cluster.md, "Metadata membership"; the rules are
pure in `cluster.metadata.membership`). pysyncobj runs with dynamicMembershipChange; it does not restore its
member list at a restart, so the store caches it (`members.cbor` in the data dir, written atomically from the tick
thread after any apply that finds it changed) and starts with the cached partners (`cluster_nodes` only seeds the
very first start).

How it works:
- Join: the joining node sends the `raftmq_join` utility message to a member (`request_join`), over pysyncobj's
  utility channel, which is encrypted with the cluster secret (the secret is probed first: another secret is a
  `ClusterSecretError`), in two phases. "record": the member (`_on_join_request`, tick thread) applies `AddNode`
  with the node's endpoints (refused for another protocol version or a taken name: nothing changed,
  `JoinRefused`) and answers the group's members. "add": while the joining node starts its store with those
  members as partners (pysyncobj's procedure; a group of one cannot commit the change without it), the member
  calls `addNodeToCluster` and answers once it committed. A change not possible now (pysyncobj takes one at a
  time) answers "retry" and the joining node asks again, bounded in time.
- Removal: `change_member("remove", address)` from a running member (forget_cluster_node of a dead node);
  `request_removal` asks another member with pysyncobj's `remove` utility message (a node cannot remove itself;
  `transfer_leadership_away` first if it leads). `mark_left` makes the cache say "left": the store then refuses to
  start (`LeftClusterError`) until the data directory is reset.
- Every wait on pysyncobj (its callbacks run in the tick thread) goes through `TrioToken.run_sync_soon` into a
  one-slot channel, bounded by `ATTEMPT_TIMEOUT_S`; every retry loop is bounded by a timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2
import trio
from pysyncobj import FAIL_REASON, SyncObj
from pysyncobj.utility import TcpUtility, UtilityException

from cluster.metadata import durable, model
from cluster.metadata import membership as mb
from cluster.metadata.errors import JoinRefused, MetadataError, MetadataTimeout
from cluster.metadata.secret import check_peers, secret_bytes

ATTEMPT_TIMEOUT_S = 2.0
ATTEMPT_TIMED_OUT = -1  # our own reason code: no callback within ATTEMPT_TIMEOUT_S, or the leader went away
MEMBERS_NAME = "members.cbor"
MEMBERSHIP_RETRY_S = 0.25  # a membership change refused (another one pending, no leader yet) is asked again
UTILITY_TIMEOUT_S = 10.0  # one utility request (join, remove) to a member

log = logging.getLogger("cluster.metadata.store")


def _deliver(send: trio.MemorySendChannel[Any], item: Any) -> None:
    """Runs in trio (posted by `run_sync_soon`): must never raise, or it would crash the trio run."""
    with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
        send.send_nowait(item)


def _utility(address: str, secret: bytes, command: list[Any]) -> Any:
    """One pysyncobj utility request (blocking: run it in a thread); None when the peer did not answer."""
    try:
        return TcpUtility(password=secret, timeout=UTILITY_TIMEOUT_S).executeCommand(address, command)
    except (UtilityException, OSError):
        return None


def _decode_reply(answer: Any) -> dict[str, Any]:
    if isinstance(answer, bytes):
        with contextlib.suppress(Exception):
            reply = cbor2.loads(answer)
            if isinstance(reply, dict):
                return reply
    return {"retry": repr(answer)[:200]}


class StoreMembership:
    """The membership methods of `MetadataStore` (which sets every attribute declared here)."""

    config: Any
    _syncobj: SyncObj | None
    _secret: bytes
    _replica: Any
    _token: trio.lowlevel.TrioToken
    _members_saved: tuple[str, ...]
    _members_lock: threading.Lock
    _left: bool

    def leader(self) -> str | None:
        raise NotImplementedError

    def members(self) -> tuple[str, ...]:
        """The metadata group's members as this node sees them (metadata addresses, itself included, sorted)."""
        syncobj = self._syncobj
        if syncobj is None:
            return ()
        for _ in range(3):  # the tick thread may change the set while we copy it
            try:
                others = {str(n.id) for n in syncobj.otherNodes}
                break
            except RuntimeError:
                continue
        else:
            return self._members_saved
        return tuple(sorted(others | {self.config.address}))

    @property
    def members_cache_path(self) -> Path | None:
        return None if self.config.data_dir is None else self.config.data_dir / MEMBERS_NAME

    def read_members_cache(self) -> mb.MembersCache | None:
        path = self.members_cache_path
        if path is None or not path.exists():
            return None
        try:
            return mb.decode_members_cache(path.read_bytes())
        except (OSError, mb.MembershipDecodeError) as exc:
            raise MetadataError(f"cannot read the metadata members cache {path}: {exc}") from None

    def write_members_cache(self, cache: mb.MembersCache) -> None:
        """Atomically (temporary file, fsync, rename, fsync of the directory)."""
        path = self.members_cache_path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(mb.encode_members_cache(cache))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        durable.fsync_dir(str(path))

    def _save_members(self) -> None:
        """Cache the group's members when they changed (tick thread after an apply, or trio)."""
        members = self.members()
        if not members or members == self._members_saved or self._left:
            return
        with self._members_lock:
            if members == self._members_saved or self._left:
                return
            try:
                self.write_members_cache(mb.MembersCache(members))
            except OSError:
                log.exception("%s: cannot write the metadata members cache", self.config.node_name)
                return
            self._members_saved = members
        log.info("%s: metadata group members %s", self.config.node_name, list(members))

    def mark_left(self) -> None:
        """This node has left the cluster: it refuses to start as a member again (`LeftClusterError`)."""
        with self._members_lock:
            self._left = True
            self.write_members_cache(mb.MembersCache(self._members_saved or (self.config.address,), left=True))

    def _on_join_request(self, args: list[Any], callback: Callable[[Any, Any], None]) -> None:
        """The `raftmq_join` utility message (tick thread; the sender proved it holds the secret). Phase "record":
        apply `AddNode` with the node's endpoints (refused for another protocol version or a taken name: nothing
        changed) and answer the group's members. Phase "add": add the recorded node to the group and answer once
        the change committed (the joining node runs its store meanwhile: a group of one needs it to commit)."""

        def reply(**fields: Any) -> None:
            callback(cbor2.dumps(fields), None)

        try:
            request = mb.decode_join_request(args[0] if args else None)
        except mb.MembershipDecodeError as exc:
            reply(error=str(exc))
            return
        phase = args[1] if len(args) > 1 else ""
        if self._syncobj is None:
            reply(retry="this member is stopping")
        elif phase == mb.JOIN_PHASE_RECORD:
            self._record_joining(request, reply)
        elif phase == mb.JOIN_PHASE_ADD:
            self._add_joining(request, reply)
        else:
            reply(error=f"unknown join phase {phase!r}")

    def _record_joining(self, request: mb.JoinRequest, reply: Callable[..., None]) -> None:
        state = self._replica.state
        refusal = mb.join_refusal(state.nodes, state.protocol_version, request)
        if refusal:
            reply(refused=refusal)
            return

        def recorded(result: Any, error: int) -> None:
            if error != FAIL_REASON.SUCCESS:
                reply(retry=f"AddNode not committed (pysyncobj reason {error}); ask again")
                return
            outcome = model.outcome_from_dict(cbor2.loads(result))
            if outcome.ok:
                reply(members=list(self.members()))
            else:
                reply(refused=outcome.refused)

        payload = cbor2.dumps(model.command_to_dict(request.add_node(uuid.uuid4().hex)))
        self._replica.apply_command(payload, callback=recorded)

    def _add_joining(self, request: mb.JoinRequest, reply: Callable[..., None]) -> None:
        address = request.endpoints.metadata_address
        record = self._replica.state.nodes.get(request.endpoints.name)
        if record is None or record.address != address:
            reply(refused=f"node {request.endpoints.name} at {address} is not recorded: record it first")
            return
        if address in self.members():
            reply(members=list(self.members()))
            return

        def added(_result: Any, error: int) -> None:
            if address in self.members() and error == FAIL_REASON.SUCCESS:
                reply(members=list(self.members()))
            else:
                reply(retry=f"membership change not done now (pysyncobj reason {error}); ask again")

        syncobj = self._syncobj
        assert syncobj is not None
        syncobj.addNodeToCluster(address, callback=added)

    async def change_member(self, op: str, address: str, timeout_s: float = 30.0) -> None:
        """Add (`op` "add") or remove ("remove") one metadata group member, from this running member; returns once
        this node sees the change. pysyncobj takes one change at a time: a refusal is asked again until
        `timeout_s` (then MetadataTimeout). A node cannot remove itself (use `request_removal`)."""
        if op not in ("add", "remove"):
            raise ValueError(f"op must be add or remove, not {op!r}")
        if op == "remove" and address == self.config.address:
            raise MetadataError("a node cannot remove itself from the metadata group; ask another member")
        with trio.move_on_after(timeout_s):
            while True:
                if (address in self.members()) == (op == "add"):
                    await trio.to_thread.run_sync(self._save_members)
                    return
                syncobj = self._syncobj
                if syncobj is None:
                    raise MetadataError("the metadata store is not running")
                change = syncobj.addNodeToCluster if op == "add" else syncobj.removeNodeFromCluster
                _, error = await self._call_in_tick(change, address)
                if error != FAIL_REASON.SUCCESS:
                    log.info("%s: %s %s: pysyncobj reason %s; asking again", self.config.node_name, op, address,
                             error)
                    await trio.sleep(MEMBERSHIP_RETRY_S)
        raise MetadataTimeout(f"metadata group change {op} {address} not done within {timeout_s} s")

    async def _call_in_tick(self, method: Callable[..., None], *args: Any) -> tuple[Any, int]:
        """Call a pysyncobj method that reports through a callback; wait (bounded) for the callback."""
        send, receive = trio.open_memory_channel[tuple[Any, int]](1)
        token = self._token

        def callback(result: Any, error: int) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(_deliver, send, (result, error))

        method(*args, callback=callback)
        async with receive:
            with trio.move_on_after(ATTEMPT_TIMEOUT_S):
                return await receive.receive()
        return None, ATTEMPT_TIMED_OUT

    async def transfer_leadership_away(self, timeout_s: float = 15.0) -> None:
        """If this node leads the metadata group, hand leadership to a caught-up member; returns once another
        member leads (MetadataTimeout otherwise)."""
        with trio.move_on_after(timeout_s):
            while self.leader() == self.config.address:
                if self._syncobj is None:
                    raise MetadataError("the metadata store is not running")
                await self._call_in_tick(self._syncobj.transferLeadership, None)
                await trio.sleep(MEMBERSHIP_RETRY_S)
            return
        raise MetadataTimeout(f"{self.config.node_name} still leads the metadata group after {timeout_s} s")

    async def request_removal(self, timeout_s: float = 30.0) -> None:
        """Ask another member (any that answers) to remove this node from the metadata group (pysyncobj's
        `remove` utility message, encrypted with the secret). The leader cannot remove itself, so whenever this node
        leads (again) it hands leadership away first. Done when a member confirms the removal, or reports (its
        status) that this node is no longer its partner (a confirmation that got lost)."""
        me = self.config.address
        peers = [m for m in self.members() if m != me]
        with trio.move_on_after(timeout_s):
            while True:
                if self.leader() == me:
                    with contextlib.suppress(MetadataTimeout):
                        await self.transfer_leadership_away(timeout_s=5.0)
                for peer in peers:
                    answer = await trio.to_thread.run_sync(_utility, peer, self._secret, ["remove", me])
                    if isinstance(answer, str) and answer.startswith("SUCCESS"):
                        return
                    status = await trio.to_thread.run_sync(_utility, peer, self._secret, ["status"])
                    if isinstance(status, dict) and f"partner_node_status_server_{me}" not in status:
                        return  # the peer answers and no longer counts this node among its partners
                log.info("%s: no member removed it yet; asking again", self.config.node_name)
                await trio.sleep(MEMBERSHIP_RETRY_S)
        raise MetadataTimeout(f"no member removed {me} from the metadata group within {timeout_s} s")

    @staticmethod
    async def request_join(seed: str, secret: str | bytes | None, request: mb.JoinRequest,
                           phase: str = mb.JOIN_PHASE_RECORD, timeout_s: float = 30.0) -> tuple[str, ...]:
        """Ask the member at `seed` (metadata address) to record (`JOIN_PHASE_RECORD`), then to add
        (`JOIN_PHASE_ADD`) the node of `request`; returns the group's members. Raises ClusterSecretError (the
        seed refuses our secret), JoinRefused (nothing changed), MetadataTimeout (no answer; asking again is
        safe)."""
        raw = secret_bytes(secret)
        await trio.to_thread.run_sync(check_peers, [seed], raw, 3.0)
        payload = mb.encode_join_request(request)
        last = "no answer"
        with trio.move_on_after(timeout_s):
            while True:
                answer = await trio.to_thread.run_sync(_utility, seed, raw, [mb.JOIN_COMMAND, payload, phase])
                reply = _decode_reply(answer)
                if "members" in reply:
                    return tuple(str(m) for m in reply["members"])
                if "refused" in reply or "error" in reply:
                    raise JoinRefused(str(reply.get("refused") or reply.get("error")))
                last = str(reply.get("retry") or answer)
                await trio.sleep(MEMBERSHIP_RETRY_S)
        raise MetadataTimeout(f"joining through {seed} ({phase}): no answer within {timeout_s} s (last: {last})")
