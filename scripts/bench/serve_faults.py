#!/usr/bin/env python
"""fc-serve under faults and hostile input (issue 43): start one server with the fault hook on
(``FC_SERVE_FAULTS=1``, user_dir/serving/faults.py) and tight request bounds, send it every kind of
malformed, oversized, slow, disconnecting and cancelled request, inject faults into its batches, then a
burst of good requests with a SIGTERM in the middle; count what came back.

    python scripts/bench/serve_faults.py --out results/serving.md -- CHECKPOINT [fc-serve flags ...]

Everything after ``--`` is fc-serve's command line (the model, its plugins and policy); this script adds
``--max-body-bytes``, ``--max-texts``, ``--max-text-chars``, ``--body-timeout-s`` and ``--request-timeout-s``
(its own flags of the same names) and a free localhost port. Loopback only, bounded: each kind sends one
request (a few for the cancelled ones), each with a client timeout; a request without an answer within it is
a hang. Reported: requests tried, answers by status and kind, 5xx outside the injected faults, hangs, requests
lost (sent whole, then the connection closed without an answer), worker restarts (``/health``), the seconds
from each fault's answer until a good request is answered again, and ``/health``'s latency while a request
of the largest allowed size is parsed and tokenised. tests/test_serve_faults.py runs it on a tiny model.
"""
import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from bench_serving import free_port, stop_server, wait_ready, write_faults_section
from benchlib import ROOT, environment, invocation, machine, write_json

GOOD_TEXT = "A man is playing a guitar on a stage."
GOOD_PAIR = ["A man is playing a guitar on a stage.", "A person plays music."]
GOOD_GERMAN = "Ein Mann spielt Gitarre auf einer Bühne."
CLIENT_ERROR = set(range(400, 500))
ANY_ANSWER = set(range(200, 300)) | CLIENT_ERROR  # (expected statuses: an answer or a refusal, never a 5xx)


# ---- raw HTTP over a socket (what httpx will not send) -----------------------------------------------------
async def raw_request(port, head: bytes, body_parts=(), pause=0.0, close_early=False, timeout=10.0):
    """Send ``head`` then each of ``body_parts`` ``pause`` s apart; the answer's status, "closed" (the server
    closed without one), "gone" (we closed first: ``close_early``) or "hang" (nothing within ``timeout``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        for part in body_parts:
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
            writer.write(part)
        await writer.drain()
        if close_early:
            return "gone"
        try:
            line = await asyncio.wait_for(reader.readline(), timeout)
        except asyncio.TimeoutError:
            return "hang"
        parts = line.split()
        return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else "closed"
    except (ConnectionError, OSError):
        return "closed"
    finally:
        writer.close()


def post_head(path: str, length=None, chunked=False, extra=b"") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
    if chunked:
        head += b"Transfer-Encoding: chunked\r\n"
    elif length is not None:
        head += f"Content-Length: {length}\r\n".encode()
    return head + extra + b"\r\n"


# ---- the battery -------------------------------------------------------------------------------------------
def kinds(endpoint: str, field: str, good, limits: dict, max_length: int):
    """(kind, group, body or a coroutine factory, expected statuses) of every hostile request: ``body`` bytes are
    POSTed to ``endpoint`` with httpx, a factory is called with the port (raw sockets)."""
    other = "/translate" if endpoint == "/classify" else "/classify"
    long_words = " ".join(["x"] * (max_length + 10))  # over the model's length, under --max-text-chars
    one = json.dumps({field: good}).encode()
    j = lambda value: json.dumps(value).encode()  # noqa: E731
    bad_element = {field: ["a", 1]} if field == "pairs" else {field: ["a", None]}
    deep = b"[" * 20000 + b"]" * 20000
    big = limits["max_body_bytes"]
    return [
        ("malformed JSON", "malformed", b'{"%s": [' % field.encode(), {400}),
        ("empty body", "malformed", b"", {400}),
        ("not JSON", "malformed", b"hello", {400}),
        ("invalid UTF-8", "malformed", b'{"texts": "\xff\xfe"}', {400}),
        ("huge integer literal", "malformed", b'{"truncate": ' + b"9" * 5000 + b"}", {400}),
        ("deeply nested JSON", "malformed", deep, {400}),
        ("deeply nested field", "malformed", b'{"%s": ' % field.encode() + deep + b"}", {400}),
        ("top-level array", "wrong shape", b"[1, 2]", {422}),
        ("top-level string", "wrong shape", b'"texts"', {422}),
        ("top-level null", "wrong shape", b"null", {422}),
        ("unknown field", "wrong shape", j({field: good, "colour": "red"}), {422}),
        ("texts and pairs", "wrong shape", j({"texts": "a", "pairs": ["a", "b"]}), {422}),
        ("no texts", "wrong shape", b"{}", {422}),
        ("texts a number", "wrong shape", j({field: 7}), {422}),
        ("empty list", "wrong shape", j({field: []}), {422}),
        ("a bad element", "wrong shape", j(bad_element), {422}),
        ("truncate a string", "wrong shape", j({field: good, "truncate": "no"}), {422}),
        ("truncate NaN", "wrong shape", b'{"%s": %s, "truncate": NaN}' % (field.encode(), j(good)), {422}),
        ("the other input", "wrong shape", j({"pairs" if field == "texts" else "texts": GOOD_PAIR}), {422}),
        ("empty text", "bad text", j({field: ["", "b"] if field == "pairs" else ""}), {422}),
        ("whitespace text", "bad text", j({field: [" \t\n", "b"] if field == "pairs" else " \t\n"}), {422}),
        ("lone surrogate", "bad text",
         b'{"%s": %s}' % (field.encode(), b'["\\ud800", "b"]' if field == "pairs" else b'"\\ud800 x"'), {422}),
        ("NUL characters", "bad text", j({field: ["a\u0000b", "c"] if field == "pairs" else "a\u0000b"}),
         ANY_ANSWER),
        ("symbols only", "bad text", j({field: ["%%%", "@@@"] if field == "pairs" else "%%% @@@ ###"}),
         ANY_ANSWER),
        ("over the model's length, no truncation", "bad text",
         j({field: [long_words, "b"] if field == "pairs" else long_words, "truncate": False}), {422}),
        ("too many texts", "oversized", j({field: [good] * (limits["max_texts"] + 1)}), {413}),
        ("a too long text", "oversized",
         j({field: ["x" * (limits["max_text_chars"] + 1), "b"] if field == "pairs"
            else "x" * (limits["max_text_chars"] + 1)}), {413}),
        ("body over the bound", "oversized", b'{"%s": "' % field.encode() + b"x" * big + b'"}', {413}),
        ("Content-Length over the bound, no body", "oversized",
         lambda port: raw_request(port, post_head(endpoint, length=100 * big)), {413}),
        ("chunked body over the bound", "oversized",
         lambda port: raw_request(port, post_head(endpoint, chunked=True),
                                  [b"%x\r\n" % 65536 + b"x" * 65536 + b"\r\n"] * (big // 65536 + 2)), {413}),
        ("wrong endpoint", "protocol", ("POST", other, one), {404}),
        ("GET on a POST endpoint", "protocol", ("GET", endpoint, b""), {405}),
        ("unknown path", "protocol", ("POST", "/admin", one), {404}),
        ("not an HTTP request", "protocol", lambda port: raw_request(port, b"GARBAGE\r\n\r\n"), {400, "closed"}),
        ("bad Content-Length", "protocol",
         lambda port: raw_request(port, post_head(endpoint, extra=b"Content-Length: abc\r\n")), {400, "closed"}),
        ("100 kB header", "protocol",  # (uvicorn reads a header that arrives whole; a slow one it bounds)
         lambda port: raw_request(port, post_head(endpoint, length=len(one), extra=b"X-Big: " + b"a" * 100_000
                                                  + b"\r\n"), [one]), {200, "closed"} | CLIENT_ERROR),
        ("slow body (under the body timeout)", "slow client",
         lambda port: raw_request(port, post_head(endpoint, length=len(one)), [one[:5], one[5:]],
                                  pause=limits["body_timeout_s"] / 4), {200}),
        ("body that never ends", "slow client",
         lambda port: raw_request(port, post_head(endpoint, length=len(one) + 100), [one]), {408}),
        ("headers, then silence", "slow client",
         lambda port: raw_request(port, post_head(endpoint, length=len(one))), {408}),
        ("disconnect mid-body", "disconnecting client",
         lambda port: raw_request(port, post_head(endpoint, length=len(one) + 100), [one], close_early=True),
         {"gone"}),
        ("disconnect before the answer", "disconnecting client",
         lambda port: raw_request(port, post_head(endpoint, length=len(one)), [one], close_early=True), {"gone"}),
    ]


PROBES = []  # the status of every good request that timed a recovery or was cancelled ("cancelled", "hang")


async def good_request(client, url, endpoint, field, good, timeout):
    import httpx
    status = None
    try:
        r = await client.post(url + endpoint, json={field: good}, timeout=timeout)
        status = r.status_code
    except asyncio.CancelledError:
        status = "cancelled"
        raise
    except httpx.TimeoutException:
        status = "hang"
    except httpx.TransportError:
        status = "closed"
    finally:
        PROBES.append(status)
    return status


async def seconds_to_recover(client, url, endpoint, field, good, timeout, give_up=30.0):
    """Seconds until a good request is answered 200 again (None: not within ``give_up``)."""
    start = time.perf_counter()
    while time.perf_counter() - start < give_up:
        if await good_request(client, url, endpoint, field, good, timeout) == 200:
            return time.perf_counter() - start
        await asyncio.sleep(0.05)
    return None


async def battery(url, port, endpoint, field, good, limits, burst_size):
    """Every hostile kind, the injected faults and the cancelled requests (the burst with shutdown is apart)."""
    import httpx
    timeout = limits["body_timeout_s"] + limits["request_timeout_s"] + 10
    records, faults = [], []
    async with httpx.AsyncClient(timeout=timeout) as client:
        max_length = (await client.get(url + "/health")).json()["model"]["max_length"]
        for kind, group, body, expected in kinds(endpoint, field, good, limits, max_length):
            start, detail = time.perf_counter(), ""
            if callable(body):
                status = await body(port)
            else:
                method, path, content = body if isinstance(body, tuple) else ("POST", endpoint, body)
                try:
                    r = await client.request(method, url + path, content=content,
                                             headers={"content-type": "application/json"})
                    status, detail = r.status_code, r.text[:200]
                except httpx.TimeoutException:
                    status = "hang"
                except httpx.TransportError:
                    status = "closed"
            records.append({"kind": kind, "group": group, "status": status, "expected": expected_text(expected),
                            "ok": status in expected, "seconds": round(time.perf_counter() - start, 3),
                            "detail": detail})
        # /health while a request of the largest allowed size is parsed and tokenised
        largest = {field: [[("word " * (limits["max_text_chars"] // 5))[:limits["max_text_chars"]]] * 2
                           if field == "pairs" else ("word " * (limits["max_text_chars"] // 5))[:limits["max_text_chars"]]]
                   * min(limits["max_texts"], limits["max_body_bytes"] // (2 * limits["max_text_chars"] + 16))}
        heavy = asyncio.ensure_future(client.post(url + endpoint, json=largest))
        health_ms = []
        while not heavy.done():
            start = time.perf_counter()
            await client.get(url + "/health")
            health_ms.append(1000 * (time.perf_counter() - start))
            await asyncio.sleep(0.02)
        heavy_status = (await heavy).status_code
        records.append({"kind": "the largest allowed request", "group": "oversized", "status": heavy_status,
                        "expected": ["200"], "ok": heavy_status == 200, "seconds": None, "detail": ""})
        # injected faults: each one's answer, then the seconds until a good request is answered again
        for fault in ("fail", "kill", "slow"):
            text = f"{GOOD_TEXT} FC_SERVE_FAULT:{fault}"
            value = [text, GOOD_PAIR[1]] if field == "pairs" else text
            r = await client.post(url + endpoint, json={field: value})
            expected = 504 if fault == "slow" else 500
            faults.append({"fault": fault, "status": r.status_code, "ok": r.status_code == expected,
                           "detail": r.json().get("detail", "")[:160],
                           "recover_s": await seconds_to_recover(client, url, endpoint, field, good, timeout)})
        # cancelled requests: sent, then given up by the client 50 ms later (the server's handlers see them go)
        cancelled = [asyncio.ensure_future(good_request(client, url, endpoint, field, [good] * 4, timeout))
                     for _ in range(burst_size)]
        await asyncio.sleep(0.05)
        for task in cancelled:
            task.cancel()
        await asyncio.gather(*cancelled, return_exceptions=True)
        faults.append({"fault": f"{burst_size} requests cancelled by their client", "status": "-", "ok": True,
                       "detail": "", "recover_s": await seconds_to_recover(client, url, endpoint, field, good,
                                                                            timeout)})
        health = (await client.get(url + "/health")).json()
    return records, faults, health, health_ms


async def burst_with_shutdown(url, proc, endpoint, field, good, size, timeout):
    """``size`` good requests, SIGTERM in the middle: the first half queued behind a paused batch (the fault hook's
    ``pause``) when the signal comes, the second half sent after it, 50 ms apart. Each of the first half must be
    answered (uvicorn's graceful shutdown, then the worker drains the queue): one that is not is lost. The second
    half may be answered, refused while shutting down (503), find the port closed ("refused"), or find its
    connection closed before the server read its request ("closed unread": nothing was done, safe to retry)."""
    import httpx
    first, second = [], []

    async def one(client, out, value):
        try:
            r = await client.post(url + endpoint, json={field: value})
            out.append(r.status_code)
        except httpx.ConnectError:
            out.append("refused")
        except httpx.TimeoutException:
            out.append("hang")
        except httpx.TransportError:
            out.append("closed unread" if out is second else "lost")

    paused = [f"{good[0]} FC_SERVE_FAULT:pause", good[1]] if field == "pairs" else f"{good} FC_SERVE_FAULT:pause"
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=size)) as client:
        tasks = [asyncio.ensure_future(one(client, first, paused))]
        await asyncio.sleep(0.1)
        tasks += [asyncio.ensure_future(one(client, first, good)) for _ in range(size // 2 - 1)]
        deadline = time.perf_counter() + 5
        async with httpx.AsyncClient(timeout=timeout) as probe:
            while time.perf_counter() < deadline and (await probe.get(url + "/health")).json()["queued"] < size // 2 - 1:
                await asyncio.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        for _ in range(size - size // 2):
            await asyncio.sleep(0.05)
            tasks.append(asyncio.ensure_future(one(client, second, good)))
        await asyncio.gather(*tasks)
    return first, second


# ---- the run -----------------------------------------------------------------------------------------------
def run_faults(server_args, limits, burst_size=24, log_path=None, threads=1):
    """Start fc-serve (``server_args``: its checkpoint and flags) with the fault hook and ``limits``, run the
    battery and the burst with shutdown; a summary dict."""
    port = free_port()
    cmd = [sys.executable, "-m", "user_dir.serving.serve", *server_args, "--port", str(port), "--log-level", "warning",
           *[x for name, value in limits.items() for x in (f"--{name.replace('_', '-')}", f"{value:g}")]]
    env = environment(threads)
    env["FC_SERVE_FAULTS"] = "1"
    env["FC_SERVE_FAULT_SLOW_S"] = f"{limits['request_timeout_s'] + 1:g}"  # the injected slow batch: a 504
    log_path = log_path or os.path.join(ROOT, "work", "serve_faults", "server.log")
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    out = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        health = wait_ready(proc, url, log_path, timeout=600)
        endpoint = "/" + health["model"]["task"]
        field = "pairs" if health["model"].get("inputs") == "pairs" else "texts"
        good = GOOD_PAIR if field == "pairs" else (GOOD_GERMAN if endpoint == "/translate" else GOOD_TEXT)
        started = time.perf_counter()
        records, faults, health, health_ms = asyncio.run(battery(url, port, endpoint, field, good, limits,
                                                                 burst_size))
        burst_first, burst_second = asyncio.run(burst_with_shutdown(url, proc, endpoint, field, good, burst_size,
                                                                    limits["request_timeout_s"] + 30))
        burst = burst_first + burst_second
        seconds = time.perf_counter() - started
    finally:
        stop_server(proc, out)
    log = open(log_path, encoding="utf-8", errors="replace").read()
    injected = [f["status"] for f in faults if f["status"] != "-"]
    others = [r["status"] for r in records] + PROBES + burst  # (the burst's 503s: refused while shutting down)
    statuses = others + injected
    return {
        "command": cmd, "model": health["model"], "limits": limits, "seconds": round(seconds, 1),
        "kinds": records, "faults": faults, "burst": burst, "requests": len(statuses),
        "burst_before_signal": count_by(burst_first), "burst_after_signal": count_by(burst_second),
        "answered_by_status": count_by(statuses),
        "unexpected": [r for r in records if not r["ok"]] + [f for f in faults if not f["ok"]],
        "server_errors_not_injected": sum(1 for s in [r["status"] for r in records] + PROBES
                                          if isinstance(s, int) and s >= 500)
        + sum(1 for s in burst if isinstance(s, int) and s >= 500 and s != 503),
        "injected_5xx": sum(1 for s in injected if isinstance(s, int) and s >= 500),
        "hangs": statuses.count("hang"), "lost": burst.count("lost"),
        "worker_restarts": health["worker_restarts"], "health_during_largest_ms": summary_ms(health_ms),
        "shutdown_clean": proc.returncode in (0, -signal.SIGTERM) and "worker stopped" in log,
        "tracebacks_in_log": log.count("Traceback"),
        # progress lines of the tokenisers (preprocess.textio.progress), once printed for every request
        "progress_lines_in_log": sum(1 for line in log.splitlines() if "tokenising" in line or "applying BPE" in line),
    }


def expected_text(statuses) -> list:
    """The expected statuses, a range of them named by its class ("4xx")."""
    named = [s for s in statuses if not isinstance(s, int)]
    numbers = sorted(s for s in statuses if isinstance(s, int))
    if set(range(400, 500)) <= set(numbers):
        named.append("4xx")
        numbers = [n for n in numbers if not 400 <= n < 500]
    if set(range(200, 300)) <= set(numbers):
        named.append("2xx")
        numbers = [n for n in numbers if not 200 <= n < 300]
    return [str(n) for n in numbers] + named


def count_by(values):
    counts = {}
    for v in values:
        counts[str(v)] = counts.get(str(v), 0) + 1
    return dict(sorted(counts.items()))


def summary_ms(values):
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {"n": len(values), "median": round(ordered[len(ordered) // 2], 1), "max": round(ordered[-1], 1)}


def faults_report(result, command, when, notes=()) -> str:
    """The Markdown section of results/serving.md."""
    r = result
    by_group = {}
    for rec in r["kinds"]:
        by_group.setdefault(rec["group"], []).append(rec)
    L = ["## Faults and hostile input (scripts/bench/serve_faults.py)", "",
         f"Made by `{command}` on {when}; {machine()}; server: 1 torch thread, one worker, "
         f"`FC_SERVE_FAULTS=1` (the fault hook), bounds `"
         + " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in r["limits"].items()) + "`; client: asyncio + httpx "
         "and raw sockets in another process, loopback. Model: " + json.dumps(r["model"]) + ".", "",
         *[f"Note: {note}" for note in notes], *([""] if notes else []),
         f"- requests tried: {r['requests']} ({len(r['kinds'])} kinds of hostile or odd request, 3 injected faults, "
         f"{len(r['burst'])} requests cancelled by their client, the good requests that timed each recovery, and a "
         f"burst of {len(r['burst'])} with SIGTERM in the middle) in {r['seconds']:g} s",
         "- answers by status: " + ", ".join(f"{s}: {n}" for s, n in r["answered_by_status"].items()),
         f"- 5xx: {r['injected_5xx']} from the injected faults, {r['server_errors_not_injected']} otherwise "
         f"(goal 0); hangs: {r['hangs']} (goal 0); requests lost: {r['lost']} (goal 0)",
         f"- worker restarts: {r['worker_restarts']}; requests answered other than expected: {len(r['unexpected'])}; "
         f"tracebacks in the server's log: {r['tracebacks_in_log']} (the injected faults'); tokeniser progress lines "
         f"in it: {r['progress_lines_in_log']} (`--log-level warning`); shutdown clean: {r['shutdown_clean']}",
         f"- `/health` while the largest allowed request was parsed and tokenised: median "
         f"{r['health_during_largest_ms'].get('median', '-')} ms, max {r['health_during_largest_ms'].get('max', '-')} "
         f"ms over {r['health_during_largest_ms']['n']} probes", "",
         "| fault | answer | detail | seconds until a good request is answered again |", "|---|---|---|---|"]
    for f in r["faults"]:
        rec = "-" if f["recover_s"] is None else f"{f['recover_s']:.2f}"
        L.append(f"| {f['fault']} | {f['status']} | {f['detail'].replace('|', '/')} | {rec} |")
    L += ["", f"Burst of {len(r['burst'])} with SIGTERM in the middle: the half queued when the signal came (behind "
          "a paused batch): " + ", ".join(f"{s}: {n}" for s, n in r["burst_before_signal"].items())
          + "; the half sent after it: " + ", ".join(f"{s}: {n}" for s, n in r["burst_after_signal"].items())
          + " (503: refused while shutting down; refused: the port already closed; closed unread: the connection "
          "closed before the server read the request, nothing done).", "",
          "Each kind of hostile or odd request, the answer expected (never a 5xx) and the one given:", "",
          "| group | kind | expected | answer |", "|---|---|---|---|"]
    for group, recs in by_group.items():
        for rec in recs:
            L.append(f"| {group} | {rec['kind']} | {' or '.join(rec['expected'])} | {rec['status']} |")
    return "\n".join(L) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ours, server_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-body-bytes", type=int, default=65536, help="fc-serve's, tight so the battery is small")
    p.add_argument("--max-texts", type=int, default=16, help="fc-serve's")
    p.add_argument("--max-text-chars", type=int, default=4096,
                   help="fc-serve's (over twice the model's length in tokens: a text of single-letter words too long "
                        "for the model fits under it)")
    p.add_argument("--body-timeout-s", type=float, default=1.0, help="fc-serve's")
    p.add_argument("--request-timeout-s", type=float, default=2.0,
                   help="fc-serve's (the injected slow batch takes 1 s more: a 504); more than the largest allowed "
                        "request takes")
    p.add_argument("--burst", type=int, default=24, help="requests in the burst with shutdown, and cancelled ones")
    p.add_argument("--out", default=os.path.join(ROOT, "work", "serve_faults", "serving.md"),
                   help="the report whose fault section this writes (results/serving.md for the committed one)")
    p.add_argument("--json", default=None, help="also the whole result as JSON here")
    p.add_argument("--note", action="append", default=[], help="a sentence for the report (why these settings)")
    args = p.parse_args(ours)
    if not server_args:
        p.error("give fc-serve's checkpoint and flags after --")
    limits = {k: getattr(args, k) for k in ("max_body_bytes", "max_texts", "max_text_chars", "body_timeout_s",
                                            "request_timeout_s")}
    result = run_faults(server_args, limits, args.burst,
                        log_path=os.path.join(os.path.dirname(os.path.abspath(args.out)), "serve_faults_server.log")
                        if not os.path.abspath(args.out).startswith(os.path.join(ROOT, "results")) else None)
    if args.json:
        write_json(args.json, result)
    write_faults_section(args.out, faults_report(result, invocation("serve_faults.py", argv),
                                                 time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), args.note))
    print(json.dumps({k: result[k] for k in ("requests", "answered_by_status", "server_errors_not_injected",
                                             "hangs", "lost", "worker_restarts", "unexpected")}, indent=1))
    return result


if __name__ == "__main__":
    main()
