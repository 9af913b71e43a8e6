"""Capsule against capsule (primitive.capsule_capsule) against MuJoCo 4.0.0 (float64):
parallel, antiparallel and nearly parallel axes, where MuJoCo 4.0 puts its two
contacts at the ends of the segments' overlap, and crossing axes (one contact)."""
from __future__ import annotations

import jax
import mujoco
import numpy as np
import pytest

from engine_helpers import geom_poses
from mujoco_oracle import model_from_mujoco
from simjax.engine import io
from simjax.engine.collision import driver

#: dist, pos and normal of the same closed-form contacts: measured within 1e-15 (the
#: sines of 1e-6 and 5e-5 included)
TOL = 1e-12
#: the normal of nearly coaxial capsules: the sphere centres as little as 1e-5 apart,
#: the normal's rounding grows by the reciprocal (measured 1.7e-12)
TOL_COAXIAL = 1e-9
#: sines of the angle between the axes: parallel for MuJoCo 4.0 below 1e-4
SINES = (0.0, 1e-6, 5e-5, 3e-4, 0.3)


def _scene(r1, h1, r2, h2, margin):
    return f"""<mujoco><worldbody>
      <body><geom type="capsule" size="{r1} {h1}" euler="0 90 0" margin="{margin}"/></body>
      <body><freejoint/><geom type="capsule" size="{r2} {h2}"/></body>
      </worldbody></mujoco>"""


def _quat_z_to(v):
    q = np.zeros(4)
    mujoco.mju_quatZ2Vec(q, np.asarray(v, np.float64))
    return q


@pytest.mark.parametrize("margin", [0.0, 0.02])
def test_capsule_pairs_match_mujoco(margin):
    """Contacts in MuJoCo's order, with its dist, pos and normal, at 120 random poses
    (6 pairs of sizes, 20 poses each) of a capsule whose axis is (anti)parallel to a
    fixed one's up to the sines in :data:`SINES`: overlapping segments, one inside
    the other, disjoint ones (the same contact twice), coaxial ones, apart ones; both
    orders of the overlap's ends."""
    rng = np.random.default_rng(5)
    seen = {"two": 0, "one": 0, "same twice": 0, "none": 0}
    for size in range(6):
        r1, r2 = rng.uniform(0.03, 0.15, 2)
        h1, h2 = rng.uniform(0.05, 0.4, 2)
        mjm = mujoco.MjModel.from_xml_string(_scene(r1, h1, r2, h2, margin))
        mjd = mujoco.MjData(mjm)
        m = model_from_mujoco(mjm)
        collide = jax.jit(lambda d: driver.collision(m, d))
        for k in range(20 * size, 20 * size + 20):
            s = SINES[k % len(SINES)]
            sign = 1.0 if k % 2 else -1.0
            axis = np.array([sign * np.sqrt(1 - s * s), s * np.cos(k), s * np.sin(k)])
            lat = 0.0 if k % 17 == 0 else rng.uniform(0, 1.3 * (r1 + r2))
            phi = rng.uniform(0, 2 * np.pi)
            mjd.qpos[:3] = [rng.uniform(-1.2, 1.2) * (h1 + h2), lat * np.cos(phi),
                            lat * np.sin(phi)]
            mjd.qpos[3:] = _quat_z_to(axis)
            mujoco.mj_forward(mjm, mjd)
            c = jax.tree_util.tree_map(
                np.asarray, collide(geom_poses(io.make_data(m), mjd)).contact)
            mine = np.nonzero(c.valid)[0]
            assert len(mine) == mjd.ncon, (k, len(mine), mjd.ncon)
            for j, mc in zip(mine, mjd.contact[:mjd.ncon]):
                assert abs(c.dist[j] - mc.dist) < TOL, (k, c.dist[j], mc.dist)
                np.testing.assert_allclose(c.pos[j], mc.pos, atol=TOL, err_msg=str(k))
                np.testing.assert_allclose(c.frame[j][0], mc.frame[:3], err_msg=str(k),
                                           atol=TOL_COAXIAL if lat == 0 else TOL)
            if mjd.ncon == 2:
                same = np.allclose(mjd.contact.pos[0], mjd.contact.pos[1])
                seen["same twice" if same else "two"] += 1
            else:
                seen[{0: "none", 1: "one"}[mjd.ncon]] += 1
    assert min(seen.values()) >= 3, seen
