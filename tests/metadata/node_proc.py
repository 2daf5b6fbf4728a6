"""One metadata node as a process, driven by JSON lines on stdin (used by the real-process tests).

Requests: {"op": "apply", "cmd": <command_to_dict>, "timeout_s": 20} -> {"outcome": ...} or {"error": ...};
{"op": "state"} -> {"definitions": ...}; {"op": "status"} -> {"status": ...}. Prints {"ready": true} once started, or {"error": ...} and exits 2.
The cluster secret comes from the RAFTMQ_CLUSTER_SECRET environment variable, never argv.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import trio

from cluster.metadata import model
from cluster.metadata.secret import ClusterSecretError
from cluster.metadata.store import MetadataError, MetadataStore, StoreConfig


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def handle(store: MetadataStore, req: dict[str, Any]) -> dict[str, Any]:
    if req["op"] == "apply":
        try:
            out = await store.apply(model.command_from_dict(req["cmd"]), req.get("timeout_s", 20.0))
        except MetadataError as exc:
            return {"error": str(exc)}
        return {"outcome": model.outcome_to_dict(out)}
    if req["op"] == "state":
        return {"definitions": store.state.definitions()}
    return {"status": store.status()}


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--peers", required=True)
    p.add_argument("--data-dir", required=True)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"{a.name} %(asctime)s %(name)s %(message)s")
    cfg = StoreConfig(a.name, a.address, tuple(a.peers.split(",")), os.environ.get("RAFTMQ_CLUSTER_SECRET"),
                      Path(a.data_dir), raft_min_timeout_s=0.3, raft_max_timeout_s=0.8, connection_timeout_s=1.5)
    try:
        store = MetadataStore(cfg)
        await store.start()
    except (ClusterSecretError, MetadataError) as exc:
        emit({"error": f"{type(exc).__name__}: {exc}"})
        sys.exit(2)
    emit({"ready": True})
    stdin = trio.wrap_file(sys.stdin)
    try:
        while line := await stdin.readline():
            emit(await handle(store, json.loads(line)))
    finally:
        store.close()


if __name__ == "__main__":
    trio.run(main)
