"""One measurement in a fresh process: one backend, one model, one batch size.

A fresh process per measurement gives honest compile times (no warm caches), an
honest peak memory (the process's maximum resident set) and keeps a crash, a hang or
an out-of-memory in one backend from ending the whole run.

The worker reports as it goes, one line each, so the parent keeps what was measured
when it has to stop a phase that hangs:

- ``PHASE <name>``: a phase starts (``forward``: load, compile of the ``chunk``-step
  rollout (and with ``--compile-step`` of one step alone), timed rollouts;
  ``grad``: compile and time value-and-gradient);
- ``RESULT <json>``: the row so far (each line supersedes the previous one).

``cpu_sps`` is the rate per second of process CPU time (all threads) of the same calls:
``sps / cpu_sps`` is the number of cores the backend kept busy (XLA CPU runs parts of
its kernels on a second thread where a core is free).

Timing is adaptive: the compiled rollout is ``chunk`` steps long; one call after the
warm-up call gives the cost of a call, and the number of timed calls is sized to fill
``budget`` seconds (at least 2, at most 30); steps/s comes from the median call.

Usage: python -m bench.worker BACKEND MODEL_KEY BATCH CHUNK [--budget S]
                              [--grad-nstep N] [--no-forward] [--compile-step]
                              [--simjax-threads N]

simjax steps its batch as ``simjax.rollout_batch`` does: on CPU cut into one chunk
per usable core, the chunks run at once from threads (``--simjax-threads 1``: one
program over the whole batch, as before 2026-12-05-c); the row records ``threads``.
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
import traceback


def _emit(kind, payload):
    print(f"{kind} {payload}", flush=True)


def timed_calls(run, budget, min_calls=2, max_calls=30):
    """Median seconds of ``run()`` (which returns its own duration): one warm-up call,
    one probe call, then as many calls as fit in ``budget`` seconds. Returns
    (median seconds, number of timed calls)."""
    run()
    first = run()
    n = min(max_calls, max(min_calls, math.ceil(budget / max(first, 1e-6))))
    times = [first] + [run() for _ in range(n - 1)]
    return statistics.median(times), n


def _error(e):
    return f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]


def measure(backend_name, key, batch, chunk, grad_nstep=0, budget=3.0, forward=True,
            compile_step=False, threads=None):
    """Measure and report (``RESULT`` lines); returns the final row."""
    from bench import backends
    from bench.models import MODELS, mj_model

    spec = MODELS[key]
    row = dict(model=key, backend=backend_name, batch=batch)

    def build(nstep):
        mjm = mj_model(spec)
        if backend_name == "mujoco":
            return backends.MuJoCoC(mjm, batch, nstep)
        if backend_name == "simjax":
            return backends.SimJax(mjm, batch, nstep, spec.path, spec.disableflags,
                                   threads)
        if backend_name == "mjx":
            return backends.MJX(mjm, batch, nstep)
        raise ValueError(f"unknown backend {backend_name}")

    def peak():
        row["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    if forward:
        _emit("PHASE", "forward")
        try:
            b = build(chunk)
            row["nstep"] = chunk
            if hasattr(b, "threads"):
                row["threads"] = b.threads
            if compile_step and backend_name != "mujoco":
                row["compile_step_s"] = b.compile_step()
                _emit("RESULT", json.dumps(row))
            row["compile_s"] = b.compile()
            _emit("RESULT", json.dumps(row))
            cpu = []

            def run():
                c0 = time.process_time()
                sec = b.run()
                cpu.append(time.process_time() - c0)
                return sec
            sec, ncalls = timed_calls(run, budget)
            row["sps"] = batch * chunk / sec
            # steps per second of process CPU time (all threads): sps / cpu_sps is the
            # number of cores the backend kept busy, so a wall-clock rate that moves
            # with the machine's load shows whether it came from a second core
            row["cpu_sps"] = batch * chunk / max(statistics.median(cpu[1:]), 1e-9)
            row["ncalls"] = ncalls
            row["memory_bytes"] = b.memory()
        except Exception as e:      # the failure is data; the run goes on
            traceback.print_exc(file=sys.stderr)
            row["error"] = _error(e)
        peak()
        _emit("RESULT", json.dumps(row))
        if "error" in row:
            return row
    if grad_nstep and backend_name != "mujoco":
        _emit("PHASE", "grad")
        try:
            gb = build(grad_nstep)
            row["grad_nstep"] = grad_nstep
            row["grad_compile_s"] = gb.compile_grad()
            row["grad_memory_bytes"] = gb.memory_grad()
            _emit("RESULT", json.dumps(row))
            sec, ncalls = timed_calls(gb.run_grad, budget)
            row["grad_sps"] = batch * grad_nstep / sec
            row["grad_ncalls"] = ncalls
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            row["grad_error"] = _error(e)
        peak()
        _emit("RESULT", json.dumps(row))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("backend")
    ap.add_argument("model")
    ap.add_argument("batch", type=int)
    ap.add_argument("chunk", type=int, help="steps per compiled rollout call")
    ap.add_argument("--budget", type=float, default=3.0,
                    help="seconds of timed calls per measurement (after warm-up)")
    ap.add_argument("--grad-nstep", type=int, default=0)
    ap.add_argument("--no-forward", action="store_true")
    ap.add_argument("--compile-step", action="store_true",
                    help="also time the compile of one batched step (a second compile)")
    ap.add_argument("--simjax-threads", type=int, default=None,
                    help="chunks of the batch simjax steps at once (default: as "
                         "simjax.rollout_batch, the usable cores on CPU)")
    args = ap.parse_args(argv)
    try:
        measure(args.backend, args.model, args.batch, args.chunk, args.grad_nstep,
                args.budget, forward=not args.no_forward, compile_step=args.compile_step,
                threads=args.simjax_threads)
    except Exception as e:          # e.g. an unknown model key
        traceback.print_exc(file=sys.stderr)
        _emit("RESULT", json.dumps(dict(model=args.model, backend=args.backend,
                                        batch=args.batch, error=_error(e))))


if __name__ == "__main__":
    main()
