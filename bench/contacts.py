"""Contact capacity, active contacts and batched steps/s on the contact stress scene,
against MJX on the same scene.

Usage: python bench/contacts.py [--batch N] [--steps N] [--model PATH] [--ncon-max N]

The scene (models/contact_stress.xml) is settled with MuJoCo C first so the benchmark
runs on a resting pile (MuJoCo's contact count is printed for reference). The full step (collision,
constraint assembly, the model's solver, integration) and the collision stage alone are
timed for both simjax and MJX, and each one's contact capacity is printed next to its
active contacts.
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
DEFAULT = os.path.join(HERE, "..", "models", "contact_stress.xml")


def _time(fn, *args, repeat=3):
    out = fn(*args)
    jax.block_until_ready(out)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--settle", type=int, default=1500)
    ap.add_argument("--ncon-max", type=int, default=None)
    args = ap.parse_args()
    import mujoco
    import simjax
    from simjax import engine
    from simjax.engine import io, smooth
    from simjax.engine.collision import driver

    mjm = mujoco.MjModel.from_xml_path(args.model)
    mjd = mujoco.MjData(mjm)
    for _ in range(args.settle):
        mujoco.mj_step(mjm, mjd)
    print(f"device: {jax.devices()[0]}  batch {args.batch}  steps {args.steps}")
    print(f"mujoco C contacts after settling: {mjd.ncon}")

    m = simjax.load_model(args.model)
    d = io.make_data(m, ncon_max=args.ncon_max)
    plan = driver.plan(m)
    print(f"simjax candidate pairs: {len(plan.g1)}  contact capacity: "
          f"{d.contact.dist.shape[0]}  (per dim {driver.dim_split(m, d.contact.dist.shape[0])})")
    rng = np.random.default_rng(0)
    q = np.tile(mjd.qpos, (args.batch, 1))
    q[:, 0::7] += 1e-6 * rng.standard_normal(q[:, 0::7].shape)   # jitter x of every body
    batch = jax.vmap(lambda qq: d.replace(qpos=qq))(jnp.asarray(q, d.qpos.dtype))

    coll = jax.jit(jax.vmap(lambda dd: driver.collision(m, smooth.kinematics(m, dd))))
    out = coll(batch)
    ncon = np.asarray(out.ncon)
    print(f"simjax active contacts: mean {ncon.mean():.1f}  max {ncon.max()}  "
          f"overflow worlds {int(np.sum(np.asarray(out.warning)[:, 1] > 0))}")
    t = _time(coll, batch)
    print(f"simjax collision (kinematics + collision): {args.batch / t:12.1f} worlds/s")

    def roll(dd):
        def body(x, _):
            return engine.step(m, x), None
        return jax.lax.scan(body, dd, None, length=args.steps)[0]
    step = jax.jit(jax.vmap(roll))
    t = _time(step, batch)
    print(f"simjax step (full, with solver):        {args.batch * args.steps / t:12.1f} steps/s")

    try:
        from mujoco import mjx
        mx = mjx.put_model(mjm)
        dx = mjx.put_data(mjm, mjd)
        bx = jax.vmap(lambda qq: dx.replace(qpos=qq))(jnp.asarray(q, jnp.float32))

        def mroll(dd):
            def body(x, _):
                return mjx.step(mx, x), None
            return jax.lax.scan(body, dd, None, length=args.steps)[0]
        print(f"mjx contact capacity: {dx.contact.dist.shape[0]}  active after settling "
              f"(dist < 0): {int(np.sum(np.asarray(dx.contact.dist) < 0))}")
        mstep = jax.jit(jax.vmap(mroll))
        t = _time(mstep, bx)
        print(f"mjx step (full, with solver):           "
              f"{args.batch * args.steps / t:12.1f} steps/s")
        mcol = jax.jit(jax.vmap(lambda dd: mjx.collision(mx, mjx.kinematics(mx, dd))))
        t = _time(mcol, bx)
        print(f"mjx collision (kinematics + collision): {args.batch / t:12.1f} worlds/s")
    except Exception as e:  # MJX may not support every pair of the scene
        print(f"mjx: not run ({type(e).__name__}: {str(e)[:200]})")


if __name__ == "__main__":
    main()
