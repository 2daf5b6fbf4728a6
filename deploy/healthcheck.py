"""AMQP readiness probe: exit 0 when host:port answers the 0-9-1 protocol header with a Connection.Start frame.

Used by the compose file's health checks and by the local runner; HAProxy performs the same exchange with its
tcp-check rules (deploy/haproxy.cfg). With `tls_ca_file` the exchange runs over TLS (the server's certificate
checked against that CA): an amqps listener or HAProxy's amqps frontend.
"""

from __future__ import annotations

import socket
import ssl
import sys

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def answers_amqp(host: str, port: int, timeout_s: float = 2.0, tls_ca_file: str | None = None) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            sock = raw
            if tls_ca_file is not None:
                sock = ssl.create_default_context(cafile=tls_ca_file).wrap_socket(raw, server_hostname=host)
            sock.settimeout(timeout_s)
            sock.sendall(PROTOCOL_HEADER)
            head = b""
            while len(head) < 3:
                chunk = sock.recv(3 - len(head))
                if not chunk:
                    return False
                head += chunk
            return head == b"\x01\x00\x00"
    except OSError:  # (ssl.SSLError too)
        return False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    host, port = (args + ["127.0.0.1", "5672"][len(args):])[:2]
    return 0 if answers_amqp(host, int(port)) else 1


if __name__ == "__main__":
    sys.exit(main())
