"""Admission control and cross-request batching: the one queue between HTTP and the model.

A model runs one forward at a time, so requests wait. They wait here, in a bounded queue, and not
unbounded behind a lock: when `max_queue` requests are already in (waiting, or running in the current
batch) a new one is refused at once (429, with a Retry-After from the measured service time) instead of
being held until its client gives up. Counting the running batch bounds what a client meets: an accepted
request is answered within about `max_queue` requests' service time. A request
still queued at its deadline is dropped (503) rather than computed for nobody, and so is one whose client
disconnects. One worker thread takes the oldest request and, with batching on, every other waiting one
for the same engine (up to `max_batch`), and runs them in shared passes (Engine.score_requests: each answer
equals its answer alone). Everything accepted is answered or refused with a reason: nothing is lost.

The worker runs the model part only; the rest (the fallback's remote calls, building the answers) runs
in the caller's thread, so a slow fallback never holds up the queue.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for annotations only: the command line reads this module's defaults without the engine
    from ..engine import Engine, EngineRequest, Scored

# 4 requests in per core: a full queue is then a few seconds of work for the default model, inside the
# official SDK's 10 s timeout; a longer queue only makes every accepted request slower (`python -m
# benchmarks.speed.load`, docs/measurements/serving-under-load.md).
DEFAULT_MAX_QUEUE = 4 * (os.cpu_count() or 2)
# After a burst, how long the queue stays empty before on_idle runs: long enough that back-to-back requests
# (a client's next one arrives within milliseconds) never pay for it.
IDLE_S = 1.0
IDLE: list = []  # _take's answer when the queue has been empty IDLE_S after work

# A safety net past the queue bound: a request still waiting after 30 s is dropped with 503.
DEFAULT_MAX_WAIT_S = 30.0
# At most 8 requests a batch: on a CPU a batch costs a little less than its requests alone, and more in a
# batch kept paying up to 8 (docs/measurements/serving-under-load.md, `python -m benchmarks.speed.load --batching on
# --serve-args "--max-batch N"`). GPUs gain far more.
DEFAULT_MAX_BATCH = 8


class Overloaded(Exception):
    """The queue is full: retry after `retry_after` seconds."""

    def __init__(self, retry_after: int, depth: int):
        super().__init__(f"the server is at capacity ({depth} requests in); retry after {retry_after} s")
        self.retry_after = retry_after


class DeadlineExceeded(Exception):
    """The request waited past its deadline and was dropped unanswered."""

    def __init__(self, waited: float, retry_after: int):
        super().__init__(
            f"the request waited {waited:.1f} s in the queue, past the server's deadline, and was "
            f"dropped unanswered; retry after {retry_after} s"
        )
        self.retry_after = retry_after


@dataclass(eq=False)
class Job:
    engine: Engine
    request: EngineRequest
    future: Future = field(default_factory=Future)  # a Scored, or the request's exception
    enqueued: float = field(default_factory=time.monotonic)


class Scheduler:
    def __init__(
        self,
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        max_batch: int = DEFAULT_MAX_BATCH,
        batching: bool = True,
        on_batch=None,
        on_idle=None,
    ):
        if max_queue < 1 or max_batch < 1 or max_wait_s <= 0:
            raise ValueError("max_queue and max_batch must be at least 1, max_wait_s positive")
        self.max_queue, self.max_wait_s = max_queue, max_wait_s
        self.max_batch = max_batch if batching else 1
        self.on_batch = on_batch  # called with (requests in the batch, seconds) after each batch
        self.on_idle = on_idle  # called once the queue has been empty IDLE_S after work (the allocator hands back)
        self._worked = False  # a batch ran since on_idle was last called
        self._queue: deque[Job] = deque()
        self._running = 0  # requests in the batch the worker is running
        self._cond = threading.Condition()
        self._seconds_per_request = 1.0  # running mean of the service time, for Retry-After
        self._closed = False
        self._worker: threading.Thread | None = None  # started by the first request, again after close()

    @property
    def depth(self) -> int:
        """Requests waiting (not counting the running batch)."""
        return len(self._queue)

    def retry_after(self) -> int:
        """Seconds until the requests in now have been worked off (at least 1)."""
        return max(1, math.ceil((self.depth + self._running + 1) * self._seconds_per_request))

    def submit(self, engine: Engine, request: EngineRequest) -> Job:
        """Queue a request, or refuse it at once (Overloaded) when `max_queue` are already in."""
        with self._cond:
            if self._worker is None or not self._worker.is_alive():
                self._closed = False
                self._worker = threading.Thread(target=self._run, name="prefill-scheduler", daemon=True)
                self._worker.start()
            if len(self._queue) + self._running >= self.max_queue:
                raise Overloaded(self.retry_after(), len(self._queue) + self._running)
            job = Job(engine, request)
            self._queue.append(job)
            self._cond.notify()
        return job

    def drop(self, job: Job) -> bool:
        """Take a job back if it has not started (client gone, deadline passed): True if it never runs."""
        with self._cond:
            if not job.future.cancel():
                return False
            try:
                self._queue.remove(job)
            except ValueError:
                pass
            return True

    def close(self) -> None:
        """Stop the worker once the queue is empty (the server is shutting down)."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _take(self) -> list[Job] | None:
        """The oldest live job and, up to max_batch, the other waiting jobs for the same engine."""
        with self._cond:
            while not self._queue and not self._closed:
                if not (self._worked and self.on_idle):
                    self._cond.wait()
                elif not self._cond.wait(IDLE_S) and not self._queue and not self._closed:
                    self._worked = False
                    return IDLE
            if not self._queue:
                self._worker = None
                return None
            first = self._queue.popleft()
            batch = [first]
            for job in list(self._queue):
                if len(batch) >= self.max_batch:
                    break
                if job.engine is first.engine:
                    self._queue.remove(job)
                    batch.append(job)
            self._running = len(batch)  # out of the queue, still counted as in
        now = time.monotonic()
        live = []
        for job in batch:
            if not job.future.set_running_or_notify_cancel():
                continue  # dropped while it waited
            if now - job.enqueued > self.max_wait_s:  # nobody is waiting for it any more
                job.future.set_exception(DeadlineExceeded(now - job.enqueued, self.retry_after()))
                continue
            live.append(job)
        with self._cond:
            self._running = len(live)
        return live

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            if batch is IDLE:
                self.on_idle()
                continue
            if not batch:
                continue
            self._worked = True
            start = time.monotonic()
            try:
                found: list[Scored | Exception] = batch[0].engine.score_requests([j.request for j in batch])
            except Exception as e:  # noqa: BLE001 — a failed pass fails its requests, never the worker
                found = [e] * len(batch)
            seconds = time.monotonic() - start
            self._seconds_per_request = 0.8 * self._seconds_per_request + 0.2 * seconds / len(batch)
            with self._cond:
                self._running = 0
            for job, result in zip(batch, found):
                if isinstance(result, Exception):
                    job.future.set_exception(result)
                else:
                    job.future.set_result(result)
            if self.on_batch is not None:
                self.on_batch(len(batch), seconds)


def wait_time(job: Job, max_wait_s: float) -> float:
    """How much longer a queued job may wait before its deadline."""
    return max(0.0, max_wait_s - (time.monotonic() - job.enqueued))
