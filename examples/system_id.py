"""System identification: recover masses and damping from a recorded trajectory.

The "true" system is simjax's ``models/cartpole.xml`` with the slider's damping raised
from 0.05 to 1 N s/m (at 0.05 the cart's damping hardly shows in a 1.5 s recording: the
trajectory does not determine it). We record one trajectory (pole
released at 0.5 rad while the cart is driven by a two-tone control signal), then start
from a wrong model (cart mass x1.6, pole mass x0.6, slider damping x3, hinge damping
x0.4) and fit four parameters by gradient-based least squares on the trajectory error:

    p = log(cart mass scale, pole mass scale, slider damping, hinge damping)
    L(p) = mean_t sum_k (s_k(t; p) - s_k^rec(t))^2 / var(s_k^rec)

over the state channels s = (x, angle, xdot, angledot). Each body's inertia scales with
its mass (as if its density changed). The optimiser is Levenberg-Marquardt (Gauss-Newton
steps on the trajectory residuals, damped towards gradient descent), with the residual
Jacobian from forward-mode autodiff (``jax.jacfwd``, four directional derivatives)
through ``simjax.rollout``. Plain first-order descent (e.g. Adam) also lowers the error
but is slow on this problem: the damping parameters change the trajectory far less than
the masses, so the loss is badly conditioned, and after 150 Adam steps parameters are
still several percent off. Parameters are fitted in log space so they stay positive and
relative errors weigh the same.

Constraints: the slider's joint range (+-2 m) is enforced as in MuJoCo. Contacts are
disabled in the model. The short mode (``--short``, the test) fits fewer iterations on
a lighter program: semi-implicit Euler and constraints disabled, which compiles several
times faster (recording and fit use the same model, so the identification is exact).
Run ``python examples/system_id.py [--short]``.
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
NAMES = ("cart mass [kg]", "pole mass [kg]", "slider damping [N s/m]",
         "hinge damping [N m s/rad]")


def load_cartpole(light=False):
    """The cart-pole. ``light``: semi-implicit Euler and no constraints (no slider
    limit; the recorded cart stays well inside it), a program that compiles several
    times faster than RK4 with the constraint solver (the short mode's choice)."""
    model = simjax.load_model(CARTPOLE)
    if light:
        model = light_options(model)
    return model


def with_params(model, p):
    """The model with parameters p = log(cart scale, pole scale, damping (2,))."""
    scale = jnp.concatenate([jnp.ones(1, p.dtype), jnp.exp(p[:2])])   # world, cart, pole
    return model.replace(
        body_mass=jnp.asarray(model.body_mass) * scale,
        body_inertia=jnp.asarray(model.body_inertia) * scale[:, None],
        dof_damping=jnp.exp(p[2:]))


def physical(model, p):
    """(cart mass, pole mass, slider damping, hinge damping) for parameters p."""
    m = with_params(model, jnp.asarray(p))
    return np.concatenate([np.asarray(m.body_mass[1:3]), np.asarray(m.dof_damping)])


def main(short=False, seed=0):
    """Record, fit, and return true / initial / identified parameters and the loss curve."""
    model = load_cartpole(light=short)
    nstep = 150                                            # 1.5 s
    iters = 12 if short else 25
    dtype = simjax.make_data(model).qpos.dtype
    d0 = simjax.make_data(model)
    d0 = d0.replace(qpos=d0.qpos.at[1].set(0.5))
    t = float(model.opt.timestep) * jnp.arange(nstep)
    ctrl = (0.6 * jnp.sin(2 * jnp.pi * 0.7 * t)
            + 0.4 * jnp.sin(2 * jnp.pi * 1.9 * t + 1.0))[:, None].astype(dtype)

    p_true = jnp.log(jnp.asarray([1.0, 1.0, 1.0, float(model.dof_damping[1])], dtype))
    p_init = p_true + jnp.log(jnp.asarray([1.6, 0.6, 3.0, 0.4], dtype))

    def states(p):
        traj = simjax.rollout(with_params(model, p), d0, ctrl)
        return jnp.concatenate([traj.qpos, traj.qvel], axis=1)     # (nstep, 4)

    def residuals(p, target, scale):
        return ((states(p) - target) * scale).ravel()

    # Residuals and their Jacobian (nstep * 4, 4) from one forward-mode pass; the same
    # compiled function records the data (target 0, scale 1), so it compiles once.
    lin = jax.jit(lambda p, target, scale: (
        residuals(p, target, scale), jax.jacfwd(residuals)(p, target, scale)))
    recorded = lin(p_true, jnp.zeros((nstep, 4), dtype), jnp.ones(4, dtype))[0]
    recorded = recorded.reshape(nstep, 4)
    scale = jnp.sqrt(1.0 / (nstep * jnp.var(recorded, axis=0)))   # loss = |r|^2
    lin_fit = lambda p: [np.asarray(a, np.float64) for a in lin(p, recorded, scale)]

    p, lam = np.asarray(p_init, np.float64), 1e-2
    r, jac = lin_fit(p)
    losses = [float(r @ r)]
    t0 = time.perf_counter()
    for it in range(iters):
        jtj, jtr = jac.T @ jac, jac.T @ r
        # Levenberg-Marquardt step: Gauss-Newton, damped towards scaled gradient descent.
        step = np.linalg.solve(jtj + lam * np.diag(np.diag(jtj)), -jtr)
        r_new, jac_new = lin_fit(p + step)
        if float(r_new @ r_new) < losses[-1]:
            p, r, jac, lam = p + step, r_new, jac_new, lam / 3
            losses.append(float(r @ r))
        else:
            lam *= 3
            losses.append(losses[-1])
        print(f"iter {it:3d}  loss {losses[-1]:.3e}  lambda {lam:.1e}  "
              f"[{time.perf_counter() - t0:.1f} s]")
    truth, init, found = (physical(model, jnp.asarray(q, dtype)) for q in (p_true, p_init, p))
    rel = np.abs(found - truth) / np.abs(truth)
    print(f"loss {losses[0]:.3e} -> {losses[-1]:.3e} in {iters} iterations "
          f"({time.perf_counter() - t0:.1f} s after compiling)")
    print(f"  {'parameter':26s} {'true':>9s} {'initial':>9s} {'identified':>11s} {'rel.err':>8s}")
    for name, a, b, c, r in zip(NAMES, truth, init, found, rel):
        print(f"  {name:26s} {a:9.4f} {b:9.4f} {c:11.4f} {r:8.1e}")
    return dict(names=NAMES, truth=truth, initial=init, identified=found, rel_err=rel,
                initial_rel_err=np.abs(init - truth) / np.abs(truth), losses=losses)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--short", action="store_true", help="fewer iterations")
    main(short=p.parse_args().short)
