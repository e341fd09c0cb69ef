"""Dynamic batching with one worker thread that owns the model.

Requests put their examples into one FIFO queue (``submit``); the worker takes the oldest example,
waits at most ``max_wait`` seconds from its arrival for more to join (up to ``max_batch``), asks the
policy for a ratio k with the ages of everything queued, and runs the batch. Each example carries a
``concurrent.futures.Future`` that the HTTP side awaits.

Hand-written (about a hundred lines) because neither FastAPI nor uvicorn batches requests, and the
serving engines that do (Ray Serve, TorchServe, Triton) would replace this server rather than
serve inside it; the README's "Serving Variator" names them as the way to scale past one machine.
"""
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """More queued examples than the bound: the request is refused (HTTP 503)."""

    def __init__(self, queued: int, asked: int, bound: int):
        super().__init__(f"{queued} examples queued, {asked} more asked for, bound {bound}")
        self.queued, self.asked, self.bound = queued, asked, bound


@dataclass
class Item:
    payload: Any
    arrival: float
    future: Future = field(default_factory=Future)


@dataclass
class BatchRecord:
    """What the worker did with one batch (for metrics and logs)."""
    k: int
    size: int
    queued: int  # examples queued when the ratio was chosen, the batch included
    predicted: float  # the policy's predicted latency of the queued work (nan for fixed policies)
    seconds: float  # compute time of the batch


class Batcher:
    def __init__(self, run_batch: Callable[[List[Any], int], List[Any]],
                 choose: Callable[[Sequence[float]], Tuple[int, float]], max_batch: int, max_wait: float,
                 max_queue: int, on_batch: Optional[Callable[[BatchRecord], None]] = None, clock=time.monotonic,
                 bound: Optional[Callable[[int], int]] = None):
        if max_batch < 1 or max_queue < 1 or max_wait < 0:
            raise ValueError(f"max_batch {max_batch} and max_queue {max_queue} must be >= 1, max_wait {max_wait} >= 0")
        self.run_batch, self.choose = run_batch, choose
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait, max_queue
        self.on_batch, self.clock = on_batch, clock
        self.bound = bound  # the admission bound now, given max_queue (the adaptive policy's; None: max_queue)
        self._pending: deque = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    @property
    def current_bound(self) -> int:
        """Most examples the queue admits now: ``max_queue``, or the live bound given it."""
        return self.max_queue if self.bound is None else self.bound(self.max_queue)

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._pending)

    def submit(self, payloads: Sequence[Any], arrival: Optional[float] = None) -> List[Future]:
        """Queue every example of one request together, or none of them (QueueFull). ``arrival`` (``clock()``'s
        time when the request reached the server, before its parsing and tokenisation; default now) is where an
        example's age starts, so the policy's predictions count the time spent before it was queued."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            bound = self.current_bound
            if len(self._pending) + len(payloads) > bound:
                raise QueueFull(len(self._pending), len(payloads), bound)
            now = self.clock()
            items = [Item(p, now if arrival is None else min(arrival, now)) for p in payloads]
            self._pending.extend(items)
            self._cond.notify()
        return [item.future for item in items]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fc-serve-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Refuse new work, finish everything queued, then end the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _next_batch(self) -> Optional[Tuple[List[Item], int, float, int]]:
        with self._cond:
            while not self._pending:
                if self._stopping:
                    return None
                self._cond.wait()
            deadline = self._pending[0].arrival + self.max_wait
            while len(self._pending) < self.max_batch and not self._stopping:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            now = self.clock()
            queued = len(self._pending)
            k, predicted = self.choose([now - item.arrival for item in self._pending])
            batch = [self._pending.popleft() for _ in range(min(self.max_batch, queued))]
        return batch, k, predicted, queued

    def _loop(self) -> None:
        while True:
            got = self._next_batch()
            if got is None:
                return
            batch, k, predicted, queued = got
            start = time.perf_counter()
            try:
                results = self.run_batch([item.payload for item in batch], k)
            except Exception as e:  # a failed batch fails its requests, never the worker
                logger.exception("batch of %d at k=%d failed", len(batch), k)
                for item in batch:
                    item.future.set_exception(e)
                continue
            seconds = time.perf_counter() - start
            done = self.clock()
            for item, result in zip(batch, results):
                item.future.done_at = done  # (clock() time: the server measures its reply delay from it)
                item.future.set_result(result)
            if self.on_batch is not None:
                self.on_batch(BatchRecord(k, len(batch), queued, predicted, seconds))
