"""Loops that vmap batches more than once while the batched step is traced.

Usage: python bench/profile_batching.py [--models humanoid,ant,...] [--batch N]
                                         [--forward]

jax's batching rules for ``scan`` and ``while`` find which loop-carried values are
batched by a fixpoint: the body is batched with the initial values' batching, and again
for every round in which a value that came in unbatched leaves the body batched. Each
round traces the whole body again (a collider's GJK iteration, a solver pass), so a
loop whose start is not batched where its body makes it so costs trace time for
nothing; simjax batches such starts with ``solver_worlds.batched_like``.

For each model (a bench name, as in ``bench/models.py``, or an MJCF path) the step (or
with --forward, forward) is traced under ``jax.vmap`` over ``--batch`` worlds with the
two rules wrapped, and every loop batched in more than one round is printed: the rounds,
how often the loop was batched so, the first simjax source line of its body, and the
carried values (index and type) that came in unbatched and left batched. Uses jax's
internal rule tables (``batching.fancy_primitive_batchers``); the trace is otherwise
the usual one. Measured with it (2026-12-07): the pusher's GJK iteration and
polygonQuad walk took two rounds each until their starts were batched (GJK's also at
the batch's level under the colliders' vmap over pairs: ``batched_like`` nested). Left
at two rounds: the shadow hand's clip of the box-box patch (inside jax's own cumsum),
the solver's bisection (``solver_gather._bisect``) and PGS's island loop, whose starts
batched made no measurable difference (humanoid, Gymnasium humanoid).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def _source(jaxpr):
    """The first simjax frame (file:function:line) among the body's first equations."""
    for eqn in jaxpr.jaxpr.eqns[:20]:
        tb = eqn.source_info.traceback
        if tb is None:
            continue
        for fr in tb.frames:
            if "/simjax/" in fr.file_name and not fr.file_name.endswith("inline.py"):
                return (f"{fr.file_name.split('/simjax/')[-1]}:{fr.function_name}:"
                        f"{fr.line_num}")
    return "?"


def rounds(fn, arg):
    """{(loop kind, source): (most rounds, times batched, flipped carries)} of the loops
    batched while ``jax.jit(fn)`` is traced at ``arg``."""
    import jax
    from jax._src.interpreters import batching
    from jax._src.lax.control_flow import loops

    orig = batching.batch_jaxpr
    seen = collections.defaultdict(lambda: [0, 0, []])

    def wrap(rule, kind):
        def run(axis_data, args, dims, **params):
            body = params.get("jaxpr") or params.get("body_jaxpr")
            calls = []

            def counting(j, *a, **k):
                if j is body:
                    calls.append(list(a[1]))
                return orig(j, *a, **k)
            batching.batch_jaxpr = counting
            try:
                return rule(axis_data, args, dims, **params)
            finally:
                batching.batch_jaxpr = orig
                rec = seen[(kind, _source(body))]
                rec[1] += 1
                if len(calls) > rec[0]:
                    rec[0] = len(calls)
                    rec[2] = [(i, str(body.in_avals[i])) for i, (x, y)
                              in enumerate(zip(calls[0], calls[-1])) if x != y]
        return run

    table = batching.fancy_primitive_batchers
    saved = {p: table[p] for p in (loops.scan_p, loops.while_p)}
    table[loops.scan_p] = wrap(saved[loops.scan_p], "scan")
    table[loops.while_p] = wrap(saved[loops.while_p], "while")
    try:
        jax.jit(fn).trace(arg)
    finally:
        table.update(saved)
    return dict(seen)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="humanoid,ant,barkour,shadow_hand")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--forward", action="store_true", help="trace forward, not step")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp

    import simjax
    from bench import models as bench_models
    for name in args.models.split(","):
        spec = bench_models.MODELS.get(name)
        model = simjax.load_model(spec.path if spec else name)
        if spec and spec.disableflags:
            model = model.replace(opt=model.opt.replace(
                disableflags=model.opt.disableflags | spec.disableflags))
        d0 = simjax.make_data(model)
        batch = jax.vmap(lambda i: d0)(jnp.arange(args.batch))
        fn = simjax.forward if args.forward else simjax.step
        found = rounds(jax.vmap(lambda d, m=model: fn(m, d)), batch)
        many = {k: v for k, v in found.items() if v[0] > 1}
        print(f"== {name}: {sum(v[1] for v in found.values())} loop batchings, "
              f"{len(many)} loops in more than one round")
        for (kind, src), (n, times, flipped) in sorted(many.items(),
                                                       key=lambda kv: -kv[1][0]):
            print(f"  {n} rounds ({times}x) {kind} {src}: unbatched in, batched out "
                  f"{flipped}")


if __name__ == "__main__":
    main()
