"""One measurement in a fresh process: one backend, one model, one batch size.

A fresh process per measurement gives honest compile times (no warm caches), an
honest peak memory (the process's maximum resident set) and keeps a crash or an
out-of-memory in one backend from ending the whole run. Prints one JSON object.

Usage: python -m bench.worker BACKEND MODEL_KEY BATCH NSTEP [--grad-nstep N]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
import traceback


def _measure(backend, repeats, min_time):
    """Median seconds of ``backend.run`` over ``repeats`` calls (after one warm-up),
    repeating more while the total stays under ``min_time``."""
    backend.run()
    times = []
    t0 = time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - t0 < min_time and len(times) < 50):
        times.append(backend.run())
    return statistics.median(times)


def measure(backend_name, key, batch, nstep, grad_nstep=0, repeats=3, min_time=1.0):
    from bench import backends
    from bench.models import MODELS, mj_model

    spec = MODELS[key]
    mjm = mj_model(spec)
    row = dict(model=key, backend=backend_name, batch=batch, nstep=nstep)
    if backend_name == "mujoco":
        b = backends.MuJoCoC(mjm, batch, nstep)
    elif backend_name == "simjax":
        b = backends.SimJax(mjm, batch, nstep, spec.path, spec.disableflags)
    elif backend_name == "mjx":
        b = backends.MJX(mjm, batch, nstep)
    else:
        raise ValueError(f"unknown backend {backend_name}")
    if backend_name != "mujoco":
        row["compile_step_s"] = b.compile_step()
    row["compile_s"] = b.compile()
    sec = _measure(b, repeats, min_time)
    row["sps"] = batch * nstep / sec
    row["memory_bytes"] = b.memory()
    if grad_nstep and backend_name != "mujoco":
        gb = type(b)(mjm, batch, grad_nstep, *((spec.path, spec.disableflags)
                                               if backend_name == "simjax" else ()))
        row["grad_nstep"] = grad_nstep
        row["grad_compile_s"] = gb.compile_grad()
        gb.run_grad()
        row["grad_sps"] = batch * grad_nstep / min(gb.run_grad() for _ in range(repeats))
    row["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("backend")
    ap.add_argument("model")
    ap.add_argument("batch", type=int)
    ap.add_argument("nstep", type=int)
    ap.add_argument("--grad-nstep", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        row = measure(args.backend, args.model, args.batch, args.nstep, args.grad_nstep,
                      args.repeats)
    except Exception as e:      # report the failure as data, the run goes on
        row = dict(model=args.model, backend=args.backend, batch=args.batch,
                   error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
        traceback.print_exc(file=sys.stderr)
    print("RESULT " + json.dumps(row))


if __name__ == "__main__":
    main()
