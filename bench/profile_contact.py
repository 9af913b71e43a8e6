"""Profile of the contact step: CPU time per world-step of the whole step and of its
stages (smooth position stage, collision, make_constraint, velocity/actuation stages,
constraint solve, integration), solver iteration counts, jaxpr size and compile time.

Usage: python bench/profile_contact.py [--batch N] [--models humanoid,ant] [--parts]
                                       [--compile]

With --compile the batched step's jaxpr size and compile time are printed (wall and
process CPU time), and with --parts as well each stage's jaxpr size and compile CPU time.

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
from bench.profiling import count_eqns, cpu_time  # noqa: E402

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
            extra = ""
            if args.compile:
                neq = count_eqns(jax.make_jaxpr(jax.vmap(fn))(fw).jaxpr)
                t0 = time.process_time()
                g.lower(fw).compile()
                extra = f"   {neq:6d} eqns  compile {time.process_time() - t0:6.2f} s CPU"
            t = cpu_time(g, fw, repeat=5)
            print(f"  {pname:18s} {1e6 * t / args.batch:8.2f} us{extra}")


if __name__ == "__main__":
    main()
