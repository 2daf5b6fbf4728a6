"""The web console's static files: `GET /` and `GET /console/{file}` on the management port (no login needed).

What it is for: the console (node/runtime/console/: index.html, console.js, console.css; package data, no build
step) is a page whose script logs in and reads the management API (/api/...) with the same credentials, so every
node serves the same console for the whole cluster. How it works: `console_reply(head)` answers the page and its
files from the package's `console` directory (read once, then kept), or None for any other path; a file it does
not ship is 404. HEAD answers the same head without a body (management.py).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from node.runtime.management_api import Reply, error_reply
from node.runtime.management_http import RequestHead, Text

FILES: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}


@cache
def _read(name: str) -> str:
    return resources.files("node.runtime").joinpath("console", name).read_text(encoding="utf-8")


def console_reply(head: RequestHead) -> Reply | None:
    """The console file a GET/HEAD asks for; None when the path is not the console's."""
    if head.method not in ("GET", "HEAD"):
        return None
    segments = head.segments
    if segments in ((), ("console",)):
        name = "index.html"
    elif len(segments) == 2 and segments[0] == "console":
        name = segments[1]
    else:
        return None
    if name not in FILES:
        return error_reply(404, "Object Not Found", "Not Found")
    return Reply(200, Text(_read(name), FILES[name]))
