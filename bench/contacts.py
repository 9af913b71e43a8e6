"""Contact capacity, active contacts and batched steps/s on the contact stress scene,
against MJX on the same scene.

Usage: python bench/contacts.py [--batch N] [--steps N] [--model PATH] [--ncon-max N]
                                [--mjx-timeout S] [--out results.json]

The scene (models/contact_stress.xml) is settled with MuJoCo C first so the benchmark
runs on a resting pile (MuJoCo's contact count is printed for reference). The full step (collision,
constraint assembly, the model's solver, integration) and the collision stage alone are
timed for both simjax and MJX, and each one's contact capacity is printed next to its
active contacts. MJX runs in a child process with ``--mjx-timeout`` seconds (compile
included): a failure or a timeout is reported, and the simjax results stand. With
``--out`` the numbers are also written as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
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


def settle(path, nsettle):
    """MuJoCo C model and data after ``nsettle`` steps from the model's initial state,
    then mj_forward: after mj_step, ``d.contact`` / ``d.ncon`` belong to the state
    before the last integration (e.g. 78 contacts after 300 steps, where the qpos
    reached has 76), so the count is recomputed at the qpos the benchmark starts from."""
    import mujoco
    mjm = mujoco.MjModel.from_xml_path(path)
    mjd = mujoco.MjData(mjm)
    for _ in range(nsettle):
        mujoco.mj_step(mjm, mjd)
    mujoco.mj_forward(mjm, mjd)
    return mjm, mjd


def batch_qpos(mjd, batch):
    """(batch, nq): the settled qpos with the x of every free body jittered by 1e-6."""
    rng = np.random.default_rng(0)
    q = np.tile(mjd.qpos, (batch, 1))
    q[:, 0::7] += 1e-6 * rng.standard_normal(q[:, 0::7].shape)
    return q


def run_simjax(args, mjd, res):
    import simjax
    from simjax import engine
    from simjax.engine import io, smooth
    from simjax.engine.collision import driver

    m = simjax.load_model(args.model)
    d = io.make_data(m, ncon_max=args.ncon_max)
    plan = driver.plan(m)
    cap = d.contact.dist.shape[0]
    res.update(simjax_candidate_pairs=len(plan.g1), simjax_capacity=cap)
    print(f"simjax candidate pairs: {len(plan.g1)}  contact capacity: {cap}  "
          f"(per dim {driver.dim_split(m, cap)})", flush=True)
    q = batch_qpos(mjd, args.batch)
    batch = jax.vmap(lambda qq: d.replace(qpos=qq))(jnp.asarray(q, d.qpos.dtype))

    coll = jax.jit(jax.vmap(lambda dd: driver.collision(m, smooth.kinematics(m, dd))))
    out = coll(batch)
    ncon = np.asarray(out.ncon)
    overflow = int(np.sum(np.asarray(out.warning)[:, 1] > 0))
    res.update(simjax_active_mean=float(ncon.mean()), simjax_active_max=int(ncon.max()),
               simjax_overflow_worlds=overflow)
    print(f"simjax active contacts: mean {ncon.mean():.1f}  max {ncon.max()}  "
          f"overflow worlds {overflow}", flush=True)
    t = _time(coll, batch)
    res["simjax_collision_worlds_per_s"] = args.batch / t
    print(f"simjax collision (kinematics + collision): {args.batch / t:12.1f} worlds/s",
          flush=True)

    step = batched_rollout(engine.step, m, args.steps)
    t = _time(step, batch)
    res["simjax_steps_per_s"] = args.batch * args.steps / t
    print(f"simjax step (full, with solver):        {args.batch * args.steps / t:12.1f} "
          "steps/s", flush=True)


def batched_rollout(step, model, nstep):
    """jit(vmap) of ``nstep`` calls of ``step(model, data)`` (simjax or MJX alike)."""
    def roll(d):
        return jax.lax.scan(lambda x, _: (step(model, x), None), d, None, length=nstep)[0]
    return jax.jit(jax.vmap(roll))


def run_mjx(args, mjm, mjd, res):
    from mujoco import mjx
    mx = mjx.put_model(mjm)
    dx = mjx.put_data(mjm, mjd)
    q = batch_qpos(mjd, args.batch)
    bx = jax.vmap(lambda qq: dx.replace(qpos=qq))(jnp.asarray(q, jnp.float32))
    cap = dx.contact.dist.shape[0]
    active = int(np.sum(np.asarray(dx.contact.dist) < 0))
    res.update(mjx_capacity=cap, mjx_active=active)
    print(f"mjx contact capacity: {cap}  active after settling (dist < 0): {active}",
          flush=True)

    mstep = batched_rollout(mjx.step, mx, args.steps)
    t = _time(mstep, bx)
    res["mjx_steps_per_s"] = args.batch * args.steps / t
    print(f"mjx step (full, with solver):           {args.batch * args.steps / t:12.1f} "
          "steps/s", flush=True)
    mcol = jax.jit(jax.vmap(lambda dd: mjx.collision(mx, mjx.kinematics(mx, dd))))
    t = _time(mcol, bx)
    res["mjx_collision_worlds_per_s"] = args.batch / t
    print(f"mjx collision (kinematics + collision): {args.batch / t:12.1f} worlds/s",
          flush=True)


def mjx_child(args, argv):
    """Run the MJX part in a child process with a timeout; returns its results."""
    cmd = [sys.executable, os.path.abspath(__file__)] + list(argv) + ["--part", "mjx"]
    res = {}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True,
                             timeout=args.mjx_timeout)
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        for line in text.splitlines():
            if not line.startswith("RESULT "):
                print(line)
        res["mjx_error"] = f"timeout {args.mjx_timeout}s"
        print(f"mjx: stopped after {args.mjx_timeout} s (timeout)")
        return res
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
        else:
            print(line)
    if "mjx_steps_per_s" not in res and "mjx_error" not in res:
        tail = [ln for ln in out.stderr.splitlines() if ln.strip()][-1:]
        res["mjx_error"] = (tail[0][:300] if tail else f"exit status {out.returncode}")
        print(f"mjx: not run ({res['mjx_error']})")
    return res


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--settle", type=int, default=1500)
    ap.add_argument("--ncon-max", type=int, default=None)
    ap.add_argument("--mjx-timeout", type=int, default=600,
                    help="seconds for the MJX part, compile included")
    ap.add_argument("--no-mjx", action="store_true")
    ap.add_argument("--out", help="JSON file for the numbers")
    ap.add_argument("--part", choices=("all", "mjx"), default="all", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    mjm, mjd = settle(args.model, args.settle)
    res = dict(model=args.model, batch=args.batch, steps=args.steps,
               device=str(jax.devices()[0]), mujoco_active_after_settle=int(mjd.ncon))
    if args.part == "mjx":          # the child process: MJX alone, results on stdout
        try:
            run_mjx(args, mjm, mjd, res)
        except Exception as e:      # MJX may not support every pair of the scene
            res["mjx_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print(f"mjx: not run ({res['mjx_error']})")
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    print(f"device: {jax.devices()[0]}  batch {args.batch}  steps {args.steps}")
    print(f"mujoco C contacts after settling: {mjd.ncon}")
    run_simjax(args, mjd, res)
    if not args.no_mjx:
        mres = mjx_child(args, argv)
        res.update({k: v for k, v in mres.items() if k.startswith("mjx_")})
        if res.get("mjx_steps_per_s"):
            print(f"simjax / mjx steps/s: {res['simjax_steps_per_s'] / res['mjx_steps_per_s']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
