#!/usr/bin/env python
"""fc-serve (user_dir/serving/) under a burst of traffic and under faults; one report (``--out``).

    python scripts/bench/bench_serving.py [burst] [--plugins k2.pt,k4.pt] [--out results/serving.md] [-- fc-serve flags]
    python scripts/bench/bench_serving.py faults [--out results/serving.md] -- CHECKPOINT [fc-serve flags]

burst: one server per policy and repeat replays a seeded Poisson trace of GLUE dev sentences (idle, a burst above the
backbone's throughput, idle): latency and its Server-Timing split, accuracy against fixed:0, /metrics, a series per
second (.json, .png). faults: a server with the fault hook (FC_SERVE_FAULTS=1) under every kind of hostile request,
faults in its batches and a burst cut by SIGTERM: its 5xx, hangs, lost requests and recovery.
"""
import argparse
import asyncio
import collections
import contextlib
import json
import logging
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time

from benchlib import (ROOT, command_line, environment, invocation, logger, machine, plot_panels, rel, write_json,
                      write_text)
from glue_bench import REPORT_SUBSET, check_report_subset
from record import sha256_of  # (scripts/experiments/, on the path benchlib sets)

from preprocess.textio import read_lines

log = logger("bench_serving")
# the burst's trace: idle, burst, idle (seconds; rates in multiples of the backbone's throughput), TEXTS dev sentences
# a request (at 1, a 2-core client falls behind); the faults' good requests and fc-serve's bounds (tight: small battery)
IDLE_S, BURST_S, IDLE_X, BURST_X, TEXTS, SEED = 15.0, 20.0, 0.2, 3.0, 4, 1
GOOD_TEXT, GOOD_GERMAN = "A man is playing a guitar on a stage.", "Ein Mann spielt Gitarre auf einer Bühne."
GOOD_PAIR = [GOOD_TEXT, "A person plays music."]
BOUNDS = dict(max_body_bytes=65536, max_texts=16, max_text_chars=4096, body_timeout_s=1.0, request_timeout_s=2.0)


def fmt(v, digits=0):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.{digits}f}"


def bound_flags(bounds) -> str:
    return " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in bounds.items())


def write_section(md_path, name, text):
    """``text`` as the report's section ``name``, in place of the old one or after the rest."""
    begin, end = f"<!-- section: {name} -->", f"<!-- /section: {name} -->"
    old = open(md_path, encoding="utf-8").read() if os.path.isfile(md_path) else "# fc-serve under load and faults\n"
    block = f"{begin}\n{text.strip()}\n{end}\n"
    write_text(md_path, old[:old.index(begin)] + block + old[old.index(end) + len(end):].lstrip("\n")
               if begin in old and end in old else old.rstrip("\n") + "\n\n" + block)


@contextlib.contextmanager
def fc_serve(args, log_path, **env):
    """fc-serve (checkpoint and flags: ``args``) on a free port, logging to ``log_path``, once /health answers."""
    import httpx
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "user_dir.serving.serve", *args, "--port", str(port), "--log-level", "warning"]
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**environment(1), **env}, cwd=ROOT)
    url, deadline = f"http://127.0.0.1:{port}", time.time() + 600
    try:
        while True:
            if proc.poll() is not None or time.time() > deadline:
                sys.exit(f"bench_serving: fc-serve exited ({proc.returncode}) or not ready in 10 min: {log_path}")
            with contextlib.suppress(httpx.TransportError):
                if (r := httpx.get(url + "/health", timeout=5)).status_code == 200:
                    break
            time.sleep(0.5)
        yield argparse.Namespace(proc=proc, url=url, port=port, cmd=cmd, health=r.json())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ==== burst ===========================================================================================================
def poisson_schedule(phases, seed: int):
    """Arrival times (seconds) of a Poisson process whose rate is constant within each (seconds, rate) phase."""
    rng, times, start = random.Random(seed), [], 0.0
    for seconds, rate in phases:
        t = start + (rng.expovariate(rate) if rate > 0 else seconds)
        while t < start + seconds:
            times.append(t)
            t += rng.expovariate(rate)
        start += seconds
    return times


def percentile(values, q):
    """The q-th percentile (0-100), numpy's linear interpolation; nan for no values."""
    import numpy as np
    return float(np.percentile(values, q)) if len(values) else math.nan


def server_timing(header: str) -> dict:
    """{name: seconds} from a W3C Server-Timing header (fc-serve's: wait, batch, reply, total)."""
    parts = (part.strip().partition(";") for part in header.split(","))
    return {name: float(value) / 1000 for name, _, params in parts if name
            for key, _, value in (p.strip().partition("=") for p in params.split(";")) if key == "dur"}


async def replay(url, arrivals, requests, texts):
    """Send request i (dev sentences requests[i]) at arrivals[i] s whatever the server does, never retrying: records."""
    import httpx
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=4000)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        t0 = time.perf_counter() + 1.0

        async def one(at, indices):
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            record = {"at": at, "lag": time.perf_counter() - (t0 + at), "indices": indices}
            try:
                r = await client.post("/classify", json={"texts": [texts[i] for i in indices]})
                record["status"] = r.status_code
                if r.status_code == 200:
                    results = r.json()["results"]
                    record.update(ks=[x["k"] for x in results], labels=[x["label"] for x in results],
                                  server=server_timing(r.headers.get("server-timing", "")))
            except httpx.HTTPError as e:
                record["status"] = f"error: {type(e).__name__}"
            record["latency"] = time.perf_counter() - (t0 + at)
            return record

        return await asyncio.gather(*(one(at, ix) for at, ix in zip(arrivals, requests)))


def serving_summary(records, gold, burst, duration, reference=None):
    """Latency per request; throughput, k and accuracy per sentence; against ``reference`` (fixed:0's records of the
    same trace) on the sentences both answered."""
    answered = [r for r in records if r["status"] == 200]
    refused, lat = sum(r["status"] == 503 for r in records), [r["latency"] * 1000 for r in answered]
    in_burst = [r for r in answered if burst[0] <= r["at"] < burst[1]]
    pairs = [(i, label) for r in answered for i, label in zip(r["indices"], r["labels"])]
    ks, n = collections.Counter(k for r in answered for k in r["ks"]), max(1, len(pairs))
    out = {"requests": len(records), "answered": len(answered), "refused": refused,
           "failed": len(records) - len(answered) - refused, "examples_answered": len(pairs),
           **{f"p{q}_ms": percentile(lat, q) for q in (50, 95, 99)},
           "burst_p95_ms": percentile([r["latency"] * 1000 for r in in_burst], 95), "burst_answered": len(in_burst),
           "throughput": len(pairs) / duration, "accuracy": 100 * sum(gold[i] == lab for i, lab in pairs) / n,
           "k_share": {str(k): c / n for k, c in sorted(ks.items())},
           "client_lag_p99_ms": percentile([r["lag"] * 1000 for r in records], 99)}
    # where a burst request's time went: the server's split (its Server-Timing header) and the rest, outside its view
    timed = [r for r in in_burst if "total" in r.get("server", {})]
    parts = {name: [1000 * r["server"][name] for r in timed] for name in ("wait", "batch", "reply", "total")}
    parts["outside"] = [1000 * (r["latency"] - r["server"]["total"]) for r in timed]
    out["burst_split_ms"] = {name: {"p50": percentile(v, 50), "p95": percentile(v, 95)} for name, v in parts.items()}
    if reference is not None:
        both = [(i, a, b) for r, q in zip(records, reference) if r["status"] == 200 and q["status"] == 200
                for i, a, b in zip(r["indices"], r["labels"], q["labels"])]
        m = max(1, len(both))
        out.update(shared=len(both), shared_accuracy=100 * sum(gold[i] == a for i, a, _ in both) / m,
                   shared_reference_accuracy=100 * sum(gold[i] == b for i, _, b in both) / m,
                   agreement_with_reference=100 * sum(a == b for _, a, b in both) / m)
        if both:  # the paired difference, a 95% bootstrap interval and a permutation test (scipy)
            from user_dir.common.significance import paired_glue
            ids = {x: i for i, x in enumerate(sorted({x for t in both for x in t[1:]} | set(gold)))}
            test = paired_glue([[ids[a] for _, a, _ in both]], [[ids[b] for _, _, b in both]],
                               [ids[gold[i]] for i, _, _ in both], "accuracy")
            out["shared_test"] = {key: test[key] for key in ("diff", "low", "high", "p")}
    return out


def series(records, duration):
    """Per second of the trace (by send time): sentences offered, answered, refused; mean k; p95 request latency."""
    rows = []
    for lo in range(int(math.ceil(duration))):
        inside = [r for r in records if lo <= r["at"] < lo + 1]
        ok = [r for r in inside if r["status"] == 200]
        ks = [k for r in ok for k in r["ks"]]
        rows.append({"t": lo, "offered": sum(len(r["indices"]) for r in inside), "answered": len(ks),
                     "refused": sum(len(r["indices"]) for r in inside if r["status"] == 503),
                     "mean_k": statistics.mean(ks) if ks else None,
                     "p95_ms": percentile([r["latency"] * 1000 for r in ok], 95) if ok else None})
    return rows


def server_side(metrics_text):
    """/metrics: per k the batches, their mean size, padded length and time; the cost scale and budget (seconds)."""
    from prometheus_client.parser import text_string_to_metric_families
    out, by_k = {}, collections.defaultdict(dict)
    names = {"fc_serve_batch_seconds_sum": "seconds", "fc_serve_batch_seconds_count": "batches",
             "fc_serve_examples_total": "examples", "fc_serve_batch_padded_tokens_total": "padded_tokens"}
    for s in (s for family in text_string_to_metric_families(metrics_text) for s in family.samples):
        if s.name in names:
            by_k[s.labels["k"]][names[s.name]] = s.value
        elif s.name in ("fc_serve_cost_scale", "fc_serve_budget_seconds"):
            out["cost_scale" if s.name.endswith("scale") else "budget"] = s.value
    for row in by_k.values():
        n, seconds = row.pop("batches", 0), row.pop("seconds", 0)
        if n:
            row.update(batches=n, mean_batch_ms=1000 * seconds / n, mean_batch_size=row.get("examples", 0) / n)
            row.update({"mean_padded": row["padded_tokens"] / n} if "padded_tokens" in row else {})
    return {"by_k": dict(by_k), **out}


def plot_serving(result, path):
    """Offered and answered sentences/s, mean k and p95 latency over the trace (each policy's first repeat)."""
    runs = [(name, run) for name, run in result["policies"].items() if run["repeat"] == 1]
    t, step = [row["t"] for row in runs[0][1]["series"]], dict(kind="step", where="post")
    answered = [dict(x=t, y=[row["offered"] for row in runs[0][1]["series"]], color="k", lw=2, label="offered", **step)]
    ks, p95 = [], []
    for i, (name, run) in enumerate(runs):
        get = lambda key: [math.nan if row[key] is None else row[key] for row in run["series"]]  # noqa: E731
        answered.append(dict(x=t, y=get("answered"), color=f"C{i}", label=f"answered, {name}", **step))
        ks.append(dict(x=t, y=get("mean_k"), color=f"C{i}", label=name, **step))
        p95.append(dict(x=[x + 0.5 for x in t], y=get("p95_ms"), marker=".", color=f"C{i}", label=name))
    common = dict(vlines=[dict(x=x, color="grey", lw=0.8, ls=":") for x in result["burst_window"]], grid=True,
                  legend=dict(fontsize=8, loc="upper right"))
    plot_panels(path, [dict(series=answered, ylabel="sentences / s", **common),
                       dict(series=ks, ylabel="mean k of answered sentences", **common),
                       dict(series=p95, ylabel="p95 request latency per second (ms)", yscale="log", **common,
                            xlabel="seconds into the trace (by scheduled send time)",
                            hlines=[dict(y=result["target_p95_ms"], color="k", ls="--", lw=1, label="target p95")])],
                command=result["command"], shape=(3, 1), figsize=(9, 9), dpi=110, sharex=True,
                title=f"fc-serve, {result['task']}: idle, burst at {result['burst_factor']:g}x the backbone, idle")


def serving_verdict(result):
    """Each adaptive run against fixed:0 of its repeat (latency goal: within the target through the burst where
    fixed:0 is not; accuracy goal: within 1 point), the goals' tally, each policy's median over its repeats."""
    pol, target, lines, goals, no = result["policies"], result["target_p95_ms"], [], {}, {True: "", False: "not "}
    for name, run in pol.items():
        base = pol.get(f"fixed:0 #{run['repeat']}", {}).get("summary")
        if not run["policy"].startswith("adaptive") or base is None:
            continue
        ad = run["summary"]
        diff, test = ad["accuracy"] - base["accuracy"], ad.get("shared_test")
        kept, missed = ad["burst_p95_ms"] <= target and ad["p95_ms"] <= target, base["burst_p95_ms"] > target
        goals.setdefault(run["policy"], []).append((kept and missed, abs(diff) <= 1))
        lines.append(f"{name} against fixed:0 -- p95 within the {target:.0f} ms target through the burst: {name} "
                     f"{'yes' if kept else 'no'}, fixed:0 {'no' if missed else 'yes'} -> the latency goal is "
                     f"{no[kept and missed]}met; accuracy of answered sentences {ad['accuracy']:.2f} vs "
                     f"{base['accuracy']:.2f} ({diff:+.2f} points; goal: within 1 point -> {no[abs(diff) <= 1]}met)"
                     + (f", on the {ad['shared']:,} sentences both answered {test['diff']:+.2f} points, 95% interval "
                        f"[{test['low']:+.2f}, {test['high']:+.2f}]" if test else ""))
    lines += [f"{policy}: the latency goal met in {sum(a for a, _ in met)} of {len(met)} repeats, the accuracy goal in "
              f"{sum(b for _, b in met)}, both in {sum(a and b for a, b in met)}" for policy, met in goals.items()]
    for policy in dict.fromkeys(run["policy"] for run in pol.values()) if result["repeats"] > 1 else ():
        s = [run["summary"] for run in pol.values() if run["policy"] == policy]
        median = lambda key: statistics.median(x[key] for x in s)  # noqa: E731
        lines.append(f"{policy}, median of {len(s)} repeats: burst p95 {median('burst_p95_ms'):,.0f} ms, accuracy "
                     f"{median('accuracy'):.2f}, sentences answered {median('examples_answered'):,.0f}")
    return lines


def burst_report(r, png_name):
    pol, parts, t = r["policies"], ("wait", "batch", "reply", "total", "outside"), r["teacher"]
    L = [f"## Under a burst ({r['task']} dev sentences)", "",
         f"Made by `{r['command']}` on {r['date']}; {r['machine']}; server: {r['threads']} torch thread(s), one worker;"
         f" client in another process; load (1/5/15 min) before {r['load_before']}, after {r['load_after']}.", "",
         f"Backbone: `{t['checkpoint']}` (sha256 {t['sha256'][:12]}), {t['note']}. Plugins: {r['plugins_note']}. Dev "
         f"accuracy offline ({r['dev_examples']}): " + ", ".join(f"k={k}: {v:.2f}" for k, v in
                                                                 r["offline_accuracy"].items()) + ".", "",
         f"The trace (seed {r['seed']}): {r['requests']:,} requests of {r['texts_per_request']} dev sentences, "
         f"{r['idle_rate']:.1f}, {r['burst_rate']:.1f}, {r['idle_rate']:.1f} sentences/s for {r['idle_seconds']:g}, "
         f"{r['burst_seconds']:g}, {r['idle_seconds']:g} s (the backbone's {r['backbone_throughput']:.1f} from the "
         f"{r['calibrated_on']} server's cost table). Server: `--max-batch {r['max_batch']} --max-wait-ms "
         f"{r['max_wait_ms']:g} --max-queue {r['max_queue']}` (the full batches the largest k finishes within the "
         f"target, less one), target p95 {r['target_p95_ms']:.0f} ms (twice a full batch at k=0 plus the wait), "
         f"`--client-overhead-ms {r['client_overhead_ms']:.1f}` ({r['client_overhead_note']}).", "",
         *[f"Note: {n}" for n in r["notes"]], *([""] if r["notes"] else []),
         "| run | p50 ms | p95 ms | p99 ms | burst p95 ms | answered | refused (503) | failed | sentences/s | accuracy "
         "| vs fixed:0 on the sentences both answered | k share | client lag p99 ms | load before |", "|---" * 14 + "|"]
    for name, run in pol.items():
        s, test = run["summary"], run["summary"].get("shared_test")
        shared = (f"{s['shared_accuracy']:.2f} vs {s['shared_reference_accuracy']:.2f} ({s['shared']:,}, "
                  f"{s['agreement_with_reference']:.1f}% same label)" if "shared" in s else "-")
        shared += f"; {test['diff']:+.2f} [{test['low']:+.2f}, {test['high']:+.2f}], p {test['p']:.3f}" if test else ""
        L.append(f"| {name} | " + " | ".join(fmt(s[k]) for k in ("p50_ms", "p95_ms", "p99_ms", "burst_p95_ms"))
                 + f" | {s['answered']:,} | {s['refused']:,} | {s['failed']:,} | {s['throughput']:.1f} | "
                 f"{s['accuracy']:.2f} | {shared} | " + ", ".join(f"k={k}: {100 * v:.0f}%" for k, v in
                                                                   s["k_share"].items())
                 + f" | {fmt(s['client_lag_p99_ms'])} | {run['load_before']} |")
    L += ["", "Accuracy: of the answered sentences; against fixed:0: the paired difference in points over the "
          "sentences both answered, a 95% bootstrap interval, a permutation test's p. A burst request's time, p50 / "
          "p95 ms (the server's Server-Timing; outside: the client's latency less the server's total):", "",
          "| run | " + " | ".join(parts) + " |", "|---" * (len(parts) + 1) + "|"]
    L += [f"| {name} | " + " | ".join(" / ".join(fmt(run["summary"]["burst_split_ms"][n][q]) for q in ("p50", "p95"))
                                      for n in parts) + " |" for name, run in pol.items()]
    return "\n".join(L + ["", "Against the goal:", "", *[f"- {line}" for line in r["verdict"]], "",
                          f"![offered load, k chosen and latency over time]({png_name})", ""])


def plugins_from_store(store_root, task, checkpoint):
    """[(plugin file, record)], one per k: the last record in the store of scripts/recipes/variator.sh on
    ``checkpoint`` for ``task``, its plugin WORK/plugin-kK.pt beside the scored WORK/plugin/checkpoint_*.pt."""
    from store import Store
    digest, found = sha256_of(checkpoint), {}
    for r in Store(store_root).records():
        v = r.get("variables") or {}
        if r.get("recipe") == "variator.sh" and v.get("GLUE_TASK") == task and r["teacher"]["sha256"] == digest:
            found[int(v["K"])] = r
    if not found:
        sys.exit(f"bench_serving: the store {rel(store_root)} holds no plugin of scripts/recipes/variator.sh on "
                 f"{rel(checkpoint)} for {task}: give --plugins, or run TEACHER={rel(checkpoint)} GLUE_TASK={task} K=k "
                 "bash scripts/recipes/variator.sh WORK for each k through grid.py (which files its record)")
    out = [(os.path.join(os.path.dirname(os.path.dirname(os.path.join(ROOT, r["checkpoint"]))), f"plugin-k{k}.pt"), r)
           for k, r in sorted(found.items())]
    for path, r in out:
        if not os.path.isfile(path):
            sys.exit(f"bench_serving: {path}: missing (the store's record {r['key'][:12]} names it)")
    return out


def plugin_provenance(path, record):
    """How a plugin was made: its record's recipe, variables and training (the store's, or WORK/result.json)."""
    if not record:
        return f"{rel(path)} (how it was trained is not recorded beside it)"
    text = f"{rel(path)}: {record['recipe']} " + " ".join(f"{n}={v}" for n, v in sorted(record["variables"].items())
                                                          if v)
    text += "".join(f"; {stage}: {s['updates']} updates" + (f", the best at {s['best_updates']}" if s.get(
        "best_updates") else "") for stage, s in (record.get("training") or {}).items() if s)
    return text + (f" (the store's record {record['key'][:12]})" if "key" in record else " (WORK/result.json)")


def burst(args, server_flags, argv):
    checkpoint = args.checkpoint or os.path.join(ROOT, "work", "glue", args.task, "checkpoints", "checkpoint_best.pt")
    data = args.data or os.path.join(ROOT, "work", "glue", "data-bin", f"{args.task}.wordpiece")
    for path, name in ((checkpoint, "--checkpoint"), (data, "--data")):
        if not os.path.exists(path):
            sys.exit(f"bench_serving: {name} {path}: not found (scripts/recipes/glue_teachers.sh makes it)")
    given = [(p, os.path.join(os.path.dirname(p), "result.json")) for p in (args.plugins or "").split(",") if p]
    plugins = [(p, json.load(open(r)) if os.path.isfile(r) else None) for p, r in given] or \
        plugins_from_store(args.store, args.task, checkpoint)
    check_report_subset(data, args.task)  # prepare_glue.py holds a slice of train out as 'valid'; dev reports
    text = os.path.join(data, "text", f"{REPORT_SUBSET}.raw.input")
    if os.path.exists(text + "1"):
        sys.exit("bench_serving: a single-sentence task is expected (the requests are single texts)")
    texts, gold = read_lines(text + "0"), read_lines(os.path.join(data, "text", f"{REPORT_SUBSET}.label"))
    stem, work = os.path.splitext(os.path.abspath(args.out))[0], os.path.join(ROOT, "work", "serving", "runs")
    import httpx
    import torch
    from user_dir.serving.cost_table import CostTable
    from user_dir.serving.policy import queue_bound
    from user_dir.tools.glue_predict import predict
    logging.getLogger().setLevel(logging.INFO)  # (fairseq's import sets DEBUG: httpx would log every request)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    files = [p for p, _ in plugins]
    by_k = {int(torch.load(f, map_location="cpu", weights_only=True)["config"]["ratio"]): f for f in files}
    ratios = [0] + sorted(by_k)
    policies = [p.replace("fixed:max", f"fixed:{ratios[-1]}") for p in args.policies.split(",")]
    for p in policies:
        if not {int(k) for k in p.partition("@")[2].split("+") if k} <= set(by_k):
            sys.exit(f"bench_serving: --policies {p}: the plugins attached have k in {sorted(by_k)}")
    loadavg = lambda: " ".join(f"{v:.2f}" for v in os.getloadavg())  # noqa: E731
    load_before, offline = loadavg(), {}
    log(f"offline dev accuracy of each k ({len(texts)} sentences)")
    for k in ratios:
        _, preds, labels, _ = predict(data, checkpoint, REPORT_SUBSET, variator_plugins=",".join(files),
                                      variator_ratio=k)
        offline[str(k)] = 100 * sum(int(a) == int(b) for a, b in zip(preds, labels)) / len(labels)
    names = dict(line.split("\t", 1) for line in read_lines(os.path.join(data, "label", "names.txt"), allow_empty=True)
                 if line.strip())
    gold = gold if set(gold) <= set(names.values()) else [names[g] for g in gold]

    def server(policy, target_ms, max_queue, key, overhead_ms=0.0):
        base, _, subset = policy.partition("@")
        flags = [checkpoint, "--data", data, "--policy", base, "--target-p95-ms", f"{target_ms:g}", "--max-queue",
                 str(max_queue), "--plugins", ",".join([by_k[int(k)] for k in subset.split("+")] if subset else files),
                 "--cost-texts", text + "0", *server_flags]
        flags += ["--client-overhead-ms", f"{overhead_ms:.1f}"] if base == "adaptive" and overhead_ms else []
        return fc_serve(flags, os.path.join(work, f"server-{key.replace(':', '').replace(' #', '-')}.log"))

    log(f"calibrating: the {policies[0]} server measures its cost table")
    with server(policies[0], 1000.0, 1, "calibration") as s:
        table, settings = CostTable.from_dict(s.health["cost_table"]), s.health
    B, full = settings["max_batch"], table.batch_seconds(0, settings["max_batch"])
    target = 1000 * (2 * full + settings["max_wait_ms"] / 1000)  # twice a full batch at k=0 plus the batching wait
    max_queue = queue_bound(table, ratios[-1], B, target / 1000)  # the full batches the largest k finishes, less one
    idle, peak, order = IDLE_X * B / full, BURST_X * B / full, list(range(len(texts)))
    schedule = poisson_schedule([(IDLE_S, idle / TEXTS), (BURST_S, peak / TEXTS), (IDLE_S, idle / TEXTS)], SEED)
    random.Random(SEED).shuffle(order)
    requests = [[order[j % len(order)] for j in range(i * TEXTS, (i + 1) * TEXTS)] for i in range(len(schedule))]
    duration, window = IDLE_S * 2 + BURST_S, [IDLE_S, IDLE_S + BURST_S]
    trained = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(checkpoint))), "command.txt")
    result = {"command": invocation("bench_serving.py", argv), "machine": machine(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": settings["threads"],
              "task": args.task, "ratios": ratios, "offline_accuracy": offline, "dev_examples": len(texts),
              "max_batch": B, "max_wait_ms": settings["max_wait_ms"], "seed": SEED, "idle_seconds": IDLE_S,
              "burst_seconds": BURST_S, "idle_factor": IDLE_X, "burst_factor": BURST_X, "load_before": load_before,
              "notes": args.note, "texts_per_request": TEXTS, "repeats": args.repeats, "policies": {},
              "teacher": {"checkpoint": rel(os.path.realpath(checkpoint)), "sha256": sha256_of(checkpoint),
                          "note": "trained by: " + open(trained).read().strip() if os.path.isfile(trained)
                          else "how it was trained is not recorded beside it"},
              "plugins_note": "; ".join(plugin_provenance(p, r) for p, r in plugins), "client_overhead_ms": None,
              "backbone_throughput": B / full, "target_p95_ms": target, "max_queue": max_queue,
              "calibrated_on": policies[0], "idle_rate": idle, "burst_rate": peak, "requests": len(schedule),
              "duration": duration, "burst_window": window}
    log(f"backbone {B / full:.1f} sentences/s -> idle {idle:.1f}, burst {peak:.1f}; target {target:.0f} ms; "
        f"max queue {max_queue}; {len(schedule)} requests over {duration:g} s")
    records = {}  # every policy once per repeat, the order reversed every other repeat (a drifting load favours none)
    for repeat, policy in [(r, p) for r in range(1, args.repeats + 1) for p in policies[::1 if r % 2 else -1]]:
        key = f"{policy} #{repeat}"
        with server(policy, target, max_queue, key, result["client_overhead_ms"] or 0.0) as s:
            run = result["policies"][key] = {"policy": policy, "repeat": repeat, "load_before": loadavg(),
                                             "cost_table": s.health["cost_table"],
                                             "server_command": command_line(s.cmd[1:]).replace(ROOT + "/", "")}
            log(f"{key}: replaying the trace")
            records[key] = asyncio.run(replay(s.url, schedule, requests, texts))
            run["server_side"] = server_side(httpx.get(s.url + "/metrics", timeout=30).text)
        if result["client_overhead_ms"] is None:  # the client's p95 time outside the server, in this first run
            result["client_overhead_ms"] = percentile([1000 * (r["latency"] - r["server"]["total"]) for r in
                                                       records[key] if "total" in r.get("server", {})], 95)
            result["client_overhead_note"] = f"the p95 of the client's latency less the server's total in {key}"
    for key, run in result["policies"].items():  # beside fixed:0's answers of the same repeat
        reference = records.get(f"fixed:0 #{run['repeat']}") if run["policy"] != "fixed:0" else None
        run["summary"] = serving_summary(records[key], gold, window, duration, reference)
        run["series"] = series(records[key], duration)
    result.update(load_after=loadavg(), verdict=serving_verdict(result))
    plot_serving(result, stem + ".png")
    write_text(os.path.join(work, "records.json"), json.dumps(records))  # every request, to look at again
    write_json(stem + ".json", result)
    write_section(stem + ".md", "burst", burst_report(result, os.path.basename(stem + ".png")))
    log("\n".join([f"wrote {stem}.md, .json, .png", *result["verdict"]]))
    return result


# ==== faults ==========================================================================================================
def kinds(endpoint: str, field: str, good, limits: dict, max_length: int):
    """(kind, group, body, expected answers) of every hostile request: bytes POSTed to ``endpoint``, a (method, path,
    bytes) triple, or a coroutine on a raw socket (called with the port); "4xx", "2xx": any of the class."""
    pairs, f, one, big = field == "pairs", field.encode(), json.dumps({field: good}).encode(), limits["max_body_bytes"]
    j = lambda v: json.dumps(v).encode()  # noqa: E731
    text = lambda t: [t, "b"] if pairs else t  # noqa: E731  (a text where the field wants one; a pair's first)
    deep, long_words = b"[" * 20000 + b"]" * 20000, " ".join(["x"] * (max_length + 10))  # (over the model's length)

    def raw(parts=(), pause=0.0, close_early=False, length=None, chunked=False, extra=b"", head=None):
        """A POST's head (Content-Length ``length`` or chunked, ``extra`` headers), then ``parts`` ``pause`` s apart:
        the answer's status, "closed" (none), "gone" (we closed first) or "hang" (nothing within 10 s)."""
        head = head or (f"POST {endpoint} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
                        + (b"Transfer-Encoding: chunked\r\n" if chunked else b"" if length is None
                           else b"Content-Length: %d\r\n" % length) + extra + b"\r\n")

        async def request(port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                for i, part in enumerate([head, *parts]):
                    await asyncio.sleep(pause if i else 0)
                    writer.write(part)
                    await writer.drain()
                if close_early:
                    return "gone"
                answer = (await asyncio.wait_for(reader.readline(), 10.0)).split()
                return int(answer[1]) if len(answer) >= 2 and answer[1].isdigit() else "closed"
            except asyncio.TimeoutError:
                return "hang"
            except OSError:
                return "closed"
            finally:
                writer.close()
        return request

    table = {
        "malformed": [
            ("malformed JSON", b'{"%s": [' % f, {400}), ("empty body", b"", {400}), ("not JSON", b"hello", {400}),
            ("invalid UTF-8", b'{"texts": "\xff\xfe"}', {400}), ("deeply nested JSON", deep, {400}),
            ("huge integer literal", b'{"truncate": ' + b"9" * 5000 + b"}", {400}),
            ("deeply nested field", b'{"%s": ' % f + deep + b"}", {400})],
        "wrong shape": [
            ("top-level array", b"[1, 2]", {422}), ("top-level string", b'"texts"', {422}),
            ("top-level null", b"null", {422}), ("unknown field", j({field: good, "colour": "red"}), {422}),
            ("texts and pairs", j({"texts": "a", "pairs": ["a", "b"]}), {422}), ("no texts", b"{}", {422}),
            ("texts a number", j({field: 7}), {422}), ("empty list", j({field: []}), {422}),
            ("a bad element", j({field: ["a", 1] if pairs else ["a", None]}), {422}),
            ("truncate a string", j({field: good, "truncate": "no"}), {422}),
            ("truncate NaN", b'{"%s": %s, "truncate": NaN}' % (f, j(good)), {422}),
            ("the other input", j({"texts" if pairs else "pairs": GOOD_PAIR}), {422})],
        "bad text": [
            ("empty text", j({field: text("")}), {422}), ("whitespace text", j({field: text(" \t\n")}), {422}),
            ("lone surrogate", b'{"%s": %s}' % (f, b'["\\ud800", "b"]' if pairs else b'"\\ud800 x"'), {422}),
            ("NUL characters", j({field: text("a\u0000b")}), {"2xx", "4xx"}),
            ("symbols only", j({field: ["%%%", "@@@"] if pairs else "%%% @@@ ###"}), {"2xx", "4xx"}),
            ("over the model's length, no truncation", j({field: text(long_words), "truncate": False}), {422})],
        "oversized": [
            ("too many texts", j({field: [good] * (limits["max_texts"] + 1)}), {413}),
            ("a too long text", j({field: text("x" * (limits["max_text_chars"] + 1))}), {413}),
            ("body over the bound", b'{"%s": "' % f + b"x" * big + b'"}', {413}),
            ("Content-Length over the bound, no body", raw(length=100 * big), {413}),
            ("chunked body over the bound",
             raw([b"10000\r\n" + b"x" * 65536 + b"\r\n"] * (big // 65536 + 2), chunked=True), {413})],
        "protocol": [
            ("wrong endpoint", ("POST", "/translate" if endpoint == "/classify" else "/classify", one), {404}),
            ("GET on a POST endpoint", ("GET", endpoint, b""), {405}), ("unknown path", ("POST", "/admin", one), {404}),
            ("not an HTTP request", raw(head=b"GARBAGE\r\n\r\n"), {400, "closed"}),
            ("bad Content-Length", raw(extra=b"Content-Length: abc\r\n"), {400, "closed"}),
            ("100 kB header", raw([one], length=len(one), extra=b"X-Big: " + b"a" * 100_000 + b"\r\n"),
             {200, "closed", "4xx"})],  # (uvicorn reads a header that arrives whole; a slow one it bounds)
        "slow client": [
            ("slow body (under the body timeout)",
             raw([one[:5], one[5:]], limits["body_timeout_s"] / 4, length=len(one)), {200}),
            ("body that never ends", raw([one], length=len(one) + 100), {408}),
            ("headers, then silence", raw(length=len(one)), {408})],
        "disconnecting client": [
            ("disconnect mid-body", raw([one], close_early=True, length=len(one) + 100), {"gone"}),
            ("disconnect before the answer", raw([one], close_early=True, length=len(one)), {"gone"})]}
    return [(kind, group, body, expected) for group, rows in table.items() for kind, body, expected in rows]


async def send(client, method, url, probes=None, **kwargs):
    """The answer's status and text, or "hang" (client timeout), "refused" (nothing listens), "closed" (no answer);
    the status goes to ``probes`` too ("cancelled": the caller gave up)."""
    import httpx
    status, detail = "cancelled", ""
    try:
        r = await client.request(method, url, **kwargs)
        status, detail = r.status_code, r.text[:200]
    except httpx.TransportError as e:
        status = "refused" if isinstance(e, httpx.ConnectError) else "hang" if isinstance(
            e, httpx.TimeoutException) else "closed"
    finally:
        if probes is not None:
            probes.append(status)
    return status, detail


async def battery(server, endpoint, field, good, limits, size, probes):
    """The hostile kinds; /health while the largest allowed request is parsed; the injected faults and ``size``
    cancelled requests, each followed by the seconds until a good request is answered again; ``size`` good requests
    cut by SIGTERM: those queued (behind a paused batch) answered or "lost", those sent after it answered, 503,
    "refused" (the port closed) or "closed unread" (closed before the server read them: safe to retry)."""
    import httpx
    records, faults, health_ms, url = [], [], [], server.url + endpoint
    post = lambda client, body, out=None: send(client, "POST", url, out, json={field: body})  # noqa: E731
    marked = lambda fault: [f"{good[0]} FC_SERVE_FAULT:{fault}", good[1]] if field == "pairs" else \
        f"{good} FC_SERVE_FAULT:{fault}"  # noqa: E731  (the fault hook's mark, user_dir/serving/faults.py)

    async def recover(give_up=30.0):
        start = time.perf_counter()
        while time.perf_counter() - start < give_up:
            if (await post(client, good, probes))[0] == 200:
                return time.perf_counter() - start
            await asyncio.sleep(0.05)

    async with httpx.AsyncClient(timeout=limits["body_timeout_s"] + limits["request_timeout_s"] + 10) as client:
        for kind, group, body, expected in kinds(endpoint, field, good, limits, server.health["model"]["max_length"]):
            start, call = time.perf_counter(), body if isinstance(body, tuple) else ("POST", endpoint, body)
            status, detail = (await body(server.port), "") if callable(body) else await send(
                client, call[0], server.url + call[1], content=call[2], headers={"content-type": "application/json"})
            records.append({"kind": kind, "group": group, "status": status, "expected": sorted(map(str, expected)),
                            "ok": status in expected or isinstance(status, int) and f"{status // 100}xx" in expected,
                            "seconds": round(time.perf_counter() - start, 3), "detail": detail})
        longest = ("word " * (limits["max_text_chars"] // 5))[:limits["max_text_chars"]]
        count = min(limits["max_texts"], limits["max_body_bytes"] // (2 * limits["max_text_chars"] + 16))
        heavy = asyncio.ensure_future(post(client, [[longest] * 2 if field == "pairs" else longest] * count))
        while not heavy.done():
            start = time.perf_counter()
            await client.get(server.url + "/health")
            health_ms.append(1000 * (time.perf_counter() - start))
            await asyncio.sleep(0.02)
        records.append({"kind": "the largest allowed request", "group": "oversized", "status": heavy.result()[0],
                        "expected": ["200"], "ok": heavy.result()[0] == 200, "seconds": None, "detail": ""})
        for fault, expected in (("fail", 500), ("kill", 500), ("slow", 504)):
            r = await client.post(url, json={field: marked(fault)})
            faults.append({"fault": fault, "status": r.status_code, "ok": r.status_code == expected,
                           "detail": r.json().get("detail", "")[:160], "recover_s": await recover()})
        cancelled = [asyncio.ensure_future(post(client, [good] * 4, probes)) for _ in range(size)]
        await asyncio.sleep(0.05)  # then given up by the client (the server's handlers see them go)
        for task in cancelled:
            task.cancel()
        await asyncio.gather(*cancelled, return_exceptions=True)
        faults.append({"fault": f"{size} requests cancelled by their client", "status": "-", "ok": True,
                       "detail": "", "recover_s": await recover()})
        health = (await client.get(server.url + "/health")).json()
    async with httpx.AsyncClient(timeout=limits["request_timeout_s"] + 30,
                                 limits=httpx.Limits(max_connections=size + 1)) as client:
        first = [asyncio.ensure_future(post(client, marked("pause")))]
        await asyncio.sleep(0.1)
        first += [asyncio.ensure_future(post(client, good)) for _ in range(size // 2 - 1)]
        deadline = time.perf_counter() + 5
        while time.perf_counter() < deadline and \
                (await client.get(server.url + "/health")).json()["queued"] < size // 2 - 1:
            await asyncio.sleep(0.01)
        server.proc.send_signal(signal.SIGTERM)
        second = []
        for _ in range(size - size // 2):
            await asyncio.sleep(0.05)
            second.append(asyncio.ensure_future(post(client, good)))
        first, second = await asyncio.gather(*first), await asyncio.gather(*second)
    return records, faults, health, health_ms, [{"closed": "lost"}.get(s, s) for s, _ in first], \
        [{"closed": "closed unread"}.get(s, s) for s, _ in second]


def faults(args, server_args, argv):
    """fc-serve with the fault hook and the bounds BOUNDS (unless given after --): the battery; a summary, a report."""
    if not server_args:
        sys.exit("bench_serving faults: give fc-serve's checkpoint and flags after --")
    stem = os.path.splitext(os.path.abspath(args.out))[0]
    log_path = os.path.join(ROOT, "work", "serving", "faults_server.log") if stem.startswith(
        os.path.join(ROOT, "results", "")) else stem + "_faults_server.log"
    timeout = float(dict(zip(server_args, server_args[1:])).get("--request-timeout-s", BOUNDS["request_timeout_s"]))
    with fc_serve([*bound_flags(BOUNDS).split(), *server_args], log_path, FC_SERVE_FAULTS="1",
                  FC_SERVE_FAULT_SLOW_S=f"{timeout + 1:g}") as server:  # the injected slow batch: a 504
        limits, model, probes = {name: server.health[name] for name in BOUNDS}, server.health["model"], []
        endpoint, field = "/" + model["task"], "pairs" if model.get("inputs") == "pairs" else "texts"
        good = GOOD_PAIR if field == "pairs" else GOOD_GERMAN if endpoint == "/translate" else GOOD_TEXT
        started = time.perf_counter()
        records, fault_rows, health, health_ms, before, after = asyncio.run(
            battery(server, endpoint, field, good, limits, args.burst, probes))
        seconds = time.perf_counter() - started
    text = open(log_path, encoding="utf-8", errors="replace").read()
    injected, others = [f["status"] for f in fault_rows if f["status"] != "-"], [x["status"] for x in records] + probes
    statuses = others + before + after + injected  # (the burst's 503s: refused while shutting down)
    is_5xx = lambda s: isinstance(s, int) and s >= 500  # noqa: E731
    count = lambda values: dict(sorted(collections.Counter(map(str, values)).items()))  # noqa: E731
    r = {"command": server.cmd, "model": health["model"], "limits": limits, "seconds": round(seconds, 1),
         "kinds": records, "faults": fault_rows, "burst": before + after, "requests": len(statuses),
         "burst_before_signal": count(before), "burst_after_signal": count(after),
         "answered_by_status": count(statuses),
         "unexpected": [x for x in records if not x["ok"]] + [f for f in fault_rows if not f["ok"]],
         "server_errors_not_injected": sum(map(is_5xx, others)) + sum(is_5xx(s) and s != 503 for s in before + after),
         "injected_5xx": sum(map(is_5xx, injected)), "hangs": statuses.count("hang"), "lost": before.count("lost"),
         "worker_restarts": health["worker_restarts"], "health_during_largest_ms": {"n": len(health_ms), **(
             {"median": round(statistics.median(health_ms), 1), "max": round(max(health_ms), 1)} if health_ms else {})},
         "shutdown_clean": server.proc.returncode in (0, -signal.SIGTERM) and "worker stopped" in text,
         "tracebacks_in_log": text.count("Traceback"),  # and the tokenisers' progress lines (no line per request)
         "progress_lines_in_log": sum("tokenising" in line or "applying BPE" in line for line in text.splitlines())}
    if args.json:
        write_json(args.json, r)
    h, by_status = r["health_during_largest_ms"], lambda counts: ", ".join(f"{s}: {n}" for s, n in counts.items())
    write_section(args.out, "faults", "\n".join([
        "## Faults and hostile input", "",
        f"Made by `{invocation('bench_serving.py', argv)}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{machine()}; server: 1 torch thread, one worker, `FC_SERVE_FAULTS=1`, bounds `{bound_flags(limits)}`; "
        f"client: asyncio + httpx and raw sockets in another process, loopback. Model: {json.dumps(r['model'])}.", "",
        *[f"Note: {note}" for note in args.note], *([""] if args.note else []),
        f"- requests tried: {r['requests']} in {r['seconds']:g} s ({len(records)} kinds, 3 injected faults, "
        f"{args.burst} cancelled by their client, the recoveries' probes, a burst of {args.burst} cut by SIGTERM)",
        f"- answers by status: {by_status(r['answered_by_status'])}",
        f"- 5xx: {r['injected_5xx']} from the injected faults, {r['server_errors_not_injected']} otherwise (goal 0); "
        f"hangs: {r['hangs']} (goal 0); requests lost: {r['lost']} (goal 0)",
        f"- worker restarts: {r['worker_restarts']}; answered other than expected: {len(r['unexpected'])}; tracebacks "
        f"in the server's log: {r['tracebacks_in_log']} (the injected faults'), tokeniser progress lines: "
        f"{r['progress_lines_in_log']}; shutdown clean: {r['shutdown_clean']}",
        f"- `/health` while the largest allowed request was parsed: median {h.get('median', '-')} ms, max "
        f"{h.get('max', '-')} ms over {h['n']} probes", "",
        "| fault | answer | detail | seconds until a good request is answered again |", "|---|---|---|---|",
        *[f"| {f['fault']} | {f['status']} | {f['detail'].replace('|', '/')} | {fmt(f['recover_s'], 2)} |"
          for f in fault_rows], "",
        f"The burst cut by SIGTERM: queued when it came (behind a paused batch) {by_status(r['burst_before_signal'])}; "
        f"sent after it {by_status(r['burst_after_signal'])} (503: refused while shutting down; refused: the port "
        "closed; closed unread: closed before the server read the request).", "",
        "| group | kind | expected (never a 5xx) | answer |", "|---|---|---|---|",
        *[f"| {x['group']} | {x['kind']} | {' or '.join(x['expected'])} | {x['status']} |" for x in records], ""]))
    print(json.dumps({k: r[k] for k in ("requests", "answered_by_status", "server_errors_not_injected", "hangs", "lost",
                                        "worker_restarts", "unexpected")}, indent=1))
    return r


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, server_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    if not ours or ours[0] not in ("burst", "faults", "-h", "--help"):
        ours = ["burst"] + ours  # (the default subcommand)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")
    b = sub.add_parser("burst", help="the load benchmark (after --: more fc-serve flags, e.g. --max-batch 32)")
    f = sub.add_parser("faults", help="faults and hostile input (after --: fc-serve's checkpoint and flags; unless "
                                      f"given there, {bound_flags(BOUNDS)})")
    for q in (b, f):
        q.add_argument("--out", default=os.path.join(ROOT, "work", "serving", "serving.md"),
                       help="the report (the burst: a .json and .png beside it); results/... only when asked")
        q.add_argument("--note", action="append", default=[], help="a sentence of provenance for the report")
    b.add_argument("--task", default="SST-2", help="GLUE task (its dev sentences are the trace's requests)")
    b.add_argument("--checkpoint", help="the backbone (default work/glue/TASK/checkpoints/checkpoint_best.pt)")
    b.add_argument("--data", help="its data folder (default work/glue/data-bin/TASK.wordpiece)")
    b.add_argument("--plugins", help="comma-separated plugin files (default: the store's records of "
                                     "scripts/recipes/variator.sh on the checkpoint for the task)")
    b.add_argument("--store", default=os.path.join(ROOT, "results", "store"), help="the results store")
    b.add_argument("--policies", default="fixed:0,fixed:max,adaptive",
                   help="policies in order (fixed:max: the largest k; adaptive@4+8: only k=4 and k=8 attached)")
    b.add_argument("--repeats", type=int, default=2, help="runs of each policy, in turns")
    f.add_argument("--burst", type=int, default=24, help="requests in the burst with shutdown, and cancelled ones")
    f.add_argument("--json", help="also the whole result as JSON here")
    args = p.parse_args(ours)
    return (burst if args.command == "burst" else faults)(args, server_args, argv)


if __name__ == "__main__":
    main()
