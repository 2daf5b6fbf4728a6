"""One long-lived worker thread for the Ready loop's fsync (`RaftStorage.commit`), instead of a thread hand-off
through `trio.to_thread.run_sync` per cycle.

`to_thread.run_sync` takes the default capacity limiter, copies the context and hands the call to trio's thread
cache; on a loaded machine the trio thread often asks for the next call before the previous worker has put
itself back in the cache, so a new OS thread is started per cycle (what that cost is in docs/benchmarks.md,
"The trio thread hand-off per fsync"). Here one daemon thread takes jobs from a queue and
reports each outcome back with `TrioToken.run_sync_soon(reschedule)`. At most one job runs at a time; the queue
holds at most one per waiting task (the Ready loop awaits each call), so it is bounded by the callers. A call
cannot be cancelled once queued (like `to_thread.run_sync` without `abandon_on_cancel`): the caller waits for
the job, so storage is never used by two threads at once. `close()` stops the thread after the queued jobs.

`start(job)` queues a job without waiting and returns a `SyncJob`; the caller does other work on the trio thread
(the Ready loop applies committed entries while its fsync runs) and then must `await job.wait()`, which is shielded
from cancellation for the same reason as `run`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import outcome
import trio

_STOP = None


class SyncJob:
    """A job `SyncThread.start` queued: `await wait()` for its outcome (value or raise)."""

    __slots__ = ("_done", "_on_done", "_outcome")

    def __init__(self, on_done: Callable[[], object] | None = None) -> None:
        self._done = trio.Event()
        self._outcome: outcome.Outcome[Any] | None = None
        self._on_done = on_done

    def finish(self, result: outcome.Outcome[Any]) -> None:
        """Called on the trio thread (through `run_sync_soon`) when the job is done."""
        self._outcome = result
        self._done.set()
        if self._on_done is not None:
            self._on_done()

    def result(self) -> Any:
        """The outcome of a job that is `done` (its value, or its exception raised)."""
        result = self._outcome
        assert result is not None, "the job is not done"
        if isinstance(result, outcome.Error):
            raise result.error  # (not `unwrap`: an outcome unwraps only once, and this may be asked again)
        assert isinstance(result, outcome.Value)
        return result.value

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> Any:
        """The job's return value (or its exception). Waits for the job even when cancelled, then raises."""
        with trio.CancelScope(shield=True):
            await self._done.wait()
        await trio.lowlevel.checkpoint_if_cancelled()
        return self.result()


class SyncThread:
    def __init__(self, name: str = "raft-fsync") -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], trio.lowlevel.TrioToken,
                                            Callable[[outcome.Outcome[Any]], object]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()
        self._closed = False

    async def run(self, job: Callable[[], Any]) -> Any:
        """Run `job()` in the thread and return (or raise) what it did. Not cancellable once called."""
        if self._closed:
            raise RuntimeError("SyncThread is closed")
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()

        def deliver(result: outcome.Outcome[Any]) -> None:
            trio.lowlevel.reschedule(task, result)

        self._jobs.put((job, trio.lowlevel.current_trio_token(), deliver))

        def abort(_: Any) -> trio.lowlevel.Abort:
            return trio.lowlevel.Abort.FAILED  # the job is running or queued: wait for it

        return await trio.lowlevel.wait_task_rescheduled(abort)  # unwraps the job's outcome: value or raise

    def start(self, job: Callable[[], Any], on_done: Callable[[], object] | None = None) -> SyncJob:
        """Queue `job()` and return at once (call from the trio thread); `await` the result's `wait()`, or call
        its `result()` once it is `done`. `on_done()` is called on the trio thread when the job is done."""
        if self._closed:
            raise RuntimeError("SyncThread is closed")
        pending = SyncJob(on_done)
        self._jobs.put((job, trio.lowlevel.current_trio_token(), pending.finish))
        return pending

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is _STOP:
                return
            job, token, deliver = item
            result = outcome.capture(job)
            try:
                token.run_sync_soon(deliver, result)
            except trio.RunFinishedError:
                return  # the trio run is gone: nobody waits any more

    def close(self) -> None:
        """Stop the thread once the queued jobs are done (it does not wait)."""
        if not self._closed:
            self._closed = True
            self._jobs.put(_STOP)
