"""Toxic definitions as Toxiproxy 2.x describes them: names, types, defaults, attribute validation.

How it works: a `ToxicSpec` is the JSON object the API exchanges ({name, type, stream, toxicity, attributes}).
`parse_toxic` validates a create request (unknown type or stream, or a non-numeric attribute, is a 400 as in
Toxiproxy) and fills the defaults (stream downstream, name "<type>_<stream>", toxicity 1.0, every attribute of the
type 0 unless given); `updated` merges an update. Units are Toxiproxy's: latency/jitter/timeout/delay in ms,
bandwidth rate in KB/s (1 KB = 1000 bytes), slicer delay in microseconds, limit_data bytes. The behaviour lives in
chaos.faultproxy.proxy; `slice_sizes` (slicer) is here because it is pure given its random.Random.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

STREAMS = ("upstream", "downstream")
TOXIC_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}


class ToxicError(ValueError):
    """A bad toxic request; `status` is the HTTP status Toxiproxy answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ToxicSpec:
    name: str
    type: str
    stream: str = "downstream"
    toxicity: float = 1.0
    attributes: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "stream": self.stream, "toxicity": self.toxicity,
                "attributes": dict(self.attributes)}

    def attr(self, key: str) -> int:
        return self.attributes.get(key, 0)


def _attributes(toxic_type: str, given: Any, base: dict[str, int]) -> dict[str, int]:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ToxicError("attributes must be an object")
    values = dict(base)
    for key in TOXIC_ATTRIBUTES[toxic_type]:
        value = given.get(key, values.get(key, 0))
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ToxicError(f"attribute {key} must be a number")
        values[key] = int(value)
    return values


def _toxicity(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ToxicError("toxicity must be a number between 0 and 1")
    return float(value)


def parse_toxic(body: Any) -> ToxicSpec:
    """A new toxic from a POST /proxies/{name}/toxics body."""
    if not isinstance(body, dict):
        raise ToxicError("bad request body")
    toxic_type = body.get("type")
    if toxic_type not in TOXIC_ATTRIBUTES:
        raise ToxicError("invalid toxic type")
    stream = body.get("stream") or "downstream"
    if stream not in STREAMS:
        raise ToxicError("stream must be upstream or downstream")
    name = body.get("name") or f"{toxic_type}_{stream}"
    toxicity = _toxicity(body.get("toxicity", 1.0))
    return ToxicSpec(str(name), toxic_type, stream, toxicity, _attributes(toxic_type, body.get("attributes"), {}))


def updated(spec: ToxicSpec, body: Any) -> ToxicSpec:
    """POST /proxies/{name}/toxics/{toxic}: attributes and toxicity change, name, type and stream stay."""
    if not isinstance(body, dict):
        raise ToxicError("bad request body")
    toxicity = _toxicity(body.get("toxicity", spec.toxicity))
    return replace(spec, toxicity=toxicity,
                   attributes=_attributes(spec.type, body.get("attributes"), spec.attributes))


def slice_sizes(total_bytes: int, average_size: int, size_variation: int, rng: random.Random) -> list[int]:
    """Split a chunk as the slicer toxic does: pieces of average_size ± size_variation bytes (at least 1)."""
    if average_size <= 0:
        return [total_bytes] if total_bytes else []
    sizes: list[int] = []
    left = total_bytes
    while left > 0:
        variation = rng.randint(-size_variation, size_variation) if size_variation > 0 else 0
        size = min(left, max(1, average_size + variation))
        sizes.append(size)
        left -= size
    return sizes


def jittered_ms(latency_ms: int, jitter_ms: int, rng: random.Random) -> float:
    """Latency with uniform jitter in [-jitter, +jitter], never negative."""
    if jitter_ms <= 0:
        return float(latency_ms)
    return max(0.0, latency_ms + rng.uniform(-jitter_ms, jitter_ms))
