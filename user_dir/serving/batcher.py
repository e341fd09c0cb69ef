"""Dynamic batching with one worker thread that owns the model.

Requests put their examples into one FIFO queue (``submit``), all of a request or none: past
``max_queue`` examples, or when the policy's ``admit`` says the queue with them would miss its target,
the request is refused (``QueueFull``). The worker takes the oldest example, waits at most ``max_wait``
seconds from its arrival for more to join (up to ``max_batch``), asks the policy for a ratio k with the
ages and token counts of everything queued, and runs the batch. Each example carries a
``concurrent.futures.Future`` that the HTTP side awaits.

The worker outlives what goes wrong in a batch: each example's future is marked running when the
worker takes it (a request cancelled before that -- a client gone, a shutdown's timeout -- is left out
of the batch, and one cancelled after it cannot be), a batch whose ratio choice, model run or
bookkeeping raises fails its own requests with that error and the next batch runs, and whatever ends
the thread all the same fails its batch's requests (``WorkerError``) rather than leaving them waiting;
``ensure_running`` starts a new worker in its place (``restarts`` counts them).

Hand-written (about a hundred lines) because neither FastAPI nor uvicorn batches requests, and the
serving engines that do (Ray Serve, TorchServe, Triton) would replace this server rather than
serve inside it; user_dir/serving/README.md names them as the way to scale past one machine.
"""
import logging
import math
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue cannot take a request: past ``max_queue``, or predicted to miss the target (HTTP 503)."""

    def __init__(self, queued: int, asked: int, why: str):
        super().__init__(f"{queued} examples queued, {asked} more asked for: {why}")
        self.queued, self.asked, self.why = queued, asked, why


class WorkerError(RuntimeError):
    """The worker thread ended, or its batch could not be run: the error of that batch's requests (HTTP 500)."""


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
        self.restarts = 0  # workers started in place of one that ended

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

    def _refusal(self, lengths: Optional[List[float]], asked: int, arrival: Optional[float],
                 reserved: int) -> Optional[QueueFull]:
        """Why ``asked`` new examples of ``lengths`` tokens cannot be queued now, behind ``reserved`` examples
        already promised a place (None: they can). Called with the lock held."""
        if len(self._pending) + reserved + asked > self.max_queue:
            return QueueFull(len(self._pending) + reserved, asked, f"bound {self.max_queue} (--max-queue)")
        if self.admit is not None:
            now = self.clock()
            queued = self._lengths(self._pending)
            queue = None if queued is None or lengths is None else queued + [1.0] * reserved + list(lengths)
            age = 0.0 if arrival is None else max(0.0, now - arrival)
            if not self.admit(len(self._pending) + reserved + asked, queue, age, self.busy(now)):
                return QueueFull(len(self._pending) + reserved, asked, "predicted to miss the latency target")
        return None

    def precheck(self, asked: int, arrival: Optional[float] = None, reserved: int = 0) -> None:
        """Refuse (QueueFull) ``asked`` examples that would be refused whatever their lengths, before anything is
        spent on them (their tokenisation): the queue bound, and the policy's admission with each new example
        taken as 1 token long, behind ``reserved`` examples being prepared (also taken as 1 token)."""
        with self._cond:
            self.ensure_running()
            refusal = self._refusal(None if self.size_of is None else [1.0] * asked, asked, arrival, reserved)
        if refusal is not None:
            raise refusal

    def submit(self, payloads: Sequence[Any], arrival: Optional[float] = None) -> List[Future]:
        """Queue every example of one request together, or none of them (QueueFull). ``arrival`` (``clock()``'s
        time when the request reached the server, before its parsing and tokenisation; default now) is where an
        example's age starts, so the policy's predictions count the time spent before it was queued."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            self.ensure_running()
            now = self.clock()
            items = [Item(p, now if arrival is None else min(arrival, now),
                          None if self.size_of is None else self.size_of(p)) for p in payloads]
            refusal = self._refusal(self._lengths(items), len(items), items[0].arrival if items else now, 0)
            if refusal is not None:
                raise refusal
            self._pending.extend(items)
            self._cond.notify()
        return [item.future for item in items]

    def start(self) -> None:
        with self._cond:
            self._thread = threading.Thread(target=self._loop, name="fc-serve-worker", daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the worker thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def ensure_running(self) -> bool:
        """Start a new worker in place of one that ended (unless stopping, or never started); whether one runs."""
        with self._cond:
            if self._thread is not None and not self._thread.is_alive() and not self._stopping:
                self.restarts += 1
                logger.error("the worker thread had ended: starting worker number %d", self.restarts + 1)
                self.start()
            return self.running

    def stop(self, timeout: Optional[float] = None) -> None:
        """Refuse new work, finish everything queued, then end the worker."""
        with self._cond:
            self.ensure_running()  # (one that ended leaves the queue to a new one)
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _next_batch(self):
        """(batch, k, predicted, queued, padded, error) of the next batch, or None when stopping with nothing queued.
        Cancelled examples are left out; ``error`` is what the ratio choice raised (the batch is not run)."""
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
            error = None
            try:
                k, predicted = self.choose([now - item.arrival for item in self._pending],
                                           self._lengths(self._pending))
            except Exception as e:  # a policy error fails this batch, not the worker
                logger.exception("choosing the ratio of a batch of %d failed", min(self.max_batch, queued))
                k, predicted, error = -1, math.nan, e
            taken = [self._pending.popleft() for _ in range(min(self.max_batch, queued))]
            # running from now on: a request cancelled from here on cannot take its examples back
            batch = [item for item in taken if item.future.set_running_or_notify_cancel()]
            lengths = self._lengths(batch)
            padded = None if not batch or lengths is None else max(lengths)
            if self.predict is not None and batch and error is None:  # (under the lock: submit reads it)
                self._busy_until = now + self.predict(k, len(batch), padded)
        return batch, k, predicted, queued, padded, error

    @staticmethod
    def _settle(batch: List[Item], error: BaseException) -> None:
        """Fail every future of ``batch`` not answered yet with ``error``."""
        for item in batch:
            if not item.future.done():
                try:
                    item.future.set_exception(error)
                except InvalidStateError:  # (settled meanwhile)
                    pass

    def _run(self, batch: List[Item], k: int, predicted: float, queued: int, padded: Optional[float]) -> None:
        began = self.clock()
        start = time.perf_counter()
        results = self.run_batch([item.payload for item in batch], k)
        seconds = time.perf_counter() - start
        done = self.clock()
        if len(results) != len(batch):
            raise WorkerError(f"the model answered {len(results)} of a batch of {len(batch)} examples")
        with self._cond:
            self._busy_until = 0.0  # nothing runs until the next batch is chosen
        for item, result in zip(batch, results):
            # (clock() times: the server measures its reply delay from done_at and reports the split in each
            # answer's Server-Timing header)
            item.future.began_at, item.future.done_at = began, done
            try:
                item.future.set_result(result)
            except InvalidStateError:  # (settled meanwhile)
                pass
        if self.on_batch is not None:
            try:
                self.on_batch(BatchRecord(k, len(batch), queued, predicted, seconds, padded))
            except Exception:  # metrics and measurements: the answers have left, the worker goes on
                logger.exception("recording a batch of %d at k=%d failed", len(batch), k)

    def _loop(self) -> None:
        while True:
            got = self._next_batch()
            if got is None:
                return
            batch, k, predicted, queued, padded, error = got
            try:
                if error is not None:
                    raise WorkerError(f"choosing the batch's ratio failed: {type(error).__name__}: {error}")
                if batch:
                    self._run(batch, k, predicted, queued, padded)
            except Exception as e:  # a failed batch fails its requests, never the worker
                logger.exception("batch of %d at k=%d failed", len(batch), k)
                self._settle(batch, e)
            finally:  # whatever ends the batch, even the thread itself: no request of it waits for ever
                with self._cond:
                    self._busy_until = 0.0
                self._settle(batch, WorkerError("the worker thread ended while running this batch; it is restarted"))
