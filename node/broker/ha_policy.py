"""The ha-* policy keys of RabbitMQ 3.x classic mirrored queues: validation, parsing and replica choice (pure).

What it is for: a classic queue is mirrored when the policy that applies to it has `ha-mode` (docs/mirrored_queues.md,
"In the broker"). `validate_ha` refuses a bad definition with rabbit_mirror_queue_misc's wording (the policy API
answers 400 with it); `ha_spec` turns a valid definition into an `HaSpec`; `mirror_replicas` picks the replicas
among the cluster's nodes (leader first); `mirror_settings` gives the mirror core's `Settings`.

RabbitMQ's keys: `ha-mode` (`exactly` with `ha-params` N, the replica count including the leader; `all`; `nodes`
with `ha-params` a non-empty list of node names), `ha-sync-mode` (`manual`|`automatic`), `ha-sync-batch-size`,
`ha-promote-on-failure` and `ha-promote-on-shutdown` (`always`|`when-synced`). Ours: `ha-min-insync` (an integer
>= 1: the ISR size a publish needs to be confirmed) and `ha-truncation` (`leader-epoch`|`hw`). One deliberate
difference: `ha-promote-on-failure` defaults to `when-synced` (RabbitMQ's default `always` loses confirmed
messages on an unclean promotion; it stays one policy key away).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cluster.mirror_queues.core.types import Promote, Settings, Truncation

HA_KEYS: Final = frozenset({
    "ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-failure", "ha-promote-on-shutdown",
    "ha-min-insync", "ha-truncation",
})
MODES: Final = ("all", "exactly", "nodes")
SYNC_MODES: Final = ("manual", "automatic")
PROMOTE: Final = ("always", "when-synced")
TRUNCATIONS: Final = ("leader-epoch", "hw")


@dataclass(frozen=True, slots=True)
class HaSpec:
    """A valid ha-* definition, with defaults filled in."""

    mode: str
    params: int | tuple[str, ...] | None = None  # exactly: the count; nodes: the names; all: None
    sync_mode: str = "manual"
    promote_on_failure: str = "when-synced"
    promote_on_shutdown: str = "when-synced"
    min_insync: int = 1
    truncation: str = "leader-epoch"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _erl(value: Any) -> str:
    """A value as Erlang's ~p prints it in RabbitMQ's messages (binaries as <<"...">>)."""
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, list | tuple):
        return "[" + ",".join(_erl(v) for v in value) + "]"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _check_params(mode: str, params: Any) -> str | None:
    if mode == "all":
        return None if params is None else 'ha-mode="all" does not take parameters'
    if mode == "exactly":
        if _is_int(params) and params > 0:
            return None
        return f'ha-mode="exactly" takes an integer, {_erl(params)} given'
    if isinstance(params, list | tuple):
        if not params:
            return 'ha-mode="nodes" list must be non-empty'
        invalid = [p for p in params if not isinstance(p, str)]
        return f'ha-mode="nodes" takes a list of strings, {_erl(invalid)} given' if invalid else None
    return f'ha-mode="nodes" takes a list, {_erl(params)} given'


def validate_ha(definition: Mapping[str, Any]) -> str | None:
    """RabbitMQ's refusal of the definition's ha-* keys (rabbit_mirror_queue_misc:validate_policy), None if fine."""
    if not any(key in definition for key in HA_KEYS):
        return None
    mode = definition.get("ha-mode")
    if mode is None:
        return "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"
    if mode not in MODES:
        return f"{_erl(mode)} is not a valid ha-mode value"
    error = _check_params(mode, definition.get("ha-params"))
    if error is not None:
        return error
    sync = definition.get("ha-sync-mode", "manual")
    if sync not in SYNC_MODES:
        return f'ha-sync-mode must be "manual" or "automatic", got {_erl(sync)}'
    batch = definition.get("ha-sync-batch-size", 1)
    if not _is_int(batch) or batch < 1:
        return f"ha-sync-batch-size takes an integer greater than 0, {_erl(batch)} given"
    for key in ("ha-promote-on-shutdown", "ha-promote-on-failure"):
        value = definition.get(key, "when-synced")
        if value not in PROMOTE:
            return f'{key} must be "always" or "when-synced", got {_erl(value)}'
    min_insync = definition.get("ha-min-insync", 1)
    if not _is_int(min_insync) or min_insync < 1:
        return f"ha-min-insync takes an integer greater than 0, {_erl(min_insync)} given"
    truncation = definition.get("ha-truncation", "leader-epoch")
    if truncation not in TRUNCATIONS:
        return f'ha-truncation must be "leader-epoch" or "hw", got {_erl(truncation)}'
    return None


def ha_spec(definition: Mapping[str, Any] | None) -> HaSpec | None:
    """The mirroring a policy definition asks for (None: not mirrored, or not valid)."""
    if not definition or "ha-mode" not in definition or validate_ha(definition) is not None:
        return None
    params = definition.get("ha-params")
    return HaSpec(
        mode=definition["ha-mode"],
        params=tuple(params) if isinstance(params, list | tuple) else params,
        sync_mode=definition.get("ha-sync-mode", "manual"),
        promote_on_failure=definition.get("ha-promote-on-failure", "when-synced"),
        promote_on_shutdown=definition.get("ha-promote-on-shutdown", "when-synced"),
        min_insync=definition.get("ha-min-insync", 1),
        truncation=definition.get("ha-truncation", "leader-epoch"),
    )


def mirror_replicas(spec: HaSpec, nodes: Sequence[str], first: str) -> tuple[str, ...]:
    """The replicas, leader first, among the cluster's `nodes`, for a queue declared on `first`.

    `exactly` N: `first` and the next N-1 nodes in name order after it (wrapping), at most every node; `all`:
    every node; `nodes`: the listed nodes that exist, `first` leading if listed, else the first listed one; none
    of them existing: `first` alone (RabbitMQ keeps the queue on the declaring node then)."""
    ordered = sorted(set(nodes) | {first})
    at = ordered.index(first)
    ring = ordered[at:] + ordered[:at]
    if spec.mode == "all":
        return tuple(ring)
    if spec.mode == "exactly":
        count = spec.params if isinstance(spec.params, int) else 1
        return tuple(ring[:max(1, count)])
    listed = [n for n in (spec.params if isinstance(spec.params, tuple) else ()) if n in ordered]
    listed = list(dict.fromkeys(listed))
    if not listed:
        return (first,)
    if first in listed:
        listed.remove(first)
        listed.insert(0, first)
    return tuple(listed)


def mirror_settings(spec: HaSpec, replica_count: int) -> Settings:
    """The mirror core's settings: min ISR capped by the replica count (a 1-node cluster still serves)."""
    promote: Promote = "always" if spec.promote_on_failure == "always" else "when-synced"
    truncation: Truncation = "hw" if spec.truncation == "hw" else "leader-epoch"
    return Settings(min_insync=max(1, min(spec.min_insync, replica_count)), promote_on_failure=promote,
                    truncation=truncation)
