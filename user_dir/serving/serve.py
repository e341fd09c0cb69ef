"""fc-serve: one frozen backbone and its Variator plugins behind an HTTP server that picks the plugin
(the compression ratio k) from the load -- Variator's plug-and-play promise (Xiao et al., abstract and
section 1: "dynamically select different compression plugins with varying acceleration ratios based on
the current workload").

    fc-serve work/glue/SST-2/checkpoints/checkpoint_best.pt --plugins k4.pt,k16.pt \\
        --policy adaptive --target-p95-ms 250 --max-batch 32 --max-wait-ms 5 --port 8000
    fc-serve checkpoints/multi30k.de-en/teacher.pt --source-lang de --target-lang en --lowercase \\
        --plugins k4.pt --policy fixed:4

Endpoints (JSON):

* ``POST /classify`` ``{"texts": "one" | ["one", "two"]}`` or, for a sentence-pair task,
  ``{"pairs": ["first", "second"] | [["a1", "b1"], ...]}``; optional ``"truncate": false`` refuses an
  example longer than the model reads instead of cutting it as its training data was cut. Answers
  ``{"results": [{"label", "label_index", "scores": {label: probability}, "k", "truncated"}, ...]}``.
* ``POST /translate`` ``{"texts": "ein satz" | [...]}`` -> ``{"results": [{"translation", "k", "truncated"}]}``.
* ``GET /health``: the model, policy, limits and the start-up cost table; ``GET /metrics``: Prometheus.

Each answer carries a ``Server-Timing`` header: the request's wait, its batch, its reply and their total in
milliseconds. Bad input is a 4xx whose ``detail`` names the field (``texts[2]: empty text``); more queued examples
than ``--max-queue`` is a 503 with ``Retry-After``, and so, under the adaptive policy, is a request whose
examples are predicted to miss the target even at the largest k (serving/policy.py, "Admission"), unless it
could not meet the target even alone on an idle server: that is a 413. SIGTERM/SIGINT stop accepting
connections and finish the requests in flight (uvicorn's graceful shutdown), then the worker drains its queue
and exits.

Hostile input and faults. A request is bounded before any work is spent on it: its body in bytes
(``--max-body-bytes``, checked on Content-Length and counted while it streams in, within ``--body-timeout-s``),
its texts (``--max-texts``) and each text's characters (``--max-text-chars``): past a bound, a 413 naming the
bound and its flag. It is admitted (the queue bound and the policy's prediction, its texts taken as short as
can be) before it is tokenised; parsing and tokenising run on one thread beside the event loop, so a long
request never stalls ``/health``, ``/metrics`` or other requests. A batch that fails answers its requests with
a 500 naming the cause and the next batch runs; a worker thread that ends is replaced (``/health`` counts the
restarts, and answers 503 while no worker runs); no request waits past ``--request-timeout-s`` (504).

One process owns one model and one worker thread. To serve more traffic, run several replicas (one per
core group or machine) behind a load balancer (user_dir/serving/README.md).
"""
import argparse
import asyncio
import json
import logging
import math
import sys
import time
from contextlib import asynccontextmanager
from typing import List, Optional, Sequence, Tuple

logger = logging.getLogger("fc-serve")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)


class BadRequest(Exception):
    """A request the server will not queue: HTTP ``status`` with a message naming the field."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.status, self.field, self.message = status, field, message


# ---- requests: JSON -> examples (a tuple of one text, or of two for a pair) ---------------------------------
def _text(value, field: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise BadRequest(422, field, f"a text is a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise BadRequest(413, field, f"{len(value)} characters, more than the server reads in one text "
                                     f"(--max-text-chars {max_chars}); shorten it")
    if not value.strip():
        raise BadRequest(422, field, "empty text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequest(422, field, f"not valid Unicode: a lone surrogate {value[e.start]!r} at character "
                                     f"{e.start}") from None
    return value


def _pair(value, field: str, max_chars: int) -> Tuple[str, str]:
    if not isinstance(value, list) or len(value) != 2:
        raise BadRequest(422, field, "a pair is a list of two texts [first, second]")
    return _text(value[0], f"{field}[0]", max_chars), _text(value[1], f"{field}[1]", max_chars)


def parse_request(body: bytes, endpoint: str, pair_task: bool, max_queue: int, max_texts: Optional[int] = None,
                  max_chars: int = 20000):
    """(examples, field of each example, truncate or None) of a request body; BadRequest names what is wrong.
    At most ``max_texts`` examples (and ``max_queue``) of at most ``max_chars`` characters each (413)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(400, "body", f"malformed JSON ({e})") from None
    except RecursionError:
        raise BadRequest(400, "body", "JSON nested too deeply (a request is an object of texts)") from None
    if not isinstance(data, dict):
        raise BadRequest(422, "body", f"a JSON object is expected, got {type(data).__name__}")
    known = {"texts", "pairs", "truncate"} if endpoint == "classify" else {"texts", "truncate"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise BadRequest(422, unknown[0], f"unknown field (this endpoint reads {sorted(known)})")
    truncate = data.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise BadRequest(422, "truncate", f"true or false, got {truncate!r}")
    given = [f for f in ("texts", "pairs") if f in data]
    if len(given) != 1:
        need = "\"texts\" or \"pairs\"" if endpoint == "classify" else "\"texts\""
        raise BadRequest(422, "texts", f"give {need}" + (" (not both)" if len(given) > 1 else ""))
    field = given[0]
    if field == "pairs" and not pair_task:
        raise BadRequest(422, "pairs", "this model classifies single sentences (its data has one input); "
                                       "send \"texts\"")
    if field == "texts" and pair_task:
        raise BadRequest(422, "texts", "this model classifies sentence pairs (its data has two inputs); "
                                       "send \"pairs\": [[first, second], ...]")
    value = data[field]
    # one pair: a list of two things neither of which is a list (["a", 1] is a pair whose second text is wrong)
    one = isinstance(value, str) if field == "texts" else (isinstance(value, list) and len(value) == 2
                                                            and not any(isinstance(v, list) for v in value))
    items = [value] if one else value
    if not isinstance(items, list) or not items:
        raise BadRequest(422, field, "a text or a non-empty list" if field == "texts" else
                         "a pair [first, second] or a non-empty list of pairs")
    if len(items) > max_queue:
        raise BadRequest(413, field, f"{len(items)} examples in one request, more than the server ever queues "
                                     f"(--max-queue {max_queue}); split it")
    if max_texts is not None and len(items) > max_texts:
        raise BadRequest(413, field, f"{len(items)} examples in one request, more than the server takes in one "
                                     f"(--max-texts {max_texts}); split it")
    fields = [field] if one else [f"{field}[{i}]" for i in range(len(items))]
    if field == "texts":
        examples = [(_text(v, f, max_chars),) for v, f in zip(items, fields)]
    else:
        examples = [_pair(v, f, max_chars) for v, f in zip(items, fields)]
    return examples, fields, truncate


async def read_body(request, limit: int, timeout: float) -> bytes:
    """The request's body, refused (413) past ``limit`` bytes -- on its Content-Length before reading it, and
    counted while it streams in (a chunked body has none) -- or (408) when it takes more than ``timeout`` s."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, "body", f"{int(declared)} bytes, more than the server reads "
                                      f"(--max-body-bytes {limit})")
    body = bytearray()

    async def stream():
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise BadRequest(413, "body", f"more than the server reads (--max-body-bytes {limit})")

    try:
        await asyncio.wait_for(stream(), timeout)
    except asyncio.TimeoutError:
        raise BadRequest(408, "body", f"not received within {timeout:g} s (--body-timeout-s)") from None
    return bytes(body)


# ---- metrics --------------------------------------------------------------------------------------------------
class ServerMetrics:
    """Prometheus metrics of one server, in their own registry (several servers can share a process)."""

    def __init__(self, table, max_batch: int):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        from .cost_table import default_batch_sizes
        r = self.registry = CollectorRegistry()
        self.queue = Gauge("fc_serve_queue_examples", "Examples waiting in the queue (a forming batch included)",
                           registry=r)
        self.batch_size = Histogram("fc_serve_batch_size", "Examples per batch", registry=r,
                                    buckets=default_batch_sizes(max_batch))
        self.batches = Counter("fc_serve_batches", "Batches run, by Variator ratio k", ["k"], registry=r)
        self.examples = Counter("fc_serve_examples", "Examples answered, by Variator ratio k", ["k"], registry=r)
        self.chosen = Gauge("fc_serve_chosen_k", "Variator ratio k of the latest batch", registry=r)
        self.predicted = Gauge("fc_serve_predicted_latency_seconds",
                               "Adaptive policy: predicted latency of the queued work at the chosen k", registry=r)
        self.scale = Gauge("fc_serve_cost_scale", "Adaptive policy: measured / cost-table time its predictions assume "
                                                  "for a full batch, the --cost-quantile of the last --cost-window "
                                                  "batches of about that size (1 = the machine as fast as at start-up)",
                           registry=r)
        self.batch_seconds = Histogram("fc_serve_batch_seconds", "Compute time of one batch, by k", ["k"],
                                       registry=r, buckets=LATENCY_BUCKETS)
        self.padded = Counter("fc_serve_batch_padded_tokens", "Tokens each batch was padded to, summed over the "
                              "batches, by k (over fc_serve_batches_total: the mean padded length)", ["k"], registry=r)
        self.latency = Histogram("fc_serve_request_latency_seconds", "Request latency in the server, by endpoint",
                                 ["endpoint"], registry=r, buckets=LATENCY_BUCKETS)
        self.bound = Gauge("fc_serve_queue_bound_examples", "Most examples the queue holds (--max-queue)",
                           registry=r)
        self.backlog = Gauge("fc_serve_backlog_seconds", "Adaptive policy: predicted seconds until the queued work "
                             "is answered at the largest k, the running batch's rest included (admission keeps it "
                             "within the budget)", registry=r)
        self.budget = Gauge("fc_serve_budget_seconds", "Adaptive policy: the target less the p95 reply delay, the "
                            "p95 event-loop lag and --client-overhead-ms: what the predictions must meet", registry=r)
        self.refused = Counter("fc_serve_refused_requests", "Requests refused, by reason", ["reason"], registry=r)
        self.restarts = Gauge("fc_serve_worker_restarts", "Worker threads started in place of one that ended",
                              registry=r)
        cost = Gauge("fc_serve_cost_table_seconds", "Start-up cost table: seconds of one batch by k and batch size",
                     ["k", "batch_size"], registry=r)
        for k, row in table.seconds.items():
            for b, s in row.items():
                cost.labels(k=str(k), batch_size=str(b)).set(s)

    def record_batch(self, record) -> None:
        self.batch_size.observe(record.size)
        self.batches.labels(k=str(record.k)).inc()
        self.examples.labels(k=str(record.k)).inc(record.size)
        self.chosen.set(record.k)
        if not math.isnan(record.predicted):
            self.predicted.set(record.predicted)
        self.batch_seconds.labels(k=str(record.k)).observe(record.seconds)
        if record.length is not None:
            self.padded.labels(k=str(record.k)).inc(record.length)


# ---- the application ------------------------------------------------------------------------------------------
def retry_after_seconds(queued: int, policy, table, max_batch: int) -> int:
    """Whole seconds until the queue would be empty at the largest ratio the policy uses (at least 1)."""
    from .policy import predicted_latency
    scale = getattr(policy, "scale_at", 1.0)  # (a fixed policy: the table as it is)
    return max(1, math.ceil(predicted_latency([0.0] * queued, policy.largest_ratio, table, max_batch, scale)))


def server_timing(arrival: float, began: float, done: float, now: float) -> str:
    """The W3C Server-Timing header of an answer (milliseconds): ``wait`` from the request's arrival (its body
    received, before its parsing) to the start of its last batch, ``batch`` that batch's compute, ``reply`` from its end to the answer
    leaving the handler, ``total`` their sum. A client subtracts ``total`` from its own latency to see the time
    outside the server's view (connection, the event loop reaching the request, the answer's transfer)."""
    parts = {"wait": began - arrival, "batch": done - began, "reply": now - done, "total": now - arrival}
    return ", ".join(f"{name};dur={1000 * max(0.0, v):.2f}" for name, v in parts.items())


LIMITS = {"max_body_bytes": 1 << 20, "max_texts": 256, "max_text_chars": 20000, "body_timeout_s": 30.0,
          "request_timeout_s": 60.0}  # fc-serve's defaults of the request bounds (get_parser's help explains each)


def create_app(backend, policy, table, settings: dict):
    """The FastAPI application: ``settings`` holds max_batch, max_wait_ms, max_queue, truncate, the request
    bounds of ``LIMITS`` (their defaults where missing), and what /health shows."""
    from concurrent.futures import ThreadPoolExecutor

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.requests import ClientDisconnect

    from . import faults
    from .backends import InputError
    from .batcher import Batcher, QueueFull

    settings = {**LIMITS, **settings}
    if faults.enabled():  # the test and debug hook (serving/faults.py)
        logger.warning("%s=1: faults named in a request's texts are injected into its batch", faults.ENV)
        backend = faults.FaultInjectingBackend(backend)
    metrics = ServerMetrics(table, settings["max_batch"])
    # parsing and tokenising: one thread beside the event loop (the worker owns the model and its own thread)
    preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fc-serve-prepare")
    preparing = [0]  # examples admitted and being tokenised (the event loop's own count)

    scale_at = getattr(policy, "scale_at", lambda size: 1.0)  # (a fixed policy predicts nothing: the table as it is)

    def on_batch(record):
        if logger.isEnabledFor(logging.DEBUG):  # (--log-level debug: one line per batch)
            logger.debug("batch k=%d size=%d padded=%s queued=%d: %.1f ms, predicted %.1f ms at scale %.3f",
                         record.k, record.size, record.length, record.queued, 1000 * record.seconds,
                         1000 * scale_at(record.size) * table.batch_seconds(record.k, record.size, record.length),
                         scale_at(record.size))
        policy.observe(record.k, record.size, record.seconds, record.length)
        metrics.record_batch(record)
        metrics.scale.set(policy.scale)

    adaptive = policy.admits is not None
    batcher = Batcher(backend.run, policy.choose, settings["max_batch"], settings["max_wait_ms"] / 1000.0,
                      settings["max_queue"], on_batch=on_batch, admit=policy.admits, size_of=backend.size_of,
                      predict=policy.batch_seconds if adaptive else None)
    metrics.queue.set_function(lambda: batcher.queued)
    metrics.restarts.set_function(lambda: batcher.restarts)
    metrics.bound.set(settings["max_queue"])
    if adaptive:
        metrics.backlog.set_function(lambda: batcher.backlog(policy.largest_ratio))
        metrics.budget.set_function(lambda: policy.budget)

    async def probe_loop_lag(interval: float = 0.005):
        """How late the event loop wakes a probe sleeping ``interval`` seconds: the time a new request waits for its
        handler to start, before its arrival is stamped (serving/policy.py, the budget)."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(interval)
            policy.observe_lag(loop.time() - start - interval)

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        probe = asyncio.create_task(probe_loop_lag()) if adaptive else None
        logger.info("ready: %s, policy %s", backend.kind, policy.name)
        yield
        if probe is not None:
            probe.cancel()
        # uvicorn has stopped accepting and finished the requests in flight: end the worker. (uvicorn then
        # re-raises the signal that stopped it, so a supervisor sees the process end by SIGTERM/SIGINT.)
        batcher.stop(timeout=settings.get("graceful_timeout"))
        preparer.shutdown(wait=False, cancel_futures=True)
        print(f"fc-serve: shut down: requests in flight answered, {batcher.queued} examples left queued, "
              "worker stopped", flush=True)

    app = FastAPI(title="fc-serve", lifespan=lifespan)
    app.state.batcher, app.state.metrics = batcher, metrics

    def refuse(status: int, field: str, message: str, reason: str, headers=None):
        metrics.refused.labels(reason=reason).inc()
        return JSONResponse({"detail": f"{field}: {message}", "field": field}, status_code=status, headers=headers)

    def refuse_queue_full(e):
        seconds = retry_after_seconds(e.queued, policy, table, settings["max_batch"])
        return refuse(503, "queue", f"{e.queued} examples queued, {e.asked} more asked for: {e.why}; retry in "
                      f"{seconds} s", "queue_full", headers={"Retry-After": str(seconds)})

    def never_fits(lengths) -> bool:
        """A request (its examples' token counts) the adaptive policy could not answer within the target even alone."""
        return adaptive and not policy.fits_alone(lengths)

    def refuse_never_fits(n: int):
        return refuse(413, "texts", f"{n} examples predicted to take longer than the latency target "
                      f"(--target-p95-ms {1000 * policy.target:g}) even alone on an idle server at the largest k; "
                      "send fewer or shorter texts", "never_fits")

    async def serve(request: Request, endpoint: str):
        start = time.perf_counter()
        if backend.kind != endpoint:
            return refuse(404, "endpoint", f"this server serves a {backend.kind} model: POST /{backend.kind}",
                          "wrong_endpoint")
        loop = asyncio.get_running_loop()
        try:
            body = await read_body(request, settings["max_body_bytes"], settings["body_timeout_s"])
            # the example's age counts its parsing and tokenising, not the client's own time sending its body
            arrival = batcher.clock()
            examples, fields, truncate = await loop.run_in_executor(
                preparer, parse_request, body, endpoint, getattr(backend, "pair", False), settings["max_queue"],
                settings["max_texts"], settings["max_text_chars"])
        except BadRequest as e:
            return refuse(e.status, e.field, e.message, "too_large" if e.status == 413 else "bad_input")
        except ClientDisconnect:
            metrics.refused.labels(reason="client_disconnected").inc()
            return Response(status_code=400)  # (nobody reads it)
        # admission before the expensive work: the queue bound and the policy, these examples taken as 1 token long
        if never_fits([1.0] * len(examples)):
            return refuse_never_fits(len(examples))
        try:
            batcher.precheck(len(examples), arrival, reserved=preparing[0])
        except QueueFull as e:
            return refuse_queue_full(e)
        except RuntimeError as e:  # shutting down
            return refuse(503, "server", str(e), "shutting_down", headers={"Retry-After": "1"})
        preparing[0] += len(examples)
        try:
            payloads = await loop.run_in_executor(preparer, backend.prepare, examples,
                                                  settings["truncate"] if truncate is None else truncate)
        except InputError as e:
            return refuse(422, fields[e.index], str(e), "bad_input")
        finally:
            preparing[0] -= len(examples)
        try:
            futures = batcher.submit(payloads, arrival)
        except QueueFull as e:
            if e.why.startswith("predicted") and never_fits([backend.size_of(p) for p in payloads]):
                return refuse_never_fits(len(payloads))
            return refuse_queue_full(e)
        except RuntimeError as e:  # shutting down
            return refuse(503, "server", str(e), "shutting_down", headers={"Retry-After": "1"})
        waiting = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        try:
            results = await asyncio.wait_for(waiting, settings["request_timeout_s"])
        except asyncio.TimeoutError:
            for f in futures:
                f.cancel()  # (those still queued leave their batch)
            return refuse(504, "server", f"not answered within {settings['request_timeout_s']:g} s "
                          "(--request-timeout-s)", "timeout")
        except asyncio.CancelledError:
            for f in futures:
                f.cancel()
            raise
        except Exception as e:  # its batch failed: the cause, named
            logger.warning("a request of %d examples failed in its batch: %s: %s", len(futures), type(e).__name__, e)
            return refuse(500, "batch", f"the batch failed: {type(e).__name__}: {e}", "batch_failed")
        began, done, now = max(f.began_at for f in futures), max(f.done_at for f in futures), batcher.clock()
        policy.observe_reply(now - done)  # the time after its last batch
        metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - start)
        logger.debug("%s: %d examples answered in %.1f ms", endpoint, len(results), 1000 * (now - arrival))
        return JSONResponse({"results": results}, headers={"Server-Timing": server_timing(arrival, began, done, now)})

    @app.post("/classify")
    async def classify(request: Request):
        return await serve(request, "classify")

    @app.post("/translate")
    async def translate(request: Request):
        return await serve(request, "translate")

    @app.get("/health")
    async def health():
        running = batcher.ensure_running()  # (a worker that ended is replaced here too)
        body = {"status": "ok" if running else "worker not running", "worker_restarts": batcher.restarts,
                "model": backend.describe(), "policy": policy.name, "ratios": backend.ratios,
                "queued": batcher.queued, "cost_table": table.as_dict(), "cost_scale": policy.scale,
                **({"budget_s": policy.budget, "backlog_s": batcher.backlog(policy.largest_ratio),
                    "reply_delay_p95_s": policy.reply_delay_p95(), "loop_lag_p95_s": policy.loop_lag_p95()}
                   if adaptive else {}),
                **{k: v for k, v in settings.items() if k != "graceful_timeout"}}
        return JSONResponse(body, status_code=200 if running else 503)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        """What no handler expected: a 500 naming it (the server goes on)."""
        logger.exception("%s %s failed", request.method, request.url.path)
        metrics.refused.labels(reason="internal_error").inc()
        return JSONResponse({"detail": f"server: internal error: {type(e).__name__}: {e}", "field": "server"},
                            status_code=500)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


# ---- the command line -------------------------------------------------------------------------------------------
def _number(kind, low: float, inclusive: bool = True):
    """An argparse type: a ``kind`` (int or float) at least ``low`` (more than ``low`` when not ``inclusive``);
    argparse's error names the flag ("argument --max-queue: 0: at least 1")."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: not {'an integer' if kind is int else 'a number'}") from None
        if value < low or (not inclusive and value == low) or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text}: {'at least' if inclusive else 'more than'} {low:g}")
        return value
    parse.__name__ = kind.__name__
    return parse


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fc-serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="fairseq checkpoint of the frozen backbone: a sentence_prediction classifier "
                                      "(served at /classify) or a translation model (/translate)")
    p.add_argument("--data", default=None, help="its data folder (default: the checkpoint's own --data for a "
                                                "classifier, the checkpoint's folder for translation): dictionaries, "
                                                "label names and, for GLUE, .prepared.json naming the tokenisation")
    p.add_argument("--plugins", default="", help="Variator plugin files to attach, comma-separated "
                                                 "(user_dir.variator.tools.plugins export); k=0, the backbone alone, "
                                                 "is always served")
    p.add_argument("--policy", default="adaptive",
                   help="'fixed:K' (every batch at ratio K, 0 = backbone) or 'adaptive' (default: the smallest k "
                        "whose predicted latency for the queued work meets --target-p95-ms, else the largest)")
    p.add_argument("--target-p95-ms", type=_number(float, 0, inclusive=False), default=250.0,
                   help="adaptive policy's latency target in milliseconds (default 250; ours, no paper value)")
    p.add_argument("--client-overhead-ms", type=float, default=0.0,
                   help="adaptive policy: milliseconds of a request's latency spent where this server cannot see it "
                        "(the client, the network, a load balancer), at its p95, taken off --target-p95-ms besides "
                        "the reply delay and event-loop lag the server measures (default 0; measure it as the "
                        "client's latency less the answer's Server-Timing total)")
    p.add_argument("--max-batch", type=_number(int, 1), default=32, help="most examples per batch (default 32, the GLUE "
                                                             "recipes' batch size)")
    p.add_argument("--max-wait-ms", type=_number(float, 0), default=5.0,
                   help="longest an example waits for others to join its batch, in ms (default 5)")
    p.add_argument("--max-queue", type=_number(int, 1), default=256,
                   help="most examples queued; a request beyond it gets 503 with Retry-After (default 256); the "
                        "adaptive policy also refuses a request whose examples, with the queue before them, are "
                        "predicted to miss --target-p95-ms at its largest k")
    p.add_argument("--truncate", choices=("yes", "no"), default="yes",
                   help="an example longer than the model reads: 'yes' cuts it as the training data was cut "
                        "(default), 'no' refuses it (422); a request's \"truncate\" field overrides")
    p.add_argument("--threads", type=_number(int, 1), default=1, help="torch threads of the worker (default 1)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_number(int, 0), default=8000, help="port (default 8000)")
    p.add_argument("--graceful-timeout", type=_number(float, 0), default=30.0,
                   help="seconds a shutdown waits for requests in flight (default 30)")
    lim = p.add_argument_group("request bounds (past one: 413, or 408/504 for time, naming the flag; ours, no "
                               "paper value)")
    lim.add_argument("--max-body-bytes", type=_number(int, 1), default=LIMITS["max_body_bytes"],
                     help="most bytes of a request's body, checked on its Content-Length and while it streams in "
                          "(default 1 MiB: 256 texts of 4 kB)")
    lim.add_argument("--max-texts", type=_number(int, 1), default=LIMITS["max_texts"],
                     help="most texts (or pairs) in one request (default 256, the default --max-queue); "
                          "--max-queue bounds it too")
    lim.add_argument("--max-text-chars", type=_number(int, 1), default=LIMITS["max_text_chars"],
                     help="most characters of one text (default 20000: several times what a 512-token model "
                          "reads; a longer text is cut to the model's length after tokenising, per --truncate)")
    lim.add_argument("--body-timeout-s", type=_number(float, 0, inclusive=False),
                     default=LIMITS["body_timeout_s"],
                     help="seconds a client has to send its whole body (default 30): a slow client gets 408")
    lim.add_argument("--request-timeout-s", type=_number(float, 0, inclusive=False),
                     default=LIMITS["request_timeout_s"],
                     help="seconds a request waits for its answer once queued (default 60): then 504, and its "
                          "examples not yet running leave the queue")
    lim.add_argument("--limit-concurrency", type=_number(int, 1), default=1000,
                     help="most connections and requests at once; past it uvicorn answers 503 (default 1000)")
    cost = p.add_argument_group("cost table (measured at start-up for the adaptive policy and Retry-After)")
    cost.add_argument("--cost-table", default=None, help="read the table from this JSON (from --save-cost-table or "
                                                         "GET /health) instead of measuring it")
    cost.add_argument("--save-cost-table", default=None, help="write the table to this JSON")
    cost.add_argument("--cost-texts", default=None,
                      help="a file of example texts (one per line; a pair tab-separated) to time batches on "
                           "(default: random ordinary tokens of --cost-length)")
    cost.add_argument("--cost-length", type=int, default=None,
                      help="tokens per random example when no --cost-texts (default 64 for a classifier, 32 for "
                           "translation)")
    cost.add_argument("--cost-batch-sizes", default=None,
                      help="comma-separated batch sizes to time (default 1, 2, 4, ... up to --max-batch)")
    cost.add_argument("--cost-runs", type=_number(int, 1), default=3, help="timed runs per cell; the median is kept (default 3)")
    cost.add_argument("--cost-window", type=_number(int, 0), default=64,
                      help="adaptive policy: the last N batches of each timed size whose measured / table times "
                           "scale the table's predictions for batches of about that size (a machine shared with other work runs slower or faster than at start-up); "
                           "0 uses the table as it is (default 64; ours)")
    cost.add_argument("--cost-quantile", type=float, default=0.95,
                      help="adaptive policy: the quantile of those ratios the predictions use (default 0.95, the "
                           "target's own percentile: a mean would put the requests behind every slower-than-average "
                           "batch over the target once the queue is full)")
    cost.add_argument("--observation-memory-s", type=_number(float, 0, inclusive=False), default=10.0,
                      help="adaptive policy: seconds a measured reply delay, event-loop lag or batch time counts "
                           "before it ages out, so a budget shrunk by a few slow replies recovers once they are "
                           "old, even on a server that refuses everything meanwhile (default 10; ours)")
    cls = p.add_argument_group("classification")
    cls.add_argument("--head", default=None, help="classification head to serve (default: the checkpoint's only one)")
    cls.add_argument("--wordpiece-vocab", default=None,
                     help="the WordPiece vocabulary folder, when the one .prepared.json names has moved")
    tr = p.add_argument_group("translation (fairseq-interactive's flags of the same names)")
    tr.add_argument("--source-lang", default=None, help="source language (default: the checkpoint's)")
    tr.add_argument("--target-lang", default=None, help="target language (default: the checkpoint's)")
    tr.add_argument("--tokenizer", default="moses", help="fairseq tokenizer (default moses, with --moses-no-escape "
                                                         "--moses-no-dash-splits as the shipped teacher's data)")
    tr.add_argument("--bpe", default="subword_nmt", help="fairseq BPE (default subword_nmt)")
    tr.add_argument("--bpe-codes", default=None, help="BPE codes (default: 'code' beside the checkpoint)")
    tr.add_argument("--lowercase", action="store_true", help="lowercase the input (the shipped Multi30k teacher's "
                                                             "data was lowercased)")
    tr.add_argument("--beam", type=int, default=5, help="beam size (default 5, as the papers)")
    tr.add_argument("--max-len-a", type=float, default=0, help="max length = a*src_len + b (fairseq default a=0)")
    tr.add_argument("--max-len-b", type=int, default=200, help="max length = a*src_len + b (fairseq default b=200)")
    p.add_argument("--log-level", default="info", type=str.lower,
                   choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn and fc-serve log level (default info: start-up and shutdown lines, no line per "
                        "request; debug: a line per batch and per request)")
    return p


def cost_batches(backend, sizes: Sequence[int], texts: Optional[str], length: Optional[int]) -> dict:
    """The timing batch of each size: the first examples of ``texts`` (cycled), or random tokens."""
    if texts is None:
        length = length or (64 if backend.kind == "classify" else 32)
        return {b: backend.synthetic(b, length) for b in sizes}
    with open(texts, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    if not lines:
        raise ValueError(f"--cost-texts {texts}: no text in it")
    examples = [tuple(line.split("\t")) if getattr(backend, "pair", False) else (line,) for line in lines]
    if any(len(e) != len(examples[0]) or (getattr(backend, "pair", False) and len(e) != 2) for e in examples):
        raise ValueError(f"--cost-texts {texts}: this model reads " + ("pairs: one tab per line" if backend.pair
                                                                     else "single texts"))
    need = max(sizes)
    payloads = backend.prepare([examples[i % len(examples)] for i in range(need)], truncate=True)
    return {b: payloads[:b] for b in sizes}


def build(args):
    """(backend, cost table, policy, settings) from parsed arguments; ValueError names the flag."""
    import torch

    from .backends import load_backend
    from .cost_table import CostTable, default_batch_sizes, measure
    from .policy import parse_policy

    if args.threads < 1:
        raise ValueError(f"--threads {args.threads}: at least 1")
    torch.set_num_threads(args.threads)
    backend = load_backend(args.checkpoint, data=args.data, plugins=args.plugins, head=args.head,
                           wordpiece_vocab=args.wordpiece_vocab, source_lang=args.source_lang,
                           target_lang=args.target_lang, tokenizer=args.tokenizer, bpe=args.bpe,
                           bpe_codes=args.bpe_codes, lowercase=args.lowercase, beam=args.beam,
                           max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    if args.cost_table:
        table = CostTable.load(args.cost_table)
    else:
        try:
            sizes = ([int(b) for b in args.cost_batch_sizes.split(",")] if args.cost_batch_sizes
                     else default_batch_sizes(args.max_batch))
        except ValueError:
            raise ValueError(f"--cost-batch-sizes {args.cost_batch_sizes!r}: comma-separated integers") from None
        batches = cost_batches(backend, sizes, args.cost_texts, args.cost_length)
        padded = {b: max(backend.size_of(p) for p in batch) for b, batch in batches.items()}
        table = measure(lambda k, b: backend.run(batches[b], k), backend.ratios, sizes, args.cost_runs, padded)
        table.details.update(threads=args.threads, texts=args.cost_texts or "random tokens")
    if args.save_cost_table:
        table.save(args.save_cost_table)
    policy = parse_policy(args.policy, backend.ratios, table, args.max_batch, args.target_p95_ms, args.cost_window,
                          args.cost_quantile, args.client_overhead_ms, args.observation_memory_s)
    settings = {"max_batch": args.max_batch, "max_wait_ms": args.max_wait_ms, "max_queue": args.max_queue,
                "truncate": args.truncate == "yes", "threads": args.threads,
                **{name: getattr(args, name) for name in LIMITS},
                "target_p95_ms": args.target_p95_ms if policy.name == "adaptive" else None,
                "graceful_timeout": args.graceful_timeout}
    return backend, table, policy, settings


def cli_main(argv: Optional[List[str]] = None):
    args = get_parser().parse_args(argv)
    # force: importing fairseq (user_dir does, before this runs) has already configured the root logger, at DEBUG
    # (fairseq/models/wav2vec/wav2vec2_classification.py calls logging.basicConfig(level=DEBUG)), which would
    # otherwise keep --log-level from taking effect
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        force=True)
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as e:
        sys.exit(f"fc-serve: {e.name} is missing; install the server's extra: pip install -e '.[serve]'")
    from user_dir.variator.plugged_encoder import VariatorError
    try:
        backend, table, policy, settings = build(args)
    except (ValueError, VariatorError, FileNotFoundError) as e:
        sys.exit(f"fc-serve: {e}")
    logging.getLogger("fairseq").setLevel(max(logging.WARNING, logging.getLogger().level))  # no log line per batch
    print(table.format(), flush=True)
    print(f"fc-serve: {backend.kind} model, ratios {backend.ratios}, policy {policy.name}"
          + (f" (target p95 {args.target_p95_ms:g} ms)" if policy.name == "adaptive" else ""), flush=True)
    app = create_app(backend, policy, table, settings)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                timeout_graceful_shutdown=args.graceful_timeout, limit_concurrency=args.limit_concurrency)


if __name__ == "__main__":
    cli_main()
