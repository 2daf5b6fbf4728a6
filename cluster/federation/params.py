"""Federation definitions: RabbitMQ's `federation-upstream` and `federation-upstream-set` runtime parameters.

Pure. `parse_upstream(vhost, name, value)` validates one upstream into an `Upstream`; `parse_upstream_set(vhost,
name, value)` validates a set (a JSON list of `{"upstream": NAME, <overrides>}`); both raise
`FederationParamError` with the reason, and nothing is stored before validation passed. `resolve(...)` turns a
policy's `federation-upstream` / `federation-upstream-set` value into the upstreams it names (the implicit set
`all` is every upstream of the vhost; a set element's keys override the upstream's). The two policy keys (mutually
exclusive, names) are checked with the other policy keys (node/broker/policies.py).

Keys and defaults are RabbitMQ 3.10's (rabbit_federation_parameters, rabbit_federation_upstream): `uri` (required,
a string or a non-empty list), `prefetch-count` 1000, `reconnect-delay` 5 (seconds: the code's default; the docs
say 1), `ack-mode` `on-confirm` / `on-publish` / `no-ack`, `trust-user-id` false, `exchange` (default: the
downstream exchange's name), `max-hops` 1, `expires`, `message-ttl` (on the upstream queue), `queue` and
`consumer-tag` (queue federation), `ha-policy`, `bind-nowait`,
`resource-cleanup-mode` (`default` / `never`), `queue-type`. The error texts are RabbitMQ's
(rabbit_parameter_validation): "prefetch-count should be a number, actually was ...", "trust-user-id should be
boolean, ...", "ack-mode should be one of [...], ...", "Key \"uri\" not found in federation-upstream". Unknown
keys are refused ("Unrecognised terms").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from cluster.link.uri import AmqpUri, UriError, parse_uri

UPSTREAM: Final = "federation-upstream"
UPSTREAM_SET: Final = "federation-upstream-set"
COMPONENTS: Final = (UPSTREAM, UPSTREAM_SET)
POLICY_KEYS: Final = frozenset({UPSTREAM, UPSTREAM_SET})
ALL: Final = "all"
ACK_MODES: Final = ("on-confirm", "on-publish", "no-ack")

_NUMBER = ("prefetch-count", "reconnect-delay", "max-hops", "expires", "message-ttl")
_BINARY = ("exchange", "queue", "consumer-tag", "ha-policy", "queue-type")
_BOOLEAN = ("trust-user-id", "bind-nowait")
SHARED_KEYS: Final = frozenset({*_NUMBER, *_BINARY, *_BOOLEAN, "ack-mode", "resource-cleanup-mode"})
UPSTREAM_KEYS: Final = SHARED_KEYS | {"uri"}
SET_ELEMENT_KEYS: Final = SHARED_KEYS | {"upstream"}


class FederationParamError(ValueError):
    """The definition is refused; str() is the reason (answered as 400 by the API, printed by ctl)."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """One upstream, with a set element's overrides applied (what a link runs with)."""

    vhost: str
    name: str
    uris: tuple[str, ...]
    prefetch_count: int = 1000
    reconnect_delay_ms: int = 5000
    ack_mode: str = "on-confirm"
    trust_user_id: bool = False
    exchange: str | None = None  # None: the downstream exchange's own name
    max_hops: int = 1
    expires: int | None = None
    message_ttl: int | None = None
    queue: str | None = None
    consumer_tag: str | None = None
    resource_cleanup_mode: str = "default"
    value: dict[str, Any] = field(default_factory=dict)

    def uri(self, index: int) -> AmqpUri:
        return parse_uri(self.uris[index % len(self.uris)])


def _erl(value: Any) -> str:
    """A value as RabbitMQ prints it with ~p (close enough: JSON text)."""
    return json.dumps(value)


def _check_shared(value: Mapping[str, Any]) -> None:
    for key in sorted(value):
        raw = value[key]
        if key in _NUMBER and (isinstance(raw, bool) or not isinstance(raw, (int, float))):
            raise FederationParamError(f"{key} should be a number, actually was {_erl(raw)}")
        if key in _BINARY and not isinstance(raw, str):
            raise FederationParamError(f"{key} should be binary, actually was {_erl(raw)}")
        if key in _BOOLEAN and not isinstance(raw, bool):
            raise FederationParamError(f"{key} should be boolean, actually was {_erl(raw)}")
        if key == "ack-mode" and raw not in ACK_MODES:
            raise FederationParamError(f"ack-mode should be one of [{', '.join(ACK_MODES)}], "
                                       f"actually was {_erl(raw)}")
        if key == "resource-cleanup-mode" and raw not in ("default", "never"):
            raise FederationParamError(f"resource-cleanup-mode should be one of [default, never], "
                                       f"actually was {_erl(raw)}")
    for key in ("prefetch-count", "max-hops"):
        if key in value and (not isinstance(value[key], int) or value[key] < (1 if key == "max-hops" else 0)):
            raise FederationParamError(f"{key} should be a {'positive' if key == 'max-hops' else 'non-negative'} "
                                       f"integer, actually was {_erl(value[key])}")
    for key in ("reconnect-delay", "expires", "message-ttl"):
        if key in value and value[key] < 0:
            raise FederationParamError(f"{key} should be a non-negative number, actually was {_erl(value[key])}")


def _unknown(value: Mapping[str, Any], known: frozenset[str], component: str) -> None:
    unknown = sorted(set(value) - known)
    if unknown:
        terms = ",".join(f"{{<<\"{k}\">>,{_erl(value[k])}}}" for k in unknown)
        raise FederationParamError(f"Unrecognised terms [{terms}] in {component}")


def _uris(raw: Any) -> tuple[str, ...]:
    uris = [raw] if isinstance(raw, str) else raw
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise FederationParamError(f"uri should be a URI string or a non-empty list of URI strings, "
                                   f"actually was {_erl(raw)}")
    for uri in uris:
        try:
            parse_uri(uri)
        except UriError as exc:
            raise FederationParamError(f"\"{uri}\" not a valid URI: {exc}") from None
    return tuple(uris)


def parse_upstream(vhost: str, name: str, value: Any) -> Upstream:
    if not isinstance(value, dict):
        raise FederationParamError(f"{UPSTREAM} should be a JSON object, actually was {_erl(value)}")
    if not name:
        raise FederationParamError("the upstream name must not be empty")
    _unknown(value, UPSTREAM_KEYS, UPSTREAM)
    if "uri" not in value:
        raise FederationParamError(f"Key \"uri\" not found in {UPSTREAM}")
    uris = _uris(value["uri"])
    _check_shared(value)
    return _build(vhost, name, uris, value)


def _build(vhost: str, name: str, uris: tuple[str, ...], value: Mapping[str, Any]) -> Upstream:
    def num(key: str) -> int | None:
        return int(value[key]) if key in value else None

    return Upstream(
        vhost=vhost, name=name, uris=uris, prefetch_count=int(value.get("prefetch-count", 1000)),
        reconnect_delay_ms=int(value.get("reconnect-delay", 5) * 1000), ack_mode=value.get("ack-mode", "on-confirm"),
        trust_user_id=bool(value.get("trust-user-id", False)), exchange=value.get("exchange"),
        max_hops=int(value.get("max-hops", 1)), expires=num("expires"), message_ttl=num("message-ttl"),
        queue=value.get("queue"), consumer_tag=value.get("consumer-tag"),
        resource_cleanup_mode=value.get("resource-cleanup-mode", "default"), value=dict(value))


def parse_upstream_set(vhost: str, name: str, value: Any) -> list[dict[str, Any]]:
    """The set's elements (each with `upstream` and its overrides), validated."""
    if not isinstance(value, list):
        raise FederationParamError(f"{UPSTREAM_SET} should be a list, actually was {_erl(value)}")
    for element in value:
        if not isinstance(element, dict):
            raise FederationParamError(f"{UPSTREAM_SET} elements should be objects, actually was {_erl(element)}")
        _unknown(element, SET_ELEMENT_KEYS, UPSTREAM_SET)
        if "upstream" not in element:
            raise FederationParamError(f"Key \"upstream\" not found in {UPSTREAM_SET}")
        if not isinstance(element["upstream"], str):
            raise FederationParamError(f"upstream should be binary, actually was {_erl(element['upstream'])}")
        _check_shared(element)
    return [dict(e) for e in value]


def parse(component: str, vhost: str, name: str, value: Any) -> None:
    """Validate a parameter of either federation component (FederationParamError when refused)."""
    if component == UPSTREAM:
        parse_upstream(vhost, name, value)
    elif component == UPSTREAM_SET:
        parse_upstream_set(vhost, name, value)
    else:
        raise FederationParamError(f"unknown component {component}")


def resolve(policy_definition: Mapping[str, Any], vhost: str,
            stored: Mapping[tuple[str, str, str], str]) -> list[Upstream]:
    """The upstreams a policy names. `stored`: (component, vhost, name) -> JSON text of the federation
    parameters. `federation-upstream: X` is upstream X (none if it is not defined); `federation-upstream-set: all`
    is every upstream of the vhost; another set is its elements, each upstream's keys overridden by the element's.
    Undefined or invalid upstreams are skipped (RabbitMQ ignores them too)."""
    def upstream(name: str, overrides: Mapping[str, Any]) -> Upstream | None:
        raw = stored.get((UPSTREAM, vhost, name))
        if raw is None:
            return None
        try:
            base = json.loads(raw)
            merged = {**base, **{k: v for k, v in overrides.items() if k != "upstream"}}
            return _build(vhost, name, _uris(merged["uri"]), merged)
        except (ValueError, KeyError, TypeError):
            return None

    found: list[Upstream | None]
    if UPSTREAM in policy_definition:
        found = [upstream(str(policy_definition[UPSTREAM]), {})]
    elif UPSTREAM_SET in policy_definition:
        set_name = str(policy_definition[UPSTREAM_SET])
        if set_name == ALL:
            found = [upstream(n, {}) for (c, v, n) in sorted(stored) if c == UPSTREAM and v == vhost]
        else:
            raw = stored.get((UPSTREAM_SET, vhost, set_name))
            try:
                elements = json.loads(raw) if raw is not None else []
            except ValueError:
                elements = []
            found = [upstream(e["upstream"], e) for e in elements if isinstance(e, dict) and "upstream" in e]
    else:
        found = []
    return [u for u in found if u is not None]
