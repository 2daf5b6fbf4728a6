"""AMQP URIs (RabbitMQ's URI spec, the subset links use): `amqp[s]://user:pass@host:port/vhost?heartbeat=N&...`.

Pure: a string in, an `AmqpUri` out, or `UriError` with the reason. Defaults are RabbitMQ's: guest/guest,
localhost, port 5672 (5671 for amqps), vhost "/" when the path is absent (an empty path `amqp://host/` is the vhost
""); the vhost is percent-decoded (`%2F` is "/"). Query parameters read: `heartbeat` (seconds), `connection_timeout`
(ms), `frame_max`, `channel_max`, and for `amqps` RabbitMQ's TLS keys (its "URI query parameters" page):
`cacertfile`, `certfile`, `keyfile` (paths; a client certificate is sent when `certfile` is given, its key from
`keyfile` or from the certificate file), `verify` (`verify_peer`, the default here as in RabbitMQ on Erlang/OTP 26+:
the server's chain is checked against `cacertfile`, or the system's CAs without one, and its name against
`server_name_indication`, by default the URI's host; `verify_none`: no check) and `server_name_indication` (a host
name, or `disable`: no SNI and no name check). Other keys are accepted and ignored, as RabbitMQ ignores unknown
ones; TLS keys on an `amqp` URI are refused (they would silently not apply). `amqp://` with no host is the local
node (`local=True`; the runtime fills in its own listener and credentials), as in RabbitMQ's shovels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


class UriError(ValueError):
    """The URI cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class AmqpUri:
    host: str = "localhost"
    port: int = 5672
    username: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    heartbeat_s: int = 60
    connection_timeout_ms: int = 10_000
    frame_max: int = 131072
    channel_max: int = 2047
    local: bool = False  # `amqp://` with no host: the node itself (RabbitMQ's direct connection)
    tls: bool = False  # amqps
    cacertfile: str = ""
    certfile: str = ""
    keyfile: str = ""
    verify: str = "verify_peer"
    server_name_indication: str = ""  # "" = the host; "disable" = none

    def redacted(self) -> str:
        """The URI without its password (for status and logs)."""
        vhost = self.vhost.replace("%", "%25").replace("/", "%2F")
        return f"{'amqps' if self.tls else 'amqp'}://{self.username}@{self.host}:{self.port}/{vhost}"

    @property
    def tls_server_name(self) -> str | None:
        """The name sent as SNI and checked in the server's certificate (None: `disable`)."""
        if self.server_name_indication == "disable":
            return None
        return self.server_name_indication or self.host


TLS_KEYS = ("cacertfile", "certfile", "keyfile", "verify", "server_name_indication")
VERIFY_MODES = ("verify_peer", "verify_none")


def _int_param(params: dict[str, list[str]], name: str, default: int) -> int:
    values = params.get(name)
    if not values:
        return default
    try:
        value = int(values[-1])
    except ValueError:
        raise UriError(f"{name} must be an integer, not {values[-1]!r}") from None
    if value < 0:
        raise UriError(f"{name} must not be negative")
    return value


def parse_uri(uri: str) -> AmqpUri:
    if not isinstance(uri, str) or not uri:
        raise UriError("the URI must be a non-empty string")
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError as exc:
        raise UriError(f"cannot parse {uri!r}: {exc}") from None
    if parts.scheme not in ("amqp", "amqps"):
        raise UriError(f"the URI scheme must be amqp or amqps, not {parts.scheme!r}")
    tls = parts.scheme == "amqps"
    path = parts.path
    if not path:
        vhost = "/"
    else:
        vhost = unquote(path[1:])
        if "/" in path[1:]:
            raise UriError(f"the vhost in {uri!r} must be percent-encoded (%2F for '/')")
    params = parse_qs(parts.query)
    tls_options = {key: params[key][-1] for key in TLS_KEYS if params.get(key)}
    if tls_options and not tls:
        raise UriError(f"{', '.join(sorted(tls_options))}: TLS options need an amqps URI")
    if tls_options.get("verify", "verify_peer") not in VERIFY_MODES:
        raise UriError(f"verify must be verify_peer or verify_none, not {tls_options['verify']!r}")
    if tls and not parts.netloc:
        raise UriError("amqps:// needs a host (amqp:// with no host is the node itself)")
    if "keyfile" in tls_options and "certfile" not in tls_options:
        raise UriError("keyfile needs certfile (the client certificate)")
    return AmqpUri(
        host=parts.hostname or "localhost", port=port or (5671 if tls else 5672),
        username=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        vhost=vhost, heartbeat_s=_int_param(params, "heartbeat", 60),
        connection_timeout_ms=_int_param(params, "connection_timeout", 10_000),
        frame_max=_int_param(params, "frame_max", 131072), channel_max=_int_param(params, "channel_max", 2047),
        local=not parts.netloc, tls=tls, **tls_options,
    )


def resolve_local(uri: AmqpUri, local: AmqpUri | None) -> AmqpUri:
    """`uri`, or for `amqp://` (the node itself) the node's own address `local` with `uri`'s vhost."""
    if uri.local and local is not None:
        return replace(local, vhost=uri.vhost)
    return uri


LOCAL_URI_KEYS = {"shovel": ("src-uri", "dest-uri"), "federation-upstream": ("uri",)}  # per parameter component


def local_uri_vhosts(component: str, value: Any) -> set[str]:
    """The vhosts that a parameter value's URIs without a host (the node itself) name; URIs that do not parse are
    left to the component's validation."""
    vhosts: set[str] = set()
    if not isinstance(value, dict):
        return vhosts
    for key in LOCAL_URI_KEYS.get(component, ()):
        raw = value.get(key)
        for uri in [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []:
            try:
                parsed = parse_uri(uri)
            except UriError:
                continue
            if parsed.local:
                vhosts.add(parsed.vhost)
    return vhosts
