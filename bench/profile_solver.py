"""Profile of the constraint solve alone (fwd_constraint): CPU time per world, compile
CPU time and jaxpr size, on settled contact states of the bench models.

Usage: python bench/profile_solver.py --prep [--batch N] [--models humanoid,ant]
       python bench/profile_solver.py [--batch N] [--tile-from B] [--models ...] [--compile]
           [--repeat R] [--attribute DEPTH] [--top N]

--prep settles the worlds (MuJoCo C, then simjax steps) and stores the inputs of the
solve (a forward pass' Data, numpy leaves) under --cache, so that later runs, on any
checkout of the code (the script imports simjax from the working directory), time the
same states without compiling the whole step; --tile-from B times --batch worlds made
of copies of the states stored for batch B. Times are process CPU time per world of a
function returning only the fields the solve writes.

With --attribute DEPTH, the solve's kernel time in a profiler trace is also charged to
the DEPTH innermost simjax functions of each kernel (bench.profiling.
runtime_attribution), per world, the --top costliest printed: a ranking (the trace adds
a cost per kernel). Seen on mjx_sensor's settled states (batch 256, Intel Xeon, 2
cores): 53.6 of 192 us per world in Newton's Hessian refactorisations
(solver_worlds.where_needed: the J' D J product and LAPACK's potrf on 39 dofs), 20.8 in
the write-back of the Newton loop's trips (solver_worlds._put_rows), 14.9 in the line
search's per-island sums (solver_search._eval), 9.8 in the island search
(pgs._islands).
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys

sys.path.insert(0, os.getcwd())

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.join(HERE, ".."))
from bench.profile_contact import MODELS, settled  # noqa: E402
from bench.profiling import compile_note, cpu_time, runtime_attribution  # noqa: E402


#: the fields fwd_constraint writes
OUTPUTS = ("qacc", "efc_force", "efc_state", "qfrc_constraint", "efc_b", "solver_niter",
           "solver_improvement", "solver_gradient")


def _outputs(d):
    return {k: getattr(d, k) for k in OUTPUTS}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--models", default="humanoid,ant,barkour,shadow_hand")
    ap.add_argument("--prep", action="store_true")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cache", default="/tmp/solver_bench")
    ap.add_argument("--tile-from", type=int, default=0,
                    help="time --batch worlds tiled from the states stored for this batch")
    ap.add_argument("--attribute", type=int, default=0, metavar="DEPTH",
                    help="also the kernels' traced time by their DEPTH innermost functions")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    import simjax
    import importlib
    from simjax.engine import io, solver
    forward = importlib.import_module("simjax.engine.forward")

    os.makedirs(args.cache, exist_ok=True)
    for name in args.models.split(","):
        path = MODELS.get(name, name)
        m = simjax.load_model(path)
        d0 = io.make_data(m)
        stored = args.tile_from if args.tile_from and not args.prep else args.batch
        # a model given by its path stays inside the cache directory
        key = name.strip("/").replace("/", "_")
        fname = os.path.join(args.cache, f"{key}_{stored}.pkl")
        if args.prep:
            _, _, qpos, qvel = settled(path, args.batch, 400)
            dt = d0.qpos.dtype
            batch = jax.vmap(lambda q, v: d0.replace(qpos=q, qvel=v))(
                jnp.asarray(qpos, dt), jnp.asarray(qvel, dt))
            roll = lambda dd: jax.lax.scan(lambda x, _: (forward.step(m, x), None), dd,
                                           None, length=args.steps)[0]
            out = jax.jit(jax.vmap(roll))(batch)
            fw = jax.jit(jax.vmap(lambda dd: forward.forward(m, dd)))(out)
            with open(fname, "wb") as f:
                pickle.dump(jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.asarray, fw)), f)
            print(f"{name}: stored {fname}")
            continue
        with open(fname, "rb") as f:
            leaves = pickle.load(f)
        if stored != args.batch:
            rep = -(-args.batch // stored)
            leaves = [np.concatenate([x] * rep)[:args.batch] if np.ndim(x) else x
                      for x in leaves]
        treedef = jax.tree_util.tree_structure(jax.vmap(lambda _: d0)(jnp.zeros(2)))
        fw = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(x) for x in leaves])
        # only what the solve writes: returning the whole Data makes XLA copy the
        # untouched inputs into the outputs and overstates the stage
        fn = lambda dd: _outputs(solver.fwd_constraint(m, dd))
        g = jax.jit(jax.vmap(fn))
        extra = compile_note(jax.vmap(fn), fw) if args.compile else ""
        out = g(fw)
        t = cpu_time(g, fw, repeat=args.repeat)
        niter = np.asarray(out["solver_niter"]).max(-1)
        print(f"{name:12s} solve {1e6 * t / args.batch:8.2f} us/world  niter mean "
              f"{niter.mean():.2f} max {niter.max()}{extra}", flush=True)
        if args.attribute:
            spent, count = runtime_attribution(g.lower(fw).compile(), (fw,),
                                               depth=args.attribute)
            print(f"  traced kernel time {sum(spent.values()) / args.batch:.1f} us/world; "
                  "us/world, kernels per call, innermost functions:")
            for key, us in spent.most_common(args.top):
                print(f"  {us / args.batch:9.2f} {count[key]:8.0f}  {key}")


if __name__ == "__main__":
    main()
