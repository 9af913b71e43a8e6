"""Cart-pole swing-up by gradient-based trajectory optimisation through simjax.rollout.

The model is simjax's own ``models/cartpole.xml`` (RK4, 0.01 s) with the motor's gear
raised from 10 to 40 (a 40 N push at |ctrl| = 1): with 10 N on a ~4 kg cart, a swing-up
needs several pumping cycles and a horizon past 6 s, where single shooting by gradient
descent stalls in local minima (pole stuck near horizontal). Starting from keyframe
"down" (pole hanging, angle pi) we optimise the open-loop control sequence
u_0..u_{T-1} over 2.5 s (u = tanh(z), so controls stay inside ctrlrange [-1, 1]) to bring
the pole upright (angle 0, or any multiple of 2 pi) with the cart near the origin and at
rest. The cost is

    J(z) = mean_t [ (1 - cos angle_t) + 0.1 x_t^2 + 0.01 u_t^2 ]
           + 5 [ (1 - cos angle_T) + x_T^2 + 0.1 (xdot_T^2 + angledot_T^2) ],

its gradient ``jax.grad`` through the whole rollout (``simjax.rollout`` with per-step
rematerialisation), and the optimiser a small Adam written inline (no dependencies).
The cost curve and the final trajectory are plotted to a PNG when matplotlib is
installed.

Constraints: the slider's joint range (+-2 m) is enforced as in MuJoCo (a soft limit
solved by the model's constraint solver, differentiated implicitly); the example reports
the cart's largest |x|. Contacts are disabled in the model itself. The short mode
(``--short``, the test) runs the same problem on a lighter program: semi-implicit Euler
and constraints disabled (no slider limit), which compiles about 4x faster.

Run ``python examples/trajopt_cartpole.py [--short] [--png out.png]``.
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


ITERS_SHORT = 120


def load_cartpole(gear_scale=4.0, light=False):
    """The cart-pole with the stronger motor. ``light``: semi-implicit Euler and no
    constraints (no slider limit), a program that compiles about 4x faster than RK4
    with the constraint solver (the short mode's choice)."""
    model = simjax.load_model(CARTPOLE)
    model = model.replace(actuator_gear=jnp.asarray(model.actuator_gear) * gear_scale)
    if light:
        model = light_options(model)
    return model


def make_cost(model, data0):
    """cost(z) -> scalar and the trajectory (see the module docstring)."""

    def cost(z):
        u = jnp.tanh(z)
        traj = simjax.rollout(model, data0, u)
        x, angle = traj.qpos[:, 0], traj.qpos[:, 1]
        run = jnp.mean((1 - jnp.cos(angle)) + 0.1 * x ** 2 + 0.01 * u[:, 0] ** 2)
        v = traj.qvel[-1]
        final = (1 - jnp.cos(angle[-1])) + x[-1] ** 2 + 0.1 * (v @ v)
        return run + 5.0 * final, traj

    return cost


def adam(lr, b1=0.9, b2=0.999, eps=1e-8):
    """Adam (Kingma & Ba 2015) as (init, update) over a single array."""
    def init(x):
        return jnp.zeros_like(x), jnp.zeros_like(x), jnp.zeros((), x.dtype)

    def update(x, g, state):
        m, v, t = state
        t = t + 1
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        step = lr * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + eps)
        return x - step, (m, v, t)

    return init, update


def plot(path, costs, traj, dt):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return None
    t = dt * np.arange(1, traj["qpos"].shape[0] + 1)
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    ax[0].semilogy(costs)
    ax[0].set(xlabel="Adam iteration", ylabel="cost", title="cost")
    ax[1].plot(t, traj["qpos"][:, 1], label="pole angle [rad]")
    ax[1].plot(t, traj["qpos"][:, 0], label="cart x [m]")
    ax[1].axhline(0, color="k", lw=0.5)
    ax[1].set(xlabel="time [s]", title="final trajectory")
    ax[1].legend()
    ax[2].plot(t, traj["ctrl"])
    ax[2].set(xlabel="time [s]", ylabel="ctrl", title="controls", ylim=(-1.05, 1.05))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(short=False, png="trajopt_cartpole.png", seed=0):
    """Optimise; returns the cost curve, final state and the plot path."""
    model = load_cartpole(light=short)
    data0 = simjax.reset(model, key="down")
    horizon = 250                                   # 2.5 s
    # Adam's first step moves every control by about lr whatever its gradient: with
    # RK4 and the slider limit, lr = 0.1 throws the cart into the limit (the cost first
    # rises 12 -> 33 and was still 16 after 120 steps); 0.03 descends steadily in
    # float32 and float64 alike.
    iters, lr = (ITERS_SHORT, 0.1) if short else (500, 0.03)
    dt = float(model.opt.timestep)
    cost = make_cost(model, data0)
    value_and_grad = jax.jit(jax.value_and_grad(cost, has_aux=True))
    init, update = adam(lr)
    # Small random initial controls break the symmetry of the hanging pole; drawn in
    # float32 so that float32 and float64 runs start from the same controls.
    z = (0.1 * jax.random.normal(jax.random.PRNGKey(seed), (horizon, model.nu),
                                 jnp.float32)).astype(data0.qpos.dtype)
    state = init(z)
    update = jax.jit(update)
    costs = []
    t0 = time.perf_counter()
    for it in range(iters):
        (c, traj), g = value_and_grad(z)
        costs.append(float(c))
        if it % max(1, iters // 10) == 0:
            print(f"iter {it:4d}  cost {costs[-1]:.4f}  final angle "
                  f"{float(traj.qpos[-1, 1]):+.3f} rad  [{time.perf_counter() - t0:.1f} s]")
        z, state = update(z, g, state)
    (c, traj), _ = value_and_grad(z)
    costs.append(float(c))
    elapsed = time.perf_counter() - t0
    final_qpos = np.asarray(traj.qpos[-1])
    final_qvel = np.asarray(traj.qvel[-1])
    print(f"cost {costs[0]:.4f} -> {costs[-1]:.4f} (x{costs[0] / costs[-1]:.1f} lower) in "
          f"{iters} iterations, {elapsed:.1f} s incl. compile; final cart x "
          f"{final_qpos[0]:+.3f} m, pole angle {final_qpos[1]:+.3f} rad")
    out = dict(traj=dict(qpos=np.asarray(traj.qpos), ctrl=np.tanh(np.asarray(z))))
    path = plot(png, costs, out["traj"], dt) if png else None
    if path:
        print(f"plot: {path}")
    return dict(costs=costs, initial_cost=costs[0], final_cost=costs[-1],
                final_qpos=final_qpos, final_qvel=final_qvel,
                max_abs_cart=float(np.abs(out["traj"]["qpos"][:, 0]).max()),
                max_abs_ctrl=float(np.abs(out["traj"]["ctrl"]).max()),
                plot=path, seconds=elapsed)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--short", action="store_true", help="fewer iterations")
    p.add_argument("--png", default="trajopt_cartpole.png", help="plot path ('' for none)")
    a = p.parse_args()
    main(short=a.short, png=a.png)
