"""The cost table: how long one batch takes on this machine, by Variator ratio k and batch size.

Measured once at start-up on the served model (``measure``), printed, exposed by ``/health`` and
``/metrics``, and read by the adaptive policy to predict when queued work would finish. A batch size
between two measured ones is interpolated linearly (a batch's time grows about linearly with its
size once past the fixed per-forward overhead); beyond the largest one it is extrapolated with the
last segment's slope.

A batch runs padded to its longest example, and its time grows about in proportion to that length
(on this machine's 2 cores, a full batch of SST-2 sentences padded to 48 tokens took 1.9x one padded to
24, at k=0 and k=4 alike): the table keeps the padded length of each timed batch (``lengths``), and a
prediction for a batch of a given padded length scales the table's time by their ratio. Without
``lengths`` (a hand-made table) the time is the table's whatever the length.
"""
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence


def default_batch_sizes(max_batch: int) -> List[int]:
    """1, 2, 4, ... up to ``max_batch``, and ``max_batch`` itself."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


@dataclass
class CostTable:
    seconds: Dict[int, Dict[int, float]]  # k -> batch size -> seconds of one batch
    lengths: Dict[int, float] = field(default_factory=dict)  # batch size -> padded length of the timed batch
    source: str = "measured"
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.seconds:
            raise ValueError("a cost table needs at least one ratio k")
        self.seconds = {int(k): {int(b): float(s) for b, s in row.items()} for k, row in self.seconds.items()}
        for k, row in self.seconds.items():
            if not row or min(row) < 1 or min(row.values()) <= 0:
                raise ValueError(f"cost table row k={k}: needs batch sizes >= 1 with positive seconds, got {row}")
        self.lengths = {int(b): float(n) for b, n in (self.lengths or {}).items()}
        if self.lengths and min(self.lengths.values()) <= 0:
            raise ValueError(f"cost table lengths: padded lengths must be positive, got {self.lengths}")

    @property
    def ratios(self) -> List[int]:
        return sorted(self.seconds)

    def batch_seconds(self, k: int, size: int, length: Optional[float] = None) -> float:
        """Predicted seconds of one batch of ``size`` examples at ratio ``k``, padded to ``length`` tokens
        (None: as long as the timed batch of that size)."""
        if size <= 0:
            return 0.0
        seconds = _interpolate(self.seconds[k], size)
        if length is not None and self.lengths:
            seconds *= length / max(self.padded_length(size), 1e-9)
        return max(seconds, 1e-9)

    def padded_length(self, size: int) -> Optional[float]:
        """The padded length of the timed batch of ``size`` (interpolated; None without ``lengths``)."""
        return _interpolate(self.lengths, size) if self.lengths else None

    def as_dict(self) -> dict:
        seconds = {str(k): {str(b): s for b, s in sorted(row.items())} for k, row in sorted(self.seconds.items())}
        lengths = {str(b): n for b, n in sorted(self.lengths.items())}
        return {"seconds": seconds, "lengths": lengths, "source": self.source, "details": self.details}

    @classmethod
    def from_dict(cls, d: dict) -> "CostTable":
        return cls(d["seconds"], d.get("lengths", {}), d.get("source", "file"), d.get("details", {}))

    @classmethod
    def load(cls, path: str) -> "CostTable":
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        d = d.get("cost_table", d)  # a /health answer holds it under "cost_table"
        table = cls.from_dict(d)
        table.source = f"file {path}"
        return table

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.as_dict(), f, indent=1)

    def format(self) -> str:
        """The table as text: a row per k, milliseconds per batch by batch size (and each batch's padded length)."""
        sizes = sorted({b for row in self.seconds.values() for b in row})
        head = "k \\ batch | " + " | ".join(f"{b:>7}" for b in sizes)
        lines = [f"cost table ({self.source}; ms per batch)", head]
        if self.lengths:
            lines.append("   padded | " + " | ".join(f"{self.lengths[b]:7.0f}" if b in self.lengths else f"{'-':>7}"
                                                      for b in sizes))
        for k in self.ratios:
            cells = [f"{self.seconds[k][b] * 1000:7.1f}" if b in self.seconds[k] else f"{'-':>7}" for b in sizes]
            lines.append(f"{k:>9} | " + " | ".join(cells))
        return "\n".join(lines)


def _interpolate(row: Dict[int, float], size: int) -> float:
    """``row``'s value at ``size``: linear between the two measured sizes around it, the end segment's line
    outside them (through the origin when only one size was measured)."""
    sizes = sorted(row)
    if size in row:
        return row[size]
    if len(sizes) == 1:
        return row[sizes[0]] * size / sizes[0]
    if size < sizes[0]:
        lo, hi = sizes[0], sizes[1]
    elif size > sizes[-1]:
        lo, hi = sizes[-2], sizes[-1]
    else:
        hi = next(s for s in sizes if s > size)
        lo = max(s for s in sizes if s < size)
    return row[lo] + (row[hi] - row[lo]) / (hi - lo) * (size - lo)


def measure(run_batch: Callable[[int, int], None], ratios: Sequence[int], batch_sizes: Sequence[int],
            runs: int, lengths: Dict[int, float], clock=time.perf_counter) -> CostTable:
    """Time ``run_batch(k, size)`` ``runs`` times for every k and batch size (after one untimed warm-up of
    each) and keep the median; ``lengths`` are the timed batches' padded lengths by size. Within each run the
    ratios take turns at each size, the order reversed every other run, so every k sees the same moments of a
    machine shared with other work."""
    if runs < 1:
        raise ValueError(f"--cost-runs {runs}: at least 1")
    times = {k: {b: [] for b in batch_sizes} for k in ratios}
    for b in batch_sizes:
        for k in ratios:
            run_batch(k, b)  # warm-up: first-call allocations, lazily built kernels
    for r in range(runs):
        for b in batch_sizes:
            for k in (list(ratios) if r % 2 == 0 else list(reversed(ratios))):
                start = clock()
                run_batch(k, b)
                times[k][b].append(clock() - start)
    seconds = {k: {b: statistics.median(ts) for b, ts in row.items()} for k, row in times.items()}
    return CostTable(seconds, lengths, "measured at start-up", {"runs": runs, "statistic": "median"})
