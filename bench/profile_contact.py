"""Profile of the contact step: CPU time per world-step of the whole step and of its
stages (smooth position stage, collision, make_constraint, velocity/actuation stages,
constraint solve, integration), solver iteration counts, jaxpr size and compile time.

Usage: python bench/profile_contact.py [--batch N] [--models humanoid,ant] [--parts]
                                       [--compile] [--compile-stages] [--prefixes]

With --compile the batched step's jaxpr size and compile time are printed (wall and
process CPU time), and with --parts as well each stage's jaxpr size and compile CPU time.

With --compile-stages (no run-time measurement): every pipeline stage (kinematics, com_pos,
tendon, crb, factor_m, collision and each of its collider groups, make_constraint,
transmission, sensors, com_vel, passive, rne, reference_constraint, actuation, smooth
acceleration, constraint solve, integrator) jitted and vmapped alone over the batch,
fed a forwarded settled state and returning only the arrays it changes, then the whole
step; per row: jaxpr equations, trace+lower and compile process-CPU seconds, and the
optimised HLO's instructions, kernels (unfused ops and fusions the CPU backend emits),
fusions and while loops (bench.profiling.hlo_stats). The sum of the top-level stages is
compared with the whole step. With --prefixes as well, the pipeline cut after the
position stage, after the velocity stage, before the solver and after the solver
(forward), to see whether the compile time grows faster than the sum of its parts.
With --attribute: the whole step compiled once and its kernels attributed, by the stack
frames in the optimised HLO, to the pipeline stage (first simjax function outside
forward.py) and to the innermost simjax module (e.g. tree_linalg inside the solver).
With --ablate-solve R: the whole step against the step whose constraint solve is left
out (qacc = qacc_smooth, the rows still made), timed alternately for R paired rounds:
the solve's true share of the step (a profiler trace's per-kernel figures overstate
small kernels, and --parts runs each stage on the whole Data).

Worlds are settled into contact with MuJoCo C (one world, then jittered copies), so the
profile runs on resting contact states. Times are process CPU time (time.process_time)
divided by batch * steps: on a shared machine CPU time is steadier than wall time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from bench.models import CORPUS  # noqa: E402
from bench.profiling import compile_note, count_eqns, cpu_time  # noqa: E402

MODELS = {"humanoid": f"{CORPUS}/mujoco_humanoid/humanoid.xml",
          "ant": f"{CORPUS}/gym_ant/ant.xml",
          "barkour": f"{CORPUS}/mjx_barkour_v0/assets/barkour_v0_mjx.xml",
          "shadow_hand": f"{CORPUS}/mjx_shadow_hand/scene_right.xml"}


def settled(path, batch, settle, seed=0):
    import mujoco
    mjm = mujoco.MjModel.from_xml_path(path)
    mjd = mujoco.MjData(mjm)
    for _ in range(settle):
        mujoco.mj_step(mjm, mjd)
    rng = np.random.default_rng(seed)
    qpos = np.tile(mjd.qpos, (batch, 1))
    qvel = np.tile(mjd.qvel, (batch, 1)) + 1e-2 * rng.standard_normal((batch, mjm.nv))
    return mjm, mjd, qpos, qvel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--settle", type=int, default=400)
    ap.add_argument("--models", default="humanoid,ant")
    ap.add_argument("--parts", action="store_true", help="time the stages separately")
    ap.add_argument("--compile", action="store_true", help="compile time of the step")
    ap.add_argument("--compile-stages", action="store_true",
                    help="compile CPU time and HLO size of each stage alone, and the step")
    ap.add_argument("--prefixes", action="store_true",
                    help="with --compile-stages: compile of the pipeline cut after stages")
    ap.add_argument("--attribute", action="store_true",
                    help="the whole step's kernels attributed to stages and modules")
    ap.add_argument("--skip-step", action="store_true",
                    help="with --compile-stages: do not compile the whole step")
    ap.add_argument("--ablate-solve", type=int, default=0, metavar="ROUNDS",
                    help="the step with and without its constraint solve, paired rounds")
    args = ap.parse_args()
    import simjax
    import importlib
    from simjax.engine import constraint, io, smooth, solver
    forward = importlib.import_module("simjax.engine.forward")
    from simjax.engine import collision

    for name in args.models.split(","):
        path = MODELS.get(name, name)
        mjm, mjd, qpos, qvel = settled(path, args.batch, args.settle)
        m = simjax.load_model(path)
        d0 = io.make_data(m)
        dt = d0.qpos.dtype
        batch = jax.vmap(lambda q, v: d0.replace(qpos=q, qvel=v))(
            jnp.asarray(qpos, dt), jnp.asarray(qvel, dt))
        print(f"== {name}: nv {m.nv}  nefc capacity {d0.efc_J.shape[0]}  contacts capacity "
              f"{d0.contact.dist.shape[0]}  mujoco ncon {mjd.ncon} nefc {mjd.nefc}  "
              f"batch {args.batch}  {dt}")

        step1 = lambda dd: forward.step(m, dd)
        if args.ablate_solve:
            full, bare = ablate_solve(m, batch, args.ablate_solve)
            print(f"  step {full:8.2f} us CPU / world-step, without the solve {bare:8.2f}: "
                  f"the solve {full - bare:.2f} ({(full - bare) / full:.0%}); medians of "
                  f"{args.ablate_solve} paired rounds")
            continue
        if args.attribute:
            attribute(m, batch)
            continue
        if args.compile_stages:
            compile_stages(m, batch, prefixes=args.prefixes, whole=not args.skip_step)
            continue
        if args.compile:
            jx = jax.make_jaxpr(jax.vmap(step1))(batch)
            t0, c0 = time.perf_counter(), time.process_time()
            jax.jit(jax.vmap(step1)).lower(batch).compile()
            print(f"  jaxpr eqns (batched step) {count_eqns(jx.jaxpr)}  compile "
                  f"{time.perf_counter() - t0:.2f} s wall, {time.process_time() - c0:.2f} s CPU")

        def roll(dd):
            return jax.lax.scan(lambda x, _: (step1(x), None), dd, None, length=args.steps)[0]
        f = jax.jit(jax.vmap(roll))
        out = f(batch)
        t = cpu_time(f, batch)
        ws = args.batch * args.steps
        niter = np.asarray(out.solver_niter).max(-1)         # slowest island of each world
        print(f"  step: {1e6 * t / ws:8.2f} us CPU / world-step   niter mean {niter.mean():.1f} "
              f"max {niter.max()}  nefc active mean {np.asarray(out.nefc).mean():.1f}  "
              f"ncon mean {np.asarray(out.ncon).mean():.1f}")
        if not args.parts:
            continue
        # stage inputs from one settled forward
        fw = jax.jit(jax.vmap(lambda dd: forward.forward(m, dd)))(out)

        def smooth_pos(dd):
            dd = smooth.kinematics(m, dd)
            dd = smooth.com_pos(m, dd)
            dd = smooth.tendon(m, dd)
            dd = smooth.crb(m, dd)
            return smooth.factor_m(m, dd)
        parts = {
            "smooth position": smooth_pos,
            "collision": lambda dd: collision.collision(m, dd),
            "make_constraint": lambda dd: constraint.make_constraint(m, dd),
            "velocity stage": lambda dd: forward.fwd_velocity(m, dd),
            "actuation+accel": lambda dd: forward.fwd_acceleration(m, forward.fwd_actuation(m, dd)),
            "fwd_constraint": lambda dd: solver.fwd_constraint(m, dd),
            "integrate": lambda dd: forward._integrate(m, dd),
        }
        for pname, fn in parts.items():
            g = jax.jit(jax.vmap(fn))
            extra = compile_note(jax.vmap(fn), fw) if args.compile else ""
            t = cpu_time(g, fw, repeat=5)
            print(f"  {pname:18s} {1e6 * t / args.batch:8.2f} us{extra}")


def _changed(fn):
    """``fn(d)`` reduced to the leaves it changed (unchanged Data leaves are the input's
    own tracers), so a stage's program does not copy the rest of Data."""
    def run(dd):
        out = fn(dd)
        if not isinstance(out, type(dd)):
            return out
        a, b = jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(dd)
        return [x for x, y in zip(a, b) if x is not y]
    return run


def stage_table(m):
    """(name, fn(d) -> Data or arrays, level) of the pipeline stages in mj_step's order;
    level 0 rows partition the step, level 1 rows split the level-0 row above them."""
    import importlib
    from simjax.engine import actuation, constraint, passive, sensor, smooth, solver, tendon
    from simjax.engine.collision import driver
    from bench.profile_collision import group_name, group_narrow
    forward = importlib.import_module("simjax.engine.forward")
    rows = [("kinematics", smooth.kinematics, 0), ("com_pos", smooth.com_pos, 0)]
    if m.ncam or m.nlight:
        rows.append(("camlight", smooth.camlight, 0))
    if m.ntendon:
        rows.append(("tendon", smooth.tendon, 0))
    rows += [("crb", smooth.crb, 0), ("factor_m", smooth.factor_m, 0),
             ("collision", driver.collision, 0)]
    p = driver.plan(m)

    def grp_fn(grp):
        return lambda m_, dd: group_narrow(m_, grp, dd.contact.dist.shape[0])(dd)
    for grp in p.groups:
        rows.append(("  " + group_name(m, p, grp) + f" x{len(grp.cand)}", grp_fn(grp), 1))
    rows += [("make_constraint", constraint.make_constraint, 0),
             ("transmission", actuation.transmission, 0),
             ("sensor_pos", sensor.sensor_pos, 0),
             ("fwd_velocity", forward.fwd_velocity, 0),
             ("  com_vel", smooth.com_vel, 1),
             ("  passive", passive.passive, 1),
             ("  rne" + ("+tendon_bias" if m.ntendon else ""),
              (lambda m_, dd: smooth.rne(m_, dd) + tendon.tendon_bias(m_, dd))
              if m.ntendon else smooth.rne, 1),
             ("  reference_constraint", constraint.reference_constraint, 1),
             ("sensor_vel", sensor.sensor_vel, 0),
             ("energy", forward.energy, 0),
             ("actuation", actuation.actuation, 0),
             ("fwd_acceleration", forward.fwd_acceleration, 0),
             ("fwd_constraint (solver)", solver.fwd_constraint, 0),
             ("sensor_acc", sensor.sensor_acc, 0),
             ("integrate", forward._integrate, 0)]
    if m.opt.integrator == 1:     # RK4: its scan evaluates forward itself
        rows[-1] = ("integrate (RK4: forward in a scan)", forward._integrate, 0)
    return rows


def _prefixes(m):
    """The pipeline cut after its main stages (forward's order, sensors included)."""
    import importlib
    from simjax.engine import sensor
    forward = importlib.import_module("simjax.engine.forward")

    def upto(k):
        def fn(m_, d):
            d = forward.fwd_position(m_, d)
            d = sensor.sensor_pos(m_, d)
            if k == 0:
                return d
            d = forward.fwd_velocity(m_, d)
            d = sensor.sensor_vel(m_, d)
            d = forward.energy(m_, d)
            if k == 1:
                return d
            d = forward.fwd_acceleration(m_, forward.fwd_actuation(m_, d))
            if k == 2:
                return d
            d = forward.fwd_constraint(m_, d)
            return sensor.sensor_acc(m_, d)
        return fn
    rows = [("fwd_position+sensor_pos", upto(0)), ("... +velocity stage", upto(1)),
            ("... +actuation+acceleration", upto(2)), ("... +solver = forward", upto(3))]
    if m.opt.integrator != 1:
        rows.append(("... +integrate (step without checks)",
                     lambda m_, d: forward._integrate(m_, upto(3)(m_, d))))
    return rows


def _row(name, st):
    top = " ".join(f"{k}:{v}" for k, v in st["top"].items())
    print(f"  {name:40s} {st['eqns']:6d} {st['trace_s'] + st['lower_s']:6.2f} "
          f"{st['compile_s']:7.2f} {st['ops']:6d} {st['kernels']:6d} {st['fusions']:6d} "
          f"{st['whiles']:4d}  {top}")
    sys.stdout.flush()


def compile_stages(m, batch, prefixes=False, whole=True):
    """Print the per-stage compile profile (see the module docstring)."""
    import importlib
    from bench.profiling import compile_stats
    forward = importlib.import_module("simjax.engine.forward")
    fw = jax.jit(jax.vmap(lambda dd: forward.forward(m, dd)))(batch)
    print(f"  {'stage (jit(vmap), batch ' + str(batch.qpos.shape[0]) + ')':40s} "
          f"{'eqns':>6s} {'trace':>6s} {'compile':>7s} {'hloops':>6s} {'kernel':>6s} "
          f"{'fusion':>6s} {'while':>4s}  top kernel opcodes")
    tot = dict(eqns=0, trace=0.0, compile=0.0, ops=0, kernels=0, fusions=0, whiles=0)
    for name, fn, level in stage_table(m):
        st = compile_stats(jax.vmap(_changed(lambda dd, fn=fn: fn(m, dd))), fw)
        _row(name, st)
        if level == 0 and name.startswith("integrate ("):
            print("  (RK4: the sum below leaves the integrator out; the whole step is the "
                  "RK4 scan, forward included)")
        elif level == 0:
            tot["eqns"] += st["eqns"]
            tot["trace"] += st["trace_s"] + st["lower_s"]
            tot["compile"] += st["compile_s"]
            for k in ("ops", "kernels", "fusions", "whiles"):
                tot[k] += st[k]
    print(f"  {'sum of stages (level 0)':40s} {tot['eqns']:6d} {tot['trace']:6.2f} "
          f"{tot['compile']:7.2f} {tot['ops']:6d} {tot['kernels']:6d} {tot['fusions']:6d} "
          f"{tot['whiles']:4d}")
    if prefixes:
        for name, fn in _prefixes(m):
            _row(name, compile_stats(jax.vmap(lambda dd, fn=fn: fn(m, dd)), batch))
    if whole:
        _row("whole step", compile_stats(jax.vmap(lambda dd: forward.step(m, dd)), batch))


def ablate_programs(m, batch):
    """The batched step compiled twice for ``batch`` (a batched Data): as it is, and with
    ``solver.fwd_constraint`` giving qacc = qacc_smooth (the solver restored after)."""
    import importlib
    from simjax.engine import solver
    forward = importlib.import_module("simjax.engine.forward")
    orig = solver.fwd_constraint
    progs = []
    for fn in (orig, lambda m_, d: d.replace(qacc=d.qacc_smooth)):
        solver.fwd_constraint = fn
        try:
            progs.append(jax.jit(jax.vmap(lambda dd: forward.step(m, dd)))
                         .lower(batch).compile())
        finally:
            solver.fwd_constraint = orig
    return progs


def ablate_solve(m, batch, rounds):
    """(step, step without the constraint solve, :func:`ablate_programs`): medians of
    ``rounds`` paired rounds of process CPU microseconds per world-step over ``batch``."""
    size = jax.tree_util.tree_leaves(batch)[0].shape[0]
    progs = ablate_programs(m, batch)
    times = [[], []]
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            times[i].append(1e6 * cpu_time(progs[i], batch) / size)
    return float(np.median(times[0])), float(np.median(times[1]))


def attribute(m, batch, min_leaf=8):
    """Print the whole step's kernels by pipeline stage and by (stage, module)."""
    import importlib
    from bench.profiling import compile_stats, hlo_attribution
    forward = importlib.import_module("simjax.engine.forward")
    st = compile_stats(jax.vmap(lambda dd: forward.step(m, dd)), batch)
    stage, leaf = hlo_attribution(st["exe"].as_text())
    print(f"  whole step: {st['kernels']} kernels, {st['ops']} HLO ops, compile "
          f"{st['compile_s']:.2f} s CPU (trace+lower {st['trace_s'] + st['lower_s']:.2f} s)")
    for k, v in stage.most_common():
        print(f"  {v:5d}  {k}")
    print(f"  -- by stage <- innermost module (>= {min_leaf} kernels)")
    for (s, mod), v in leaf.most_common():
        if v >= min_leaf:
            print(f"  {v:5d}  {s} <- {mod}")


if __name__ == "__main__":
    main()
