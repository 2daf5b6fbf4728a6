"""Cluster mode: the /api/queues rows of exclusive queues another node holds, as that node sees them.

What it is for: a cluster's queues are replicated, so every node's replica counts every node's consumers and
messages, except exclusive queues: those live on their owner connection's node only (node/broker/backend_owned.py)
and the other nodes keep an empty stand-in, whose row would say 0 consumers and 0 messages. RabbitMQ's every node
shows the owner's figures; so does raftmq.

How it works: `handle_queue_rows` is a route tried before management_api's own GET /api/queues[/{vhost}[/{name}]].
It answers only when the view names remote exclusive queues in the asked scope (`remote_queue_owners()`: (vhost,
name) -> the owner's (host, management port); a single node and a cluster without such queues fall through at
the cost of one dict walk). It then takes this node's rows and replaces each remote exclusive queue's row by its
owner's, asked once per owner node for the same path with `raftmq_local=true` and the caller's credentials
(management_peers.py, 2 s); an owner that does not answer leaves this node's row as it is.
"""

from __future__ import annotations

from typing import Any

from node.runtime.management_api import Caller, CommandError, ManagementView, Reply, jsonable
from node.runtime.management_http import RequestHead
from node.runtime.management_peers import LOCAL_QUERY, peer_answers


async def handle_queue_rows(view: ManagementView, head: RequestHead, raw: bytes, caller: Caller) -> Reply | None:
    seg = head.segments
    if head.method not in ("GET", "HEAD") or seg[:2] != ("api", "queues") or len(seg) > 4 or \
            LOCAL_QUERY in head.query:
        return None
    scope = seg[2:]
    owners_of = getattr(view, "remote_queue_owners", None)
    owners: dict[tuple[str, str], tuple[str, int]] = owners_of() if owners_of is not None else {}
    wanted = {key: owner for key, owner in owners.items() if key[:len(scope)] == scope}
    if not wanted:
        return None
    rows = [r for r in view.queues() if (r["vhost"], r["name"])[:len(scope)] == scope]
    theirs: dict[tuple[str, str], dict[str, Any]] = {}
    for owner in sorted(set(wanted.values())):
        for answer in await peer_answers([owner], head.path, caller.authorization):
            for row in answer if isinstance(answer, list) else [answer]:
                if not isinstance(row, dict):
                    continue
                key = (str(row.get("vhost")), str(row.get("name")))
                if wanted.get(key) == owner:  # (the queues it holds; the rest of its answer we have)
                    theirs[key] = row
    rows = [theirs.get((r["vhost"], r["name"]), r) for r in rows]
    if len(scope) == 2:
        if not rows or not caller.visible(rows):
            raise CommandError(404, "Not Found")
        return Reply(200, jsonable(rows[0]))
    return Reply(200, jsonable(caller.visible(rows)))
