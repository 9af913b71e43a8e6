"""Where the XLA CPU compile of the batched step goes, kernel by kernel.

Usage: python bench/profile_codegen.py [--batch N] [--models humanoid,ant] [--top N]
       [--by-computation]

XLA CPU's compile of a simjax step is mostly LLVM code generation, paid per kernel (one
per fusion or unfused op). Measured on a 2-core machine (batch 1024, float32): 4-15 ms
of CPU for a small elementwise, gather, concatenation or row-reduction kernel, 25-37 ms
for a reduction over more than 32 entries (XLA splits it into a reduce-window and a
reduce), and in this profile 40-90 ms for an unfused dot that XLA emits itself (not
handed to a library). With the legacy emitters simjax selects (simjax/__init__.py)
kernels that are identical are each compiled again (the fusion emitters would share
them, but cost more per kernel).

For each model the step, jitted and vmapped over the batch, is compiled in a child
process with XLA's LLVM IR dumped and each LLVM module's compile time logged
(ir_compiler, VLOG 1), every kernel in its own module
(--xla_cpu_parallel_codegen_split_count=1000, so that times are per kernel; the total
is then higher than a normal compile's). Printed: LLVM milliseconds and kernels by the
innermost simjax function of each kernel's stack, the costliest kernels, and the
program's while loops, conditionals, reduce-windows, unfused dots and the fused kernels
that duplicate another one exactly. Times are per-thread wall time inside XLA: on a
loaded machine they are inflated, so compare rankings, not totals.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from bench.profiling import _kernel_lines, kernel_ops, no_source_key  # noqa: E402

_CHILD = """
import sys, jax, jax.numpy as jnp
sys.path.insert(0, {root!r})
import simjax
from bench import models as bench_models
from bench.profile_contact import MODELS
name = {name!r}
if name in bench_models.MODELS:
    # a bench model (disableflags applied): the rollout the bench compiles
    from bench import backends
    spec = bench_models.MODELS[name]
    b = backends.SimJax(bench_models.mj_model(spec), {batch}, 4, spec.path,
                        spec.disableflags)
    exe = b._roll.lower(b.data).compile()
else:
    m = simjax.load_model(MODELS.get(name, name))
    d0 = simjax.make_data(m)
    b = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, ({batch},) + x.shape), d0)
    exe = jax.jit(jax.vmap(lambda d: simjax.step(m, d))).lower(b).compile()
open({out!r}, "w").write(exe.as_text())
"""


def _compile_logged(name, batch, tmp):
    """Compile in a child process; (optimised HLO text, {module: ms}, {module: [fn]})."""
    dump, hlo = os.path.join(tmp, "dump"), os.path.join(tmp, "hlo.txt")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="ir_compiler=1",
               XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""),
                                   "--xla_cpu_parallel_codegen_split_count=1000",
                                   f"--xla_dump_to={dump}",
                                   "--xla_dump_hlo_module_re=.*(lambda|roll).*"]).strip())
    code = _CHILD.format(root=os.path.join(HERE, ".."), name=name, batch=batch, out=hlo)
    log = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stderr
    ms = {}
    for mt in re.finditer(r"Compiled LLVM module: __compute_module_(\S+) time: [^(]*\((\d+) us",
                          log):
        ms[mt.group(1)] = int(mt.group(2)) / 1000     # the step is the last module compiled
    fns = {}
    for f in glob.glob(os.path.join(dump, "*jit_*.ir-with-opt.ll")):
        key = re.search(r"jit__?(?:lambda|roll)\.(.*)\.ir-with-opt\.ll", os.path.basename(f)).group(1)
        fns[key] = [re.search(r"@([\w.\-\"]+)\(", ln).group(1) for ln in open(f)
                    if ln.startswith("define ") and "@llvm." not in ln]
    return open(hlo).read(), ms, fns


def _duplicates(comps, inner):
    """Fused kernels whose fused computation equals another one's (names and metadata
    aside): {canonical text: [kernel names]} with more than one name."""
    groups = collections.defaultdict(list)
    for name, ops in comps.items():
        if name in inner:
            continue
        for op, line in ops:
            mt = re.search(r"%([\w.\-]+) = (\S+) fusion\(.*calls=%([\w.\-]+)", line)
            if mt:
                body = "\n".join(re.sub(r"%[\w.\-]+", "%", re.sub(r", metadata=\{[^}]*\}", "", ln))
                                 for _, ln in comps[mt.group(3)])
                groups[mt.group(2) + body].append(mt.group(1))
    return {k: v for k, v in groups.items() if len(v) > 1}


def _by_computation(text, comps, inner, rows, top):
    """LLVM ms and kernels per computation that runs its kernels (the entry, a loop body,
    a conditional's branch), with the simjax functions most of its kernels come from:
    a collider group run in a branch or a chunk loop has its kernels there (by the
    innermost frame, a collider's kernels are spread over its helpers)."""
    home = {line: name for name, ops in comps.items() if name not in inner
            for _, line in ops}
    kn_line = {re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)", ln).group(1): ln
               for name, ops in comps.items() if name not in inner for _, ln in ops}
    ms, cnt, fns = collections.Counter(), collections.Counter(), {}
    for cost, kn, _, fr in rows:
        c = home.get(kn_line.get(kn), "?")
        ms[c] += cost
        cnt[c] += 1
        fns.setdefault(c, collections.Counter())[fr[-1][1] if fr else "(none)"] += 1
    print("  -- by computation: LLVM ms, kernels, computation, top innermost functions")
    for c, v in ms.most_common(top):
        tops = ", ".join(f"{f} {k}" for f, k in fns[c].most_common(4))
        print(f"  {v:7.0f}  {cnt[c]:5d}  {c[:40]:40s} {tops}")


def profile(name, batch, top, only=None, by_comp=False):
    with tempfile.TemporaryDirectory() as tmp:
        text, ms, fns = _compile_logged(name, batch, tmp)
    fn_ms = {}
    for key, names in fns.items():
        for f in names:
            fn_ms[f] = fn_ms.get(f, 0.0) + ms.get(key, 0.0) / max(1, len(names))
    comps, inner = _kernel_lines(text)
    rows = []
    for op, line, chain in kernel_ops(text):
        kn = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)", line).group(1)
        cost = next((fn_ms[c] for c in (kn, kn + "_kernel", kn + "_elemental_kernel")
                     if c in fn_ms), 0.0)
        frames = [(f.split("simjax/")[-1].replace("engine/", "")[:-3], fn, ln)
                  for f, fn, ln in chain if "simjax/" in f]
        rows.append((cost, kn, op, frames))
    total = sum(ms.values())
    print(f"== {name}: {len(rows)} kernels, LLVM {total / 1e3:.2f} s in {len(ms)} modules "
          f"(per-kernel modules; per-thread time)")
    by, count = collections.Counter(), collections.Counter()
    for cost, _, op, fr in rows:
        key = f"{fr[-1][0]}.{fr[-1][1]}" if fr else no_source_key(op)
        by[key] += cost
        count[key] += 1
    print("  LLVM ms  kernels  innermost simjax function")
    for key, v in by.most_common(top):
        print(f"  {v:7.0f}  {count[key]:7d}  {key}")
    print("  -- costliest kernels: ms, kernel, opcode, innermost frames")
    for cost, kn, op, fr in sorted(rows, key=lambda r: -r[0])[:top]:
        if only and not (fr and only in f"{fr[-1][0]}.{fr[-1][1]}"):
            continue
        where = " < ".join(f"{a}.{b}:{c}" for a, b, c in fr[::-1][:2])
        print(f"  {cost:7.1f}  {kn:32s} {op:14s} {where}")
    if by_comp:
        _by_computation(text, comps, inner, rows, top)
    ops = collections.Counter(op for _, _, op, _ in rows)
    dups = _duplicates(comps, inner)
    print(f"  while {ops['while']}  conditional {ops['conditional']}  reduce-window "
          f"{ops['reduce-window']}  dot {ops['dot']}  copy {ops['copy']}  duplicated fusions "
          f"{sum(len(v) - 1 for v in dups.values())} (in {len(dups)} groups)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--models", default="humanoid")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--only", help="list the costliest kernels of this function only")
    ap.add_argument("--by-computation", action="store_true",
                    help="also LLVM ms and kernels per loop body / branch / entry")
    args = ap.parse_args()
    for name in args.models.split(","):
        profile(name, args.batch, args.top, args.only, args.by_computation)


if __name__ == "__main__":
    main()
