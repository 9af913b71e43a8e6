"""Domain randomisation: one jitted rollout over a batch of worlds with different physics.

Every world is simjax's ``models/cartpole.xml`` with its own cart mass, pole mass (the
body inertias scale with the masses, as if the density changed) and joint damping,
drawn at random. Model parameters are ``jax.Array`` leaves, so the batch is a Model whose
randomised leaves carry a leading batch axis, stepped with ``simjax.rollout_batch`` and
Model ``in_axes`` (``body_mass=0, body_inertia=0, dof_damping=0``; everything else is
shared). All worlds start from the same state (pole upright, at rest) and receive the same
control sequence, so every difference in outcome comes from the physics parameters.

Constraints: the slider's joint range (+-2 m) is enforced as in MuJoCo. Contacts are
disabled in the model. The short mode (``--short``, the test) runs 32 worlds on a
lighter program: semi-implicit Euler and constraints disabled, which compiles several
times faster.

Run ``python examples/domain_randomization.py [--short]``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import simjax  # noqa: E402
from examples import light_options  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE = os.path.join(ROOT, "models", "cartpole.xml")


def load_cartpole(light=False):
    """The cart-pole. ``light``: semi-implicit Euler and no constraints (no slider
    limit), programs that compile several times faster than RK4 with the constraint
    solver (the short mode's choice)."""
    model = simjax.load_model(CARTPOLE)
    if light:
        model = light_options(model)
    return model


def randomize(model, key, nworld, mass_range=(0.5, 2.0), damping_range=(0.0, 0.5)):
    """A Model with per-world body masses/inertias and dof damping, and its in_axes.

    Body masses (and inertias, by the same factor) are scaled log-uniformly within
    ``mass_range`` per body; joint damping is uniform in ``damping_range`` [N s/m or
    N m s/rad] per dof. Returns (batched model, model in_axes, mass scales (nworld, nbody)).
    """
    km, kd = jax.random.split(key)
    mass = jnp.asarray(model.body_mass)
    lo, hi = np.log(mass_range[0]), np.log(mass_range[1])
    scale = jnp.exp(jax.random.uniform(km, (nworld, model.nbody), mass.dtype, lo, hi))
    scale = scale.at[:, 0].set(1.0)                       # the world body has no mass
    damping = jax.random.uniform(kd, (nworld, model.nv), mass.dtype, *damping_range)
    batched = model.replace(body_mass=mass[None] * scale,
                            body_inertia=jnp.asarray(model.body_inertia)[None]
                            * scale[:, :, None],
                            dof_damping=damping)
    axes = jax.tree_util.tree_map(lambda _: None, model).replace(
        body_mass=0, body_inertia=0, dof_damping=0)
    return batched, axes, scale


def main(short=False, seed=0):
    """Roll out the randomised worlds; returns their outcomes and a few reference worlds."""
    model = load_cartpole(light=short)
    nworld = 32 if short else 1024
    nstep = 100                                           # 1 s at 0.01 s
    batched, axes, scale = randomize(model, jax.random.PRNGKey(seed), nworld)
    d0 = simjax.make_data(model)                          # pole upright, at rest
    data = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (nworld,) + x.shape), d0)
    t = float(model.opt.timestep) * jnp.arange(nstep)
    ctrl = 0.5 * jnp.sin(2 * jnp.pi * t)[:, None].astype(d0.qpos.dtype)
    ctrls = jnp.broadcast_to(ctrl, (nworld, nstep, model.nu))

    t0 = time.perf_counter()
    traj = simjax.rollout_batch(batched, data, ctrls, model_axes=axes)
    jax.block_until_ready(traj)
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(simjax.rollout_batch(batched, data, ctrls, model_axes=axes))
    t_run = time.perf_counter() - t0

    x_final = np.asarray(traj.qpos[:, -1, 0])
    angle_final = np.asarray(traj.qpos[:, -1, 1])
    # Early response to the push: x ~ F t^2 / (2 M_eff), with the effective mass of a
    # cart carrying a uniform rod hinged at its end, M_eff = m_cart + m_pole / 4.
    x_push = np.asarray(traj.qpos[:, 9, 0])               # cart after 0.1 s
    m_eff = np.asarray(batched.body_mass[:, 1] + batched.body_mass[:, 2] / 4)
    corr = float(np.corrcoef(1 / m_eff, x_push)[0, 1])
    print(f"{nworld} randomised worlds x {nstep} steps: {t_first:.1f} s incl. compile, "
          f"then {t_run * 1e3:.1f} ms ({nworld * nstep / t_run:,.0f} steps/s)")
    for name, v in (("final cart x [m]", x_final), ("final pole angle [rad]", angle_final)):
        print(f"  {name:24s} mean {v.mean():+.3f}  std {v.std():.3f}  "
              f"min {v.min():+.3f}  max {v.max():+.3f}")
    print(f"  corr(1 / (m_cart + m_pole / 4), cart x after 0.1 s) = {corr:+.4f} "
          "(heavier carts move less)")

    # The same worlds one at a time, with an unbatched Model, for comparison.
    single = jax.jit(simjax.rollout)
    check = [0, nworld // 2, nworld - 1]
    errs = []
    for i in check:
        mi = jax.tree_util.tree_map(lambda ax, x: x if ax is None else x[i], axes, batched,
                                    is_leaf=lambda x: x is None)
        ref = single(mi, d0, ctrl)
        errs.append(float(jnp.max(jnp.abs(ref.qpos - traj.qpos[i]))))
    print(f"  max |batched - single-model rollout| over worlds {check}: {max(errs):.2e}")
    return dict(nworld=nworld, x_final=x_final, angle_final=angle_final,
                x_push=x_push, m_eff=m_eff, mass_scale=np.asarray(scale),
                damping=np.asarray(batched.dof_damping), corr_inv_mass_push=corr,
                single_model_max_err=max(errs), steps_per_s=nworld * nstep / t_run)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--short", action="store_true", help="fewer worlds")
    main(short=p.parse_args().short)
