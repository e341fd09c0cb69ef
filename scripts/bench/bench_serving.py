#!/usr/bin/env python
"""Variator served under a burst of traffic: fc-serve (user_dir/serving/serve.py) with a GLUE classifier and
its plugins, under ``fixed:0`` (the backbone alone), ``fixed:K`` (the largest plugin) and ``adaptive``,
each replaying one fixed bursty trace of the task's dev sentences from localhost.

    python scripts/bench/bench_serving.py                          # -> work/serving/serving.md (.json, .png)
    python scripts/bench/bench_serving.py --out results/serving.md

The trace (seeded Poisson arrivals of requests, the same for every policy): idle
(``--idle-factor`` x the backbone's throughput) for ``--idle-seconds``, a burst at ``--burst-factor`` x
that throughput for ``--burst-seconds``, then idle again. "The backbone's throughput" is read from the
cost table the first server measures at start-up: full batches at k=0, ``max_batch / t(k=0, max_batch)``
examples per second. The client (asyncio + httpx) sends every request at its scheduled time whatever the
server does, and never retries a refused one: the run is bounded in requests and time. Latency is from
the scheduled send time to the answer, so a client that falls behind cannot hide latency.

Defaults that follow from the cost table (each can be given instead):

* ``--target-p95-ms``: twice a full batch of the backbone, plus the longest batching wait;
* ``--max-queue``: the full batches the largest plugin finishes within the target, less one (the batch a
  new example may find running) -- the bound an operator would set for this target, the same for every
  policy: beyond it a request is refused (503) rather than left to wait past the target (the adaptive policy
  also refuses what it predicts would miss its target);
* ``--client-overhead-ms`` (adaptive servers): the p95 of the client's latency less the server's Server-Timing
  total, measured in the first run -- the part of the latency no server sees, stated to the later servers.

Each request carries ``--texts-per-request`` dev sentences. Reported per policy: p50/p95/p99 latency of the
answered requests (over the trace and over the burst), throughput, refused and failed requests, the share of
sentences at each k, and accuracy of the answered sentences against the dev labels (and, on the sentences both
answered, against ``fixed:0``'s answers);
beside them each k's accuracy on the whole dev set (glue_predict). A plot over time shows offered load,
the k chosen and latency. The machine, threads and load (``/proc/loadavg``) before each policy are stated.

Where the teacher and plugins come from: by default the SST-2 teacher of scripts/recipes/glue_teachers.sh's
layout (``work/glue/SST-2/checkpoints/checkpoint_best.pt``) and the plugins scripts/recipes/variator.sh adapted to
it, one work folder per ratio k (``--variator-work``: WORK/plugin-kK.pt, checked to be made on that backbone by the
recipe's record); how each was trained is read from the recipe's stage marker beside it and quoted in the report.
"""
import argparse
import asyncio
import glob
import json
import logging
import math
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time

from benchlib import ROOT, environment, invocation, logger, machine, plot_panels, sha256_of, write_json, write_text
from glue_bench import REPORT_SUBSET, check_report_subset

log = logger("bench_serving")


def loadavg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


# ---- the trace --------------------------------------------------------------------------------------------
def poisson_schedule(phases, seed: int):
    """Arrival times (seconds) of a Poisson process whose rate is constant within each (seconds, rate) phase."""
    rng, times, start = random.Random(seed), [], 0.0
    for seconds, rate in phases:
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= start + seconds:
                break
            times.append(t)
        start += seconds
    return times


def percentile(values, q):
    """The q-th percentile (0-100) by linear interpolation between order statistics (numpy's default)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# ---- one server --------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, policy, target_ms, max_queue, logfile, overhead_ms=0.0):
    """fc-serve for ``policy``: ``fixed:K``, ``adaptive`` (every plugin attached), or ``adaptive@4+8`` (the
    adaptive policy over a subset of the plugins: only k=4 and k=8 attached, besides the backbone)."""
    port = free_port()
    files = args.plugin_files
    if "@" in policy:
        policy, subset = policy.split("@", 1)
        wanted = {int(k) for k in subset.split("+")}
        files = [f for f, k in zip(args.plugin_files, args.plugin_ratios) if k in wanted]
        if len(files) != len(wanted):
            sys.exit(f"bench_serving: --policies {policy}@{subset}: plugins attached have k in {args.plugin_ratios}")
    cmd = [sys.executable, "-m", "user_dir.serving.serve", args.checkpoint, "--data", args.data,
           "--plugins", ",".join(files), "--policy", policy, "--target-p95-ms", f"{target_ms:g}",
           "--max-batch", str(args.max_batch), "--max-wait-ms", f"{args.max_wait_ms:g}", "--max-queue",
           str(max_queue), "--threads", str(args.threads), "--cost-texts", args.cost_texts,
           "--cost-runs", str(args.cost_runs), "--port", str(port), "--log-level", "warning"]
    if policy == "adaptive" and overhead_ms:
        cmd[-4:-4] = ["--client-overhead-ms", f"{overhead_ms:.1f}"]
    env = environment(args.threads)
    out = open(logfile, "w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return proc, out, f"http://127.0.0.1:{port}", cmd


def wait_ready(proc, url, logfile, timeout=600):
    import httpx
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bench_serving: fc-serve exited ({proc.returncode}); see {logfile}")
        try:
            r = httpx.get(url + "/health", timeout=5)
            if r.status_code == 200:
                return r.json()
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"bench_serving: fc-serve not ready after {timeout} s; see {logfile}")


def stop_server(proc, out):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out.close()


async def replay(url, arrivals, requests, timeout):
    """Send request i at arrivals[i] seconds (the dev examples requests[i], a list); one record per request."""
    import httpx
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=4000)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter() + 1.0

        async def one(at, examples):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = time.perf_counter() - (t0 + at)
            record = {"at": at, "lag": lag, "indices": [e["index"] for e in examples]}
            try:
                r = await client.post("/classify", json={"texts": [e["text"] for e in examples]})
                record["status"] = r.status_code
                if r.status_code == 200:
                    results = r.json()["results"]
                    record.update(ks=[x["k"] for x in results], labels=[x["label"] for x in results],
                                  server=server_timing(r.headers.get("server-timing", "")))
            except httpx.HTTPError as e:
                record["status"] = f"error: {type(e).__name__}"
            record["latency"] = time.perf_counter() - (t0 + at)
            return record

        return await asyncio.gather(*(one(at, ex) for at, ex in zip(arrivals, requests)))


def server_timing(header: str) -> dict:
    """{name: seconds} from a W3C Server-Timing header (fc-serve's: wait, batch, reply, total)."""
    out = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur" and name:
                out[name] = float(value) / 1000
    return out


# ---- the numbers ------------------------------------------------------------------------------------------------
def serving_summary(records, gold, burst, duration, reference=None):
    """Latency per request; throughput, k and accuracy per example (a request carries several)."""
    answered = [r for r in records if r["status"] == 200]
    refused = sum(r["status"] == 503 for r in records)
    failed = len(records) - len(answered) - refused
    lat = [r["latency"] * 1000 for r in answered]
    in_burst = [r["latency"] * 1000 for r in answered if burst[0] <= r["at"] < burst[1]]
    pairs = [(i, label) for r in answered for i, label in zip(r["indices"], r["labels"])]
    ks = {}
    for r in answered:
        for k in r["ks"]:
            ks[k] = ks.get(k, 0) + 1
    out = {"requests": len(records), "answered": len(answered), "refused": refused, "failed": failed,
           "examples_answered": len(pairs),
           "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95), "p99_ms": percentile(lat, 99),
           "burst_p95_ms": percentile(in_burst, 95), "burst_answered": len(in_burst),
           "throughput": len(pairs) / duration,
           "accuracy": 100 * sum(gold[i] == lab for i, lab in pairs) / max(1, len(pairs)),
           "k_share": {str(k): n / max(1, len(pairs)) for k, n in sorted(ks.items())},
           "client_lag_p99_ms": percentile([r["lag"] * 1000 for r in records], 99)}
    # where a burst request's time went: the server's split (its Server-Timing header) and the rest, outside its view
    timed = [r for r in answered if burst[0] <= r["at"] < burst[1] and "total" in r.get("server", {})]
    parts = {name: [1000 * r["server"][name] for r in timed] for name in ("wait", "batch", "reply", "total")}
    parts["outside"] = [1000 * (r["latency"] - r["server"]["total"]) for r in timed]
    out["burst_split_ms"] = {name: {"p50": percentile(v, 50), "p95": percentile(v, 95)} for name, v in parts.items()}
    if reference is not None:  # the requests both this policy and fixed:0 answered (same trace position)
        both = [(i, a, b) for r, q in zip(records, reference) if r["status"] == 200 and q["status"] == 200
                for i, a, b in zip(r["indices"], r["labels"], q["labels"])]
        n = max(1, len(both))
        out["shared"] = len(both)
        out["shared_accuracy"] = 100 * sum(gold[i] == a for i, a, _ in both) / n
        out["shared_reference_accuracy"] = 100 * sum(gold[i] == b for i, _, b in both) / n
        out["agreement_with_reference"] = 100 * sum(a == b for _, a, b in both) / n
        if both:  # the paired difference, with a 95% bootstrap interval and a permutation test (scipy)
            from user_dir.common.significance import paired_glue
            names = {name: i for i, name in enumerate(sorted({x for t in both for x in t[1:]} | set(gold)))}
            test = paired_glue([[names[a] for _, a, _ in both]], [[names[b] for _, _, b in both]],
                               [names[gold[i]] for i, _, _ in both], "accuracy")
            out["shared_test"] = {key: test[key] for key in ("diff", "low", "high", "p")}
    return out




def series(records, arrivals, per_request, duration, step=1.0):
    """Per ``step``-second bin (by scheduled send time): offered and answered examples per second, mean k of
    the answered examples and p95 latency of the answered requests."""
    rows = []
    for b in range(int(math.ceil(duration / step))):
        lo, hi = b * step, (b + 1) * step
        inside = [r for r in records if lo <= r["at"] < hi]
        ok = [r for r in inside if r["status"] == 200]
        ks = [k for r in ok for k in r["ks"]]
        rows.append({"t": lo, "offered": per_request * sum(lo <= a < hi for a in arrivals) / step,
                     "answered": len(ks) / step,
                     "refused": per_request * sum(r["status"] == 503 for r in inside) / step,
                     "mean_k": statistics.mean(ks) if ks else None,
                     "p95_ms": percentile([r["latency"] * 1000 for r in ok], 95) if ok else None})
    return rows


def server_side(metrics_text):
    """What the server's /metrics say after the trace (prometheus_client's own parser): batches, mean batch
    size and mean batch seconds by k, and the adaptive policy's cost scale (measured / table batch time)."""
    from prometheus_client.parser import text_string_to_metric_families
    sums, counts, out = {}, {}, {"by_k": {}}
    size_sum = size_count = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "fc_serve_batch_seconds_sum":
                sums[sample.labels["k"]] = sample.value
            elif sample.name == "fc_serve_batch_seconds_count":
                counts[sample.labels["k"]] = sample.value
            elif sample.name == "fc_serve_examples_total":
                out["by_k"].setdefault(sample.labels["k"], {})["examples"] = sample.value
            elif sample.name == "fc_serve_cost_scale":
                out["cost_scale"] = sample.value
            elif sample.name == "fc_serve_batch_padded_tokens_total":
                out["by_k"].setdefault(sample.labels["k"], {})["padded_tokens"] = sample.value
            elif sample.name == "fc_serve_budget_seconds":
                out["budget"] = sample.value
    for k, n in counts.items():
        if n:
            row = out["by_k"].setdefault(k, {})
            row.update(batches=n, mean_batch_ms=1000 * sums[k] / n, mean_batch_size=row.get("examples", 0) / n)
            if "padded_tokens" in row:
                row["mean_padded"] = row["padded_tokens"] / n
    return out


def plot_serving(result, path):
    """Offered and answered examples/s, the mean k and the p95 latency over the trace, the first repeat of each
    policy, the burst's edges marked."""
    def missing(v):
        return v if v is not None else math.nan

    first = next(iter(result["policies"].values()))
    t = [row["t"] for row in first["series"]]
    edges = [dict(x=edge, color="grey", lw=0.8, ls=":") for edge in result["burst_window"]]
    answered = [dict(x=t, y=[row["offered"] for row in first["series"]], kind="step", where="post", color="black",
                     lw=2, label="offered")]
    ks, p95 = [], []
    runs = [(name, run) for name, run in result["policies"].items() if run["repeat"] == 1]  # the others: the tables
    for i, (name, run) in enumerate(runs):
        colour = f"C{i}"
        answered.append(dict(x=t, y=[row["answered"] for row in run["series"]], kind="step", where="post",
                             color=colour, label=f"answered, {name}"))
        ks.append(dict(x=t, y=[missing(row["mean_k"]) for row in run["series"]], kind="step", where="post",
                       color=colour, label=name))
        p95.append(dict(x=[row["t"] + 0.5 for row in run["series"]], marker=".", color=colour, label=name,
                        y=[missing(row["p95_ms"]) for row in run["series"]]))
    legend = dict(fontsize=8, loc="upper right")
    panels = [dict(series=answered, ylabel="examples / s", vlines=edges, grid=True, legend=legend),
              dict(series=ks, ylabel="mean k of answered examples", vlines=edges, grid=True, legend=legend),
              dict(series=p95, ylabel="p95 request latency per second (ms)", yscale="log", vlines=edges, grid=True,
                   legend=legend, xlabel="seconds into the trace (by scheduled send time)",
                   hlines=[dict(y=result["target_p95_ms"], color="black", ls="--", lw=1, label="target p95")])]
    plot_panels(path, panels, command=result["command"], shape=(3, 1), figsize=(9, 9), dpi=110, sharex=True,
                title=f"fc-serve, {result['task']}: idle, burst at {result['burst_factor']:g}x the backbone's "
                      "throughput, idle")


# ---- the report ----------------------------------------------------------------------------------------------------
def thousands(v, digits=0):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.{digits}f}"


def cost_rows(table):
    sizes = sorted({int(b) for row in table["seconds"].values() for b in row})
    lines = ["| k | " + " | ".join(f"batch {b}" for b in sizes) + " |", "|---|" + "---|" * len(sizes)]
    lengths = table.get("lengths") or {}
    if lengths:
        lines.append("| padded length | " + " | ".join(thousands(lengths.get(str(b)), 0) for b in sizes) + " |")
    for k, row in sorted(table["seconds"].items(), key=lambda kv: int(kv[0])):
        cells = [thousands(row[str(b)] * 1000, 1) if str(b) in row else "-" for b in sizes]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines


def write_serving_report(result, md_path, png_name):
    r, pol = result, result["policies"]
    L = [f"# Serving Variator: fc-serve under a burst ({r['task']} dev sentences)", "",
         f"Made by `{r['command']}` on {r['date']}; {r['machine']}; server: {r['threads']} torch thread(s), one "
         f"worker; client (asyncio + httpx) in another process on the same machine. Load average (1/5/15 min) "
         f"before the run: {r['load_before']}; after: {r['load_after']}; before each policy: "
         + "; ".join(f"{name} {run['load_before']}" for name, run in pol.items()) + ".", "",
         f"Backbone: `{r['teacher']['checkpoint']}` (sha256 {r['teacher']['sha256'][:12]}); {r['teacher']['note']}",
         "",
         f"Plugins ({', '.join('k=' + str(k) for k in r['ratios'] if k)}): {r['plugins_note']}", "",
         "Accuracy of each k on the whole dev set (user_dir.tools.glue_predict, offline): "
         + ", ".join(f"k={k}: {v:.2f}" for k, v in sorted(r["offline_accuracy"].items(), key=lambda kv: int(kv[0])))
         + f" ({r['dev_examples']} examples; one example = {100 / r['dev_examples']:.2f} points).", "",
         "## The trace", "",
         f"Seeded Poisson arrivals (seed {r['seed']}) of requests carrying {r['texts_per_request']} dev sentences each "
         f"(the dev set shuffled, then cycled): {r['idle_seconds']:g} s at {r['idle_rate']:.1f} sentences/s, "
         f"{r['burst_seconds']:g} s at {r['burst_rate']:.1f} sentences/s, {r['idle_seconds']:g} s at "
         f"{r['idle_rate']:.1f} sentences/s: {r['requests']:,} requests. The backbone's throughput, "
         f"{r['backbone_throughput']:.1f} examples/s, is full batches of {r['max_batch']} at k=0 in the cost table "
         f"the {r['calibrated_on']} server measured; idle = {r['idle_factor']:g}x, burst = {r['burst_factor']:g}x. "
         f"Server: `--max-batch {r['max_batch']} --max-wait-ms {r['max_wait_ms']:g} --max-queue {r['max_queue']}`, "
         f"adaptive target p95 {r['target_p95_ms']:.0f} ms"
         + (f", `--client-overhead-ms {r['client_overhead_ms']:.1f}` ({r['client_overhead_note']})"
            if r.get("client_overhead_ms") else "") + f". {r['defaults_note']}", ""] + \
        [f"Note: {n}" for n in r.get("notes", [])] + ([""] if r.get("notes") else []) + [
         "## Results", "",
         "| policy | p50 ms | p95 ms | p99 ms | burst p95 ms | requests answered | refused (503) | failed | "
         "throughput (sentences/s) | accuracy of answered sentences | vs fixed:0 on the sentences both answered | "
         "k share of answered sentences |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, run in pol.items():
        s = run["summary"]
        shared = (f"{s['shared_accuracy']:.2f} vs {s['shared_reference_accuracy']:.2f} ({s['shared']:,} sentences, "
                  f"{s['agreement_with_reference']:.1f}% same label)" if "shared" in s else "-")
        if "shared_test" in s:
            t = s["shared_test"]
            shared += f"; {t['diff']:+.2f} points [{t['low']:+.2f}, {t['high']:+.2f}], p {t['p']:.3f}"
        shares = ", ".join(f"k={k}: {100 * v:.0f}%" for k, v in s["k_share"].items())
        L.append(f"| {name} | {thousands(s['p50_ms'])} | {thousands(s['p95_ms'])} | {thousands(s['p99_ms'])} | "
                 f"{thousands(s['burst_p95_ms'])} | {s['answered']:,} | {s['refused']:,} | {s['failed']:,} | "
                 f"{s['throughput']:.1f} | {s['accuracy']:.2f} | {shared} | {shares} |")
    L += ["", "Latency: of a request, from its scheduled send time to its answer, answered requests only; burst "
              "p95: requests scheduled inside the burst. Throughput: answered sentences over the trace's duration. "
              "Against fixed:0 on the sentences both answered: the accuracies, the share of equal labels, the paired "
              "difference with its 95% bootstrap interval and a permutation test's p (scipy, 10,000 resamples, over "
              "the answered sentence instances: the dev set is cycled, so a sentence can count more than once). "
              "Client lag "
              "(p99 of how late the client sent a request): "
          + ", ".join(f"{name} {run['summary']['client_lag_p99_ms']:.0f} ms" for name, run in pol.items()) + ".", ""]
    if any("burst_split_ms" in run["summary"] for run in pol.values()):
        names = ("wait", "batch", "reply", "total", "outside")
        L += ["Where a burst request's time went, p50 / p95 of each part over the answered burst requests (ms; p95s "
              "do not add up): the server's own split from its Server-Timing header -- wait (arrival, before parsing, "
              "to the start of the request's last batch), batch (that batch's compute), reply (its end to the answer "
              "leaving the handler), total -- and outside: the client's latency less the server's total (the client "
              "sending late, the connection, the event loop reaching the request, the answer's transfer):", "",
              "| policy | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for name, run in pol.items():
            split = run["summary"].get("burst_split_ms")
            if split:
                L.append(f"| {name} | " + " | ".join(f"{thousands(split[n]['p50'])} / {thousands(split[n]['p95'])}"
                                                     for n in names) + " |")
        L.append("")
    L += ["The server's side of the trace (its /metrics after the trace; the start-up timing is not in them): "
          "batches run at each k, their mean size and mean compute time, beside the cost table's time for a batch "
          "of that mean size; "
          "'scale' is the adaptive policy's measured / table ratio its predictions used for a full batch at the end "
          "(the 95th percentile of its last batches of about that size), 'budget' the target less the p95 reply "
          "delay, the p95 event-loop lag and --client-overhead-ms then:", "",
          "| policy | k | batches | mean batch size | mean padded length | mean batch ms | cost table ms at that size "
          "and length | scale | budget ms |",
          "|---|---|---|---|---|---|---|---|---|"]
    from user_dir.serving.cost_table import CostTable
    for name, run in pol.items():
        table = CostTable.from_dict(run["cost_table"])
        side = run["server_side"]
        for k, row in sorted(side["by_k"].items(), key=lambda kv: int(kv[0])):
            if "batches" not in row:
                continue
            scale = f"{side['cost_scale']:.2f}" if "cost_scale" in side and name.startswith("adaptive") else "-"
            predicted = 1000 * table.batch_seconds(int(k), round(row["mean_batch_size"]), row.get("mean_padded"))
            budget = f"{1000 * side['budget']:.0f}" if "budget" in side and name.startswith("adaptive") else "-"
            L.append(f"| {name} | {k} | {row['batches']:,.0f} | {row['mean_batch_size']:.1f} | "
                     f"{thousands(row.get('mean_padded'), 1)} | {row['mean_batch_ms']:.0f} | {predicted:.0f} | "
                     f"{scale} | {budget} |")
    L += ["", "## Against the goal", ""] + [f"- {line}" for line in r["verdict"]] + [""]
    L += [f"![offered load, k chosen and latency over time]({png_name})", "", "## Cost tables measured at start-up", "",
          "Milliseconds per batch of real dev sentences (the first ones of the dev file, the server's --cost-texts), "
          "median of the server's --cost-runs; each policy's server measured its own:", ""]
    for name, run in pol.items():
        L += [f"{name}:", ""] + cost_rows(run["cost_table"]) + [""]
    L += ["## Scaling past one process", "",
          "One fc-serve process owns one model and one worker thread. More traffic is served by more replicas "
          "(one per core group or machine, each with its own --threads) behind an ordinary load balancer; each "
          "replica's adaptive policy reacts to its own queue, and a refused request (503 with Retry-After) can be "
          "retried on another replica. See user_dir/serving/README.md.", ""]
    write_text(md_path, "\n".join(L) + "\n" + faults_section(md_path))


# scripts/bench/serve_faults.py's section of the same report: kept when this script rewrites the rest
FAULTS_BEGIN, FAULTS_END = "<!-- serve_faults.py: begin -->", "<!-- serve_faults.py: end -->"


def faults_section(md_path) -> str:
    """The fault-and-abuse section of the report at ``md_path`` (with its markers; "" when there is none)."""
    if not os.path.isfile(md_path):
        return ""
    text = open(md_path, encoding="utf-8").read()
    if FAULTS_BEGIN not in text or FAULTS_END not in text:
        return ""
    return "\n" + text[text.index(FAULTS_BEGIN):text.index(FAULTS_END) + len(FAULTS_END)] + "\n"


def write_faults_section(md_path, section: str) -> None:
    """Put ``section`` (Markdown) in the report at ``md_path`` in place of its fault-and-abuse section, or after it."""
    text = open(md_path, encoding="utf-8").read() if os.path.isfile(md_path) else ""
    old = faults_section(md_path)
    if old:
        text = text.replace(old.strip("\n"), "").rstrip("\n") + "\n"
    write_text(md_path, text + ("\n" if text else "") + f"{FAULTS_BEGIN}\n{section.strip()}\n{FAULTS_END}\n")


def run_key(policy, repeat, repeats):
    """A run's name in the report: the policy, and its repeat when there are several."""
    return policy if repeats == 1 else f"{policy} #{repeat}"


def serving_verdict(result):
    pol, target = result["policies"], result["target_p95_ms"]
    lines = []
    for name, run in pol.items():
        s = run["summary"]
        lines.append(f"{name}: burst p95 {thousands(s['burst_p95_ms'])} ms, trace p95 {thousands(s['p95_ms'])} ms "
                     f"({'within' if s['p95_ms'] <= target else 'over'} the {target:.0f} ms target); "
                     f"{s['refused']:,} refused of {s['requests']:,}")
    goals = {}  # adaptive policy -> [(latency goal met, accuracy goal met)] over its repeats
    for name, run in pol.items():
        base = pol.get(run_key("fixed:0", run["repeat"], result["repeats"]), {}).get("summary")
        if not run["policy"].startswith("adaptive") or base is None:
            continue
        ad = run["summary"]
        kept = ad["burst_p95_ms"] <= target and ad["p95_ms"] <= target
        missed = base["burst_p95_ms"] > target
        diff = ad["accuracy"] - base["accuracy"]
        goals.setdefault(run["policy"], []).append((kept and missed, abs(diff) <= 1))
        lines.append(f"{name} against fixed:0{name[len(run['policy']):]} -- p95 within the target through the "
                     f"burst: {name} "
                     f"{'yes' if kept else 'no'}, fixed:0 {'no' if missed else 'yes'} -> the latency goal is "
                     f"{'met' if kept and missed else 'not met'}; accuracy of answered sentences "
                     f"{ad['accuracy']:.2f} vs {base['accuracy']:.2f} ({diff:+.2f} points; goal: within 1 point -> "
                     f"{'met' if abs(diff) <= 1 else 'not met'}), on the {ad.get('shared', 0):,} sentences both "
                     f"answered {ad.get('shared_accuracy', float('nan')):.2f} vs "
                     f"{ad.get('shared_reference_accuracy', float('nan')):.2f}"
                     + (f" ({ad['shared_test']['diff']:+.2f} points, 95% interval [{ad['shared_test']['low']:+.2f}, "
                        f"{ad['shared_test']['high']:+.2f}])" if "shared_test" in ad else "") + "; "
                     f"sentences answered {ad['examples_answered']:,} vs {base['examples_answered']:,}")
    for policy, met in goals.items():
        lines.append(f"{policy}: the latency goal met in {sum(a for a, _ in met)} of {len(met)} repeats, the accuracy "
                     f"goal in {sum(b for _, b in met)} of {len(met)}, both in {sum(a and b for a, b in met)} of "
                     f"{len(met)}")
    if result["repeats"] > 1:
        for policy in dict.fromkeys(run["policy"] for run in pol.values()):
            runs = [run["summary"] for run in pol.values() if run["policy"] == policy]
            lines.append(f"{policy}, median of {len(runs)} repeats: burst p95 "
                         f"{statistics.median(r['burst_p95_ms'] for r in runs):,.0f} ms, accuracy "
                         f"{statistics.median(r['accuracy'] for r in runs):.2f}, sentences answered "
                         f"{statistics.median(r['examples_answered'] for r in runs):,.0f}")
    return lines


def training_commands(folder):
    """The fairseq-train commands of scripts/recipes/variator.sh's work folder ``folder``: its stage markers
    (WORK/STAGE/DONE hold each stage's command), pre-training first."""
    out = []
    for name in ("pretrain", "plugin"):
        path = os.path.join(folder, name, "DONE")
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                out.append(shlex.split(f.read().strip()))
    return out


def flag(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd else None


def plugin_provenance(path):
    """How a plugin was trained, read from the logs beside it and beside the plugin it was initialised from."""
    rel = os.path.relpath(os.path.realpath(path), ROOT)
    cmds = training_commands(os.path.dirname(path))
    if not cmds:
        return f"{rel} (its training is not recorded beside it)"
    cmd = cmds[-1]
    text = f"{rel}: {flag(cmd, '--max-update')} updates of `fairseq-train --task {flag(cmd, '--task')} --criterion " \
           f"{flag(cmd, '--criterion')}` on `{os.path.relpath(flag(cmd, '--variator-backbone'), ROOT)}`"
    if flag(cmd, "--validate-interval-updates"):
        text += f", the best of its dev validations every {flag(cmd, '--validate-interval-updates')} updates"
    init = flag(cmd, "--variator-plugins")
    if init:
        before = cmds[:-1] or training_commands(os.path.dirname(init))
        text += (f", initialised from {os.path.relpath(init, ROOT)}" + (
            f" ({flag(before[-1], '--max-update')} pre-training updates on "
            f"`{os.path.relpath(flag(before[-1], '--variator-backbone'), ROOT)}`)" if before else ""))
    return text + f" (commands: {os.path.relpath(os.path.dirname(path), ROOT)}/*/DONE)"


# ---- main --------------------------------------------------------------------------------------------------
def default_plugins(variator_work, task, checkpoint):
    """Each k's plugin: WORK/plugin-kK.pt of every scripts/recipes/variator.sh work folder of ``variator_work``
    (comma-separated), each made on ``checkpoint`` (its result.json's teacher) for ``task``, in the order of k."""
    digest, found = sha256_of(checkpoint), []
    for folder in (f for f in variator_work.split(",") if f):
        files = glob.glob(os.path.join(folder, "plugin-k*.pt"))
        if len(files) != 1:
            sys.exit(f"bench_serving: --variator-work {folder}: expected one plugin-kK.pt of "
                     f"scripts/recipes/variator.sh, found {len(files)}")
        record = os.path.join(folder, "result.json")
        if os.path.isfile(record):
            with open(record) as f:
                made = json.load(f)
            if made.get("teacher", {}).get("sha256") not in (None, digest):
                sys.exit(f"bench_serving: {files[0]} was adapted to another backbone than {checkpoint}")
        found.append(files[0])
    if not found:
        sys.exit(f"bench_serving: no plugins: give --plugins, or --variator-work with the work folders of "
                 f"TEACHER={checkpoint} GLUE_TASK={task} K=k bash scripts/recipes/variator.sh WORK, one per k")
    return sorted(found, key=lambda p: int(os.path.basename(p)[len("plugin-k"):-3]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report-only", action="store_true",
                   help="rewrite --out's report (.md, .png) from its .json without running anything")
    p.add_argument("--task", default="SST-2", help="GLUE task (its dev sentences are the trace's requests)")
    p.add_argument("--checkpoint", default=None,
                   help="the backbone (default: work/glue/TASK/checkpoints/checkpoint_best.pt)")
    p.add_argument("--data", default=None, help="its data folder (default: work/glue/data-bin/TASK.wordpiece)")
    p.add_argument("--plugins", default=None, help="comma-separated plugin files (default: those of --variator-work)")
    p.add_argument("--variator-work", default=",".join(os.path.join(ROOT, "work", f"variator-sst2-k{k}") for k in (2, 4, 8)),
                   help="comma-separated work folders of scripts/recipes/variator.sh on the checkpoint, one per k "
                        "(default work/variator-sst2-k2,-k4,-k8)")
    p.add_argument("--policies", default="fixed:0,fixed:max,adaptive",
                   help="policies to run, in order (fixed:max = the largest plugin's ratio; adaptive@4+8 = the "
                        "adaptive policy with only the k=4 and k=8 plugins attached)")
    p.add_argument("--client-overhead-ms", type=float, default=None,
                   help="fc-serve --client-overhead-ms for the adaptive servers (default: measured in the first "
                        "run: the p95 of this client's latency less the server's Server-Timing total)")
    p.add_argument("--max-batch", type=int, default=32, help="fc-serve --max-batch")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="fc-serve --max-wait-ms")
    p.add_argument("--max-queue", type=int, default=None, help="fc-serve --max-queue (default: see the docstring)")
    p.add_argument("--target-p95-ms", type=float, default=None, help="adaptive target (default: see the docstring)")
    p.add_argument("--threads", type=int, default=1, help="fc-serve --threads (and OMP_NUM_THREADS)")
    p.add_argument("--cost-runs", type=int, default=3, help="fc-serve --cost-runs")
    p.add_argument("--idle-seconds", type=float, default=15.0)
    p.add_argument("--burst-seconds", type=float, default=20.0)
    p.add_argument("--idle-factor", type=float, default=0.2, help="idle rate / the backbone's throughput")
    p.add_argument("--burst-factor", type=float, default=3.0, help="burst rate / the backbone's throughput")
    p.add_argument("--texts-per-request", type=int, default=4,
                   help="dev sentences per request (default 4: at one per request, this 2-core machine's HTTP side -- "
                        "uvicorn and the httpx client beside the model's worker -- falls behind in the burst before "
                        "the server's queue sees the requests; see the report)")
    p.add_argument("--repeats", type=int, default=2,
                   help="runs of each policy, in turns (default 2; the report gives every run and the medians)")
    p.add_argument("--note", action="append", default=[], help="a sentence of provenance for the report")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0, help="client timeout per request, seconds")
    p.add_argument("--out", default=os.path.join(ROOT, "work", "serving", "serving.md"),
                   help="the report (a .json and a .png beside it); results/serving.md only when asked")
    args = p.parse_args(argv)
    if args.client_overhead_ms is not None and args.client_overhead_ms < 0:
        sys.exit(f"bench_serving: --client-overhead-ms {args.client_overhead_ms}: 0 or more")
    if args.report_only:
        stem = os.path.splitext(os.path.abspath(args.out))[0]
        if not os.path.isfile(stem + ".json"):
            sys.exit(f"bench_serving: --report-only: no {stem}.json (run the benchmark with this --out first)")
        with open(stem + ".json", encoding="utf-8") as f:
            result = json.load(f)
        result["verdict"] = serving_verdict(result)
        plot_serving(result, stem + ".png")
        write_serving_report(result, stem + ".md", os.path.basename(stem + ".png"))
        log(f"rewrote {stem}.md and .png from {stem}.json")
        return
    args.checkpoint = args.checkpoint or os.path.join(ROOT, "work", "glue", args.task, "checkpoints",
                                                      "checkpoint_best.pt")
    args.data = args.data or os.path.join(ROOT, "work", "glue", "data-bin", f"{args.task}.wordpiece")
    for path, flag in ((args.checkpoint, "--checkpoint"), (args.data, "--data")):
        if not os.path.exists(path):
            sys.exit(f"bench_serving: {flag} {path}: not found (scripts/recipes/glue_teachers.sh makes it)")
    args.plugin_files = args.plugins.split(",") if args.plugins else default_plugins(args.variator_work, args.task,
                                                                                      args.checkpoint)
    # the dev set (prepare_glue.py holds a slice of train out as 'valid', which chooses; dev reports)
    check_report_subset(args.data, args.task)
    text_dir = os.path.join(args.data, "text")
    raw, labels = (os.path.join(text_dir, f"{REPORT_SUBSET}.{name}") for name in ("raw.input0", "label"))
    if os.path.exists(os.path.join(text_dir, f"{REPORT_SUBSET}.raw.input1")):
        sys.exit("bench_serving: a single-sentence task is expected (the requests are single texts)")
    with open(raw, encoding="utf-8") as f:
        texts = f.read().splitlines()
    with open(labels, encoding="utf-8") as f:
        gold = f.read().splitlines()
    args.cost_texts = raw
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.abspath(args.out))[0]
    work = os.path.join(ROOT, "work", "serving", "runs")
    os.makedirs(work, exist_ok=True)
    import torch
    torch.set_num_threads(args.threads)
    from user_dir.tools.glue_predict import predict
    from user_dir.serving.cost_table import CostTable
    from user_dir.serving.policy import queue_bound
    # importing fairseq sets the root logger to DEBUG (fairseq/models/wav2vec/wav2vec2_classification.py calls
    # logging.basicConfig(level=DEBUG)): httpx and httpcore would then log every request of the trace, work the
    # client's process does on the cores it shares with the server
    logging.getLogger().setLevel(logging.INFO)
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)

    args.plugin_ratios = [int(torch.load(pf, map_location="cpu", weights_only=True)["config"]["ratio"])
                          for pf in args.plugin_files]
    ratios = [0] + sorted(args.plugin_ratios)
    load_before = loadavg()
    log(f"offline dev accuracy of each k ({len(texts)} sentences)")
    offline = {}
    for k in ratios:
        _, preds, dev_labels, _ = predict(args.data, args.checkpoint, REPORT_SUBSET,
                                          variator_plugins=",".join(args.plugin_files), variator_ratio=k)
        offline[str(k)] = 100 * sum(int(a) == int(b) for a, b in zip(preds, dev_labels)) / len(dev_labels)
    names_path = os.path.join(args.data, "label", "names.txt")
    with open(names_path, encoding="utf-8") as f:
        names = dict(line.rstrip("\n").split("\t", 1) for line in f if line.strip())
    gold_names = gold if set(gold) <= set(names.values()) else [names[g] for g in gold]

    policies = [s.replace("fixed:max", f"fixed:{ratios[-1]}") for s in args.policies.split(",")]
    result = {"command": invocation("bench_serving.py", argv),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), "threads": args.threads,
              "task": args.task, "ratios": ratios, "offline_accuracy": offline, "dev_examples": len(texts),
              "max_batch": args.max_batch, "max_wait_ms": args.max_wait_ms, "seed": args.seed,
              "idle_seconds": args.idle_seconds, "burst_seconds": args.burst_seconds, "idle_factor": args.idle_factor,
              "burst_factor": args.burst_factor, "load_before": load_before, "notes": args.note,
              "texts_per_request": args.texts_per_request, "repeats": args.repeats, "policies": {},
              "client_overhead_ms": args.client_overhead_ms,
              "client_overhead_note": "given (--client-overhead-ms)" if args.client_overhead_ms is not None else ""}
    teacher_dir = os.path.dirname(os.path.dirname(os.path.realpath(args.checkpoint)))
    note = open(os.path.join(teacher_dir, "command.txt")).read().strip() if os.path.exists(
        os.path.join(teacher_dir, "command.txt")) else "how it was trained is not recorded beside it"
    result["teacher"] = {"checkpoint": os.path.relpath(os.path.realpath(args.checkpoint), ROOT),
                         "sha256": sha256_of(args.checkpoint), "note": f"trained by: {note}"}
    result["plugins_note"] = "; ".join(plugin_provenance(pf) for pf in args.plugin_files)

    schedule = None
    # every policy once per repeat, the order reversed every other repeat (a machine whose load drifts
    # favours no policy by its place in the order)
    order = [(r, p) for r in range(1, args.repeats + 1) for p in (policies if r % 2 else policies[::-1])]
    for repeat, policy in order:
        key = run_key(policy, repeat, args.repeats)
        logfile = os.path.join(work, f"server-{key.replace(':', '').replace(' #', '-')}.log")
        result["policies"][key] = run = {"policy": policy, "repeat": repeat, "load_before": loadavg()}
        if schedule is None:  # calibrate on the first server's cost table: a throw-away start to read it
            log(f"calibrating: {policy} server measures its cost table")
            proc, out, url, _ = start_server(args, policy, args.target_p95_ms or 1000.0, args.max_queue or 1, logfile)
            health = wait_ready(proc, url, logfile)
            stop_server(proc, out)
            table = CostTable.from_dict(health["cost_table"])
            B = args.max_batch
            throughput = B / table.batch_seconds(0, B)
            target = args.target_p95_ms or 1000 * (2 * table.batch_seconds(0, B) + args.max_wait_ms / 1000)
            largest = ratios[-1]
            # full batches at the largest k that fit in the target, less the one a new example may find running
            max_queue = args.max_queue or queue_bound(table, largest, B, target / 1000)
            defaults = []
            if args.target_p95_ms is None:
                defaults.append(f"The target is the default: twice a full batch at k=0 "
                                f"({1000 * table.batch_seconds(0, B):.0f} ms) plus the batching wait")
            if args.max_queue is None:
                defaults.append(f"the queue bound is the default: the full batches k={largest} finishes within the "
                                f"target ({1000 * table.batch_seconds(largest, B):.0f} ms each), less one (the batch a "
                                "new example may find running), the same for every policy; the adaptive policy "
                                "also refuses a request predicted to miss its target at the largest k (the running "
                                "batch's rest, the queued batches' padded lengths, its measured speed)")
            result.update(backbone_throughput=throughput, target_p95_ms=target, max_queue=max_queue,
                          calibrated_on=policy, defaults_note=("; ".join(defaults) + ".") if defaults else "",
                          idle_rate=args.idle_factor * throughput, burst_rate=args.burst_factor * throughput)
            n = args.texts_per_request  # requests arrive at 1/n of the example rate, n examples each
            phases = [(args.idle_seconds, result["idle_rate"] / n), (args.burst_seconds, result["burst_rate"] / n),
                      (args.idle_seconds, result["idle_rate"] / n)]
            schedule = poisson_schedule(phases, args.seed)
            order = list(range(len(texts)))
            random.Random(args.seed).shuffle(order)
            requests = [[{"index": order[j % len(order)], "text": texts[order[j % len(order)]]}
                         for j in range(i * n, (i + 1) * n)] for i in range(len(schedule))]
            duration = sum(s for s, _ in phases)
            result.update(requests=len(schedule), duration=duration,
                          burst_window=[args.idle_seconds, args.idle_seconds + args.burst_seconds])
            log(f"backbone {throughput:.1f} ex/s -> idle {result['idle_rate']:.1f}, burst {result['burst_rate']:.1f} "
                f"sentences/s; target {target:.0f} ms; max queue {max_queue}; {len(schedule)} requests over "
                f"{duration:g} s")
        log(f"{key}: starting the server")
        proc, out, url, cmd = start_server(args, policy, result["target_p95_ms"], result["max_queue"], logfile,
                                           result.get("client_overhead_ms") or 0.0)
        health = wait_ready(proc, url, logfile)
        run["cost_table"] = health["cost_table"]
        run["server_command"] = " ".join(shlex.quote(c) for c in cmd[1:]).replace(ROOT + "/", "")
        log(f"{key}: replaying the trace")
        run["load_before"] = loadavg()
        records = asyncio.run(replay(url, schedule, requests, args.timeout))
        import httpx
        run["server_side"] = server_side(httpx.get(url + "/metrics", timeout=30).text)
        stop_server(proc, out)
        run["records"] = records
        if result.get("client_overhead_ms") is None:  # the client's p95 time outside the server, from this first run
            outside = [1000 * (r["latency"] - r["server"]["total"]) for r in records
                       if r["status"] == 200 and "total" in r.get("server", {})]
            result["client_overhead_ms"] = percentile(outside, 95)
            result["client_overhead_note"] = (f"the p95 of the client's latency less the server's Server-Timing "
                                              f"total over {key}'s answered requests")
            log(f"client overhead (p95 outside the server, {key}): {result['client_overhead_ms']:.1f} ms")
        run["series"] = series(records, schedule, args.texts_per_request, result["duration"])
        s = serving_summary(records, gold_names, result["burst_window"], result["duration"])
        log(f"{key}: p50 {s['p50_ms']:.0f} p95 {s['p95_ms']:.0f} p99 {s['p99_ms']:.0f} ms, burst p95 "
            f"{s['burst_p95_ms']:.0f} ms; answered {s['answered']}, refused {s['refused']}, failed {s['failed']}; "
            f"accuracy {s['accuracy']:.2f}; k share {s['k_share']}")
    for run in result["policies"].values():  # beside fixed:0's answers of the same repeat, once all have run
        reference = result["policies"].get(run_key("fixed:0", run["repeat"], args.repeats), {}).get("records")
        run["summary"] = serving_summary(run["records"], gold_names, result["burst_window"], result["duration"],
                                         reference if run["policy"] != "fixed:0" else None)
    result["load_after"] = loadavg()
    result["verdict"] = serving_verdict(result)
    png = stem + ".png"
    plot_serving(result, png)
    with open(os.path.join(work, "records.json"), "w") as f:  # every request, for whoever wants to look again
        json.dump({name: run["records"] for name, run in result["policies"].items()}, f)
    slim = json.loads(json.dumps(result))
    for run in slim["policies"].values():
        run.pop("records", None)
    write_json(stem + ".json", slim)
    write_serving_report(result, stem + ".md", os.path.basename(png))
    log(f"wrote {stem}.md, .json, .png")
    for line in result["verdict"]:
        log(line)


if __name__ == "__main__":
    main()
