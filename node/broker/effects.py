"""Effects the broker hands to the runtime (immutable data; the runtime carries them out in order): frozen
dataclasses, and `SendContent`, built once per delivery, a NamedTuple (as immutable, and built faster than a
frozen dataclass). An effect is never changed once it is in the broker's `out`.

`Send`/`SendContent` go to one channel of one connection (`SendContent` with a BasicDeliver method may use the
connection's fast `send_deliver`), `CloseChannel`/`CloseConnection` ask the protocol layer to close with a reply
code, `Block`/`Unblock` drive connection.blocked, and `Persist` asks storage to write records durably and then call
`Broker.on_persisted(token)`. In replicated mode (docs/cluster.md) `ProposeQueue` asks the runtime to propose one
queue command to that queue's Raft group, numbered by the broker (`proposal_id`; the runtime wraps it in a
`cluster.queue.envelope.Envelope` and encodes it with `Broker.envelope_codec`). `PageIn` (single-node paging,
`node/broker/paging.py`) asks storage to read back messages a long queue keeps on disk only. `PauseReading` /
`ResumeReading` (replicated mode's credit flow, `node/broker/credit_flow.py`) stop and restart reading a connection.
`HoldCloseOk` / `SendCloseOk` (replicated mode): the client's Connection.Close is answered later, once what the
close wrote (the deletion of its exclusive queues) is committed; the runtime keeps the connection until then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from node.broker.records import Record


@dataclass(frozen=True, slots=True)
class Send:
    conn_id: int
    channel: int
    method: Any


class SendContent(NamedTuple):  # one per delivery: a NamedTuple (a frozen dataclass's __init__ costs ~2x)
    conn_id: int
    channel: int
    method: Any
    properties: Any
    body: bytes


@dataclass(frozen=True, slots=True)
class CloseChannel:
    conn_id: int
    channel: int
    reply_code: int
    reply_text: str
    class_id: int = 0
    method_id: int = 0


@dataclass(frozen=True, slots=True)
class CloseConnection:
    conn_id: int
    reply_code: int
    reply_text: str
    class_id: int = 0
    method_id: int = 0


@dataclass(frozen=True, slots=True)
class Block:
    conn_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Unblock:
    conn_id: int


@dataclass(frozen=True, slots=True)
class PauseReading:
    """Credit flow (replicated mode, node/broker/credit_flow.py): do not read this connection until ResumeReading;
    unlike Block, the client is not told (connection.blocked is for resource alarms)."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class ResumeReading:
    conn_id: int


@dataclass(frozen=True, slots=True)
class HoldCloseOk:
    """The client's Connection.Close is answered by a later `SendCloseOk`: keep the connection until then."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class SendCloseOk:
    """Answer the client's Connection.Close now (after `HoldCloseOk`), then finish the connection."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class Persist:
    token: int
    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class PageIn:
    """Single-node paging: read the MessageRecords at `offsets` of log stream `stream` (in a worker thread) and
    hand them, decoded and in this order, to `Broker.on_paged_in(vhost, queue, request_id, records)`."""

    vhost: str
    queue: str
    stream: str
    request_id: int
    offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProposeQueue:
    """Replicated mode: propose `command` (a cluster.queue command) to the group of queue `queue` in `vhost`, as
    this node's proposal `proposal_id` (committed entries come back with it, `Broker.apply_committed`)."""

    vhost: str
    queue: str
    command: Any
    proposal_id: int


@dataclass(frozen=True, slots=True)
class ForwardPublish:
    """Cluster mode: a publish routed to an exclusive queue whose owner is a connection of node `node`
    (node/broker/backend_owned.py): send it there with confirms; the answer comes back as
    `Broker.forward_outcome(vhost, queue, publisher_id, sequence, acked)`."""

    node: str
    vhost: str
    queue: str
    properties: Any
    body: bytes
    publisher_id: Any
    sequence: int
    exchange: str = ""  # what it was published to here (the owner's delivery shows them, as on a single node)
    routing_key: str = ""


Effect = (Send | SendContent | CloseChannel | CloseConnection | Block | Unblock | PauseReading | ResumeReading | Persist
          | PageIn | ProposeQueue | ForwardPublish | HoldCloseOk | SendCloseOk)
