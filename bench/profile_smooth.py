"""Profile of the smooth step (constraints off): program size, compile time, speed.

Usage::

    python -m bench.profile_smooth [--models humanoid-smooth,ant-smooth] [--batch 1024]
                                   [--nstep 20] [--repeat 5] [--x64] [--stages]
                                   [--isolated] [--ops N]

For each model: the number of equations of the traced batched step (counted through
sub-jaxprs), the seconds to trace, lower and compile it (wall and process CPU), and
the process CPU time and wall time per world-step of a jitted ``nstep`` rollout at the
given batch size (best of ``repeat``). CPU time per world-step is the figure to
compare on a shared machine: it does not count time the process waits for a core.
With ``--stages``, the same speed figures for the pipeline cut after each stage
(kinematics, com_pos, crb, factor_m, velocity, forward, step), to see where time goes.
With ``--isolated``, every stage of the step is jitted on its own, fed the state the
stages before it computed, and returns only the arrays it changes (so the figure is the
stage's own work, not copying Data); the rows sum to roughly the step. With ``--ops N``,
the N most expensive XLA kernels of one batched step from a profiler trace, with the
source operation each belongs to (the tracer adds a fixed cost per kernel, so use the
ranking, not the absolute times).
"""
from __future__ import annotations

import argparse
import time

from bench.profiling import count_eqns, traced_events


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


def _isolated_stages():
    """(name, fn) for every stage of a smooth Euler/implicit step, in pipeline order."""
    import importlib
    forward = importlib.import_module("simjax.engine.forward")
    smooth = importlib.import_module("simjax.engine.smooth")
    from simjax.engine import actuation, passive, sensor, tree_linalg

    def euler_solve(m, d):
        # the integrator's factorisation and solve of M + h diag(damping'), as mj_Euler
        h = m.opt.timestep
        damping, poly = passive.dof_damping(m, d.qpos.dtype)
        diag = passive.poly_force_deriv(damping, poly, d.qvel, True)
        qld = tree_linalg.factor_ld(m, d.qM, add_diag=h * diag)
        qacc = tree_linalg.solve_ld(m, qld, d.qfrc_smooth + d.qfrc_constraint)
        return d.replace(qacc=qacc)

    return [("kinematics", smooth.kinematics), ("com_pos", smooth.com_pos),
            ("tendon", smooth.tendon), ("crb", smooth.crb), ("factor_m", smooth.factor_m),
            ("transmission", actuation.transmission), ("sensor_pos", sensor.sensor_pos),
            ("com_vel", smooth.com_vel), ("passive", passive.passive),
            ("rne", lambda m, d: d.replace(qfrc_bias=smooth.rne(m, d))),
            ("sensor_vel", sensor.sensor_vel), ("actuation", forward.fwd_actuation),
            ("fwd_acceleration", forward.fwd_acceleration),
            ("fwd_constraint", forward.fwd_constraint), ("sensor_acc", sensor.sensor_acc),
            ("euler_solve", euler_solve),
            ("advance", lambda m, d: forward._advance(m, d, d.act_dot, d.qacc))]


def isolated(model, data, repeat):
    """Print CPU us per world and equations of each stage jitted on its own."""
    import jax

    total = ctotal = 0.0
    nworld = data.qpos.shape[0]
    for name, stage in _isolated_stages():
        def changed(d, stage=stage):
            out = stage(model, d)
            return [x for x, y in zip(jax.tree_util.tree_leaves(out),
                                      jax.tree_util.tree_leaves(d)) if x is not y]
        batched = jax.vmap(changed)
        neq = count_eqns(jax.make_jaxpr(batched)(data).jaxpr)
        _, _, ccpu = _timeit(lambda: jax.jit(batched).lower(data).compile())
        run = jax.jit(batched)
        jax.block_until_ready(run(data))
        best = float("inf")
        for _ in range(repeat):
            _, _, c = _timeit(lambda: jax.block_until_ready(run(data)))
            best = min(best, c)
        us = 1e6 * best / nworld
        total += us
        ctotal += ccpu
        print(f"  {name:>16}: {us:7.3f} us CPU per world, {neq:5d} eqns, compile "
              f"{ccpu:5.2f} s CPU", flush=True)
        data = jax.jit(jax.vmap(lambda d, stage=stage: stage(model, d)))(data)
    print(f"  {'sum':>16}: {total:7.3f} us CPU per world, compile {ctotal:5.2f} s CPU",
          flush=True)


def top_ops(model, data, fn, count):
    """Print the ``count`` XLA kernels of jit(vmap(fn)) with the most traced time."""
    import collections
    import re

    import jax
    run = jax.jit(jax.vmap(lambda d: fn(model, d)))
    hlo = run.lower(data).compile().as_text()
    source = {}
    for line in hlo.splitlines():
        found = re.match(r"\s+(?:ROOT )?%(\S+) = .*op_name=\"([^\"]+)\"", line)
        if found:
            source[found.group(1)] = found.group(2)
    jax.block_until_ready(run(data))
    nrun = 5
    events = traced_events(run, data, nrun)
    spent = collections.Counter()
    for e in events:
        if e["name"] in source:
            spent[e["name"]] += e["dur"] / nrun
    total = sum(spent.values())
    print(f"  {len(spent)} kernels, {total:.0f} us traced per batched step", flush=True)
    for name, us in spent.most_common(count):
        print(f"  {us:9.1f} us {100 * us / total:5.1f}%  {name:<32} {source[name][-70:]}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="humanoid-smooth,ant-smooth")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--nstep", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--x64", action="store_true")
    ap.add_argument("--stages", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--isolated", action="store_true")
    ap.add_argument("--ops", type=int, default=0)
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
        if args.isolated:
            print(f"{name}: stages jitted one by one, batch {args.batch}", flush=True)
            isolated(model, data, max(args.repeat, 10))
        if args.ops:
            print(f"{name}: top XLA kernels of one step, batch {args.batch}", flush=True)
            top_ops(model, data, forward.step, args.ops)
        if args.isolated or args.ops:
            continue
        fns = _stages() if args.stages else dict(step=forward.step)
        for sname, fn in fns.items():
            cpu, wall = speed(model, data, fn, args.nstep, args.repeat)
            print(f"{name} {sname:>13}: {cpu:7.3f} us CPU, {wall:7.3f} us wall per "
                  f"world-step ({1e6 / wall / 1e3:.1f}K steps/s)", flush=True)


if __name__ == "__main__":
    main()
