"""Profile the collision stage against the full step on resting corpus models.

Usage: python bench/profile_collision.py [--batch N] [--model NAME ...] [--ncon-max N]
                                         [--groups] [--no-step]

For each model (simjax's own compiler) a MuJoCo C trajectory with random controls
gives ``batch`` states in contact; the collision stage alone (its input already through
the smooth position stages) and the full step are jitted and vmapped over the batch
and timed in float32 with ``time.process_time`` (CPU seconds of all threads), reported
as microseconds per world-step. Also printed: contact capacity against active
contacts, jaxpr equations (sub-jaxprs included) and compile time of the collision stage.
With --groups, the narrow phase of each collider group (one pair type, or one height-field
collider) alone: broadphase, compaction and the vmapped collider exactly as the driver
runs them, with its pair count, narrow-phase pairs, CPU time, jaxpr size and compile CPU
time. With --kernels N, the collision stage's XLA kernels (bench.profiling.hlo_stats)
and the N source lines (file:function:line of the innermost simjax frame, and opcode)
with the most kernels.
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
sys.path.insert(0, os.path.join(HERE, ".."))        # this checkout's simjax
from bench.models import CORPUS  # noqa: E402
from bench.profiling import count_eqns, cpu_time  # noqa: E402

CORPUS = os.environ.get("SIMJAX_CORPUS", CORPUS)
MODELS = {
    "humanoid": "mujoco_humanoid/humanoid.xml",
    "ant": "gym_ant/ant.xml",
    "barkour": "mjx_barkour_v0/assets/barkour_v0_mjx.xml",
    "shadow_hand": "mjx_shadow_hand/scene_right.xml",
}


def settle_states(path, batch, seed=0):
    """``batch`` qpos/qvel rows of a MuJoCo C run with random controls, after settling."""
    import mujoco
    mjm = mujoco.MjModel.from_xml_path(path)
    mjd = mujoco.MjData(mjm)
    rng = np.random.default_rng(seed)
    for _ in range(300):
        mujoco.mj_step(mjm, mjd)
    qpos, qvel, ncon = [], [], []
    for _ in range(batch):
        mjd.ctrl[:] = rng.uniform(-1, 1, mjm.nu)
        for _ in range(3):
            mujoco.mj_step(mjm, mjd)
        qpos.append(mjd.qpos.copy())
        qvel.append(mjd.qvel.copy())
        ncon.append(mjd.ncon)
    return np.asarray(qpos), np.asarray(qvel), np.asarray(ncon)


def group_name(m, p, grp):
    gt = np.asarray(m.geom_type)
    from simjax.types import GeomType
    k = grp.cand[0]
    t1, t2 = GeomType(int(gt[p.g1[k]])).name, GeomType(int(gt[p.g2[k]])).name
    fn = grp.fn
    tag = getattr(fn, "func", fn).__name__
    return f"{t1.lower()}-{t2.lower()} ({tag})"


def group_narrow(m, grp, cap):
    """``narrow(d) -> (Pre, broadphase count)`` of one collider group: broadphase,
    bounding-box filter, compaction or skip and the vmapped collider exactly as the
    collision driver runs them (driver.narrow_group; ``cap``: contact capacity of the
    Data it is applied to)."""
    from simjax.engine.collision import driver
    p = driver.plan(m)
    split = driver.dim_split(m, cap)

    def narrow(dd):
        prm = driver.pair_params(m, p, dd.geom_xpos.dtype)
        pre, _, count, _, _ = driver.narrow_group(m, dd, p, grp, prm["margin"] + prm["gap"],
                                                  split)
        return pre, count
    return narrow


def profile_groups(m, d, pre_b, repeat):
    """Per collider group: the driver's broadphase + compaction + narrow phase alone."""
    from simjax.engine.collision import driver
    from simjax.engine.collision.narrow import _pair_cap
    p = driver.plan(m)
    cap = d.contact.dist.shape[0]
    split = driver.dim_split(m, cap)
    batch = pre_b.qpos.shape[0]
    rows = []
    for grp in p.groups:
        n = len(grp.cand)
        npair_cap = min(n, _pair_cap(m, p, grp, split))
        narrow = group_narrow(m, grp, cap)
        f = jax.vmap(narrow)
        neq = count_eqns(jax.make_jaxpr(f)(pre_b).jaxpr)
        c0 = time.process_time()
        fc = jax.jit(f).lower(pre_b).compile()
        tc = time.process_time() - c0
        pre, nok = fc(pre_b)
        t = cpu_time(fc, pre_b, repeat=repeat)
        nvalid = float(np.asarray(pre.valid).sum(axis=(1, 2)).mean())
        rows.append((1e6 * t / batch, group_name(m, p, grp), n, npair_cap,
                     float(np.asarray(nok).mean()), nvalid, neq, tc))
    print(f"  {'group':44s} {'pairs':>5s} {'run':>5s} {'bp':>6s} {'valid':>6s} "
          f"{'us':>8s} {'eqns':>6s} {'compile':>7s}")
    for us, nm, n, run, nok, nv, neq, tc in rows:
        print(f"  {nm:44s} {n:5d} {run:5d} {nok:6.1f} {nv:6.1f} {us:8.1f} {neq:6d} "
              f"{tc:6.2f}s")
    print(f"  sum of groups {sum(r[0] for r in rows):.1f} us, {sum(r[6] for r in rows)} eqns, "
          f"{sum(r[7] for r in rows):.2f}s compile")
    sys.stdout.flush()


def kernel_lines(text, top):
    """Print the kernels of optimised HLO ``text`` by innermost simjax source line."""
    import collections
    from bench.profiling import hlo_stats, kernel_ops

    def innermost(chain):
        for f, fn, ln in reversed(chain):
            tail = f.split("simjax/")[-1]
            if "simjax/" in f and not tail.startswith("bench"):
                return f"{tail}:{fn}:{ln}"
        return "(no simjax frame)"
    cnt = collections.Counter((innermost(chain), op) for op, _, chain in kernel_ops(text))
    print(f"  collision kernels: {hlo_stats(text)['kernels']}")
    for (where, op), v in cnt.most_common(top):
        print(f"  {v:5d} {op:14s} {where}")


def profile(name, path, batch, ncon_max, repeat, step=True, groups=False, kernels=0):
    import simjax
    from simjax.engine import io
    from simjax.engine.forward import step as mj_step
    from simjax.engine.collision import driver

    m = simjax.load_model(path)
    d = io.make_data(m, dtype=jnp.float32, ncon_max=ncon_max)
    qpos, qvel, mj_ncon = settle_states(path, batch)
    states = jax.vmap(lambda q, v: d.replace(qpos=q, qvel=v))(
        jnp.asarray(qpos, jnp.float32), jnp.asarray(qvel, jnp.float32))

    def pre(dd):                      # smooth position stages up to collision
        from simjax.engine import smooth
        dd = smooth.kinematics(m, dd)
        dd = smooth.com_pos(m, dd)
        return dd

    pre_b = jax.jit(jax.vmap(pre))(states)
    coll = jax.vmap(lambda dd: driver.collision(m, dd))
    t0 = time.perf_counter()
    jaxpr = jax.make_jaxpr(coll)(pre_b)
    t_trace = time.perf_counter() - t0
    neq = count_eqns(jaxpr.jaxpr)
    t0, c0 = time.perf_counter(), time.process_time()
    coll_c = jax.jit(coll).lower(pre_b).compile()
    t_comp, t_ccpu = time.perf_counter() - t0, time.process_time() - c0
    if kernels:
        kernel_lines(coll_c.as_text(), kernels)
    out = coll_c(pre_b)
    ncon = np.asarray(out.ncon)
    cap = d.contact.dist.shape[0]
    t_coll = cpu_time(coll_c, pre_b, repeat=repeat)
    print(f"{name}: ngeom {m.ngeom} candidates {len(driver.plan(m).g1)} capacity {cap} "
          f"(per dim {driver.dim_split(m, cap)})")
    print(f"  active contacts simjax mean {ncon.mean():.1f} max {ncon.max()} | MuJoCo "
          f"mean {mj_ncon.mean():.1f} max {mj_ncon.max()} | overflow worlds "
          f"{int(np.sum(np.asarray(out.warning)[:, 1] > 0))}")
    print(f"  collision: {1e6 * t_coll / batch:8.1f} us/world-step  jaxpr eqns {neq}  "
          f"trace {t_trace:.2f}s compile {t_comp:.2f}s ({t_ccpu:.2f}s CPU)")
    sys.stdout.flush()
    if groups:
        profile_groups(m, d, pre_b, repeat)
    if not step:
        return
    step = jax.jit(jax.vmap(lambda dd: mj_step(m, dd)))
    t0 = time.perf_counter()
    step_c = step.lower(states).compile()
    t_scomp = time.perf_counter() - t0
    t_step = cpu_time(step_c, states, repeat=repeat)
    nefc = int(step_c(states).efc_J.shape[1])
    print(f"  step: {1e6 * t_step / batch:8.1f} us/world-step  compile {t_scomp:.2f}s  "
          f"(nefc_max {nefc})")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ncon-max", type=int, default=None)
    ap.add_argument("--model", nargs="*", default=list(MODELS))
    ap.add_argument("--no-step", action="store_true", help="time the collision stage only")
    ap.add_argument("--groups", action="store_true", help="time each collider group")
    ap.add_argument("--kernels", type=int, default=0,
                    help="print the collision stage's N source lines with most XLA kernels")
    args = ap.parse_args()
    print(f"device: {jax.devices()[0]}  batch {args.batch}  float32")
    for name in args.model:
        path = MODELS.get(name, name)
        profile(name, os.path.join(CORPUS, path), args.batch, args.ncon_max, args.repeat,
                step=not args.no_step, groups=args.groups, kernels=args.kernels)


if __name__ == "__main__":
    main()
