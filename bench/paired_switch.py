"""A module-level switch of simjax measured on the benchmark's batched rollouts, its
values paired in one process.

Each value of the switch (a module attribute read at trace time, such as
``simjax.engine.solver_worlds._PER_WORLD_WORK``) gets its own compiled rollout of the
bench (``bench.backends.SimJax``: same states, same step count per call); after two
warm-up calls each, the programs are timed in alternating order, round after round,
so that a drift of the machine (or of the rollout's state, which each program carries
from call to call) falls on every value alike. The batch runs as the bench runs it (on
CPU as one chunk per core at once; ``--threads 1``: one program, as measurements before
2026-12-05's chunked stepping were). Prints compile seconds and, per value,
the median call and its steps/s with every call's time.

Usage: python -m bench.paired_switch --switch simjax.engine.solver_worlds._PER_WORLD_WORK
           --values False,True [--models humanoid,ant] [--batch 4096] [--nstep 2]
           [--rounds 6] [--json out.json] [--threads N]
Values are Python literals (``ast.literal_eval``).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def _switch(path):
    """(module, attribute name) of a dotted ``module.attribute`` path."""
    mod, _, name = path.rpartition(".")
    module = importlib.import_module(mod)
    if not hasattr(module, name):
        raise SystemExit(f"{mod} has no attribute {name}")
    return module, name


def measure(key, module, name, values, batch, nstep, rounds, threads=None):
    """{value: [seconds per call]} for bench model ``key``, the values' calls
    alternated (the order reversed every other round)."""
    from bench import backends, models
    # a bench model's key, or the path of a model file (its own options)
    spec = models.MODELS[key] if key in models.MODELS else models.BenchModel(key)
    mjm = models.mj_model(spec)
    saved = getattr(module, name)
    runs = {}
    try:
        for v in values:
            setattr(module, name, v)
            b = backends.SimJax(mjm, batch, nstep, spec.path, spec.disableflags,
                                threads)
            print(f"{key} {name}={v!r} compile {b.compile():.2f} s", flush=True)
            b.run()
            b.run()
            runs[v] = b
    finally:
        setattr(module, name, saved)
    times = {v: [] for v in values}
    for r in range(rounds):
        for v in (values if r % 2 == 0 else values[::-1]):
            times[v].append(runs[v].run())
    for v in values:
        t = sorted(times[v])[len(times[v]) // 2]
        print(f"{key} {name}={v!r} median {t * 1e3:.1f} ms/call, "
              f"{batch * nstep / t / 1e3:.1f}K steps/s; calls (ms) "
              f"{[round(x * 1e3, 1) for x in times[v]]}", flush=True)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switch", required=True, help="module.attribute")
    ap.add_argument("--values", required=True, help="comma-separated Python literals")
    ap.add_argument("--models", default="humanoid,ant,barkour,shadow_hand",
                    help="bench model keys or model file paths")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--nstep", type=int, default=2, help="steps per rollout call")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", help="write {model: {value: [seconds]}} here")
    ap.add_argument("--threads", type=int, default=None,
                    help="chunks of the batch at once (default: as the bench, the usable "
                         "cores on CPU; 1: one program over the batch)")
    a = ap.parse_args(argv)
    module, name = _switch(a.switch)
    values = [ast.literal_eval(v) for v in a.values.split(",")]
    out = {}
    for key in a.models.split(","):
        times = measure(key, module, name, values, a.batch, a.nstep, a.rounds,
                        a.threads)
        out[key] = {repr(v): t for v, t in times.items()}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
