"""SyncThread: jobs run in one long-lived thread, results and exceptions come back, a cancelled caller still
waits for its job."""

from __future__ import annotations

import threading

import pytest
import trio

from cluster.raft.runtime.sync_thread import SyncThread


async def test_jobs_run_in_one_other_thread_and_return_or_raise() -> None:
    worker = SyncThread()
    try:
        idents = {await worker.run(threading.get_ident) for _ in range(20)}
        assert len(idents) == 1 and threading.get_ident() not in idents
        assert await worker.run(lambda: 41 + 1) == 42

        def fail() -> None:
            raise OSError("disk gone")

        with pytest.raises(OSError, match="disk gone"):
            await worker.run(fail)
        assert await worker.run(lambda: "still alive") == "still alive"
    finally:
        worker.close()


async def test_a_cancelled_caller_waits_for_its_job() -> None:
    worker = SyncThread()
    started, release = threading.Event(), threading.Event()
    done: list[str] = []

    def job() -> None:
        started.set()
        release.wait(10)
        done.append("job")

    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.run, job)
                await trio.to_thread.run_sync(started.wait)
                scope.cancel()
                release.set()
        assert done == ["job"]  # the job finished before the cancelled caller returned
    finally:
        worker.close()


async def test_a_closed_worker_refuses_jobs() -> None:
    worker = SyncThread()
    worker.close()
    with pytest.raises(RuntimeError):
        await worker.run(lambda: None)


async def test_start_runs_the_job_while_the_caller_works_and_wait_returns_or_raises() -> None:
    worker = SyncThread()
    release = threading.Event()
    try:
        job = worker.start(lambda: release.wait(10) and "synced")
        assert not job.done  # the caller goes on working while the job runs
        release.set()
        assert await job.wait() == "synced" and job.done

        def fail() -> None:
            raise OSError("disk gone")

        with pytest.raises(OSError, match="disk gone"):
            await worker.start(fail).wait()
    finally:
        worker.close()


async def test_a_cancelled_waiter_still_waits_for_a_started_job() -> None:
    worker = SyncThread()
    release = threading.Event()
    done: list[str] = []

    def job() -> None:
        release.wait(10)
        done.append("job")

    try:
        pending = worker.start(job)
        with trio.CancelScope() as scope:
            scope.cancel()
            release.set()
            await pending.wait()
        assert scope.cancelled_caught and done == ["job"]
    finally:
        worker.close()


async def test_a_started_job_can_be_asked_for_its_result_more_than_once() -> None:
    worker = SyncThread()
    try:
        job = worker.start(lambda: 7)
        assert await job.wait() == 7 and job.result() == 7 and await job.wait() == 7

        def fail() -> None:
            raise OSError("disk gone")

        failed = worker.start(fail)
        for _ in range(2):
            with pytest.raises(OSError, match="disk gone"):
                await failed.wait()
        with pytest.raises(OSError, match="disk gone"):
            failed.result()
    finally:
        worker.close()
