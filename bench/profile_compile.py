"""Where the compile of the bench's batched rollout goes, and what LLVM options trade.

Usage: python bench/profile_compile.py [--models humanoid,ant] [--batch N] [--runs R]
       python bench/profile_compile.py --llvm-options=xla_cpu_disable_loop_unrolling
                                       [--models ant] [--rounds 10]
       (write --llvm-options=-some-llvm-option=value: with '=' since LLVM options
       start with '-')
       python bench/profile_compile.py --compile-options='{"xla_disable_hlo_passes":
                                       "while-loop-invariant-code-motion"}' [--models ant]
                                       [--compile-rounds 4] [--rounds 12]
       python bench/profile_compile.py --passes [--models ant] [--top 25]

Without --llvm-options: for each model, R fresh child processes (models alternated) compile
the rollout the bench times (bench.backends: jit(vmap(fori_loop(step))) at ``--batch``,
float32, 4 steps) and report, in process CPU and wall seconds: the trace (jax's
``trace``), the lowering to StableHLO, and XLA's compile, split into XLA's HLO passes
(one thread), and XLA's LLVM work (``llvm_thread_s``: the per-module LLVM compile
times XLA logs, summed over its compile threads, so on 2 idle cores about twice the wall
time it takes). Also Python's cyclic garbage collector during trace and lowering: full
(generation 2) collections and the wall seconds spent in all collections.

Measured on the 2-core machine (loaded, so walls are inflated): shadow hand trace 3.3-4.2
s and lowering 0.7-1.0 s CPU, during which 4 full collections of 200-400 thousand objects
took 1.0-1.3 s wall; with the collector off over trace and lowering, those two took
0.6-1.4 s less CPU (fresh processes), but a gc.disable() scoped to simjax.step did not
pay (the collections then come when it returns); simjax.engine.gc_pause now holds the pause until
jax has lowered the program (no full collection left in trace or lowering). A second trace and
lowering in the same process takes 2.8-3.0 s instead of about 4 s (jax's nested-jit traces and
lowering caches are warm: 1081 nested jit traces in the first, 2 in the second). Ant:
trace 1.4, lowering 0.8, HLO passes 1.2 (the "simplification" fixpoint 0.54 s of it, 16
iterations of while-loop constant sinking and simplification), LLVM about 4.4
thread-seconds.

With --llvm-options: one process per model compiles the rollout twice, as usual (A) and
with the given ``xla_backend_extra_options`` (B: comma-separated ``key`` or ``key=value``;
XLA's own keys such as ``xla_cpu_disable_loop_unrolling`` / ``xla_cpu_optimize_for_size``,
or LLVM command-line options such as ``-force-vector-interleave=1``), then alternates
timed calls of A and B (process CPU per world-step) and reports both compile CPU times,
the run-time ratio B/A and the largest output difference. jax's ``compiler_options``
cannot set that DebugOptions map, and XLA_FLAGS is read once per process, so B's
options are appended to the serialised CompileOptions proto (field numbers of XLA's
xla.proto: CompileOptionsProto.executable_build_options = 3,
ExecutableBuildOptionsProto.debug_options = 3, DebugOptions.xla_backend_extra_options =
500); an unknown LLVM option makes XLA exit with "Unknown command line argument",
which shows the options reach LLVM.

What the options traded (batch 1024, float32, 2 loaded cores; compile CPU A -> B, run
B/A paired): ``xla_cpu_disable_loop_unrolling`` ant 6.4 -> 5.7 s and 6.1 -> 4.6 s, run
1.05-1.06; shadow hand 12.2 -> 10.1 s, run 1.22 (outputs not bit-identical).
``-force-vector-interleave=1`` and ``-unroll-runtime=false,-unroll-allow-partial=false``:
compile and run unchanged (bit-identical). Whole-pipeline settings, one fresh process
each (ant): ``xla_backend_optimization_level`` 0: compile 6.4 -> 2.4 s, run 4.8x slower;
1: 5.2 s, run 1.44x; 2: about the same compile, run 1.4x; XLA_FLAGS
``--xla_backend_extra_options=xla_cpu_optimize_for_size`` (no loop vectorizer): 5.6 -> 5.1
s, run 1.37x; ``xla_llvm_disable_expensive_passes``, ``xla_cpu_prefer_vector_width=128``,
``xla_cpu_max_isa=AVX2``, split counts 4 and 128, ``-post-RA-scheduler=false``,
``-enable-misched=false``: no compile gain seen. In a perf profile of the ant's compile
(LLVM threads) SelectionDAG instruction selection took 17% of the LLVM samples, the loop
vectorizer 12%, InstCombine 8.5%, GVN 4%, IndVarSimplify 4%, the machine schedulers 6%.

With --compile-options (a JSON dict of DebugOptions fields, as jax's ``compiler_options``
takes them): one process per model compiles the rollout as usual (A) and with the options
(B), alternately, ``--compile-rounds`` times each (every compile gets its own
``xla_dump_max_hlo_modules`` value, a no-op without a dump directory, so that jax's
compile cache misses), and reports the process CPU of each and the per-pair ratio B/A;
then the paired run times (as --llvm-options) and the output differences per field. On a
loaded 2-core machine compile CPU varies by 10-20% between fresh processes, more than
the effects sought; alternated pairs in one process vary less (ratios within about +-5%).

With --passes: the rollout is compiled in a child process with XLA's pass pipeline
logged (hlo_pass_pipeline, VLOG 1) and the time per HLO pass (summed over its runs) is
printed for the rollout's module. Ant: HLO passes 2.9 s wall (logging and
load included), the "simplification" fixpoint (15 rounds on the ant) 1.5 s of it:
simplify-while-loops 0.56 s, algsimp 0.38 s, while-loop-invariant-code-motion 0.35 s,
while-loop-constant-sinking 0.10 s; the HLO verifier, run after each outer pass that
changed the module, 0.56 s.

What HLO-pass and XLA:CPU settings traded (batch 1024, float32, 2 cores at load 5-10;
compile CPU B/A medians of alternated pairs in one process, run B/A paired over 12
rounds):
``xla_disable_hlo_passes=while-loop-invariant-code-motion``: compile barkour 0.884 and
0.952 (3 and 4 pairs), humanoid 0.935 (3), ant 0.989 (4), shadow hand 1.076 and 1.056
(3 and 4); run humanoid 0.943 [0.84, 1.00], barkour 0.956 [0.87, 1.20], ant 0.979
[0.93, 1.08], shadow hand 0.940 [0.85, 1.08]; outputs after 4 steps + forward (batch 32)
bit-identical in float32 on humanoid, ant and barkour, shadow hand qacc 1.2e-3; float64
at most 2.4e-11 (humanoid qacc). Kernels 752 -> 742 (humanoid), 669 -> 639 (barkour),
652 -> 660 (ant), 859 -> 848 (shadow hand). Fresh processes (3-4 each, alternated)
could not tell the compiles apart (medians within their 10-20% spread). Adding
while-loop-constant-sinking to the disabled passes: barkour compile 1.003 more.
``xla_disable_hlo_passes=tree_reduction_rewriter`` (reductions over more than 32
entries stay one reduce instead of a reduce-window and a reduce): 12-43 fewer kernels
(shadow hand 859 -> 816), but compile ant 1.027, shadow hand 1.019 (2 and 4 pairs), the
reduce kernels cost what the reduce-windows did; run inconclusive (ant 0.998, shadow hand
0.927 [0.84, 1.11], barkour 1.088 [0.74, 1.41], 8 rounds at load 6-7), float32 outputs
not bit-identical. ``xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_COMPILE``: ant 652 -> 1120
kernels, compile 7.0 -> 12.3 s, run 1.35x. ``xla_cpu_emitter_verification_level=0``:
no change. Backend extra options ``xla_cpu_disable_slp_vectorizer``: compile 7.7 -> 8.2 s
(B second), run 1.02, bit-identical; ``xla_cpu_use_multi_output_fusion=true``: 338 ->
312 fusions, 652 -> 656 kernels, compile 9.2 -> 9.8 s.

Where the single-threaded part of XLA's compile goes (``perf record -F 499 --call-graph
dwarf`` of a child that traces and lowers, then compiles; samples from the end of lowering
to the end of ``compile()``, attributed by stack; process CPU seconds, 2 cores at load 8-12):

    model        compile  setup  HLO passes (verifier, fixpoints)  serial backend  LLVM
    humanoid        7.8    0.22   1.29 (0.31, 0.46)                  0.54          5.7
    ant             5.9    0.16   1.10 (0.20, 0.52)                  0.37          4.3
    barkour         8.0    0.19   1.39 (0.29, 0.58)                  0.58          5.8
    shadow hand    11.9    0.43   2.15 (0.50, 0.70)                  0.95          8.4

"setup": StableHLO -> HLO (hand: the conversion 0.14, its MLIR passes 0.08, an HLO
proto round trip 0.10, the optimised module printed to a string for the executable
0.06); jax's own Python in ``compile()`` is about 0.05 (the cache key). The HLO verifier
runs after every pass that reports a change (26 times on the hand, 12-20 ms each, in
proportion to the instruction count); no DebugOptions field turns it off. "fixpoints":
the "simplification" pipelines, repeated until nothing changes: 9 rounds on the hand, 17
on the ant, where the late rounds each remove a few dead tuple elements from the nested
loops (rollout -> RK4 stage scan -> solver -> line search), one nesting level per round.
"serial backend" (before LLVM's threads start): ``llvm::SplitModule`` 0.16-0.39 (XLA
prints every module part to a string whatever the log level and round-trips it through
bitcode), thunk and IR emission 0.08-0.25, scheduling and buffer assignment about 0.2.
LLVM includes samples with truncated stacks. Passes that never change these programs
(``--xla_dump_hlo_pass_re=.*`` dumps): the 12 float-normalization passes (0.03-0.08 s),
simplify-sorts, cpu-all-reduce-combiner, convolution-group-converter; disabled together
(--compile-options, 6 pairs, load 9-12): compile ant 0.948 (range 0.916-1.071), hand
1.020 (0.948-1.061), run 1.008 / 1.003, bit-identical: no gain measurable, and not for
XLA_FLAGS (process-wide; other programs need them).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")


def _rollout(key, batch):
    """The bench's simjax backend for ``key`` (its ``_roll`` is the jitted rollout)."""
    sys.path.insert(0, ROOT)
    from bench import backends
    from bench.models import MODELS, mj_model
    spec = MODELS[key]
    return backends.SimJax(mj_model(spec), batch, 4, spec.path, spec.disableflags)


def _child(key, batch):
    """One breakdown in this (fresh) process; prints one JSON line."""
    import gc
    b = _rollout(key, batch)
    gcs = {"full": 0, "s": 0.0}
    started = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
            return
        gcs["s"] += time.perf_counter() - started[0]
        gcs["full"] += info["generation"] == 2

    gc.callbacks.append(on_gc)
    c0, w0 = time.process_time(), time.perf_counter()
    traced = b._roll.trace(b.data)
    c1, w1 = time.process_time(), time.perf_counter()
    lowered = traced.lower()
    c2, w2 = time.process_time(), time.perf_counter()
    gc.callbacks.remove(on_gc)
    lowered.compile()
    c3, w3 = time.process_time(), time.perf_counter()
    print("ROW " + json.dumps(dict(
        model=key, trace_cpu=c1 - c0, trace_wall=w1 - w0, lower_cpu=c2 - c1,
        lower_wall=w2 - w1, xla_cpu=c3 - c2, xla_wall=w3 - w2, gc_full=gcs["full"],
        gc_s=gcs["s"])), flush=True)


def _xla_log(log):
    """(HLO pass seconds, LLVM thread-seconds) of the last (largest) program in an XLA
    VLOG (cpu_compiler=1, ir_compiler=1) log."""
    start = log.rfind("Compiling: jit_roll")
    hlo = re.findall(r"Running HLO passes on \[jit_roll\] for CPU time: [^(]*\((\d+) us", log)
    llvm = re.findall(r"Compiled LLVM module: \S+ time: [^(]*\((\d+) us", log[start:])
    return (int(hlo[-1]) / 1e6 if hlo else float("nan"),
            sum(int(u) for u in llvm) / 1e6)


def breakdown(models, batch, runs):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0",
               TF_CPP_VMODULE="cpu_compiler=1,ir_compiler=1")
    rows = {k: [] for k in models}
    for _ in range(runs):
        for key in models:
            p = subprocess.run([sys.executable, __file__, "--child", key, "--batch",
                                str(batch)], env=env, capture_output=True, text=True)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("ROW ")]
            if not line:
                print(key, "failed:", p.stderr[-2000:])
                continue
            row = json.loads(line[-1][4:])
            row["hlo_passes_s"], row["llvm_thread_s"] = _xla_log(p.stderr)
            row["load"] = os.getloadavg()[0]
            rows[key].append(row)
            print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)
    print("\nmedians (s):")
    cols = ["trace_cpu", "lower_cpu", "gc_s", "xla_cpu", "xla_wall", "hlo_passes_s",
            "llvm_thread_s"]
    print(f"{'model':12s} " + " ".join(f"{c:>13s}" for c in cols))
    for key, rs in rows.items():
        if rs:
            print(f"{key:12s} " + " ".join(f"{statistics.median(r[c] for r in rs):13.2f}"
                                           for c in cols))


def _varint(n):
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, payload):
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


@contextlib.contextmanager
def backend_extra_options(options):
    """Compiles inside this context get ``options`` ({key: value}) added to their
    DebugOptions.xla_backend_extra_options (see the module docstring)."""
    from jax._src import compiler
    original = compiler.get_compile_options
    entries = b"".join(_field(500, _field(1, k.encode()) + _field(2, v.encode()))
                       for k, v in options.items())
    extra = _field(3, _field(3, entries))

    def patched(*args, **kwargs):
        opts = original(*args, **kwargs)
        return type(opts).ParseFromString(opts.SerializeAsString() + extra)

    compiler.get_compile_options = patched
    try:
        yield
    finally:
        compiler.get_compile_options = original


def _paired_runs(exe_a, exe_b, d, batch, rounds):
    """Settle ``d`` into contact with ``exe_a``, then time both executables alternately
    (process CPU, us per world-step of the 4-step rollout): (times A, times B, state)."""
    import jax
    for _ in range(5):
        d = jax.block_until_ready(exe_a(d))

    def timed(exe, reps=3):
        t = time.process_time()
        for _ in range(reps):
            jax.block_until_ready(exe(d))
        return (time.process_time() - t) / reps / (batch * 4) * 1e6

    timed(exe_a), timed(exe_b)
    ta, tb = [], []
    for r in range(rounds):
        for v in ("AB" if r % 2 == 0 else "BA"):
            (ta if v == "A" else tb).append(timed(exe_a if v == "A" else exe_b))
    return ta, tb, d


def _output_diffs(out_a, out_b):
    """Max absolute difference per numeric field of two outputs (fields that differ)."""
    import jax
    import numpy as np
    diffs = {}
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(out_a)[0],
                            jax.tree_util.tree_leaves(out_b)):
        x, y = np.asarray(x), np.asarray(y)
        if x.size and np.issubdtype(x.dtype, np.number):
            diff = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))))
            if diff:
                diffs[jax.tree_util.keystr(path)] = diff
    return diffs


def paired_options(key, batch, options, rounds):
    """Compile A (as usual) and B (with ``options``) in this process; alternate runs."""
    b = _rollout(key, batch)
    lowered = b._roll.lower(b.data)
    c0 = time.process_time()
    exe_a = lowered.compile()
    c1 = time.process_time()
    with backend_extra_options(options):
        # a no-op option (its default value) so that jax's compile cache misses
        exe_b = lowered.compile(compiler_options={"xla_cpu_enable_fast_min_max": True})
    c2 = time.process_time()
    ta, tb, d = _paired_runs(exe_a, exe_b, b.data, batch, rounds)
    ratio = [y / x for x, y in zip(ta, tb)]
    diff = max(_output_diffs(exe_a(d), exe_b(d)).values(), default=0.0)
    print(f"{key}: options {options}: compile CPU A {c1 - c0:.2f} s, B {c2 - c1:.2f} s; "
          f"run A {statistics.median(ta):.1f}, B {statistics.median(tb):.1f} us/world-step, "
          f"B/A median {statistics.median(ratio):.3f} (range {min(ratio):.3f}-"
          f"{max(ratio):.3f}, {rounds} rounds); max output difference {diff:.3g}; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)


def paired_compile(key, batch, options, compile_rounds, rounds):
    """Alternate compiles as usual (A) and with ``options`` (B) in this process, then
    alternate timed runs (see the module docstring)."""
    b = _rollout(key, batch)
    lowered = b._roll.lower(b.data)
    lowered.compile(compiler_options={"xla_dump_max_hlo_modules": 999})   # warm-up
    cpu = {"A": [], "B": []}
    exe = {}
    for r in range(compile_rounds):
        for v in ("AB" if r % 2 == 0 else "BA"):
            opts = {"xla_dump_max_hlo_modules": 1000 + 2 * r + (v == "B")}
            if v == "B":
                opts.update(options)
            c = time.process_time()
            exe[v] = lowered.compile(compiler_options=opts)
            cpu[v].append(time.process_time() - c)
    ratio = [y / x for x, y in zip(cpu["A"], cpu["B"])]
    ta, tb, d = _paired_runs(exe["A"], exe["B"], b.data, batch, rounds)
    run = [y / x for x, y in zip(ta, tb)]
    diffs = _output_diffs(exe["A"](d), exe["B"](d))
    top = sorted(diffs.items(), key=lambda kv: -kv[1])[:6]
    print(f"{key}: options {options}: compile CPU A {statistics.median(cpu['A']):.2f} s, "
          f"B {statistics.median(cpu['B']):.2f} s, B/A median {statistics.median(ratio):.3f}"
          f" (range {min(ratio):.3f}-{max(ratio):.3f}, {compile_rounds} pairs); run A "
          f"{statistics.median(ta):.1f}, B {statistics.median(tb):.1f} us/world-step, B/A "
          f"median {statistics.median(run):.3f} (range {min(run):.3f}-{max(run):.3f}, "
          f"{rounds} rounds); load {os.getloadavg()[0]:.1f}", flush=True)
    print("  output differences:", ", ".join(f"{k} {v:.3g}" for k, v in top)
          if top else "none (bit-identical)", flush=True)


def pass_times(key, batch, top):
    """Time per HLO pass of the rollout's module (summed over its runs), from XLA's log.
    A nested pipeline (the "simplification" fixpoint) is listed as a pass too, its time
    including that of the passes it ran."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="hlo_pass_pipeline=1")
    p = subprocess.run([sys.executable, __file__, "--child", key, "--batch", str(batch)],
                       env=env, capture_output=True, text=True)
    passes, count = {}, {}
    module = None
    for ln in p.stderr.splitlines():
        mt = re.search(r"Running HLO pass pipeline on module (\S+):", ln)
        if mt:
            module = mt.group(1)
            continue
        mt = re.search(r"HLO pass: (\S+) time: .*?\((\d+) us\)", ln)
        if mt and module and module.startswith("jit_roll"):
            passes[mt.group(1)] = passes.get(mt.group(1), 0) + int(mt.group(2))
            count[mt.group(1)] = count.get(mt.group(1), 0) + 1
    print(f"== {key}: HLO passes of the rollout (wall ms, one thread; load "
          f"{os.getloadavg()[0]:.1f})")
    for name, us in sorted(passes.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {us / 1e3:8.1f} ms  {count[name]:3d} runs  {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="humanoid,ant,barkour,shadow_hand")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--llvm-options", default=None)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--compile-options", default=None)
    ap.add_argument("--compile-rounds", type=int, default=4)
    ap.add_argument("--passes", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    if args.child:
        return _child(args.child, args.batch)
    models = args.models.split(",")
    if args.passes:
        for key in models:
            pass_times(key, args.batch, args.top)
        return
    if args.compile_options is not None:
        options = json.loads(args.compile_options)
        for key in models:
            paired_compile(key, args.batch, options, args.compile_rounds, args.rounds)
        return
    if args.llvm_options is None:
        return breakdown(models, args.batch, args.runs)
    options = dict((kv.split("=", 1) + [""])[:2] for kv in args.llvm_options.split(",") if kv)
    for key in models:
        paired_options(key, args.batch, options, args.rounds)


if __name__ == "__main__":
    main()
