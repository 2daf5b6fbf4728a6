"""Management API routes for shovels in a cluster: every node lists every shovel with its full status, and a
restart asked of any node reaches the node that runs the shovel.

What it is for: a shovel runs on one node (docs/shovel.md, "Where a shovel runs"); another node's ShovelManager
knows only its definition and owner (state `running elsewhere`). RabbitMQ lists every shovel of the cluster with its
node and status from any node; so does this. How it works: in cluster mode, GET /api/shovels[/{vhost}] and
/api/shovels/vhost/{vhost}/{name} ask every peer for its own rows at once (management_peers.py, `raftmq_local=true`,
`STATUS_TIMEOUT_S`), and `merge_shovel_rows` keeps per shovel the row of the node that runs it (the owner this node
names first); a shovel whose node does not answer in time keeps this node's row (its owner, `running elsewhere`).
Static shovels of other nodes' config files are listed too. DELETE /api/shovels/vhost/{vhost}/{name}/restart
restarts the shovel here or, when it does not run here, asks every peer (the one running it restarts it; 404 when
none does). On a single node, and when a peer asks with `raftmq_local=true`, these routes return None and
management_api's own routes answer with this node's rows.
"""

from __future__ import annotations

from typing import Any

from node.runtime.management_api import Caller, CommandError, ManagementView, Reply, jsonable
from node.runtime.management_http import RequestHead
from node.runtime.management_peers import LOCAL_QUERY, peer_delete, peer_rows

STATUS_TIMEOUT_S = 1.0
ELSEWHERE = "running elsewhere"


def merge_shovel_rows(local: list[dict[str, Any]], peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pure: one row per (type, vhost, name). Among this node's row and the peers' rows of a shovel, the row of a
    node that runs it (any state but `running elsewhere`: starting, running, terminated) wins, the one of the
    owner this node names first; with none, this node's row (or a peer's, for a shovel this node does not list).
    This node's order first, then the shovels only peers list, sorted."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in [*local, *peers]:
        groups.setdefault(_key(row), []).append(row)
    known = list(dict.fromkeys(_key(row) for row in local))
    extra = sorted(set(groups) - set(known))
    merged = []
    for key in [*known, *extra]:
        rows = groups[key]
        owner = rows[0].get("node")
        runners = [row for row in rows if row.get("state") != ELSEWHERE]
        merged.append(next((row for row in runners if row.get("node") == owner), runners[0] if runners else rows[0]))
    return merged


def _key(row: dict[str, Any]) -> tuple[str, str, str]:
    return str(row.get("type", "dynamic")), str(row.get("vhost", "")), str(row.get("name", ""))


async def handle_shovel_request(view: ManagementView, head: RequestHead, raw: bytes, caller: Caller) -> Reply | None:
    seg = head.segments
    if len(seg) < 2 or seg[:2] != ("api", "shovels") or not view.peers() or LOCAL_QUERY in head.query:
        return None
    rest = seg[2:]
    if head.method in ("GET", "HEAD") and (len(rest) <= 1 or (rest[0] == "vhost" and len(rest) == 3)):
        rows = caller.visible(await cluster_shovel_status(view, caller.authorization))
        if len(rest) == 3:
            found = [r for r in rows if r.get("vhost") == rest[1] and r.get("name") == rest[2]]
            if not found:
                raise CommandError(404, "Not Found")
            return Reply(200, jsonable(found[0]))
        return Reply(200, jsonable([r for r in rows if r.get("vhost") == rest[0]] if rest else rows))
    if head.method == "DELETE" and len(rest) == 4 and rest[0] == "vhost" and rest[3] == "restart":
        try:
            await view.run_command("restart_shovel", {"vhost": rest[1], "name": rest[2]})
        except CommandError as err:
            if err.status != 404 or not await peer_delete(view.peers(), head.path, caller.authorization):
                raise
        return Reply(204)
    return None


async def cluster_shovel_status(view: ManagementView, authorization: str) -> list[dict[str, Any]]:
    """Every shovel of the cluster with the status from the node that runs it (this node's row when that node
    does not answer within STATUS_TIMEOUT_S)."""
    local = view.shovel_status()
    peers = await peer_rows(view.peers(), "/api/shovels", authorization, timeout_s=STATUS_TIMEOUT_S)
    return merge_shovel_rows(local, peers)
