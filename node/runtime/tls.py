"""TLS for the amqps listener and the HTTPS management listener: the server's `ssl.SSLContext` built from the
`ssl_*` settings (amqps) or the `management_ssl_*` ones (management and Prometheus over HTTPS), and the login name a
verified client certificate gives (for the EXTERNAL SASL mechanism).

The context follows RabbitMQ's `ssl_options`: `ssl_certfile`/`ssl_keyfile` are the node's certificate chain and
key, `ssl_cacertfile` the CAs client certificates are checked against; `ssl_verify = verify_peer` asks the client
for a certificate (checked if given) and `ssl_fail_if_no_peer_cert` makes one mandatory. TLS 1.2 is the oldest
version accepted (RabbitMQ's default versions are 1.2 and 1.3). Files are read once, at start: a missing or bad
file stops the node with a `ConfigError` naming the setting.

The certificate's login name (`ssl_cert_login_from`, as rabbitmq_auth_mechanism_ssl): `distinguished_name` (the
default there) is the subject in RFC 4514 form, most specific part first ("CN=client,O=raftmq");
`common_name` is the subject's CN.

`tls_handshake` runs the server side of the handshake under a deadline; `PrefixedStream` hands it the bytes that
arrived with a PROXY protocol header first (the start of the ClientHello).
"""

from __future__ import annotations

import ssl

import trio
from cryptography import x509
from cryptography.x509.oid import NameOID

from node.runtime.config import ConfigError, NodeConfig

VERIFY_MODES = ("verify_none", "verify_peer")
LOGIN_FROM = ("distinguished_name", "common_name")


def server_context(config: NodeConfig) -> ssl.SSLContext:
    """The server-side context of the amqps listener; ConfigError when a file cannot be used."""
    return _context("ssl_", config.ssl_certfile, config.ssl_keyfile, config.ssl_cacertfile, config.ssl_verify,
                    config.ssl_fail_if_no_peer_cert)


def management_context(config: NodeConfig) -> ssl.SSLContext:
    """The server-side context of the HTTPS management (and Prometheus) listeners, from the `management_ssl_*`
    settings (RabbitMQ's management.ssl.*); ConfigError when a file cannot be used."""
    return _context("management_ssl_", config.management_ssl_certfile, config.management_ssl_keyfile,
                    config.management_ssl_cacertfile, config.management_ssl_verify,
                    config.management_ssl_fail_if_no_peer_cert)


def _context(prefix: str, certfile: str, keyfile: str, cacertfile: str, verify: str,
             fail_if_no_peer_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{prefix}certfile/{prefix}keyfile: cannot load {certfile!r}: {exc}") from None
    if cacertfile:
        try:
            context.load_verify_locations(cafile=cacertfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{prefix}cacertfile: cannot load {cacertfile!r}: {exc}") from None
    if verify == "verify_peer":
        context.verify_mode = ssl.CERT_REQUIRED if fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def certificate_login(der: bytes | None, login_from: str) -> str | None:
    """The login name of a verified peer certificate (DER), or None (no certificate, or no CN when asked for
    one)."""
    if not der:
        return None
    subject = x509.load_der_x509_certificate(der).subject
    if login_from == "common_name":
        names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if not names:
            return None
        value = names[0].value
        return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return subject.rfc4514_string()


async def tls_handshake(stream: trio.abc.Stream, context: ssl.SSLContext, timeout_ms: int, *,
                        https_compatible: bool = False) -> tuple[trio.SSLStream[trio.abc.Stream] | None, str]:
    """(the TLS stream, "") once the server-side handshake completed within `timeout_ms`, else (None, why).
    `https_compatible`: an end of stream without TLS close_notify is a clean end, as HTTPS clients do it."""
    ssl_stream = trio.SSLStream(stream, context, server_side=True, https_compatible=https_compatible)
    with trio.move_on_after(timeout_ms / 1000):
        try:
            await ssl_stream.do_handshake()
            return ssl_stream, ""
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            return None, f"TLS handshake failed: {cause!r}"
    return None, f"no TLS handshake within {timeout_ms} ms"


class PrefixedStream(trio.abc.Stream):
    """A stream whose first reads return `prefix` (bytes that came with the PROXY header), then `inner`'s."""

    def __init__(self, inner: trio.SocketStream, prefix: bytes) -> None:
        self.inner = inner
        self.prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.prefix:
            size = len(self.prefix) if max_bytes is None else max_bytes
            data, self.prefix = self.prefix[:size], self.prefix[size:]
            return data
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()
