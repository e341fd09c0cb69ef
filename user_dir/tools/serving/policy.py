"""Which Variator plugin a batch runs with: Variator's plug-and-play promise (abstract and section 1:
"dynamically select different compression plugins with varying acceleration ratios based on the
current workload") as a policy.

* ``fixed:K``: every batch at ratio K (0: the backbone alone).
* ``adaptive``: before each batch, for every attached ratio k from the smallest up, predict when the
  queued work would finish if it all ran at k (FIFO batches of the maximum size, times from the cost
  table), and take the first k whose worst-off example (its wait so far plus its predicted completion)
  meets the latency target; if none does (overload), the largest k. The table is measured once, at
  start-up; on a machine shared with other work every batch then runs slower or faster than it says, so
  the predictions are scaled by a running average of measured / predicted batch times (``observe``).
  Its admission bound moves with that scale (``queue_bound``): the examples whose full batches at the
  largest k finish within the target at the measured speed, less one batch (the one a new example may
  find running), never above ``--max-queue``. A bound fixed from the start-up table admits work the
  slower machine cannot finish in time (results/serving.md as of 2026-11-25, in its git history: batches ran
  1.15-1.34x the table, and every policy's p95 went over its target); a fixed:K policy has no target and keeps
  ``--max-queue``. The predictions cover an example's wait (from its request's arrival, parsing and tokenising
  included) and its batch; what follows the batch -- the answer leaving the server through an event loop busy
  with new requests -- is measured per request (``observe_reply``), and the predictions are held to the target
  less the p95 of the recent reply delays (``budget``), the bound too.

The maths are pure functions of the queue's ages and the cost table, so they are tested on hand-made
numbers (tests/test_serve.py).
"""
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence, Tuple

from .cost_table import CostTable


def predicted_latency(ages: Sequence[float], k: int, table: CostTable, max_batch: int, scale: float = 1.0) -> float:
    """Seconds until the worst-off queued example is answered if every queued example runs at ratio ``k``.

    ``ages`` are the seconds each queued example has waited, oldest first (the queue is FIFO). The
    queue runs as batches of ``max_batch``; batch m finishes after batches 0..m, and its oldest example
    (the first of the batch) is its worst-off one: latency = its age + that finish time. ``scale`` multiplies
    every batch time of the table (how much slower the machine runs now than when it was measured)."""
    if max_batch < 1:
        raise ValueError(f"max_batch {max_batch}: at least 1")
    worst, clock = 0.0, 0.0
    for start in range(0, len(ages), max_batch):
        clock += scale * table.batch_seconds(k, min(max_batch, len(ages) - start))
        worst = max(worst, ages[start] + clock)
    return worst


def queue_bound(table: CostTable, k: int, max_batch: int, target: float, scale: float = 1.0) -> int:
    """Examples a server may hold so that all of them are answered within ``target`` seconds at ratio ``k``:
    the full batches of ``max_batch`` that finish within the target (each ``scale`` x the table's time), less
    one (the batch a new example may find running); at least one batch."""
    per_batch = scale * table.batch_seconds(k, max_batch)
    return max_batch * max(1, int(target / per_batch) - 1)


def choose_ratio(ages: Sequence[float], table: CostTable, max_batch: int, target: float,
                 scale: float = 1.0) -> Tuple[int, float]:
    """(k, predicted seconds): the smallest ratio whose predicted latency for the queued work is within
    ``target`` seconds, or the largest ratio when none is (overload)."""
    predicted = 0.0
    for k in table.ratios:
        predicted = predicted_latency(ages, k, table, max_batch, scale)
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

    def choose(self, ages: Sequence[float]) -> Tuple[int, float]:
        return self.ratio, float("nan")

    def observe(self, k: int, size: int, seconds: float) -> None:
        pass

    def observe_reply(self, seconds: float) -> None:
        pass

    def queue_bound(self, cap: int) -> int:
        return cap


def updated_scale(scale: float, measured: float, predicted: float, weight: float = 0.2,
                  bounds: Tuple[float, float] = (0.25, 4.0)) -> float:
    """The running average of measured / predicted batch seconds after one more batch (exponential, ``weight``
    on the new batch), kept within ``bounds`` so that one freak batch cannot swing the policy far."""
    if predicted <= 0 or measured <= 0:
        return scale
    return min(bounds[1], max(bounds[0], (1 - weight) * scale + weight * measured / predicted))


def reply_delay(delays: Sequence[float], quantile: float = 0.95) -> float:
    """The ``quantile`` of the recent reply delays (seconds from a batch's end to its requests' answers leaving the
    handler; 0 before any): what the worker's predictions must leave of the target."""
    if not delays:
        return 0.0
    ordered = sorted(delays)
    return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


@dataclass
class AdaptivePolicy:
    table: CostTable
    max_batch: int
    target: float  # seconds
    weight: float = 0.2  # of each new batch in the running average of measured / predicted times (0: never rescale)
    scale: float = 1.0  # measured / predicted batch time, running average
    # recent reply delays (observe_reply): a request's latency is its wait, its batch and then the time its answer
    # takes to leave the server (the event loop, shared with the parsing of new requests, resumes its handler); the
    # predictions cover the first two, so they are held to the target less the p95 of the third
    delays: deque = field(default_factory=lambda: deque(maxlen=256))

    name = "adaptive"

    @property
    def largest_ratio(self) -> int:
        return self.table.ratios[-1]

    @property
    def budget(self) -> float:
        """Seconds the predicted wait + batch may take: the target less the recent p95 reply delay."""
        return max(0.0, self.target - reply_delay(self.delays))

    def choose(self, ages: Sequence[float]) -> Tuple[int, float]:
        return choose_ratio(ages, self.table, self.max_batch, self.budget, self.scale)

    def observe_reply(self, seconds: float) -> None:
        """A request's answer left the server ``seconds`` after its batch ended."""
        self.delays.append(max(0.0, seconds))

    def observe(self, k: int, size: int, seconds: float) -> None:
        """A batch of ``size`` at ratio ``k`` took ``seconds``: update the scale of the table's predictions."""
        if self.weight > 0:
            self.scale = updated_scale(self.scale, seconds, self.table.batch_seconds(k, size), self.weight)

    def queue_bound(self, cap: int) -> int:
        """The admission bound now: :func:`queue_bound` at the largest ratio and the running scale, at most
        ``cap`` (``--max-queue``)."""
        return min(cap, queue_bound(self.table, self.largest_ratio, self.max_batch, self.budget, self.scale))


def parse_policy(spec: str, ratios: Sequence[int], table: CostTable, max_batch: int, target_ms: float,
                 rescale: float = 0.2):
    """``fixed:K`` (K one of the attached ratios, 0 = backbone) or ``adaptive``; errors name --policy."""
    if spec == "adaptive":
        missing = sorted(set(ratios) - set(table.ratios))
        if missing:
            raise ValueError(f"--policy adaptive: the cost table has no row for k in {missing} "
                             f"(it has {table.ratios}; measure it with these plugins or fix --cost-table)")
        if target_ms <= 0:
            raise ValueError(f"--target-p95-ms {target_ms}: must be positive")
        if not 0 <= rescale <= 1:
            raise ValueError(f"--cost-rescale {rescale}: a weight between 0 and 1")
        sub = CostTable({k: table.seconds[k] for k in ratios}, table.length, table.source, table.details)
        return AdaptivePolicy(sub, max_batch, target_ms / 1000.0, rescale)
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
