"""The web console (node/runtime/console/) in a real headless Chromium, driven by selenium, in both modes.

The test logs in through the console's form (a wrong password first), opens each page (overview, queues,
connections, exchanges, policies, links) and checks what it shows against objects made over AMQP (pika) and the
management API; in cluster mode the browser talks to the last node while the client reached the cluster through
HAProxy, so every page must show the whole cluster. Screenshots go to the test's tmp dir (`console-<mode>-<page>
.png`). Needs Debian's `chromium` and `chromium-driver` (installed by `./dev test`) and selenium; skipped without
them. The console's files themselves (served without login, 404 for a file it does not ship) are checked with
plain HTTP in both modes.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest
import requests

from tests.integration.conftest import Target
from tests.integration.test_vhost_limits import management_ports

CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WAIT_S = 30.0
PAGES = ("overview", "queues", "connections", "exchanges", "policies", "links")


def _have_browser() -> bool:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return False
    return CHROMIUM is not None and Path(CHROMEDRIVER).exists()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not _have_browser():
        pytest.skip("needs chromium, chromium-driver (Debian) and selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--disable-extensions"):
        options.add_argument(arg)
    if CHROMIUM is not None:
        options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_console_files_are_served_without_login(amqp_target: Target) -> None:
    port = management_ports(amqp_target)[-1]
    page = requests.get(f"http://127.0.0.1:{port}/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/console/console.js" in page.text
    script = requests.get(f"http://127.0.0.1:{port}/console/console.js", timeout=10)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert requests.get(f"http://127.0.0.1:{port}/console/console.css", timeout=10).status_code == 200
    assert requests.get(f"http://127.0.0.1:{port}/console/nothing.js", timeout=10).status_code == 404
    assert requests.get(f"http://127.0.0.1:{port}/api/overview", timeout=10).status_code == 401  # the API still asks


def _api(port: int, method: str, path: str, body: Any = None) -> requests.Response:
    reply = requests.request(method, f"http://127.0.0.1:{port}{path}", json=body, auth=("guest", "guest"),
                             timeout=30)
    assert reply.status_code < 300, (method, path, reply.status_code, reply.text)
    return reply


def _wait_text(browser: Any, element_id: str, wanted: Callable[[str], bool], what: str) -> str:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + WAIT_S
    text = ""
    while time.monotonic() < deadline:
        try:  # the page re-renders every refresh, so an element found may be replaced before it is read
            elements = browser.find_elements(By.ID, element_id)
            text = elements[0].text if elements else ""
            if wanted(text):
                return text
        except StaleElementReferenceException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what}: #{element_id} shows {text!r}")


def _open(browser: Any, page: str) -> None:
    from selenium.webdriver.common.by import By

    browser.find_element(By.CSS_SELECTOR, f'#nav a[data-page="{page}"]').click()
    _wait_text(browser, "page", lambda _: browser.find_element(By.ID, "page").get_attribute("data-page") == page,
               f"page {page}")


def test_console_pages_show_the_cluster(amqp_target: Target, uid: str, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    ports = management_ports(amqp_target)
    port = ports[-1]
    vhost = quote("/", safe="")
    queue, exchange, policy, shovel = f"con-q-{uid}", f"con-x-{uid}", f"con-p-{uid}", f"con-s-{uid}"
    _api(port, "PUT", f"/api/policies/{vhost}/{policy}",
         {"pattern": f"^con-q-{uid}$", "definition": {"max-length": 1000}, "apply-to": "queues"})
    _api(port, "PUT", f"/api/parameters/shovel/{vhost}/{shovel}",
         {"value": {"src-uri": "amqp://", "src-queue": f"{queue}-src", "dest-uri": "amqp://",
                    "dest-queue": f"{queue}-dst"}})
    with pika.BlockingConnection(amqp_target.params()) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        ch.exchange_declare(exchange, "topic", durable=True)
        ch.queue_bind(queue, exchange, f"key.{uid}")
        ch.confirm_delivery()
        for n in range(5):
            ch.basic_publish(exchange, f"key.{uid}", f"m{n}".encode())
        ch.basic_consume(queue, lambda *_: None, auto_ack=False)
        conn.process_data_events(time_limit=0.5)
        try:
            browser.get(f"http://127.0.0.1:{port}/?refresh=1000#overview")
            browser.execute_script("sessionStorage.clear()")
            browser.refresh()
            _wait_text(browser, "login", lambda t: "Log in" in t, "the login form")
            browser.find_element(By.ID, "username").send_keys("guest")
            browser.find_element(By.ID, "password").send_keys("wrong")
            browser.find_element(By.ID, "login-button").click()
            _wait_text(browser, "login-error", lambda t: "Login failed" in t, "a wrong password")
            assert not browser.find_element(By.ID, "nav").is_displayed()
            browser.find_element(By.ID, "password").clear()
            browser.find_element(By.ID, "password").send_keys("guest")
            browser.find_element(By.ID, "login-button").click()
            _check_pages(browser, amqp_target, ports, queue, exchange, policy, shovel, uid, tmp_path)
            if amqp_target.mode == "single":  # (once: the tags are the API's, the same in both modes)
                _management_user_sees_no_nodes(browser, port, uid)
        finally:
            _api(port, "DELETE", f"/api/parameters/shovel/{vhost}/{shovel}")
            _api(port, "DELETE", f"/api/policies/{vhost}/{policy}")
            ch.queue_delete(queue)
            ch.exchange_delete(exchange)


def _check_pages(browser: Any, target: Target, ports: list[int], queue: str, exchange: str, policy: str,
                 shovel: str, uid: str, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    nodes = len(ports)  # one row per node, each with its memory ("N MiB of M GiB")
    _wait_text(browser, "who", lambda t: "guest" in t, "logged in")
    text = _wait_text(browser, "nodes", lambda t: t.count(" of ") >= nodes and "running" in t, "nodes, memory")
    assert "Disk free" in text
    totals = _wait_text(browser, "totals", lambda t: "Connections" in t, "totals")
    assert "Queues" in totals and "Consumers" in totals
    # the charts fill in as the page refreshes (every second here): two samples make a rate
    _wait_text(browser, "chart-rates", lambda t: "Publish" in t and browser.execute_script(
        "return history.rates.length") >= 2, "the rate chart")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-rates polyline")) == 3
    _wait_text(browser, "chart-queued", lambda t: "Ready" in t and "Unacked" in t, "the queued chart")
    browser.save_screenshot(str(shots / f"console-{target.mode}-overview.png"))

    _open(browser, "queues")
    row = _row(browser, "queues", queue)
    assert "quorum" in row and policy in row, row
    if target.mode == "cluster":  # leader, three members and the replication state of the queue's Raft group
        names = [n["name"] for n in _api(ports[-1], "GET", "/api/nodes").json()]
        assert len(names) == 3 and all(name in row for name in names) and "term" in row, row
    browser.save_screenshot(str(shots / f"console-{target.mode}-queues.png"))

    _open(browser, "connections")
    _wait_text(browser, "connections", lambda t: "guest" in t and "running" in t, "connections")
    _wait_text(browser, "channels", lambda t: "guest" in t, "channels")
    browser.save_screenshot(str(shots / f"console-{target.mode}-connections.png"))

    _open(browser, "exchanges")
    assert "topic" in _row(browser, "exchanges", exchange)
    _wait_text(browser, "bindings", lambda t: f"key.{uid}" in t, "the binding")
    browser.save_screenshot(str(shots / f"console-{target.mode}-exchanges.png"))

    _open(browser, "policies")
    assert "max-length" in _row(browser, "policies", policy)

    _open(browser, "links")
    _row(browser, "shovels", shovel)
    _wait_text(browser, "federation-links", lambda t: "Upstream" in t, "the federation links table")
    browser.save_screenshot(str(shots / f"console-{target.mode}-links.png"))


def _row(browser: Any, table: str, name: str) -> str:
    text = _wait_text(browser, table, lambda t: name in t, f"{name} in {table}")
    return next(line for line in text.splitlines() if name in line)


def _management_user_sees_no_nodes(browser: Any, port: int, uid: str) -> None:
    """A user tagged management only may not list nodes or shovels (RabbitMQ's tags): the console stays logged in
    and leaves those tables out, as RabbitMQ's does."""
    from selenium.webdriver.common.by import By

    user = f"console-mgmt-{uid}"
    _api(port, "PUT", f"/api/users/{user}", {"password": "pw", "tags": "management"})
    _api(port, "PUT", f"/api/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"})
    browser.find_element(By.ID, "logout").click()
    _wait_text(browser, "login", lambda t: "Log in" in t, "the login form again")
    browser.find_element(By.ID, "username").clear()
    browser.find_element(By.ID, "username").send_keys(user)
    browser.find_element(By.ID, "password").clear()
    browser.find_element(By.ID, "password").send_keys("pw")
    browser.find_element(By.ID, "login-button").click()
    _open(browser, "overview")
    _wait_text(browser, "nodes", lambda t: "needs another user tag" in t, "nodes left out")
    _wait_text(browser, "totals", lambda t: "Queues" in t, "the totals a management user sees")
    _open(browser, "links")
    _wait_text(browser, "shovels", lambda t: "needs another user tag" in t, "shovels left out")
    assert browser.find_element(By.ID, "nav").is_displayed()
