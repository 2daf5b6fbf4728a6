"""Dynamic shovel definitions: RabbitMQ's `shovel` runtime parameter (JSON) validated into a `ShovelDefinition`.

Pure. `parse_definition(vhost, name, value)` returns the definition or raises `ShovelParamError` with the reason;
nothing is stored before validation passed, so an invalid definition changes nothing. Keys and defaults are
RabbitMQ 3.10's (rabbit_shovel_parameters): `src-uri`/`dest-uri` (a string or a non-empty list, tried in turn),
`src-queue` xor `src-exchange` (+ `src-exchange-key`, default ""), `src-prefetch-count` (1000; legacy
`prefetch-count`), `src-delete-after` (`never`, `queue-length` or a number; legacy `delete-after`),
`dest-queue` xor `dest-exchange` (+ `dest-exchange-key`; neither: the message's own exchange and key),
`dest-add-forward-headers`, `dest-add-timestamp-header` (legacy `add-forward-headers`, `add-timestamp-header`),
`ack-mode` (`on-confirm`, `on-publish`, `no-ack`), `reconnect-delay` (seconds, 1), `src-protocol`/`dest-protocol`
(`amqp091` only: AMQP 1.0 is not built), `src-queue-args`/`dest-queue-args` (tables used when the shovel declares
a missing queue). The error texts follow RabbitMQ's where it has one (e.g. "Cannot specify 'src-exchange' and
'src-queue'"). Unknown keys are refused, as RabbitMQ does ("Unrecognised terms").
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Final

from cluster.link.uri import AmqpUri, UriError, parse_uri
from node.amqp.properties import BasicProperties

ACK_MODES: Final = ("on-confirm", "on-publish", "no-ack")
KNOWN_KEYS: Final = frozenset({
    "src-uri", "dest-uri", "src-protocol", "dest-protocol", "src-queue", "src-exchange", "src-exchange-key",
    "src-prefetch-count", "prefetch-count", "src-delete-after", "delete-after", "src-queue-args",
    "src-consumer-args", "dest-queue", "dest-exchange", "dest-exchange-key", "dest-queue-args",
    "dest-add-forward-headers", "add-forward-headers", "dest-add-timestamp-header", "add-timestamp-header",
    "dest-publish-properties", "ack-mode", "reconnect-delay",
})


class ShovelParamError(ValueError):
    """The definition is refused; str() is the reason (answered as 400 by the API, printed by ctl)."""


@dataclass(frozen=True, slots=True)
class ShovelDefinition:
    vhost: str
    name: str
    src_uris: tuple[str, ...]
    dest_uris: tuple[str, ...]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = ""
    src_prefetch_count: int = 1000
    src_delete_after: str | int = "never"  # "never", "queue-length" or a count
    src_queue_args: dict[str, Any] = field(default_factory=dict)
    src_consumer_args: dict[str, Any] = field(default_factory=dict)
    dest_queue: str | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    dest_queue_args: dict[str, Any] = field(default_factory=dict)
    dest_publish_properties: dict[str, Any] = field(default_factory=dict)
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    ack_mode: str = "on-confirm"
    reconnect_delay_ms: int = 1000
    value: dict[str, Any] = field(default_factory=dict)  # the JSON as given (what GET /api/parameters shows)

    def src_uri(self, index: int) -> AmqpUri:
        return parse_uri(self.src_uris[index % len(self.src_uris)])

    def dest_uri(self, index: int) -> AmqpUri:
        return parse_uri(self.dest_uris[index % len(self.dest_uris)])


def _uris(value: dict[str, Any], key: str, shovel: str) -> tuple[str, ...]:
    if key not in value:
        raise ShovelParamError(f"Key \"{key}\" not found in shovel {shovel!r}")
    raw = value[key]
    uris = [raw] if isinstance(raw, str) else raw
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise ShovelParamError(f"{key} must be a URI string or a non-empty list of URI strings")
    for uri in uris:
        try:
            parse_uri(uri)
        except UriError as exc:
            raise ShovelParamError(f"{key} {uri!r}: {exc}") from None
    return tuple(uris)


def _opt_str(value: dict[str, Any], key: str) -> str | None:
    raw = value.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ShovelParamError(f"{key} should be a string, actually was {raw!r}")
    return raw


def _bool(value: dict[str, Any], *keys: str) -> bool:
    for key in keys:
        if key in value:
            raw = value[key]
            if not isinstance(raw, bool):
                raise ShovelParamError(f"{key} should be a boolean, actually was {raw!r}")
            return raw
    return False


def _table(value: dict[str, Any], key: str) -> dict[str, Any]:
    raw = value.get(key, {})
    if not isinstance(raw, dict):
        raise ShovelParamError(f"{key} should be an object, actually was {raw!r}")
    return dict(raw)


def _first(value: dict[str, Any], *keys: str) -> tuple[str, Any] | None:
    for key in keys:
        if key in value:
            return key, value[key]
    return None


def parse_definition(vhost: str, name: str, value: Any) -> ShovelDefinition:
    if not isinstance(value, dict):
        raise ShovelParamError("the shovel definition must be a JSON object")
    unknown = sorted(set(value) - KNOWN_KEYS)
    if unknown:
        raise ShovelParamError(f"Unrecognised terms {unknown} in shovel {name!r}")
    if not name:
        raise ShovelParamError("the shovel name must not be empty")
    for key in ("src-protocol", "dest-protocol"):
        if value.get(key, "amqp091") != "amqp091":
            raise ShovelParamError(f"{key} {value[key]!r} is not supported (only amqp091; AMQP 1.0 is not built)")
    src_uris = _uris(value, "src-uri", name)
    dest_uris = _uris(value, "dest-uri", name)
    src_queue, src_exchange = _opt_str(value, "src-queue"), _opt_str(value, "src-exchange")
    if src_queue is None and src_exchange is None:
        raise ShovelParamError("Must specify 'src-exchange' or 'src-queue'")
    if src_queue is not None and src_exchange is not None:
        raise ShovelParamError("Cannot specify 'src-exchange' and 'src-queue'")
    dest_queue, dest_exchange = _opt_str(value, "dest-queue"), _opt_str(value, "dest-exchange")
    if dest_queue is not None and dest_exchange is not None:
        raise ShovelParamError("Cannot specify 'dest-exchange' and 'dest-queue'")
    dest_key = _opt_str(value, "dest-exchange-key")
    ack_mode = value.get("ack-mode", "on-confirm")
    if ack_mode not in ACK_MODES:
        raise ShovelParamError(f"ack-mode should be one of {list(ACK_MODES)}, actually was {ack_mode!r}")
    prefetch_item = _first(value, "src-prefetch-count", "prefetch-count")
    prefetch = 1000 if prefetch_item is None else prefetch_item[1]
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 0 <= prefetch <= 65535:
        raise ShovelParamError(f"src-prefetch-count should be a number between 0 and 65535, actually was {prefetch!r}")
    delete_item = _first(value, "src-delete-after", "delete-after")
    delete_after: str | int = "never" if delete_item is None else delete_item[1]
    if isinstance(delete_after, bool) or not (delete_after in ("never", "queue-length") or
                                              (isinstance(delete_after, int) and delete_after >= 0)):
        raise ShovelParamError(f"src-delete-after should be \"never\", \"queue-length\" or a non-negative number, "
                               f"actually was {delete_after!r}")
    if isinstance(delete_after, int) and ack_mode == "no-ack":
        raise ShovelParamError("Cannot specify 'no-ack' and numerical 'delete-after'")
    if delete_after == "queue-length" and src_queue is None:
        raise ShovelParamError("Cannot specify 'queue-length' delete-after with 'src-exchange'")
    delay = value.get("reconnect-delay", 1)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise ShovelParamError(f"reconnect-delay should be a non-negative number, actually was {delay!r}")
    publish_properties = _table(value, "dest-publish-properties")
    if "headers" in publish_properties:
        raise ShovelParamError("dest-publish-properties cannot set headers")
    allowed = {f.name for f in fields(BasicProperties)} - {"headers"}
    bad = sorted(set(publish_properties) - allowed)
    if bad:
        raise ShovelParamError(f"dest-publish-properties: unknown properties {bad}")
    return ShovelDefinition(
        vhost=vhost, name=name, src_uris=src_uris, dest_uris=dest_uris, src_queue=src_queue,
        src_exchange=src_exchange, src_exchange_key=_opt_str(value, "src-exchange-key") or "",
        src_prefetch_count=prefetch, src_delete_after=delete_after, src_queue_args=_table(value, "src-queue-args"),
        src_consumer_args=_table(value, "src-consumer-args"), dest_queue=dest_queue, dest_exchange=dest_exchange,
        dest_exchange_key=dest_key, dest_queue_args=_table(value, "dest-queue-args"),
        dest_publish_properties=publish_properties,
        add_forward_headers=_bool(value, "dest-add-forward-headers", "add-forward-headers"),
        add_timestamp_header=_bool(value, "dest-add-timestamp-header", "add-timestamp-header"),
        ack_mode=ack_mode, reconnect_delay_ms=int(delay * 1000), value=dict(value),
    )
