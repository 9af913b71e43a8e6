"""Profile of the smooth step (constraints off): program size, compile time, speed.

Usage::

    python -m bench.profile_smooth [--models humanoid-smooth,ant-smooth] [--batch 1024]
                                   [--nstep 20] [--repeat 5] [--x64] [--stages]

For each model: the number of equations of the traced batched step (counted through
sub-jaxprs), the seconds to trace, lower and compile it (wall and process CPU), and
the process CPU time and wall time per world-step of a jitted ``nstep`` rollout at the
given batch size (best of ``repeat``). CPU time per world-step is the figure to
compare on a shared machine: it does not count time the process waits for a core.
With ``--stages``, the same speed figures for the pipeline cut after each stage
(kinematics, com_pos, crb, factor_m, velocity, forward, step), to see where time goes.
"""
from __future__ import annotations

import argparse
import time

from bench.profiling import count_eqns


def _batch(name, batch, dtype):
    import jax
    import jax.numpy as jnp

    import simjax
    from bench.backends import _states
    from bench.models import MODELS, mj_model
    spec = MODELS[name]
    mjm = mj_model(spec)
    model = simjax.load_model(spec.path)
    model = model.replace(opt=model.opt.replace(
        disableflags=model.opt.disableflags | spec.disableflags))
    qpos, qvel, ctrl = _states(mjm, batch)
    d0 = simjax.make_data(model, dtype=dtype)
    data = jax.vmap(lambda q, v, u: d0.replace(qpos=q, qvel=v, ctrl=u))(
        jnp.asarray(qpos, dtype), jnp.asarray(qvel, dtype), jnp.asarray(ctrl, dtype))
    return model, data


def _timeit(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def compile_report(model, data, fn):
    """Equation count and trace / lower / compile seconds of jit(vmap(fn))."""
    import jax
    f = jax.vmap(lambda d: fn(model, d))
    jaxpr, tw, tc = _timeit(lambda: jax.make_jaxpr(f)(data))
    neq = count_eqns(jaxpr.jaxpr)
    jf = jax.jit(f)
    lowered, lw, lc = _timeit(lambda: jf.lower(data))
    _, cw, cc = _timeit(lambda: lowered.compile())
    return dict(eqns=neq, trace_s=tw, lower_wall_s=lw, lower_cpu_s=lc, compile_wall_s=cw,
                compile_cpu_s=cc)


def speed(model, data, fn, nstep, repeat):
    """(CPU us, wall us) per world-step of a jitted nstep rollout, best of repeat."""
    import jax

    def roll(d):
        return jax.lax.fori_loop(0, nstep, lambda i, d: fn(model, d), d)

    run = jax.jit(jax.vmap(roll)).lower(data).compile()
    jax.block_until_ready(run(data))
    best_c = best_w = float("inf")
    nworld = data.qpos.shape[0] * nstep
    for _ in range(repeat):
        _, w, c = _timeit(lambda: jax.block_until_ready(run(data)))
        best_c, best_w = min(best_c, c), min(best_w, w)
    return 1e6 * best_c / nworld, 1e6 * best_w / nworld


def _stages():
    import jax
    import jax.numpy as jnp
    import importlib
    forward = importlib.import_module("simjax.engine.forward")
    smooth = importlib.import_module("simjax.engine.smooth")

    def kin(m, d):
        return smooth.kinematics(m, d)

    def compos(m, d):
        return smooth.com_pos(m, kin(m, d))

    def crb(m, d):
        return smooth.crb(m, compos(m, d))

    def factor(m, d):
        return smooth.factor_m(m, crb(m, d))

    def position(m, d):
        return forward.fwd_position(m, d)

    def velocity(m, d):
        return forward.fwd_velocity(m, position(m, d))

    def cut(stage):
        # feed the stage's outputs back into the state, so that XLA can neither drop
        # the stage nor hoist it out of the rollout loop as loop-invariant
        def fn(m, d):
            out = stage(m, d)
            s = sum(jnp.sum(x) for x, y in zip(jax.tree_util.tree_leaves(out),
                                               jax.tree_util.tree_leaves(d))
                    if x is not y and jnp.issubdtype(x.dtype, jnp.floating))
            return d.replace(qpos=d.qpos + 1e-30 * s, qvel=d.qvel + 1e-30 * s)
        return fn

    stages = dict(kinematics=kin, com_pos=compos, crb=crb, factor_m=factor,
                  fwd_position=position, fwd_velocity=velocity, forward=forward.forward)
    out = {k: cut(v) for k, v in stages.items()}
    out["step"] = forward.step
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="humanoid-smooth,ant-smooth")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--nstep", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--x64", action="store_true")
    ap.add_argument("--stages", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args(argv)
    import jax
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import importlib
    forward = importlib.import_module("simjax.engine.forward")
    dtype = jnp.float64 if args.x64 else jnp.float32
    for name in args.models.split(","):
        model, data = _batch(name, args.batch, dtype)
        if not args.no_compile:
            rep = compile_report(model, data, forward.step)
            print(f"{name}: {rep['eqns']} eqns, trace {rep['trace_s']:.2f} s, lower "
                  f"{rep['lower_wall_s']:.2f} s, compile {rep['compile_wall_s']:.2f} s wall "
                  f"/ {rep['compile_cpu_s']:.2f} s CPU", flush=True)
        fns = _stages() if args.stages else dict(step=forward.step)
        for sname, fn in fns.items():
            cpu, wall = speed(model, data, fn, args.nstep, args.repeat)
            print(f"{name} {sname:>13}: {cpu:7.3f} us CPU, {wall:7.3f} us wall per "
                  f"world-step ({1e6 / wall / 1e3:.1f}K steps/s)", flush=True)


if __name__ == "__main__":
    main()
