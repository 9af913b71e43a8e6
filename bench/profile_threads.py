"""Process CPU time against wall time of the benchmark's batched rollouts, per backend,
alternated in one process; and how many threads the simjax step keeps busy.

The benchmark reports wall-clock steps/s. XLA CPU splits many loop kernels across its
thread pool (``outer_dimension_partitions`` in the optimised HLO), so a program's wall
time depends on how many cores are free while it runs, not on its CPU time alone: on a
shared machine its steps/s swing with the other processes' load, more for a program
that uses more threads. CPU time / wall time (near 1: one thread busy on average)
tells how much of a backend's speed comes from a second core. Pin the process to one
core (``taskset -c 0 python -m bench.profile_threads ...``) for the one-core figures.

With ``--occupancy`` the simjax step (jit of vmap, on the rollout's state) is traced
with ``jax.profiler`` and its kernels' intervals per thread give the share of the
step's span with 0, 1 and 2+ threads busy, and the kernels that run while no other
thread is busy (the serial part; traced times are inflated by the profiler and by the
machine's load).

Usage: python -m bench.profile_threads [--models barkour] [--backends simjax,mjx]
                                       [--batch 1024] [--chunk 4] [--rounds 10]
                                       [--occupancy]
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def _build(backend, key, batch, chunk):
    from bench import backends
    from bench.models import MODELS, mj_model
    spec = MODELS[key]
    mjm = mj_model(spec)
    if backend == "simjax":
        return backends.SimJax(mjm, batch, chunk, spec.path, spec.disableflags)
    if backend == "mjx":
        return backends.MJX(mjm, batch, chunk)
    raise ValueError(f"unknown backend {backend}")


def cpu_wall(key, names, batch, chunk, rounds):
    """{backend: (cpu us, wall us) per world-step, medians} of alternated rollouts."""
    built = {}
    for name in names:
        b = _build(name, key, batch, chunk)
        b.compile()
        b.run()
        b.run()
        built[name] = b
    got = {name: ([], []) for name in built}
    for _ in range(rounds):
        for name, b in built.items():
            c0, w0 = time.process_time(), time.perf_counter()
            b.run()
            got[name][0].append(1e6 * (time.process_time() - c0) / (batch * chunk))
            got[name][1].append(1e6 * (time.perf_counter() - w0) / (batch * chunk))
    return built, got


def occupancy(model, data, nrun=10, top=15):
    """Print the thread occupancy of ``jit(vmap(step))`` at ``data`` (see module doc)."""
    import re

    import jax

    import simjax
    from bench.profiling import traced_events
    run = jax.jit(jax.vmap(lambda d: simjax.step(model, d)))
    hlo = run.lower(data).compile().as_text()
    names = set(re.findall(r"^\s+(?:ROOT )?%(\S+) = ", hlo, re.M))
    jax.block_until_ready(run(data))
    events = traced_events(run, data, nrun)
    per_thread = collections.defaultdict(list)
    for e in events:
        if e["name"] in names:
            per_thread[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    edges = []
    for tid, spans in per_thread.items():       # nested kernels merged into their parent
        spans.sort()
        merged = []
        for a, b, n in spans:
            if merged and a < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b, n])
        for a, b, n in merged:
            edges += [(a, 1, tid, n), (b, -1, tid, n)]
    edges.sort(key=lambda x: (x[0], x[1]))
    busy, last = {}, edges[0][0]
    share, alone = collections.Counter(), collections.Counter()
    for ts, kind, tid, n in edges:
        share[min(len(busy), 2)] += ts - last
        if len(busy) == 1:
            alone[next(iter(busy.values()))] += ts - last
        last = ts
        if kind == 1:
            busy[tid] = n
        else:
            busy.pop(tid, None)
    total = sum(share.values())
    batch = data.qpos.shape[0]
    print(f"  simjax step traced on {len(per_thread)} threads: " + ", ".join(
        f"{k}{'+' if k == 2 else ''} busy {100 * v / total:.0f}% ({v / nrun / batch:.2f} us"
        f"/world)" for k, v in sorted(share.items())), flush=True)
    print("  kernels running alone (us per world-step):")
    for n, v in alone.most_common(top):
        print(f"    {v / nrun / batch:6.3f}  {n}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="barkour")
    ap.add_argument("--backends", default="simjax,mjx")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--occupancy", action="store_true")
    args = ap.parse_args(argv)
    ncpu = len(os.sched_getaffinity(0))
    for key in args.models.split(","):
        built, got = cpu_wall(key, args.backends.split(","), args.batch, args.chunk,
                              args.rounds)
        print(f"== {key}: batch {args.batch}, {args.chunk}-step rollouts, {args.rounds} "
              f"alternated rounds, {ncpu} usable cores, load {os.getloadavg()[0]:.1f}",
              flush=True)
        for name, (cpu, wall) in got.items():
            ratio = statistics.median(c / w for c, w in zip(cpu, wall))
            w = statistics.median(wall)
            print(f"  {name:7s} CPU {statistics.median(cpu):7.2f} us  wall {w:7.2f} us "
                  f"(range {min(wall):.2f}-{max(wall):.2f}) per world-step  CPU/wall "
                  f"{ratio:.2f}  {1e3 / w:.1f}K steps/s", flush=True)
        if args.occupancy and "simjax" in built:
            b = built["simjax"]
            occupancy(b.model, b.data)


if __name__ == "__main__":
    main()
