"""Run the fault proxy in a background thread (for blocking callers: tests, the pika workload's runner).

How it works: `FaultProxyThread` starts `trio.run` in a daemon thread, waits (bounded) until the API listens, and
exposes `api_port`; `stop()` cancels the trio run from outside through its TrioToken and joins the thread.
"""

from __future__ import annotations

import contextlib
import threading

import trio

from chaos.faultproxy.api import run_fault_proxy

START_TIMEOUT_S = 10.0


class FaultProxyThread:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, seed: int = 0) -> None:
        self.host, self.port, self.seed = host, port, seed
        self.api_port = 0
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="faultproxy", daemon=True)

    def __enter__(self) -> FaultProxyThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError("fault proxy did not start")
        if self._error is not None:
            raise RuntimeError(f"fault proxy failed to start: {self._error}")

    def stop(self) -> None:
        if self._token is not None and self._scope is not None:
            scope = self._scope
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(scope.cancel, trio_token=self._token)
        self._thread.join(START_TIMEOUT_S)

    def _main(self) -> None:
        try:
            trio.run(self._run)
        except BaseException as error:  # reported to start(); the thread must not die silently
            self._error = error
            self._ready.set()

    async def _run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                _server, self.api_port = await nursery.start(run_fault_proxy, self.host, self.port, self.seed)
                self._ready.set()
