"""Box/mesh contact patches (MuJoCo 4.0's multicontact) against MuJoCo 4.0.0 (float64)
on small scenes written here: a cube mesh resting on a box or on a flat mesh slab, with
and without a geom margin, at random tilts and heights around touching."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from mujoco_oracle import model_from_mujoco
from simjax.engine import io
from simjax.engine.collision import driver

_ASSETS = """<asset>
  <mesh name="cube" vertex="-.1 -.1 -.1  .1 -.1 -.1  -.1 .1 -.1  .1 .1 -.1
                            -.1 -.1 .1  .1 -.1 .1  -.1 .1 .1  .1 .1 .1"/>
  <mesh name="slab" vertex="-.3 -.3 -.06  .3 -.3 -.06  -.3 .3 -.06  .3 .3 -.06
                            -.3 -.3 .06  .3 -.3 .06  -.3 .3 .06  .3 .3 .06"/>
</asset>"""
_SCENE = """<mujoco>{assets}<worldbody>
  <geom name="ground" {ground} margin="{margin}"/>
  <body pos="0 0 .3"><freejoint/><geom type="mesh" mesh="cube"/></body>
</worldbody></mujoco>"""
GROUNDS = {"box": ('type="box" size=".5 .5 .1"', 0.1),
           "mesh": ('type="mesh" mesh="slab"', 0.06)}

_collide = jax.jit(driver.collision)


def _states(mjm, top, n, seed):
    """Free-cube poses: random tilts (small: face-face patches; large: edges and
    vertices down), lowest vertex within [-0.01, 0.006] of the ground's top face."""
    rng = np.random.default_rng(seed)
    mjd = mujoco.MjData(mjm)
    mid = mjm.geom_dataid[1]
    verts = mjm.mesh_vert[mjm.mesh_vertadr[mid]:mjm.mesh_vertadr[mid] + mjm.mesh_vertnum[mid]]
    for k in range(n):
        ang = rng.uniform(0.3, 1.2) if k % 3 == 0 else rng.uniform(0, 0.02)
        axis = rng.standard_normal(3)
        q = mjm.qpos0.copy()
        q[3:7] = np.r_[np.cos(ang / 2), np.sin(ang / 2) * axis / np.linalg.norm(axis)]
        q[2] = 0
        mjd.qpos[:] = q
        mujoco.mj_kinematics(mjm, mjd)
        low = (verts @ mjd.geom_xmat[1].reshape(3, 3).T)[:, 2].min()
        q[2] = top - low + rng.uniform(-0.01, 0.006)
        yield q


@pytest.mark.parametrize("margin", [0.0, 0.01])
@pytest.mark.parametrize("ground", sorted(GROUNDS))
def test_patches_match_mujoco(ground, margin):
    """Same contact count at every state; patch contacts (2-4 per pair) equal to
    MuJoCo's to 1e-12 (closed form: clipped points, their projections on the reference
    face, depth along the incident normal). Single contacts with a margin come from
    MuJoCo's EPA on margin-inflated shapes (ccd_tolerance 1e-6): position to 1e-5,
    depth to 1e-8, normal to 1e-7 (measured 1.5e-6, 1e-9, 2e-8)."""
    xml = _SCENE.format(assets=_ASSETS, ground=GROUNDS[ground][0], margin=margin)
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    m = model_from_mujoco(mjm)
    d0 = io.make_data(m)
    npatch = nabove = 0
    for q in _states(mjm, GROUNDS[ground][1], 18, seed=1):
        mjd.qpos[:] = q
        mujoco.mj_forward(mjm, mjd)
        d = d0.replace(geom_xpos=jnp.asarray(mjd.geom_xpos),
                       geom_xmat=jnp.asarray(mjd.geom_xmat).reshape(-1, 3, 3))
        c = jax.tree_util.tree_map(np.asarray, _collide(m, d).contact)
        idx = np.nonzero(c.valid)[0]
        assert len(idx) == mjd.ncon
        patch = mjd.ncon > 1
        single = margin > 0 and not patch
        tol = (1e-5, 1e-8, 1e-7) if single else (1e-12, 1e-12, 1e-12)
        for mc in mjd.contact[:mjd.ncon]:
            i = idx[np.argmin([np.linalg.norm(c.pos[j] - mc.pos) for j in idx])]
            assert np.linalg.norm(c.pos[i] - mc.pos) < tol[0]
            assert abs(c.dist[i] - mc.dist) < tol[1]
            assert np.abs(c.frame[i].ravel() - mc.frame).max() < tol[2]
            assert abs(c.includemargin[i] - mc.includemargin) < 1e-15
            nabove += mc.dist > 0
        npatch += patch
    assert npatch >= 6
    assert margin == 0 or nabove >= 4          # patch points above the face, in margin
