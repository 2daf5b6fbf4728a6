"""`MetadataStore`: the cluster metadata replicated by pysyncobj, bridged into trio.

What it is for: every node runs one store. `await store.apply(command)` replicates a `cluster.metadata.model`
command through the Raft group and returns its `Outcome`; `store.state` is this node's replica (a read never
leaves the node and may lag the leader); `store.watch()` gives that state plus a channel of exactly the outcomes
that change it afterwards.

How it works:
- `_Replica` is a pysyncobj `SyncObjConsumer` holding the immutable `MetadataState`. Its one replicated method takes
  a cbor-encoded command (pysyncobj wraps those bytes in its own pickle; our payload is cbor) and swaps the state
  reference — so `store.state` readers always see a whole state. A change counter is bumped with the swap under a
  lock held for two assignments, so `watch()` can start each watcher exactly after the state it returns.
- pysyncobj ticks in its own thread (autoTick), which stops for good once the thread that created the `SyncObj`
  has exited. So the store creates it in a thread of its own (`_SyncObjOwner`) that stays alive until `close()`
  (a trio worker thread would not do: trio retires idle workers after ~10 s, silently stopping the replica).
  `apply` hands the command to pysyncobj's thread-safe command queue
  with a callback; the callback runs in the tick thread and only calls `TrioToken.run_sync_soon`, which never
  blocks, to put the result into a one-slot memory channel the trio task waits on. Neither side waits on the other.
- Read barriers: `sync()` applies a `Barrier` (no-op) command: once its callback came, this replica has applied
  everything committed before the call (pysyncobj calls back on a follower only after applying the entry there).
  `caught_up(timeout_s)` shares such barriers between concurrent readers (`read_barrier.py`).
- Retries: MISSING_LEADER, NOT_LEADER, LEADER_CHANGED, DISCARDED, QUEUE_FULL, REQUEST_DENIED and UNKNOWN_OUTCOME are
  retried with the same command id, with doubling backoff (`RETRY_BACKOFF_*`) until `timeout_s`; so is an attempt
  with no callback within `ATTEMPT_TIMEOUT_S` (pysyncobj silently drops a command a follower forwards over a
  connection that is down). The model's command-id table makes a retry of a command that did commit a no-op that
  returns the first outcome.
- Start: the secret is checked (length), the peers are probed with it (`secret.check_peers`: a peer with another
  secret is a clear `ClusterSecretError` and nothing is started), pysyncobj starts with `password` = secret, bound
  to this node's cluster address only (its connections use `secret.AuditedEncryptor`, which counts and logs
  frames that do not authenticate), with the durable journal and fsynced compaction snapshots (`durable`).
  Then the store waits for a leader and applies `AddNode(name, address, version)`: a refusal (another protocol version) stops the store and
  raises `IncompatibleVersionError`.
- Membership (online join/leave/forget): `StoreMembership` (`store_membership.py`), the base class; pysyncobj
  runs with dynamicMembershipChange and starts with the member list cached in the data dir (docs/cluster.md,
  "Metadata membership").
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cbor2
import trio
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, SyncObjException, replicated

from cluster.metadata import durable, model
from cluster.metadata import membership as mb
from cluster.metadata.errors import (
    IncompatibleVersionError,
    JoinRefused,
    LeftClusterError,
    MetadataError,
    MetadataTimeout,
)
from cluster.metadata.fast_election import FastElection
from cluster.metadata.model import AddNode, Command, MetadataState, Outcome
from cluster.metadata.read_barrier import SharedBarrier
from cluster.metadata.secret import (
    AuditedEncryptor,
    ClusterSecretError,
    check_bind_address,
    check_peers,
    secret_bytes,
)
from cluster.metadata.store_membership import ATTEMPT_TIMED_OUT, ATTEMPT_TIMEOUT_S, StoreMembership, _deliver

RETRYABLE = frozenset({FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.DISCARDED,
                       FAIL_REASON.NOT_LEADER, FAIL_REASON.LEADER_CHANGED, FAIL_REASON.REQUEST_DENIED,
                       FAIL_REASON.UNKNOWN_OUTCOME})
RETRY_BACKOFF_FIRST_S = 0.05
RETRY_BACKOFF_MAX_S = 1.0
LEADER_POLL_S = 0.05
OWNER_EXIT_WAIT_S = 5.0  # close(): how long the owner thread waits for pysyncobj's destroy
SUBSCRIBER_BUFFER_MAX = 1024
SHARED_BARRIER_ROUND_S = 10.0  # caught_up(): one shared barrier round gives up after this (its readers before)
JOURNAL_NAME = "metadata.journal"
SNAPSHOT_NAME = "metadata.snapshot"

log = logging.getLogger(__name__)

__all__ = ["ClusterSecretError", "IncompatibleVersionError", "JoinRefused", "LeftClusterError", "MetadataError",
           "MetadataStore", "MetadataTimeout", "StoreConfig"]


@dataclass(frozen=True, slots=True)
class StoreConfig:
    node_name: str
    address: str  # host:port of this node's Raft endpoint, on its cluster address
    peers: tuple[str, ...]  # the other nodes' Raft endpoints
    secret: str | bytes | None
    data_dir: Path | None = None  # None: an in-memory journal (tests only; nothing survives a restart)
    version: int = model.PROTOCOL_VERSION
    raft_min_timeout_s: float = 0.4
    raft_max_timeout_s: float = 1.4
    connection_timeout_s: float = 3.5
    # Followers never talk to each other, so pysyncobj drops their idle connection after connection_timeout_s and
    # redials every connection_retry_s; a follower with no live connection cannot campaign. pysyncobj's 5 s
    # default made some failovers take 3-5 s.
    connection_retry_s: float = 0.5
    start_timeout_s: float = 30.0
    probe_timeout_s: float = 3.0
    bind_retries: int = 6  # 0.5 s apart: a port still held by a dying process gets a few seconds
    # Log compaction (durable snapshots, `durable.DurableSnapshot`); only with a data_dir.
    compaction_min_entries: int = 10_000
    compaction_min_time_s: float = 3600.0
    endpoints: mb.NodeEndpoints | None = None  # recorded with AddNode (None: keep what the metadata has)


class _Replica(SyncObjConsumer):  # type: ignore[misc]
    """This node's copy of the state; `apply_command` runs in pysyncobj's tick thread, in log order."""

    def __init__(self) -> None:
        super().__init__()
        self.state = MetadataState()
        self.changes_seq = 0  # how many applied commands changed something; pairs with `state` under `lock`
        self.lock = threading.Lock()  # held for two assignments only, by either thread
        self.on_applied: Callable[[int, Outcome], None] | None = None
        self.after_apply: Callable[[], None] | None = None  # after every applied command (tick thread)

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, payload: bytes) -> bytes:
        command = model.command_from_dict(cbor2.loads(payload))
        new_state, outcome = model.apply(self.state, command)
        with self.lock:
            self.state = new_state
            if outcome.changes:
                self.changes_seq += 1
            seq = self.changes_seq
        if self.on_applied is not None and outcome.changes:
            self.on_applied(seq, outcome)
        if self.after_apply is not None:
            self.after_apply()
        return cbor2.dumps(model.outcome_to_dict(outcome))

    def read(self) -> tuple[MetadataState, int]:
        with self.lock:
            return self.state, self.changes_seq

    def _serialize(self) -> dict[str, bytes]:
        return {"cbor": self.take_state()}

    def _deserialize(self, data: dict[str, bytes]) -> None:
        self.put_state(data["cbor"])

    def take_state(self) -> bytes:
        return cbor2.dumps(model.snapshot(self.state))

    def put_state(self, data: bytes) -> None:
        """Replace the state with a snapshot's (restart, or a snapshot from the leader); watchers get the diff."""
        new_state = model.restore(cbor2.loads(data))
        with self.lock:
            outcome = Outcome(model.diff(self.state, new_state))
            self.state = new_state
            if outcome.changes:
                self.changes_seq += 1
            seq = self.changes_seq
        if self.on_applied is not None and outcome.changes:
            self.on_applied(seq, outcome)


def _compaction(config: StoreConfig, replica: _Replica, members: Callable[[], tuple[str, ...]]) -> dict[str, Any]:
    """Compaction settings: durable snapshots with a data dir; off in memory (tests only)."""
    if config.data_dir is None:
        return {"logCompactionMinEntries": 2**62, "logCompactionMinTime": 2**31}
    journal = str(config.data_dir / JOURNAL_NAME)
    snapshot = durable.DurableSnapshot(journal, replica.take_state, replica.put_state, members)
    return {"fullDumpFile": str(config.data_dir / SNAPSHOT_NAME), "serializer": snapshot.serialize,
            "deserializer": snapshot.deserialize, "logCompactionMinEntries": config.compaction_min_entries,
            "logCompactionMinTime": config.compaction_min_time_s}


def _syncobj_conf(config: StoreConfig, secret: bytes, replica: _Replica,
                  members: Callable[[], tuple[str, ...]]) -> SyncObjConf:
    journal = None
    if config.data_dir is not None:
        config.data_dir.mkdir(parents=True, exist_ok=True)
        journal = str(config.data_dir / JOURNAL_NAME)
    return SyncObjConf(
        password=secret,
        bindAddress=config.address,
        journalFile=journal,
        raftMinTimeout=config.raft_min_timeout_s,
        raftMaxTimeout=config.raft_max_timeout_s,
        appendEntriesPeriod=min(0.1, config.raft_min_timeout_s / 4),
        connectionTimeout=config.connection_timeout_s,
        connectionRetryTime=config.connection_retry_s,
        commandsWaitLeader=True,
        appendEntriesUseBatch=False,  # send each command at once: metadata changes are rare, latency matters
        bindRetryTime=0.5,
        maxBindRetries=config.bind_retries,
        dynamicMembershipChange=True,
        **_compaction(config, replica, members),
    )


class _AuditedSyncObj(SyncObj):  # type: ignore[misc]  # (pysyncobj has no type hints)
    """A SyncObj whose connections use an `AuditedEncryptor`: pysyncobj reads `encryptor` for every connection it
    opens or accepts (set before SyncObj starts, so no connection ever gets another)."""

    def __init__(self, *args: Any, audited: AuditedEncryptor, **kwargs: Any) -> None:
        self._audited = audited
        self.fast_election = FastElection()  # (fast_election.py: a campaign at once on a refusal; keepalives)
        super().__init__(*args, **kwargs)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        self.fast_election.before_tick(self)
        super()._onTick(timeToWait)

    @property
    def encryptor(self) -> AuditedEncryptor:
        return self._audited

    def _getEncryptor(self) -> AuditedEncryptor:
        return self._audited


class _SyncObjOwner:
    """A daemon thread that creates the `SyncObj` and then waits until released: pysyncobj's tick thread runs
    exactly as long as the thread that created the `SyncObj`, so this one lives as long as the store."""

    def __init__(self, name: str, create: Callable[[], SyncObj]) -> None:
        self._create = create
        self._created = threading.Event()
        self._released = threading.Event()
        self._syncobj: SyncObj | None = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            self._syncobj = self._create()
        except BaseException as exc:  # handed to the caller of start()
            self._error = exc
        finally:
            self._created.set()
        if self._error is None:
            self._released.wait()
            self._outlive_the_tick_thread()

    def _outlive_the_tick_thread(self) -> None:
        """The tick thread checks its creator's liveness before the destroy flag: leaving first would skip
        pysyncobj's destroy (its sockets would stay open). So wait (bounded) for the tick thread to finish."""
        syncobj = self._syncobj
        deadline = time.monotonic() + OWNER_EXIT_WAIT_S
        while syncobj is not None and syncobj.tick_thread_alive() and time.monotonic() < deadline:
            time.sleep(0.02)

    def start(self) -> SyncObj:
        """Blocking (run it in a worker thread): the `SyncObj`, once pysyncobj's tick thread is running."""
        self.thread.start()
        self._created.wait()
        if self._error is not None:
            raise self._error
        assert self._syncobj is not None
        return self._syncobj

    def release(self) -> None:
        self._released.set()


class MetadataStore(StoreMembership):
    """Create inside a trio run; `await start()`, then `apply`, `state`, `subscribe`; `close()` at the end."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self._secret = secret_bytes(config.secret)
        self.audit = AuditedEncryptor(self._secret)  # `audit.rejected`: frames from peers that did not authenticate
        check_bind_address(config.address)
        self._token = trio.lowlevel.current_trio_token()
        self._replica: _Replica = _Replica()
        self._replica.on_applied = self._on_applied_in_tick_thread
        self._replica.after_apply = self._save_members
        self._syncobj: SyncObj | None = None
        self._owner: _SyncObjOwner | None = None
        self._subscribers: list[tuple[trio.MemorySendChannel[Outcome], int]] = []
        self._members_saved: tuple[str, ...] = ()
        self._members_lock = threading.Lock()  # the tick thread and trio may both save the cache
        self._left = False  # mark_left(): the cache says "left" and is never rewritten by this store
        self._shared_barrier = SharedBarrier(self._barrier_round)

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        cfg = self.config
        cache = self.read_members_cache()
        if cache is not None and cache.left:
            raise LeftClusterError(f"node {cfg.node_name} left its cluster (leave_cluster); delete its data directory "
                                   f"{cfg.data_dir} to start it again (then join_cluster)")
        partners = mb.start_partners(cache, cfg.peers, cfg.address)
        await trio.to_thread.run_sync(check_peers, list(partners), self._secret, cfg.probe_timeout_s)
        durable.install()
        conf = _syncobj_conf(cfg, self._secret, self._replica, self.members)
        owner = self._owner = _SyncObjOwner(
            f"metadata-{cfg.node_name}", lambda: self._create_syncobj(partners, conf))
        self._syncobj = await trio.to_thread.run_sync(owner.start)
        try:
            await self._wait_bound()
            await self._wait_for_leader(cfg.start_timeout_s)
            await self._join()
            await trio.to_thread.run_sync(self._save_members)
        except BaseException:
            self.close()
            raise

    def _create_syncobj(self, partners: tuple[str, ...], conf: SyncObjConf) -> SyncObj:
        syncobj = _AuditedSyncObj(self.config.address, list(partners), conf, consumers=[self._replica],
                                  audited=self.audit)
        transport = syncobj._SyncObj__transport  # pysyncobj has no public hook for utility messages
        transport.setOnUtilityMessageCallback(mb.JOIN_COMMAND, self._on_join_request)
        return syncobj

    async def _wait_bound(self) -> None:
        syncobj = self._syncobj
        assert syncobj is not None
        try:
            await trio.to_thread.run_sync(syncobj.waitBinded)
        except SyncObjException:
            raise MetadataError(f"node {self.config.node_name}: cannot bind the metadata port {self.config.address}"
                                f" (in use, or not an address of this host)") from None

    async def _wait_for_leader(self, timeout_s: float) -> None:
        with trio.move_on_after(timeout_s):
            while self.leader() is None:
                await trio.sleep(0.05)
            return
        raise MetadataTimeout(
            f"node {self.config.node_name}: no metadata leader within {timeout_s} s — fewer than a majority of "
            f"{self.config.peers} answer with this cluster secret")

    async def _join(self) -> None:
        cfg = self.config
        command = AddNode(cfg.node_name, cfg.address, cfg.version)
        if cfg.endpoints is not None:
            command = mb.add_node_command(cfg.endpoints, cfg.version)
        outcome = await self.apply(command, cfg.start_timeout_s)
        if not outcome.ok:
            raise IncompatibleVersionError(f"node {cfg.node_name} refused by the cluster: {outcome.refused}")

    def syncobj_for_shutdown(self) -> Any:
        """The running `SyncObj` (or None), to wait for its tick thread after `stop_replication`."""
        return self._syncobj

    def stop_replication(self) -> None:
        """Stop pysyncobj (its port is free once the tick thread ended) but keep the watchers open: `close()` ends
        them later (a node joining a cluster swaps stores this way, so its runtime never watches a dead store)."""
        self._replica.after_apply = None
        if self._syncobj is not None:
            self._syncobj.destroy()
            self._syncobj = None
        if self._owner is not None:
            self._owner.release()
            self._owner = None

    def close(self) -> None:
        """Stop pysyncobj (its tick thread ends shortly after) and end every subscription."""
        if self._syncobj is not None:
            self._syncobj.destroy()
            self._syncobj = None
        if self._owner is not None:
            self._owner.release()  # the tick thread has been told to stop; it also ends once its owner has gone
            self._owner = None
        self._replica.on_applied = None
        for send, _ in self._subscribers:
            send.close()
        self._subscribers.clear()

    # ------------------------------------------------------------------------------------------ commands

    async def apply(self, command: Command, timeout_s: float = 10.0) -> Outcome:
        """Replicate one command; retries (same command id) until it has an outcome or `timeout_s` passes."""
        if not command.cid:
            command = replace(command, cid=uuid.uuid4().hex)
        payload = cbor2.dumps(model.command_to_dict(command))
        backoff_s = RETRY_BACKOFF_FIRST_S
        last_error = "none"
        with trio.move_on_after(timeout_s):
            while True:
                result, error = await self._submit_once(payload, ATTEMPT_TIMEOUT_S)
                if error == FAIL_REASON.SUCCESS:
                    return model.outcome_from_dict(cbor2.loads(result))
                if error not in RETRYABLE and error != ATTEMPT_TIMED_OUT:
                    raise MetadataError(f"{type(command).__name__} failed: pysyncobj reason {error}")
                last_error = str(error)
                log.info("%s %s: retrying after reason %s (leader %s)", self.config.node_name,
                         type(command).__name__, error, self.leader())
                await trio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, RETRY_BACKOFF_MAX_S)
        raise MetadataTimeout(f"{type(command).__name__} (cid {command.cid}) had no outcome within {timeout_s} s "
                              f"(last pysyncobj reason {last_error}); it may have been applied; retry it")

    async def sync(self, timeout_s: float = 10.0) -> MetadataState:
        """A read barrier: once it returns, this replica has applied everything committed before the call (a
        `Barrier` went through the log and was applied here), and its state is returned."""
        await self.apply(model.Barrier(), timeout_s)
        return self.state

    async def caught_up(self, timeout_s: float) -> bool:
        """A shared read barrier (`read_barrier.SharedBarrier`: concurrent callers share one `Barrier` command):
        True once a barrier that started after the call was applied here; False when none completed within
        `timeout_s` (no metadata majority, or the store stopped)."""
        with trio.move_on_after(timeout_s):
            return await self._shared_barrier.wait()
        return False

    async def _barrier_round(self) -> bool:
        try:
            await self.sync(SHARED_BARRIER_ROUND_S)
        except MetadataError as exc:  # (MetadataTimeout included)
            log.info("%s: metadata read barrier: %s", self.config.node_name, exc)
            return False
        return True

    async def _submit_once(self, payload: bytes, attempt_timeout_s: float) -> tuple[Any, int]:
        """One submission. pysyncobj drops a command forwarded to a leader whose connection is not up without
        calling back, so an attempt ends as `ATTEMPT_TIMED_OUT` (retried with the same id) after
        `attempt_timeout_s`, or as soon as the leader it was forwarded to is no longer the leader. A late callback
        of an abandoned attempt lands in a closed channel and is ignored."""
        if self._syncobj is None:
            raise MetadataError("the metadata store is not running")
        send, receive = trio.open_memory_channel[tuple[Any, int]](1)
        token = self._token

        def callback(result: Any, error: int) -> None:  # pysyncobj's tick thread (or ours, if rejected at once)
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(_deliver, send, (result, error))

        leader = self.leader()
        self._replica.apply_command(payload, callback=callback)
        deadline = trio.current_time() + attempt_timeout_s
        async with receive:
            while trio.current_time() < deadline:
                with trio.move_on_after(LEADER_POLL_S):
                    return await receive.receive()
                if leader is not None and self.leader() != leader:
                    return None, ATTEMPT_TIMED_OUT  # forwarded to a leader that is gone: resubmit now
        return None, ATTEMPT_TIMED_OUT

    # ------------------------------------------------------------------------------------------ reads

    @property
    def state(self) -> MetadataState:
        return self._replica.state

    def leader_refused(self, address: str) -> bool:
        """The node whose metadata address is `address` refuses connections after its link was lost (the Raft
        transport's evidence that its process is gone): if it leads, campaign at our turn (fast_election.py)."""
        syncobj = self._syncobj
        if not isinstance(syncobj, _AuditedSyncObj):
            return False
        members = [m for m in self.members() if m != self.config.address]
        if syncobj.fast_election.leader_refused(syncobj, address, members, self.config.address):
            log.info("%s: metadata leader %s refuses connections: campaigning at our turn", self.config.node_name,
                     address)
            return True
        return False

    def leader(self) -> str | None:
        if self._syncobj is None:
            return None
        node = self._syncobj._getLeader()
        return None if node is None else str(node.address if hasattr(node, "address") else node)

    def ticking(self) -> bool:
        """Whether pysyncobj's tick thread (which does all its networking and applying) is alive."""
        return self._syncobj is not None and bool(self._syncobj.tick_thread_alive())

    def status(self) -> dict[str, Any]:
        if self._syncobj is None:
            return {"running": False}
        raw = self._syncobj.getStatus()
        return {"running": True, "ticking": self.ticking(), "leader": self.leader(), "self": self.config.address,
                "raft_term": raw.get("raft_term"), "commit_idx": raw.get("commit_idx"),
                "last_applied": raw.get("last_applied"), "has_quorum": raw.get("has_quorum")}

    # ------------------------------------------------------------------------------------------ subscriptions

    def watch(self, buffer_max: int = SUBSCRIBER_BUFFER_MAX) -> tuple[MetadataState,
                                                                       trio.MemoryReceiveChannel[Outcome]]:
        """This replica's state now, and a channel of exactly the outcomes that change it after that (apply order,
        commands from any node). A watcher that falls `buffer_max` behind is closed (it sees EndOfChannel) and must
        watch again: nothing is skipped silently."""
        state, seq = self._replica.read()
        send, receive = trio.open_memory_channel[Outcome](buffer_max)
        self._subscribers.append((send, seq))
        return state, receive

    def _on_applied_in_tick_thread(self, seq: int, outcome: Outcome) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._publish, seq, outcome)

    def _publish(self, seq: int, outcome: Outcome) -> None:
        for sub in list(self._subscribers):
            send, start_seq = sub
            if seq <= start_seq:
                continue  # already in the state this watcher started from
            try:
                send.send_nowait(outcome)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                send.close()
                self._subscribers.remove(sub)
