"""The fault proxy driven by the unmodified toxiproxy-python client, with traffic to a local echo server."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest
import requests
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.faultproxy.background import FaultProxyThread


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while True:
            try:
                data = self.request.recv(65536)
            except OSError:
                return
            if not data or data.strip() == b"close":
                return
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def toxiproxy() -> Iterator[Toxiproxy]:
    with FaultProxyThread(seed=7) as fault_proxy:
        client = Toxiproxy()
        client.update_api_consumer("127.0.0.1", fault_proxy.api_port)
        yield client


def api(toxiproxy: Toxiproxy) -> str:
    from toxiproxy.api import APIConsumer
    return f"http://{APIConsumer.host}:{APIConsumer.port}"


def connect(listen: str) -> socket.socket:
    host, port = listen.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def round_trip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    received = b""
    while len(received) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def test_client_manages_proxies_and_toxics(toxiproxy: Toxiproxy, echo_port: int) -> None:
    assert toxiproxy.running() and toxiproxy.version()
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    assert proxy.enabled and proxy.listen.startswith("127.0.0.1:") and not proxy.listen.endswith(":0")
    assert set(toxiproxy.proxies()) == {"echo"}
    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 100, "jitter": 10})
    proxy.add_toxic(type="bandwidth", stream="upstream", name="slow", toxicity=0.5, attributes={"rate": 5})
    toxics = proxy.toxics()
    assert set(toxics) == {"latency_downstream", "slow"}
    assert toxics["slow"].stream == "upstream" and toxics["slow"].toxicity == 0.5
    assert toxics["latency_downstream"].attributes == {"latency": 100, "jitter": 10}
    with pytest.raises(ProxyExists):
        proxy.add_toxic(type="latency")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="no-such-toxic")
    assert proxy.destroy_toxic("slow") and proxy.get_toxic("slow") is None
    with pytest.raises(NotFound):
        proxy.destroy_toxic("slow")
    toxiproxy.reset()
    assert proxy.toxics() == {}
    assert proxy.destroy() and toxiproxy.proxies() == {}


def test_raw_api_status_codes_and_bodies(toxiproxy: Toxiproxy, echo_port: int) -> None:
    base = api(toxiproxy)
    upstream = f"127.0.0.1:{echo_port}"
    created = requests.post(f"{base}/proxies", json={"name": "a", "upstream": upstream, "listen": "127.0.0.1:0"})
    assert created.status_code == 201 and created.json()["toxics"] == []
    assert requests.get(f"{base}/proxies/nope").json() == {"error": "proxy not found", "status": 404}
    toxic = requests.post(f"{base}/proxies/a/toxics", json={"type": "latency", "attributes": {"latency": 5}})
    assert toxic.status_code == 200 and toxic.json() == {
        "name": "latency_downstream", "type": "latency", "stream": "downstream", "toxicity": 1.0,
        "attributes": {"latency": 5, "jitter": 0}}
    changed = requests.post(f"{base}/proxies/a/toxics/latency_downstream", json={"attributes": {"jitter": 2}})
    assert changed.json()["attributes"] == {"latency": 5, "jitter": 2}
    assert requests.get(f"{base}/proxies/a/toxics/latency_downstream").json()["attributes"]["jitter"] == 2
    assert requests.get(f"{base}/proxies/a/toxics/zzz").status_code == 404
    populated = requests.post(f"{base}/populate", json=[{"name": "a", "upstream": upstream},
                                                        {"name": "b", "upstream": upstream}])
    assert populated.status_code == 201 and [p["name"] for p in populated.json()["proxies"]] == ["a", "b"]
    assert requests.get(f"{base}/proxies/a").json()["toxics"] == []
    assert requests.delete(f"{base}/proxies/b").status_code == 204
    assert requests.post(f"{base}/reset").status_code == 204
    assert requests.post(f"{base}/proxies", json={"name": "c"}).status_code == 400


def test_traffic_passes_and_disable_refuses_then_enable_restores(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"hello") == b"hello"
    with proxy.down(), pytest.raises(OSError):
        connect(proxy.listen)
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"again") == b"again"


def test_latency_adds_at_least_the_configured_delay(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    proxy.add_toxic(type="latency", attributes={"latency": 150})
    proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 100, "jitter": 20})
    with connect(proxy.listen) as sock:
        started = time.monotonic()
        assert round_trip(sock, b"ping") == b"ping"
        assert time.monotonic() - started >= 0.150 + 0.080


def test_bandwidth_limits_the_rate(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    proxy.add_toxic(type="bandwidth", attributes={"rate": 20})  # 20 KB/s: 8,000 bytes take >= 0.4 s
    with connect(proxy.listen) as sock:
        started = time.monotonic()
        assert round_trip(sock, b"x" * 8000) == b"x" * 8000
        assert time.monotonic() - started >= 0.35


def test_reset_peer_resets_the_connection(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"before") == b"before"
        proxy.add_toxic(type="reset_peer", attributes={"timeout": 100})
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            for _ in range(100):
                sock.sendall(b"after")
                assert sock.recv(100), "closed gracefully instead of reset"
                time.sleep(0.05)


def test_limit_data_closes_after_n_bytes(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 10})
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"0123456789abcdef") == b"0123456789"
        assert sock.recv(100) == b""


def test_zero_toxicity_never_applies(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    proxy.add_toxic(type="limit_data", toxicity=0.0, attributes={"bytes": 1})
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"whole message") == b"whole message"


def test_timeout_zero_holds_data_until_removed(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    with connect(proxy.listen) as sock:
        sock.sendall(b"held")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(100)
        proxy.destroy_toxic("timeout_upstream")
        sock.settimeout(5)
        assert sock.recv(100) == b"held"


def test_timeout_closes_the_connection_after_the_delay(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"up") == b"up"
        started = time.monotonic()
        proxy.add_toxic(type="timeout", attributes={"timeout": 300})
        sock.sendall(b"lost")
        assert sock.recv(100) == b""
        assert time.monotonic() - started >= 0.25


def test_slow_close_delays_the_close(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    proxy.add_toxic(type="slow_close", attributes={"delay": 300})
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"x") == b"x"
        started = time.monotonic()
        sock.sendall(b"close")
        assert sock.recv(100) == b""
        assert time.monotonic() - started >= 0.25


def test_slicer_delivers_everything_in_pieces(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    proxy.add_toxic(type="slicer", attributes={"average_size": 10, "size_variation": 5, "delay": 2000})
    data = bytes(range(256)) * 4
    with connect(proxy.listen) as sock:
        started = time.monotonic()
        assert round_trip(sock, data) == data
        assert time.monotonic() - started >= 0.05  # >= 60 pieces with 2 ms between them


def test_toxicity_applies_the_toxic_to_a_fraction_of_connections(toxiproxy: Toxiproxy, echo_port: int) -> None:
    proxy = toxiproxy.create(upstream=f"127.0.0.1:{echo_port}", name="echo")
    proxy.add_toxic(type="limit_data", toxicity=0.5, attributes={"bytes": 1})
    received = []
    for _ in range(20):
        with connect(proxy.listen) as sock:
            received.append(round_trip(sock, b"hello"))
    assert set(received) == {b"h", b"hello"}
