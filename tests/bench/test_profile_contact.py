"""bench/profile_contact.py --ablate-solve: the step with and without its constraint
solve (the second's acceleration the unconstrained one, the first's not, for a ball
pressed into a plane), both timed, the solver left as it was."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import simjax
from bench import profile_contact
from simjax.engine import io, solver

XML = """<mujoco><worldbody><geom type="plane" size="1 1 0.1"/>
<body pos="0 0 0.09"><freejoint/><geom type="sphere" size="0.1"/></body>
</worldbody></mujoco>"""


def test_ablate_solve_times_both_programs_and_restores_the_solver():
    m = simjax.load_model(XML)
    d0 = io.make_data(m)
    batch = jax.vmap(lambda z: d0.replace(qpos=d0.qpos.at[2].set(z)))(
        jnp.asarray([0.09, 0.095], d0.qpos.dtype))
    orig = solver.fwd_constraint
    with_solve, without = profile_contact.ablate_programs(m, batch)
    assert solver.fwd_constraint is orig
    a, b = with_solve(batch), without(batch)
    np.testing.assert_array_equal(b.qacc, b.qacc_smooth)
    # 0.5-1 cm into the plane: the contact pushes the ball up, gravity alone pulls it
    # down
    assert np.all(np.asarray(b.qacc[:, 2]) < -9.0)
    assert np.all(np.asarray(a.qacc[:, 2]) > 5.0)
    full, bare = profile_contact.ablate_solve(m, batch, rounds=2)
    assert solver.fwd_constraint is orig
    assert math.isfinite(full) and math.isfinite(bare) and full > 0 and bare > 0
