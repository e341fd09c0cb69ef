"""Which Variator plugin a batch runs with: Variator's plug-and-play promise (abstract and section 1:
"dynamically select different compression plugins with varying acceleration ratios based on the
current workload") as a policy, and which requests the server admits while it keeps a latency target.

* ``fixed:K``: every batch at ratio K (0: the backbone alone); no target, the queue is bounded by
  ``--max-queue`` alone.
* ``adaptive``: before each batch, for every attached ratio k from the smallest up, predict when the
  queued work would finish if it all ran at k (FIFO batches of the maximum size, each padded to its longest
  example, times from the cost table), and take the first k whose worst-off example (its wait so far plus its
  predicted completion) meets the latency target; if none does (overload), the largest k.

Predictions. The table is measured once, at start-up, on a quiet machine; a batch's time grows with its
padded length, so each prediction scales the table by the batch's length (cost_table.py), and a machine
shared with other work runs every batch slower or faster than the table says: the predictions are scaled
by a quantile (``q``, default 0.95, the target's own) of the measured / predicted times of the last
``window`` batches of about the same size (``observe``). A mean would do for the k choice but not for
admission: under a sustained burst the queue sits at the edge of what the target allows, and with the mean
every batch that ran longer than it would put the requests behind it over the target. A queue's last batch
is predicted full: the worker takes whatever is queued when it gets to it, and under load the requests that
arrive meanwhile fill it (predicted at its own size, a request of 3 examples behind a queue of 32 was
answered after two full batches, not one and a short one).

Admission (``admits``): a request is taken only when its examples, queued last and everything run at the
largest k after what remains of the batch now running, are predicted to be answered within the target;
otherwise 503. A bound in examples cannot do this: it ignores the running batch, the queued examples' lengths and the waits so far
(results/serving.md of 2026-11-27 10:00, in its git history: with a bound of one batch of 32 the p95 was
2-4% over its target, two full batches at their slow end being more than the target). The predictions
cover an example's wait (from its request's arrival, parsing and tokenising included) and its batch; what
follows the batch -- the answer leaving the server through an event loop busy with new requests -- is
measured per request (``observe_reply``); what precedes the arrival stamp -- the request waiting for that
same event loop to start its handler -- is the loop's lag, measured by a probe that sleeps a few
milliseconds and notes how late it wakes (``observe_lag``). The predictions are held to the target less the
p95 of the recent reply delays and the p95 of the recent lags (``budget``): the target is a client's
latency, not the worker's (results/serving.md of 2026-11-27 12:25, in its git history: the server's own
p95 kept within its budget while the clients' burst p95 went 2 ms over, the part outside the server's view
being 10-20 ms at its p95). What no server sees -- the client's own delays, the network, a load balancer
-- an operator states (``overhead``, fc-serve --client-overhead-ms), as measured on the client's side.

Recovery. Every measurement (reply delays, loop lags, measured / table batch times) counts for ``memory``
seconds (fc-serve --observation-memory-s) and then ages out: only answered requests add reply delays, so
without an age a few slow replies on an idle server would shrink the budget below any request and keep it
there, refusing every request until restart (issue 43: three replies of 260 ms against a 250 ms target).
The worker thread writes the measurements while the event loop reads them: they are kept under one lock,
and read as snapshots.

The maths are pure functions of the queue's ages and lengths and the cost table, so they are tested on
hand-made numbers (tests/test_serve.py).
"""
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .cost_table import CostTable


def predicted_latency(ages: Sequence[float], k: int, table: CostTable, max_batch: int,
                      scale: Union[float, Callable[[int], float]] = 1.0, lengths: Optional[Sequence[float]] = None,
                      busy: float = 0.0, fill: bool = False) -> float:
    """Seconds until the worst-off queued example is answered if every queued example runs at ratio ``k``.

    ``ages`` are the seconds each queued example has waited, oldest first (the queue is FIFO); ``lengths``
    their token counts (None: each batch as long as the table's timed batch of its size). The queue runs as
    batches of ``max_batch`` after ``busy`` seconds (what remains of the batch running now); batch m, padded to
    its longest example, finishes after batches 0..m, and its oldest example (the first of the batch) is its
    worst-off one: latency = its age + that finish time. ``scale`` multiplies every batch time of the table
    (how much slower the machine runs now than when it was measured), a number or a function of the batch size.
    ``fill``: the last batch, when short, is taken as full (``max_batch`` examples, at least as long as the
    table's timed full batch): the worker takes whatever is queued when it gets to it, and under load the
    requests that arrive meanwhile fill it -- unless it is the next batch to run on an idle worker (``busy`` 0),
    which holds what is queued now."""
    if max_batch < 1:
        raise ValueError(f"max_batch {max_batch}: at least 1")
    worst, clock = 0.0, busy
    for start in range(0, len(ages), max_batch):
        end = min(start + max_batch, len(ages))
        size, padded = end - start, None if lengths is None else max(lengths[start:end])
        if fill and size < max_batch and (start > 0 or busy > 0):
            size = max_batch
            if padded is not None:
                padded = max(padded, table.padded_length(max_batch) or 0)
        clock += (scale(size) if callable(scale) else scale) * table.batch_seconds(k, size, padded)
        worst = max(worst, ages[start] + clock)
    return worst


def queue_bound(table: CostTable, k: int, max_batch: int, target: float, scale: float = 1.0) -> int:
    """Examples a server may hold so that all of them are answered within ``target`` seconds at ratio ``k``:
    the full batches of ``max_batch`` that finish within the target (each ``scale`` x the table's time), less
    one (the batch a new example may find running); at least one batch. (A static --max-queue for a target;
    the adaptive policy's own admission is :meth:`AdaptivePolicy.admits`.)"""
    per_batch = scale * table.batch_seconds(k, max_batch)
    return max_batch * max(1, int(target / per_batch) - 1)


def choose_ratio(ages: Sequence[float], table: CostTable, max_batch: int, target: float,
                 scale: Union[float, Callable[[int], float]] = 1.0, lengths: Optional[Sequence[float]] = None,
                 fill: bool = False) -> Tuple[int, float]:
    """(k, predicted seconds): the smallest ratio whose predicted latency for the queued work is within
    ``target`` seconds, or the largest ratio when none is (overload)."""
    predicted = 0.0
    for k in table.ratios:
        predicted = predicted_latency(ages, k, table, max_batch, scale, lengths, fill=fill)
        if predicted <= target:
            return k, predicted
    return table.ratios[-1], predicted


@dataclass
class FixedPolicy:
    ratio: int

    @property
    def name(self) -> str:
        return f"fixed:{self.ratio}"

    @property
    def largest_ratio(self) -> int:
        return self.ratio

    scale = 1.0

    def choose(self, ages: Sequence[float], lengths: Optional[Sequence[float]] = None) -> Tuple[int, float]:
        return self.ratio, float("nan")

    def observe(self, k: int, size: int, seconds: float, length: Optional[float] = None) -> None:
        pass

    def observe_reply(self, seconds: float) -> None:
        pass

    def observe_lag(self, seconds: float) -> None:
        pass

    admits = None  # no target: --max-queue alone bounds the queue


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank: an observed value, never an interpolated one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def reply_delay(delays: Sequence[float], q: float = 0.95) -> float:
    """The ``q`` quantile of recent delays (a batch's end to its requests' answers leaving the handler, or the event
    loop's lag; 0 before any): what the worker's predictions must leave of the target."""
    return quantile(delays, q) if delays else 0.0


class Recent:
    """The last ``maxlen`` values observed within the last ``memory`` seconds of ``clock`` (a time-stamped deque).
    Not locked itself: :class:`AdaptivePolicy` holds its lock around every use."""

    def __init__(self, maxlen: int, memory: float, clock: Callable[[], float]):
        self.memory, self.clock = memory, clock
        self._items: deque = deque(maxlen=maxlen)  # (time, value), oldest first

    def append(self, value: float) -> None:
        self._items.append((self.clock(), value))

    def values(self) -> List[float]:
        """A snapshot of the values still remembered (older ones dropped)."""
        oldest = self.clock() - self.memory
        while self._items and self._items[0][0] < oldest:
            self._items.popleft()
        return [v for _, v in self._items]


@dataclass
class AdaptivePolicy:
    table: CostTable
    max_batch: int
    target: float  # seconds
    window: int = 64  # recent batches of each timed size whose measured / table times scale the predictions
    q: float = 0.95  # the quantile of those ratios the predictions use
    overhead: float = 0.0  # seconds of a request's latency outside the server (client, network), from the operator
    memory: float = 10.0  # seconds a measurement counts before it ages out (the budget's recovery)
    clock: Callable[[], float] = time.monotonic
    # timed batch size -> measured / table time of the recent batches nearest that size, the table's time taken at
    # each batch's size and padded length (kept by size: the table's error is not the same for one example as for
    # a full batch -- the fixed cost of a forward, and the length scaling, weigh differently)
    ratios_seen: Dict[int, Recent] = field(default_factory=dict)

    name = "adaptive"

    def __post_init__(self):
        if self.memory <= 0:
            raise ValueError(f"--observation-memory-s {self.memory}: must be positive")
        self._lock = threading.Lock()  # the worker writes the measurements, the event loop reads them
        # recent reply delays (observe_reply): a request's latency is its wait, its batch and then the time its
        # answer takes to leave the server (the event loop, shared with the parsing of new requests, resumes its
        # handler); the predictions cover the first two, so they are held to the target less the p95 of the third
        self.delays = Recent(256, self.memory, self.clock)
        # recent event-loop lags (observe_lag): how late the loop starts what is ready, a new request's handler too
        self.lags = Recent(256, self.memory, self.clock)

    def reply_delay_p95(self) -> float:
        """The p95 of the reply delays of the last ``memory`` seconds (0 when none)."""
        with self._lock:
            return reply_delay(self.delays.values())

    def loop_lag_p95(self) -> float:
        """The p95 of the event-loop lags of the last ``memory`` seconds (0 when none)."""
        with self._lock:
            return reply_delay(self.lags.values())

    @property
    def largest_ratio(self) -> int:
        return self.table.ratios[-1]

    def column(self, size: int) -> int:
        """The timed batch size nearest ``size`` (the larger on a tie)."""
        sizes = sorted({b for row in self.table.seconds.values() for b in row})
        return min(sizes, key=lambda b: (abs(b - size), -b))

    def scale_at(self, size: int) -> float:
        """Measured / table time the predictions assume for a batch of ``size``: the ``q`` quantile of the recent
        batches nearest that size, else of all recent batches, else 1 (none yet, or ``window`` 0)."""
        if self.window <= 0:
            return 1.0
        column = self.column(size)
        with self._lock:
            seen = self.ratios_seen[column].values() if column in self.ratios_seen else []
            if not seen:
                seen = [r for ratios in self.ratios_seen.values() for r in ratios.values()]
        return quantile(seen, self.q) if seen else 1.0

    @property
    def scale(self) -> float:
        """The scale of a full batch (what the predictions under load use; /health and /metrics show it)."""
        return self.scale_at(self.max_batch)

    @property
    def budget(self) -> float:
        """Seconds the predicted wait + batch may take: the target less the recent p95 reply delay, the recent
        p95 event-loop lag (what a request waits before its arrival is stamped) and the stated client overhead."""
        return max(0.0, self.target - self.reply_delay_p95() - self.loop_lag_p95() - self.overhead)

    def batch_seconds(self, k: int, size: int, length: Optional[float] = None) -> float:
        """Predicted seconds of one batch on this machine now."""
        return self.scale_at(size) * self.table.batch_seconds(k, size, length)

    def choose(self, ages: Sequence[float], lengths: Optional[Sequence[float]] = None) -> Tuple[int, float]:
        """The ratio of the next batch: :func:`choose_ratio` on the queue, its last batch taken as full."""
        return choose_ratio(ages, self.table, self.max_batch, self.budget, self.scale_at, lengths, fill=True)

    def admits(self, queued: int, lengths: Optional[Sequence[float]] = None, age: float = 0.0,
               busy: float = 0.0) -> bool:
        """Whether a new request's examples, queued last (``queued`` examples in all, theirs included; ``lengths``
        their tokens, oldest first), would be answered within the budget at the largest k: ``age`` (the time since
        the request arrived) + ``busy`` (the rest of the running batch) + every queued batch, the last one taken as
        full (later requests fill it). (Under FIFO a new request delays no one queued before it, so their waits do
        not count here.)"""
        return predicted_latency([age] * queued, self.largest_ratio, self.table, self.max_batch, self.scale_at,
                                 lengths, busy, fill=True) <= self.budget

    def fits_alone(self, lengths: Sequence[float]) -> bool:
        """Whether a request of examples ``lengths`` tokens long could ever be answered within the target: alone
        on an idle server at the largest k, at the cost table's speed, against the target less the stated client
        overhead (what no measurement changes: a machine slowed for a while is not "never"). False: refuse it for
        good (413), not 503 with a Retry-After it can never meet."""
        return predicted_latency([0.0] * len(lengths), self.largest_ratio, self.table, self.max_batch, 1.0,
                                 lengths) <= self.target - self.overhead

    def observe_reply(self, seconds: float) -> None:
        """A request's answer left the server ``seconds`` after its batch ended."""
        with self._lock:
            self.delays.append(max(0.0, seconds))

    def observe_lag(self, seconds: float) -> None:
        """The event loop woke a sleeping probe ``seconds`` late."""
        with self._lock:
            self.lags.append(max(0.0, seconds))

    def observe(self, k: int, size: int, seconds: float, length: Optional[float] = None) -> None:
        """A batch of ``size`` at ratio ``k``, padded to ``length`` tokens, took ``seconds``."""
        predicted = self.table.batch_seconds(k, size, length)
        if self.window > 0 and predicted > 0 and seconds > 0:
            column = self.column(size)
            with self._lock:
                if column not in self.ratios_seen:
                    self.ratios_seen[column] = Recent(self.window, self.memory, self.clock)
                self.ratios_seen[column].append(seconds / predicted)


def parse_policy(spec: str, ratios: Sequence[int], table: CostTable, max_batch: int, target_ms: float,
                 window: int = 64, q: float = 0.95, overhead_ms: float = 0.0, memory: float = 10.0):
    """``fixed:K`` (K one of the attached ratios, 0 = backbone) or ``adaptive``; errors name --policy."""
    if spec == "adaptive":
        missing = sorted(set(ratios) - set(table.ratios))
        if missing:
            raise ValueError(f"--policy adaptive: the cost table has no row for k in {missing} "
                             f"(it has {table.ratios}; measure it with these plugins or fix --cost-table)")
        if target_ms <= 0:
            raise ValueError(f"--target-p95-ms {target_ms}: must be positive")
        if window < 0:
            raise ValueError(f"--cost-window {window}: a number of batches, 0 or more")
        if not 0 < q <= 1:
            raise ValueError(f"--cost-quantile {q}: a quantile in (0, 1]")
        sub = CostTable({k: table.seconds[k] for k in ratios}, table.lengths, table.source, table.details)
        if not 0 <= overhead_ms < target_ms:
            raise ValueError(f"--client-overhead-ms {overhead_ms}: from 0 to less than --target-p95-ms {target_ms}")
        return AdaptivePolicy(sub, max_batch, target_ms / 1000.0, window, q, overhead=overhead_ms / 1000.0,
                              memory=memory)
    if spec.startswith("fixed:"):
        try:
            k = int(spec.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"--policy {spec!r}: fixed:K takes an integer ratio K (0 = the backbone alone)") from None
        if k not in ratios:
            raise ValueError(f"--policy {spec}: no plugin with k={k} is attached (ratios: {list(ratios)}; "
                             "add its file to --plugins)")
        if k not in table.ratios:
            raise ValueError(f"--policy {spec}: the cost table has no row for k={k} (Retry-After is predicted "
                             f"from it; it has {table.ratios}: measure it with these plugins or fix --cost-table)")
        return FixedPolicy(k)
    raise ValueError(f"--policy {spec!r}: 'adaptive' or 'fixed:K'")
