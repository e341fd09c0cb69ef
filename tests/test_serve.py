"""fc-serve (user_dir/serving/serve.py): the policy maths and the batcher on hand-made numbers, then real
servers in subprocesses on free localhost ports -- a tiny GLUE classifier trained on real RTE (pairs) and
served on SST-2 sentences (single texts), and the shipped Multi30k teacher -- checked against
glue_predict and fairseq-interactive at the same k, under a queue that grows, with every bad input,
a short load run and a clean shutdown."""
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from conftest import REPO, SHARED_DATA, USER_DIR, clean_env

httpx = pytest.importorskip("httpx", reason="the server tests need the 'serve' extra: pip install -e '.[serve]'")
pytest.importorskip("fastapi", reason="the server tests need the 'serve' extra: pip install -e '.[serve]'")
pytest.importorskip("prometheus_client", reason="the server tests need the 'serve' extra")

import user_dir  # noqa: F401,E402
from user_dir.serving.batcher import Batcher, QueueFull  # noqa: E402
from user_dir.serving.cost_table import CostTable, default_batch_sizes, measure  # noqa: E402
from user_dir.serving.policy import (AdaptivePolicy, FixedPolicy, choose_ratio, parse_policy,  # noqa: E402
                                           predicted_latency, queue_bound, reply_delay)

SHIPPED = os.path.join(REPO, "checkpoints", "multi30k.de-en")


# ---- the maths: cost table and policy -------------------------------------------------------------------------
def test_cost_table_interpolates_between_sizes_and_extrapolates_past_the_largest():
    table = CostTable({0: {1: 0.010, 4: 0.040, 8: 0.060}})
    assert table.batch_seconds(0, 4) == 0.040
    assert table.batch_seconds(0, 2) == pytest.approx(0.020)
    assert table.batch_seconds(0, 6) == pytest.approx(0.050)
    assert table.batch_seconds(0, 16) == pytest.approx(0.060 + 8 * 0.005)  # the last segment's slope
    assert table.batch_seconds(0, 0) == 0
    assert CostTable.from_dict(json.loads(json.dumps(table.as_dict()))).seconds == table.seconds
    assert default_batch_sizes(12) == [1, 2, 4, 8, 12] and default_batch_sizes(1) == [1]
    with pytest.raises(ValueError, match="positive seconds"):
        CostTable({0: {1: 0.0}})
    assert table.batch_seconds(0, 4, length=99) == 0.040  # no timed lengths: the length cannot be accounted for


def test_a_batch_padded_longer_than_the_timed_one_is_predicted_to_take_longer_in_proportion():
    table = CostTable({0: {1: 0.010, 8: 0.080}, 4: {1: 0.005, 8: 0.040}}, lengths={1: 10, 8: 20})
    assert table.batch_seconds(0, 8) == 0.080 and table.batch_seconds(0, 8, 20) == pytest.approx(0.080)
    assert table.batch_seconds(0, 8, 40) == pytest.approx(0.160) and table.batch_seconds(4, 8, 10) == pytest.approx(0.020)
    assert table.batch_seconds(0, 1, 20) == pytest.approx(0.020)  # size 1 was timed at 10 tokens
    assert table.batch_seconds(0, 4, 15) == pytest.approx(0.040 * 15 / (10 + 10 * 3 / 7))  # both interpolated
    again = CostTable.from_dict(json.loads(json.dumps(table.as_dict())))
    assert again.lengths == {1: 10.0, 8: 20.0} and again.batch_seconds(0, 8, 40) == pytest.approx(0.160)
    # the queue's batches are padded to their own longest example
    ages, lengths = [0.0] * 10, [20] * 7 + [40] + [10, 10]
    assert predicted_latency(ages, 0, table, 8, lengths=lengths) == pytest.approx(0.160 + 0.020 * 10 / (10 + 10 / 7))
    assert predicted_latency(ages, 0, table, 8, lengths=lengths, busy=0.05) == pytest.approx(
        0.05 + 0.160 + 0.020 * 10 / (10 + 10 / 7))  # after the rest of the running batch


def test_predicted_latency_runs_the_queue_as_fifo_batches_and_counts_the_wait_so_far():
    table = CostTable({0: {1: 0.06, 2: 0.10}})
    ages = [0.3, 0.2, 0.1, 0.0, 0.0]  # oldest first
    # batches [0.3 0.2] done at 0.10, [0.1 0.0] at 0.20, [0.0] at 0.26: worst off 0.3 + 0.10
    assert predicted_latency(ages, 0, table, max_batch=2) == pytest.approx(0.40)
    assert predicted_latency([0.0] * 5, 0, table, max_batch=2) == pytest.approx(0.26)
    assert predicted_latency([], 0, table, max_batch=2) == 0


def test_adaptive_policy_picks_the_smallest_k_meeting_the_target_and_the_largest_under_overload():
    per_example = {0: 0.010, 4: 0.005, 16: 0.002}  # seconds per example, plus 5 ms per batch
    table = CostTable({k: {b: 0.005 + s * b for b in (1, 8)} for k, s in per_example.items()})
    target = 0.100
    assert choose_ratio([0.0], table, 8, target)[0] == 0  # one example: the backbone
    assert choose_ratio([0.0] * 8, table, 8, target)[0] == 0  # one full batch: 85 ms
    assert choose_ratio([0.0] * 16, table, 8, target)[0] == 4  # k=0: 170 ms; k=4: 90 ms
    assert choose_ratio([0.0] * 32, table, 8, target)[0] == 16  # k=4: 180 ms; k=16: 84 ms
    k, predicted = choose_ratio([0.0] * 200, table, 8, target)
    assert k == 16 and predicted > target  # overload: the largest k even though it misses
    assert choose_ratio([0.095], table, 8, target)[0] == 16  # an old example: only k=16 answers it in time
    ks = [choose_ratio([0.0] * n, table, 8, target)[0] for n in range(1, 60)]
    assert ks == sorted(ks)  # a longer queue never gets a smaller k


def test_predictions_follow_the_slow_end_of_the_recent_batches_of_their_size():
    """The scale of a batch's prediction is the 95th percentile of the last ``window`` batches of about its size
    (the nearest timed size), measured / table time, each batch's table time taken at its size and padded length;
    a size with no batches yet borrows from the others."""
    table = CostTable({0: {1: 0.010, 8: 0.080}, 4: {1: 0.005, 8: 0.040}}, lengths={1: 10, 8: 20})
    policy = AdaptivePolicy(table, max_batch=8, target=0.100, window=20)
    assert policy.scale == 1.0 and policy.choose([0.0] * 8)[0] == 0  # 80 ms at k=0 as measured at start-up
    for _ in range(19):
        policy.observe(0, 8, 0.080, length=20)  # as the table says
    policy.observe(4, 7, 1.5 * table.batch_seconds(4, 7, 40), length=40)  # one slow batch in 20: 1.5x the table
    assert table.batch_seconds(4, 7, 40) == pytest.approx(0.035 * 40 / (10 + 10 * 6 / 7))  # (size and length)
    assert policy.column(7) == 8 and policy.column(5) == 8 and policy.column(4) == 1
    assert policy.scale == 1.0  # the 5% the quantile leaves out
    policy.observe(0, 8, 0.120, length=20)  # a second one: 1.5x
    assert policy.scale == pytest.approx(1.5) and policy.choose([0.0] * 8)[0] == 4  # k=0 predicted at 120 ms
    assert policy.batch_seconds(4, 8, 20) == pytest.approx(0.060)
    assert policy.scale_at(1) == pytest.approx(1.5)  # no batch of one yet: all batches' quantile
    for _ in range(5):
        policy.observe(0, 1, 0.030, length=10)  # single examples run 3x the table (a fixed cost per forward)...
    assert policy.scale_at(1) == pytest.approx(3.0) and policy.scale == pytest.approx(1.5)  # ...full batches do not
    for _ in range(20):  # the window moves on: the slow full batches leave it
        policy.observe(0, 8, 0.080, length=20)
    assert policy.scale == 1.0 and policy.scale_at(1) == pytest.approx(3.0)
    frozen = AdaptivePolicy(table, max_batch=8, target=0.100, window=0)
    frozen.observe(0, 8, 0.160)
    assert frozen.scale == 1.0 and frozen.choose([0.0] * 8)[0] == 0


def test_a_request_is_admitted_only_when_its_examples_are_predicted_to_meet_the_target():
    """Admission: the new request's examples queued last, everything at the largest k after what remains of the
    running batch, batches padded to their longest example, the last one taken as full (later requests fill it),
    plus the time since the request arrived, within the target (hand-made numbers, fake clock); a fixed policy has
    no target and keeps --max-queue."""
    table = CostTable({0: {1: 0.010, 8: 0.080}, 4: {1: 0.005, 8: 0.040}}, lengths={1: 10, 8: 10})
    policy = AdaptivePolicy(table, max_batch=8, target=0.2005, window=0)
    assert queue_bound(table, 4, 8, 0.200) == 8 * 4  # (bench_serving's static --max-queue for a target)
    # a short last batch is predicted full: 3 examples behind 8 are answered after two full batches
    assert predicted_latency([0.0] * 11, 4, table, 8) == pytest.approx(0.040 + 0.015)
    assert predicted_latency([0.0] * 11, 4, table, 8, fill=True) == pytest.approx(0.080)
    assert predicted_latency([0.0] * 3, 4, table, 8, fill=True) == pytest.approx(0.015)  # the next batch, worker idle
    assert predicted_latency([0.0] * 3, 4, table, 8, busy=0.01, fill=True) == pytest.approx(0.050)  # or running
    assert predicted_latency([0.0] * 11, 4, table, 8, lengths=[10] * 8 + [30, 10, 10], fill=True) == pytest.approx(
        0.040 + 0.120)  # as long as its longest known example
    now = [0.0]
    batcher = Batcher(lambda payloads, k: payloads, policy.choose, max_batch=8, max_wait=0.0, max_queue=100,
                      clock=lambda: now[0], admit=policy.admits, size_of=len, predict=policy.batch_seconds)
    batcher.submit(["x" * 10] * 36)  # 5 batches of 40 ms at k=4, the short last one predicted full: 200 ms
    batcher.submit(["x" * 10] * 4)  # the fifth batch is full now: still 200 ms
    with pytest.raises(QueueFull, match="predicted to miss the latency target") as refused:
        batcher.submit(["x" * 10])  # a sixth batch: 240 ms
    assert (refused.value.queued, refused.value.asked) == (40, 1)
    assert batcher.backlog(4) == pytest.approx(0.200) and batcher.backlog(0) == pytest.approx(0.400)
    batch, k, _, _, padded, _ = batcher._next_batch()  # the worker takes 8 (k=4: the queue needs it) and runs them
    assert len(batch) == 8 and k == 4 and padded == 10 and batcher.busy(0.0) == pytest.approx(0.040)
    with pytest.raises(QueueFull):  # 4 queued batches after the running one's 40 ms, and a fifth
        batcher.submit(["x" * 10])
    now[0] = 0.030  # the running batch has 10 ms left: 10 + 160 + 40 ms
    with pytest.raises(QueueFull):
        batcher.submit(["x" * 10] * 8)
    now[0] = 0.040  # it is predicted to have ended
    with pytest.raises(QueueFull):  # arrived 25 ms ago (parsing, tokenising): 25 + 200 ms
        batcher.submit(["x" * 10] * 8, arrival=0.015)
    batcher.submit(["x" * 10] * 8)  # arrived just now: 200 ms
    slow = Batcher(lambda payloads, k: payloads, policy.choose, max_batch=8, max_wait=0.0, max_queue=100,
                   clock=lambda: 0.0, admit=policy.admits, size_of=len, predict=policy.batch_seconds)
    slow.submit(["x" * 20] * 16)  # twice the timed length: each batch 80 ms at k=4
    with pytest.raises(QueueFull):
        slow.submit(["x" * 20] * 8)  # a third batch: 240 ms
    slow.submit(["x" * 10] * 8)  # a short third batch fits: 80 + 80 + 40 ms
    fixed = Batcher(lambda payloads, k: payloads, FixedPolicy(0).choose, max_batch=8, max_wait=0.0, max_queue=20,
                    admit=FixedPolicy(0).admits)
    fixed.submit(list(range(20)))  # no target: 2.5 batches of 80 ms are queued all the same
    with pytest.raises(QueueFull, match=r"bound 20 \(--max-queue\)"):
        fixed.submit([20])


def test_an_examples_age_starts_when_its_request_arrived():
    """The ages the policy sees count the time a request spent being parsed and tokenised before it was queued
    (submit's arrival), never a time after it was queued (a fake clock)."""
    now, seen = [10.0], []
    batcher = Batcher(lambda payloads, k: payloads, lambda ages, lengths: seen.append(list(ages)) or (0, 0.0), max_batch=8,
                      max_wait=0.0, max_queue=100, clock=lambda: now[0])
    batcher.submit([1, 2], arrival=9.7)  # 300 ms of parsing and tokenising before it was queued
    batcher.submit([3], arrival=10.5)  # an arrival after now is taken as now
    batcher.submit([4])
    now[0] = 10.1
    batch, k, _, queued, _, _ = batcher._next_batch()
    assert [round(a, 6) for a in seen[0]] == [0.4, 0.4, 0.1, 0.1] and batch and queued == 4 and k == 0


def test_the_adaptive_policy_leaves_the_reply_delay_out_of_its_target():
    """The p95 of the recent reply delays (a batch's end to its answers leaving the server) comes off the target the
    predictions must meet, and off the admission bound: a larger k for the same queue, fewer examples admitted."""
    table = CostTable({0: {1: 0.010, 8: 0.080}, 4: {1: 0.005, 8: 0.040}})
    policy = AdaptivePolicy(table, max_batch=8, target=0.200)
    ages = [0.05] * 16  # two full batches: even at k=4 the second ends 0.05 + 0.08 s after the oldest arrived
    assert reply_delay([]) == 0.0 and policy.budget == 0.200
    assert policy.choose([0.05] * 8)[0] == 0  # 0.05 + 0.08 <= 0.2
    assert policy.admits(40) and not policy.admits(41)  # 5 batches of 40 ms fit in 200 ms, not a sixth
    for seconds in [0.001] * 90 + [0.100] * 10:  # the p95 of the reply delays is 100 ms
        policy.observe_reply(seconds)
    assert policy.reply_delay_p95() == 0.100 and abs(policy.budget - 0.100) < 1e-12
    assert policy.choose([0.05] * 8)[0] == 4  # 0.05 + 0.08 > 0.1, 0.05 + 0.04 <= 0.1
    assert policy.choose(ages)[0] == 4  # the largest k under overload
    assert policy.admits(16) and not policy.admits(24)  # 0.1 s holds 2 batches of 40 ms, not 3
    assert policy.admits(16, age=0.019) and not policy.admits(16, age=0.021)  # the request's time before queueing
    for seconds in [0.0] * 90 + [0.030] * 10:  # the event loop wakes its probe 30 ms late at its p95
        policy.observe_lag(seconds)
    assert policy.budget == pytest.approx(0.070)  # what a request waits before its arrival is stamped comes off too
    assert policy.admits(8) and not policy.admits(16)
    stated = AdaptivePolicy(table, max_batch=8, target=0.200, overhead=0.045)  # --client-overhead-ms 45
    assert stated.budget == pytest.approx(0.155) and stated.admits(24) and not stated.admits(32)
    FixedPolicy(0).observe_reply(1.0)  # a fixed policy has no target: nothing to leave out


def test_parse_policy_names_the_flag():
    table = CostTable({0: {1: 0.01}, 4: {1: 0.005}})
    assert parse_policy("fixed:4", [0, 4], table, 8, 100).choose([0.0])[0] == 4
    adaptive = parse_policy("adaptive", [0, 4], table, 8, 100)
    assert isinstance(adaptive, AdaptivePolicy) and adaptive.target == 0.1 and adaptive.largest_ratio == 4
    with pytest.raises(ValueError, match="--policy fixed:8: no plugin with k=8"):
        parse_policy("fixed:8", [0, 4], table, 8, 100)
    with pytest.raises(ValueError, match=r"--policy adaptive: the cost table has no row for k in \[16\]"):
        parse_policy("adaptive", [0, 4, 16], table, 8, 100)
    with pytest.raises(ValueError, match="--policy fixed:4: the cost table has no row for k=4"):
        parse_policy("fixed:4", [0, 4], CostTable({0: {1: 0.01}}), 8, 100)
    with pytest.raises(ValueError, match="--policy 'fastest'"):
        parse_policy("fastest", [0, 4], table, 8, 100)
    with pytest.raises(ValueError, match="--cost-window -1"):
        parse_policy("adaptive", [0, 4], table, 8, 100, window=-1)
    with pytest.raises(ValueError, match="--cost-quantile 0"):
        parse_policy("adaptive", [0, 4], table, 8, 100, q=0)
    with pytest.raises(ValueError, match="--client-overhead-ms 100: from 0 to less than --target-p95-ms 100"):
        parse_policy("adaptive", [0, 4], table, 8, 100, overhead_ms=100)
    assert parse_policy("adaptive", [0, 4], table, 8, 100, overhead_ms=10).budget == pytest.approx(0.090)


def test_measure_takes_the_median_and_alternates_the_ratios():
    calls, ticks = [], iter(range(10_000))
    table = measure(lambda k, b: calls.append((k, b)), [0, 4], [1, 2], runs=3, lengths={1: 7, 2: 9},
                    clock=lambda: next(ticks))
    assert table.lengths == {1: 7, 2: 9}
    timed = calls[4:]  # after one warm-up per cell
    assert timed[:4] == [(0, 1), (4, 1), (0, 2), (4, 2)] and timed[4:8] == [(4, 1), (0, 1), (4, 2), (0, 2)]


def bench_serving():
    import importlib
    if os.path.join(REPO, "scripts", "bench") not in sys.path:  # imported as running the script does
        sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
    return importlib.import_module("bench_serving")


def test_benchmark_trace_is_seeded_and_its_summary_counts_sentences_requests_and_the_burst():
    bench = bench_serving()
    trace = bench.poisson_schedule([(10, 2.0), (5, 40.0), (10, 0.0)], seed=3)
    assert trace == bench.poisson_schedule([(10, 2.0), (5, 40.0), (10, 0.0)], seed=3) and trace == sorted(trace)
    burst = [t for t in trace if 10 <= t < 15]
    assert 140 <= len(burst) <= 260 and len(trace) - len(burst) < 45 and max(trace) < 15  # no arrivals at rate 0
    assert bench.percentile([1, 2, 3, 4], 50) == 2.5 and bench.percentile([5], 95) == 5
    gold = ["1", "0", "1", "0"]
    mine = [{"at": 1.0, "lag": 0.0, "indices": [0, 1], "status": 200, "latency": 0.1, "ks": [0, 0],
             "labels": ["1", "1"]},
            {"at": 12.0, "lag": 0.0, "indices": [2, 3], "status": 200, "latency": 0.5, "ks": [4, 4],
             "labels": ["1", "0"],
             "server": bench.server_timing("wait;dur=300.00, batch;dur=150.00, reply;dur=10.00, total;dur=460.00")},
            {"at": 13.0, "lag": 0.0, "indices": [0, 1], "status": 503, "latency": 0.01}]
    ref = [dict(mine[0], labels=["1", "0"]), dict(mine[1], status=503), dict(mine[2], status=200, ks=[0, 0],
                                                                             labels=["1", "0"])]
    s = bench.serving_summary(mine, gold, (10, 15), duration=20.0, reference=ref)
    assert (s["answered"], s["refused"], s["failed"], s["examples_answered"]) == (2, 1, 0, 4)
    assert s["accuracy"] == 75.0 and s["k_share"] == {"0": 0.5, "4": 0.5} and s["throughput"] == 0.2
    assert s["burst_answered"] == 1 and s["burst_p95_ms"] == pytest.approx(500)
    assert s["shared"] == 2 and s["shared_accuracy"] == 50.0 and s["shared_reference_accuracy"] == 100.0
    assert s["shared_test"]["diff"] == -50.0 and s["shared_test"]["low"] <= -50.0 <= s["shared_test"]["high"]
    split = s["burst_split_ms"]  # the one burst request: its server's split, and the 40 ms outside the server's view
    assert (split["wait"]["p95"], split["batch"]["p95"], split["reply"]["p95"]) == pytest.approx((300, 150, 10))
    assert split["total"]["p50"] == pytest.approx(460) and split["outside"]["p50"] == pytest.approx(40)


# ---- the batcher, with a fake model --------------------------------------------------------------------------
def test_batcher_fills_batches_up_to_the_maximum_refuses_past_the_bound_and_drains_on_stop():
    release, batches, seen_ages = threading.Event(), [], []

    def run_batch(payloads, k):
        release.wait(10)
        batches.append((list(payloads), k))
        return [p * 10 for p in payloads]

    def choose(ages, lengths):
        seen_ages.append(list(ages))
        return (4 if len(ages) > 4 else 0), 0.0

    batcher = Batcher(run_batch, choose, max_batch=4, max_wait=0.0, max_queue=10)
    batcher.start()
    first = batcher.submit([0])
    deadline = time.time() + 5
    while batcher.queued and time.time() < deadline:  # the worker took it and is blocked in run_batch
        time.sleep(0.01)
    futures = batcher.submit(list(range(1, 11)))  # 10 queued: the bound
    with pytest.raises(QueueFull):
        batcher.submit([99])
    release.set()
    assert [f.result(5) for f in first + futures] == [i * 10 for i in range(11)]
    assert [(len(p), k) for p, k in batches] == [(1, 0), (4, 4), (4, 4), (2, 0)]
    assert [len(a) for a in seen_ages] == [1, 10, 6, 2] and seen_ages[1] == sorted(seen_ages[1], reverse=True)
    late = batcher.submit([42])
    batcher.stop(timeout=5)
    assert late[0].result(0) == 420  # queued before stop: answered
    with pytest.raises(RuntimeError, match="shutting down"):
        batcher.submit([1])


# ---- real servers --------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m user_dir.serving.serve ...`` on a free localhost port, ready when /health answers."""

    def __init__(self, *args, log):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = clean_env()
        env["OMP_NUM_THREADS"] = "1"
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "user_dir.serving.serve", *map(str, args),
                                      "--port", str(self.port), "--log-level", "warning"],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.log_path = log

    def wait_ready(self, timeout=240):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"fc-serve exited {self.proc.returncode}:\n{open(self.log_path).read()[-4000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"fc-serve not ready in {timeout} s:\n{open(self.log_path).read()[-4000:]}")

    def post(self, path, body, **kw):
        content = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return httpx.post(self.url + path, content=content, headers={"content-type": "application/json"},
                          timeout=60, **kw)

    def stop(self):
        """SIGTERM; True when the server shut down gracefully (uvicorn re-raises the signal after its graceful
        shutdown, so the process ends by SIGTERM after printing that its worker stopped)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.finished()

    def finished(self):
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return self.proc.returncode in (0, -signal.SIGTERM) and "worker stopped" in open(self.log_path).read()


def random_plugin_file(model, path, k, layers, bottleneck=8, seed=0):
    """A plugin of ratio k with random weights (non-zero everywhere, so it changes the outputs)."""
    from user_dir.variator.compression_plugin import PluginConfig
    from user_dir.variator.plugged_encoder import VariatorPlugins, fingerprint, transformer_encoder, write_plugin_file
    container = VariatorPlugins(model)
    plugin_set = container.add(PluginConfig(ratio=k, layers=tuple(layers), bottleneck=bottleneck))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in plugin_set.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    write_plugin_file(str(path), {"config": plugin_set.config.as_dict(), "backbone": container.signature,
                                  "backbone_fingerprint": fingerprint(transformer_encoder(model).layers[0].fc1.weight),
                                  "state_dict": plugin_set.state_dict()})
    return str(path)


def synthetic_cost_table(path, per_example):
    """A cost table whose numbers make the adaptive policy's choices deterministic: 1 ms per batch plus
    ``per_example[k]`` seconds per example."""
    CostTable({k: {b: 0.001 + s * b for b in (1, 64)} for k, s in per_example.items()}, source="synthetic").save(path)
    return str(path)


@pytest.fixture(scope="module")
def glue(tiny_glue_teacher, tmp_path_factory):
    """The tiny RTE classifier with two random plugins (k=2, 4 on both layers), and a single-sentence data folder
    for the same model: 16 real SST-2 dev sentences prepared with RTE's dictionary (Moses tokens, as RTE's)."""
    from fairseq import checkpoint_utils
    root = tmp_path_factory.mktemp("serve_glue")
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(tiny_glue_teacher["teacher"])], arg_overrides={"data": str(tiny_glue_teacher["data"])})
    plugins = [random_plugin_file(models[0], root / f"k{k}.pt", k, (0, 1), seed=k) for k in (2, 4)]
    tsv = root / "tsv" / "SST-2"
    tsv.mkdir(parents=True)
    for split, rows in (("train", 8), ("dev", 16)):
        with open(os.path.join(SHARED_DATA, "glue", "SST-2", f"{split}.tsv"), encoding="utf-8") as f:
            (tsv / f"{split}.tsv").write_text("".join(line for _, line in zip(range(rows + 1), f)), encoding="utf-8")
    sst2 = root / "sst2"
    from preprocess.prepare_glue import main as prepare_glue
    prepare_glue(["--task", "SST-2", "--glue-dir", str(root / "tsv"), "--dest", str(sst2),
                  "--dict", str(tiny_glue_teacher["data"] / "input0" / "dict.txt"), "--workers", "1"])
    # k=0 costs 50 ms per example, k=2 45 ms, k=4 1 ms: one example runs at k=0, a queue of 16 at k=4
    table = synthetic_cost_table(root / "cost.json", {0: 0.05, 2: 0.045, 4: 0.001})
    return {**tiny_glue_teacher, "plugins": plugins, "sst2": sst2, "table": table, "root": root}


def raw_dev(data, n):
    """The first n dev examples as the user typed them (prepare_glue keeps the raw text) and their labels."""
    cols = [open(os.path.join(data, "text", f"dev.raw.input{i}"), encoding="utf-8").read().splitlines()[:n]
            for i in range(2) if os.path.exists(os.path.join(data, "text", f"dev.raw.input{i}"))]
    return [list(ex) for ex in zip(*cols)]


@pytest.fixture(scope="module")
def servers(glue):
    """Two servers of the tiny classifier, started together (their start-ups overlap):

    * ``pair``: RTE pairs, plugins k=2 and 4, the adaptive policy on the synthetic table (target 1 s, never
      rescaled); batches wait up to 0.4 s to fill, so a request's examples queue together, deterministically
      (and stay in flight long enough to be caught by a SIGTERM); at most 24 queued;
    * ``single``: SST-2 sentences, fixed:0, its cost table measured at start-up."""
    started = {
        "pair": Server(glue["teacher"], "--data", glue["data"], "--plugins", ",".join(glue["plugins"]),
                       "--policy", "adaptive", "--target-p95-ms", "1000", "--cost-table", glue["table"],
                       "--cost-window", "0", "--max-batch", "64", "--max-wait-ms", "400", "--max-queue", "24",
                       log=glue["root"] / "pair.log"),
        "single": Server(glue["teacher"], "--data", glue["sst2"], "--policy", "fixed:0", "--max-batch", "8",
                         "--max-wait-ms", "2", "--cost-batch-sizes", "1,8", "--cost-runs", "1",
                         log=glue["root"] / "single.log"),
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        stopped = {name: server.stop() for name, server in started.items()}
    assert all(stopped.values()), stopped


@pytest.fixture(scope="module")
def pair_server(servers):
    return servers["pair"]


@pytest.fixture(scope="module")
def single_server(servers):
    return servers["single"]


def test_answers_equal_glue_predict_at_k0_and_a_growing_queue_gets_a_larger_k(glue, pair_server):
    from user_dir.tools.glue_predict import predict
    examples = raw_dev(glue["data"], 16)
    _, at0, _, _ = predict(str(glue["data"]), str(glue["teacher"]), "dev")
    _, at4, _, _ = predict(str(glue["data"]), str(glue["teacher"]), "dev", variator_plugins=glue["plugins"][1],
                           variator_ratio=4)
    assert at0[:16] != at4[:16]  # the plugin changes answers: the comparison below tells the ratios apart
    replies = [pair_server.post("/classify", {"pairs": ex}) for ex in examples[:3]]
    alone = [r.json()["results"][0] for r in replies]
    assert [r["k"] for r in alone] == [0, 0, 0]  # one example at a time: the backbone meets the target
    bench = bench_serving()
    for r in replies:  # the server's split of its time (Server-Timing): a lone example waits out --max-wait-ms 400
        split = bench.server_timing(r.headers["server-timing"])
        assert 0.39 <= split["wait"] < 0.6 and 0 < split["batch"] < split["wait"] and split["reply"] >= 0
        assert split["total"] == pytest.approx(split["wait"] + split["batch"] + split["reply"], abs=1e-4)
        assert split["total"] <= r.elapsed.total_seconds()  # the client's latency includes it
    assert [r["label_index"] for r in alone] == at0[:3]
    together = pair_server.post("/classify", {"pairs": examples}).json()["results"]
    assert {r["k"] for r in together} == {4}  # 16 queued: k=0 would take 0.8 s after 0.4 s of waiting
    assert [r["label_index"] for r in together] == at4[:16]
    assert all(abs(sum(r["scores"].values()) - 1) < 1e-5 for r in together)
    metrics = httpx.get(pair_server.url + "/metrics").text
    assert 'fc_serve_examples_total{k="4"} 16.0' in metrics and 'fc_serve_examples_total{k="0"} 3.0' in metrics
    assert 'fc_serve_cost_table_seconds{batch_size="64",k="4"}' in metrics and "fc_serve_queue_examples" in metrics
    assert "fc_serve_backlog_seconds" in metrics and "fc_serve_budget_seconds" in metrics
    health = httpx.get(pair_server.url + "/health").json()
    assert health["ratios"] == [0, 2, 4] and health["cost_table"]["source"].startswith("file")
    assert health["backlog_s"] == 0.0 and health["cost_scale"] == 1.0 and 0 <= health["loop_lag_p95_s"] < 0.5
    assert health["budget_s"] == pytest.approx(1.0 - health["reply_delay_p95_s"] - health["loop_lag_p95_s"], abs=0.02)


def test_every_bad_input_is_a_4xx_naming_its_field_and_a_full_queue_is_503(glue, pair_server, single_server):
    pair = raw_dev(glue["data"], 1)[0]
    cases = [
        (pair_server, b'{"pairs": [["a", "b"]', 400, "body", "malformed JSON"),
        (pair_server, {"pairs": [pair, ["a premise", "  "]]}, 422, "pairs[1][1]", "empty text"),
        (pair_server, {"texts": "one sentence"}, 422, "texts", "classifies sentence pairs"),
        (pair_server, {"pairs": [["a", "b", "c"]]}, 422, "pairs[0]", "list of two texts"),
        (pair_server, {"pairs": pair, "colour": "red"}, 422, "colour", "unknown field"),
        (pair_server, {"pairs": pair, "truncate": "no"}, 422, "truncate", "true or false"),
        (pair_server, {"pairs": [pair] * 25}, 413, "pairs", "more than the server ever queues"),
        (pair_server, {"pairs": [pair, ["x " * 600, "y"]], "truncate": False}, 422, "pairs[1]",
         "over the model's maximum 512"),
        (pair_server, {"texts": "ein satz"}, 404, "endpoint", "serves a classify model"),
        (single_server, {"pairs": ["a", "b"]}, 422, "pairs", "classifies single sentences"),
        (single_server, {"texts": ["fine", 7]}, 422, "texts[1]", "a text is a string"),
        (single_server, {"texts": []}, 422, "texts", "non-empty list"),
    ]
    for server, body, status, field, words in cases:
        path = "/translate" if field == "endpoint" else "/classify"
        r = server.post(path, body)
        assert r.status_code == status and r.json()["field"] == field and words in r.json()["detail"], (body, r.text)
        assert r.json()["detail"].startswith(field + ":")
    # a full queue: 16 examples wait (up to 0.4 s) for their batch to fill; 10 more would pass the bound of 24
    with httpx.Client(timeout=60) as client:
        first = threading.Thread(target=lambda: client.post(pair_server.url + "/classify", json={"pairs": [pair] * 16}))
        first.start()
        deadline = time.time() + 5
        while httpx.get(pair_server.url + "/health").json()["queued"] < 16 and time.time() < deadline:
            time.sleep(0.01)
        refused = client.post(pair_server.url + "/classify", json={"pairs": [pair] * 10})
        first.join()
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1, refused.text
    assert "16 examples queued, 10 more asked for: bound 24 (--max-queue)" in refused.json()["detail"]
    assert 'fc_serve_refused_requests_total{reason="queue_full"} 1.0' in httpx.get(pair_server.url + "/metrics").text


def test_single_sentences_equal_glue_predict_and_long_ones_are_cut_as_training_cut_them(glue, single_server):
    from user_dir.tools.glue_predict import predict
    texts = [ex[0] for ex in raw_dev(glue["sst2"], 16)]
    _, expected, _, _ = predict(str(glue["sst2"]), str(glue["teacher"]), "dev")
    got = single_server.post("/classify", {"texts": texts}).json()["results"]
    assert [r["label_index"] for r in got] == expected and {r["k"] for r in got} == {0}
    words = ("the film is a slow and dull story but its actors are great " * 60).split()  # 720 words
    long, cut = single_server.post("/classify", {"texts": [" ".join(words), " ".join(words[:510])]}).json()["results"]
    assert long["truncated"] and not cut["truncated"]  # 512 positions: [CLS] + 510 tokens + [SEP]
    assert long["scores"] == pytest.approx(cut["scores"], abs=1e-6)
    health = httpx.get(single_server.url + "/health").json()
    assert health["cost_table"]["source"] == "measured at start-up" and set(health["cost_table"]["seconds"]) == {"0"}


def test_a_short_load_run_answers_every_request(glue, single_server):
    texts = [ex[0] for ex in raw_dev(glue["sst2"], 16)]

    async def load(seconds, rate):
        async with httpx.AsyncClient(timeout=60) as client:
            async def one(i):
                await asyncio.sleep(i / rate)
                r = await client.post(single_server.url + "/classify", json={"texts": texts[i % len(texts)]})
                return r.status_code, r.json()
            return await asyncio.gather(*(one(i) for i in range(int(seconds * rate))))

    before = httpx.get(single_server.url + "/metrics").text
    answers = asyncio.run(load(3, 20))  # 60 requests over 3 s
    assert [s for s, _ in answers] == [200] * 60
    assert all(a["results"][0]["label"] in ("0", "1") for _, a in answers)  # SST-2's label names (its data folder)
    def answered(metrics):
        found = re.search(r'^fc_serve_examples_total\{k="0"\} ([0-9.e+]+)$', metrics, re.M)
        return float(found.group(1)) if found else 0.0
    assert answered(httpx.get(single_server.url + "/metrics").text) - answered(before) == 60


def test_shutdown_finishes_the_requests_in_flight_then_exits_cleanly(glue, pair_server):
    """Two requests wait (up to 0.4 s) for their batch when SIGTERM arrives: both are answered, the worker stops,
    the process ends and the port closes. (The last test of the pair server.)"""
    pairs = raw_dev(glue["data"], 2)
    results = []
    with httpx.Client(timeout=60) as client:
        threads = [threading.Thread(target=lambda p=p: results.append(
            client.post(pair_server.url + "/classify", json={"pairs": [p] * 8}))) for p in pairs]
        for t in threads:
            t.start()
        deadline, queued = time.time() + 10, 0
        while queued < 16 and time.time() < deadline:
            queued = httpx.get(pair_server.url + "/health").json()["queued"]
        pair_server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join()
    assert queued == 16  # both were waiting in the queue when the signal came
    assert pair_server.finished(), open(pair_server.log_path).read()[-3000:]
    assert [r.status_code for r in results] == [200] * 2 and all(len(r.json()["results"]) == 8 for r in results)
    with pytest.raises(httpx.TransportError):
        httpx.get(pair_server.url + "/health", timeout=2)


def test_translations_equal_fairseq_interactive_at_the_same_k(tmp_path):
    from fairseq import checkpoint_utils
    teacher = os.path.join(SHIPPED, "teacher.pt")
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [teacher], arg_overrides={"data": SHIPPED, "source_lang": "de", "target_lang": "en"})
    plugin = random_plugin_file(models[0], tmp_path / "k2.pt", 2, (0, 1, 2), bottleneck=16)
    sentences = ["Ein Mann fährt mit dem Fahrrad über eine Brücke.", "Zwei Kinder spielen im Schnee.",
                 "Eine Frau in einem blauen Kleid singt auf einer Bühne.", "Ein Hund läuft über eine Wiese."]
    server = Server(teacher, "--plugins", plugin, "--source-lang", "de", "--target-lang", "en", "--lowercase",
                    "--beam", "5", "--max-len-a", "1.2", "--max-len-b", "10", "--policy", "adaptive",
                    "--target-p95-ms", "1000", "--max-wait-ms", "300", "--cost-window", "0",
                    "--cost-table", synthetic_cost_table(tmp_path / "cost.json", {0: 0.4, 2: 0.01}),
                    log=tmp_path / "translate.log")

    def interactive(k):  # started now, read below: both run while the server starts
        cmd = [sys.executable, "-m", "fairseq_cli.interactive", SHIPPED, "--path", teacher, "--user-dir", USER_DIR,
               "--task", "variator_translation", "--variator-plugins", plugin, "--variator-ratio", str(k),
               "--source-lang", "de", "--target-lang", "en", "--tokenizer", "moses", "--moses-no-escape",
               "--moses-no-dash-splits", "--bpe", "subword_nmt", "--bpe-codes", os.path.join(SHIPPED, "code"),
               "--beam", "5", "--max-len-a", "1.2", "--max-len-b", "10", "--cpu"]
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=clean_env())

    def hypotheses(proc):
        out, err = proc.communicate("".join(s.lower() + "\n" for s in sentences), timeout=600)
        assert proc.returncode == 0, err[-3000:]
        return [line.split("\t")[2] for line in out.splitlines() if line.startswith("D-")]

    runs = [interactive(0), interactive(2)]
    at0, at2 = [hypotheses(proc) for proc in runs]
    assert at0 != at2
    try:
        server.wait_ready()
        alone = server.post("/translate", {"texts": sentences[0]}).json()["results"][0]
        assert alone["k"] == 0 and alone["translation"] == at0[0]
        together = server.post("/translate", {"texts": sentences}).json()["results"]
        assert [r["k"] for r in together] == [2] * 4 and [r["translation"] for r in together] == at2
        r = server.post("/translate", {"texts": ["ein satz", ""]})
        assert r.status_code == 422 and r.json()["field"] == "texts[1]"
        assert server.post("/classify", {"texts": "ein satz"}).status_code == 404
    finally:
        assert server.stop()


def test_the_load_benchmark_takes_its_plugins_from_the_stores_records_of_the_variator_recipe(tmp_path):
    """bench_serving's default plugins: WORK/plugin-kK.pt beside the checkpoint of each store record of
    scripts/recipes/variator.sh made on the backbone for the task, in the order of k, the last filed of each k; records
    of another backbone or task are not taken; how each was trained is read from its record (the recipe, its
    variables, each training stage's updates)."""
    import hashlib

    bench = bench_serving()
    from store import Store  # (scripts/experiments/, on the path benchlib sets)

    backbone = tmp_path / "teacher.pt"
    backbone.write_bytes(b"backbone")
    store, digest = Store(str(tmp_path / "store")), hashlib.sha256(b"backbone").hexdigest()

    def record(key, k, task="SST-2", sha=digest):
        work = tmp_path / key
        (work / "plugin").mkdir(parents=True)
        (work / f"plugin-k{k}.pt").write_bytes(b"plugin")
        store._append({"key": key, "recipe": "variator.sh", "teacher": {"sha256": sha},
                       "checkpoint": str(work / "plugin" / "checkpoint_best.pt"),
                       "variables": {"GLUE_TASK": task, "K": str(k), "UPDATES": "800", "PRETRAIN_UPDATES": "200"},
                       "training": {"pretrain": {"updates": 200}, "plugin": {"updates": 800, "best_updates": 600}}})
        return str(work / f"plugin-k{k}.pt")

    old, k8, k2 = record("old-k8", 8), record("new-k8", 8), record("k2", 2)
    record("rte-k4", 4, task="RTE")
    record("other-k16", 16, sha=hashlib.sha256(b"another backbone").hexdigest())
    found = bench.plugins_from_store(store.root, "SST-2", str(backbone))
    assert [path for path, _ in found] == [k2, k8] and old != k8
    text = bench.plugin_provenance(*found[0])
    assert text.startswith(os.path.relpath(k2, REPO) if k2.startswith(REPO) else k2)
    assert "variator.sh GLUE_TASK=SST-2 K=2 PRETRAIN_UPDATES=200 UPDATES=800" in text
    assert "pretrain: 200 updates" in text and "plugin: 800 updates, the best at 600" in text and "record k2" in text
    (tmp_path / "other.pt").write_bytes(b"another backbone")
    assert [path for path, _ in bench.plugins_from_store(store.root, "SST-2", str(tmp_path / "other.pt"))] == \
        [str(tmp_path / "other-k16" / "plugin-k16.pt")]
    (tmp_path / "unknown.pt").write_bytes(b"a backbone no plugin was made on")
    with pytest.raises(SystemExit, match="holds no plugin of scripts/recipes/variator.sh"):
        bench.plugins_from_store(store.root, "SST-2", str(tmp_path / "unknown.pt"))
    os.remove(k8)
    with pytest.raises(SystemExit, match="plugin-k8.pt: missing"):
        bench.plugins_from_store(store.root, "SST-2", str(backbone))
