"""Profile the collision stage against the full step on resting corpus models.

Usage: python bench/profile_collision.py [--batch N] [--model NAME ...] [--ncon-max N]

For each model (simjax's own compiler) a MuJoCo C trajectory with random controls
gives ``batch`` states in contact; the collision stage alone (its input already through
the smooth position stages) and the full step are jitted and vmapped over the batch
and timed in float32 with ``time.process_time`` (CPU seconds of all threads), reported
as microseconds per world-step. Also printed: contact capacity against active
contacts, jaxpr equations (sub-jaxprs included) and compile time of the collision stage.
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


def profile(name, path, batch, ncon_max, repeat, step=True):
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
    t0 = time.perf_counter()
    coll_c = jax.jit(coll).lower(pre_b).compile()
    t_comp = time.perf_counter() - t0
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
          f"trace {t_trace:.2f}s compile {t_comp:.2f}s")
    sys.stdout.flush()
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
    args = ap.parse_args()
    print(f"device: {jax.devices()[0]}  batch {args.batch}  float32")
    for name in args.model:
        path = MODELS.get(name, name)
        profile(name, os.path.join(CORPUS, path), args.batch, args.ncon_max, args.repeat,
                step=not args.no_step)


if __name__ == "__main__":
    main()
