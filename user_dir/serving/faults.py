"""A test and debug hook: faults injected into the served model's batches (tests/test_serve_faults.py and
``scripts/bench/bench_serving.py faults`` use it to check that the server outlives them). Off unless fc-serve runs with
``FC_SERVE_FAULTS=1`` in its environment; then an example whose text contains

* ``FC_SERVE_FAULT:fail`` makes its batch raise (``InjectedFault``): its requests get a 500 naming it;
* ``FC_SERVE_FAULT:kill`` ends the worker thread (``InjectedWorkerKill``, a ``BaseException`` that no batch
  handler catches): its requests get a 500, and the server starts a new worker;
* ``FC_SERVE_FAULT:slow`` makes its batch take ``FC_SERVE_FAULT_SLOW_S`` seconds longer (default 3; more than
  --request-timeout-s: a 504);
* ``FC_SERVE_FAULT:pause`` makes it take ``PAUSE_SECONDS`` longer (requests queue behind it).
"""
import os
import time

ENV = "FC_SERVE_FAULTS"
MARK = "FC_SERVE_FAULT:"
SLOW_ENV, SLOW_SECONDS = "FC_SERVE_FAULT_SLOW_S", 3.0
PAUSE_SECONDS = 0.5


class InjectedFault(RuntimeError):
    """The injected failure of one batch."""


class InjectedWorkerKill(BaseException):
    """The injected end of the worker thread (not an ``Exception``: nothing on the worker's way catches it)."""


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


class FaultInjectingBackend:
    """``backend`` with the faults named in its examples' texts: what it does not override is ``backend``'s."""

    def __init__(self, backend):
        self.backend = backend

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def prepare(self, examples, truncate):
        payloads = self.backend.prepare(examples, truncate)
        for example, payload in zip(examples, payloads):
            text = " ".join(example)
            if MARK in text:
                payload["fault"] = text.split(MARK, 1)[1].split()[0] if text.split(MARK, 1)[1].split() else ""
        return payloads

    def run(self, payloads, k):
        faults = {p.get("fault") for p in payloads}
        if "kill" in faults:
            raise InjectedWorkerKill("injected: the worker thread ends (FC_SERVE_FAULT:kill)")
        if "fail" in faults:
            raise InjectedFault("injected fault in a batch (FC_SERVE_FAULT:fail)")
        if "slow" in faults or "pause" in faults:
            time.sleep(float(os.environ.get(SLOW_ENV, SLOW_SECONDS)) if "slow" in faults else PAUSE_SECONDS)
        return self.backend.run(payloads, k)
