"""Dynamic batching with one worker thread that owns the model.

Requests put their examples into one FIFO queue (``submit``), all of a request or none: past
``max_queue`` examples, or when the policy's ``admit`` says the queue with them would miss its target,
the request is refused (``QueueFull``). The worker takes the oldest example, waits at most ``max_wait``
seconds from its arrival for more to join (up to ``max_batch``), asks the policy for a ratio k with the
ages and token counts of everything queued, and runs the batch. Each example carries a
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
    """The queue cannot take a request: past ``max_queue``, or predicted to miss the target (HTTP 503)."""

    def __init__(self, queued: int, asked: int, why: str):
        super().__init__(f"{queued} examples queued, {asked} more asked for: {why}")
        self.queued, self.asked, self.why = queued, asked, why


@dataclass
class Item:
    payload: Any
    arrival: float
    length: Optional[float] = None  # tokens (size_of), what the batch is padded to
    future: Future = field(default_factory=Future)


@dataclass
class BatchRecord:
    """What the worker did with one batch (for metrics and logs)."""
    k: int
    size: int
    queued: int  # examples queued when the ratio was chosen, the batch included
    predicted: float  # the policy's predicted latency of the queued work (nan for fixed policies)
    seconds: float  # compute time of the batch
    length: Optional[float] = None  # tokens the batch was padded to (None without size_of)


class Batcher:
    def __init__(self, run_batch: Callable[[List[Any], int], List[Any]],
                 choose: Callable[[Sequence[float], Optional[Sequence[float]]], Tuple[int, float]], max_batch: int,
                 max_wait: float, max_queue: int, on_batch: Optional[Callable[[BatchRecord], None]] = None,
                 clock=time.monotonic, admit: Optional[Callable[..., bool]] = None,
                 size_of: Optional[Callable[[Any], float]] = None,
                 predict: Optional[Callable[[int, int, Optional[float]], float]] = None):
        """``admit(queued, lengths, age, busy)``: whether a new request's examples, queued last, meet the policy's
        target (None: ``max_queue`` alone); ``size_of(payload)``: an example's tokens (None: lengths unknown);
        ``predict(k, size, length)``: seconds of a batch, for what remains of the running one (None: 0)."""
        if max_batch < 1 or max_queue < 1 or max_wait < 0:
            raise ValueError(f"max_batch {max_batch} and max_queue {max_queue} must be >= 1, max_wait {max_wait} >= 0")
        self.run_batch, self.choose = run_batch, choose
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait, max_queue
        self.on_batch, self.clock = on_batch, clock
        self.admit, self.size_of, self.predict = admit, size_of, predict
        self._pending: deque = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self._busy_until = 0.0  # clock() time the running batch is predicted to end

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._pending)

    def _lengths(self, items) -> Optional[List[float]]:
        return None if self.size_of is None else [item.length for item in items]

    def busy(self, now: float) -> float:
        """Predicted seconds left of the running batch (0 when none runs or nothing predicts it)."""
        return max(0.0, self._busy_until - now)

    def backlog(self, k: int) -> float:
        """Predicted seconds until everything queued is answered at ratio ``k`` (FIFO batches of ``max_batch``
        after the running batch's rest; 0 without ``predict``)."""
        if self.predict is None:
            return 0.0
        with self._cond:
            items, now = list(self._pending), self.clock()
            seconds = self.busy(now)
        lengths = self._lengths(items)
        for start in range(0, len(items), self.max_batch):
            chunk = slice(start, start + self.max_batch)
            seconds += self.predict(k, len(items[chunk]), None if lengths is None else max(lengths[chunk]))
        return seconds

    def submit(self, payloads: Sequence[Any], arrival: Optional[float] = None) -> List[Future]:
        """Queue every example of one request together, or none of them (QueueFull). ``arrival`` (``clock()``'s
        time when the request reached the server, before its parsing and tokenisation; default now) is where an
        example's age starts, so the policy's predictions count the time spent before it was queued."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            if len(self._pending) + len(payloads) > self.max_queue:
                raise QueueFull(len(self._pending), len(payloads), f"bound {self.max_queue} (--max-queue)")
            now = self.clock()
            items = [Item(p, now if arrival is None else min(arrival, now),
                          None if self.size_of is None else self.size_of(p)) for p in payloads]
            if self.admit is not None:
                queue = list(self._pending) + items
                if not self.admit(len(queue), self._lengths(queue), now - items[0].arrival, self.busy(now)):
                    raise QueueFull(len(self._pending), len(payloads), "predicted to miss the latency target")
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
            k, predicted = self.choose([now - item.arrival for item in self._pending], self._lengths(self._pending))
            batch = [self._pending.popleft() for _ in range(min(self.max_batch, queued))]
            lengths = self._lengths(batch)
            padded = None if lengths is None else max(lengths)
            if self.predict is not None:  # (under the lock: submit reads it)
                self._busy_until = now + self.predict(k, len(batch), padded)
        return batch, k, predicted, queued, padded

    def _loop(self) -> None:
        while True:
            got = self._next_batch()
            if got is None:
                return
            batch, k, predicted, queued, padded = got
            began = self.clock()
            start = time.perf_counter()
            try:
                results = self.run_batch([item.payload for item in batch], k)
            except Exception as e:  # a failed batch fails its requests, never the worker
                logger.exception("batch of %d at k=%d failed", len(batch), k)
                for item in batch:
                    item.future.set_exception(e)
                with self._cond:
                    self._busy_until = 0.0
                continue
            seconds = time.perf_counter() - start
            done = self.clock()
            with self._cond:
                self._busy_until = 0.0  # nothing runs until the next batch is chosen
            for item, result in zip(batch, results):
                # (clock() times: the server measures its reply delay from done_at and reports the split in each
                # answer's Server-Timing header)
                item.future.began_at, item.future.done_at = began, done
                item.future.set_result(result)
            if self.on_batch is not None:
                self.on_batch(BatchRecord(k, len(batch), queued, predicted, seconds, padded))
