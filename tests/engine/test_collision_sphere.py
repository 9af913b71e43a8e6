"""Sphere against mesh hulls (convex_sphere.py) against MuJoCo 4.0.0 (float64): the
shadow hand's fingertip meshes and a random rock, spheres placed around them (centre
outside and apart within the margin, overlapping, centre inside the hull)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import geom_poses
from mujoco_oracle import corpus_path, model_from_mujoco
from simjax.engine import io
from simjax.engine.collision import convex_sphere, driver

#: margin of the sphere geom: separated pairs within it are reported too
MARGIN = 0.01
#: centre outside the hull (GJK): dist, pos and normal agree to ~1e-15 (measured)
TOL = 1e-9
#: centre inside the hull: MuJoCo's EPA stops within opt.ccd_tolerance (1e-6) of the
#: optimum, simjax's depth is exact (measured: depth 3.4e-7, normal 1.3e-5 and
#: position 6e-5 apart, EPA's witness points scattered by its tolerance)
TOL_INSIDE = (1e-6, 1e-4, 5e-5)


def _scene(meshes, radius):
    fmt = lambda p: " ".join(f"{x:.12g}" for x in np.asarray(p).reshape(-1))
    assets = "".join(f'<mesh name="m{i}" vertex="{fmt(v)}"/>' for i, v in enumerate(meshes))
    bodies = "".join(
        f'<body pos="{0.2 * i} 0 0" euler="{20 * i} {35 + 10 * i} {50 - 5 * i}">'
        f'<geom type="mesh" mesh="m{i}" contype="1" conaffinity="2"/></body>'
        for i in range(len(meshes)))
    return f"""<mujoco><asset>{assets}</asset><worldbody>{bodies}
      <body><freejoint/><geom type="sphere" size="{radius}" margin="{MARGIN}"
        contype="2" conaffinity="1"/></body></worldbody></mujoco>"""


def _meshes():
    rng = np.random.default_rng(3)
    rock = rng.standard_normal((60, 3)) * [0.02, 0.015, 0.01]
    out = [rock]
    path = corpus_path("mjx_shadow_hand/scene_right.xml")
    hand = mujoco.MjModel.from_xml_path(path)
    for g in range(hand.ngeom):                   # fingertip collision meshes
        if hand.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH and hand.geom_conaffinity[g]:
            mid = hand.geom_dataid[g]
            v = hand.mesh_vert[hand.mesh_vertadr[mid]:hand.mesh_vertadr[mid]
                               + hand.mesh_vertnum[mid]]
            if not any(len(v) == len(o) and np.allclose(v, o) for o in out):
                out.append(np.array(v, np.float64))
    return out


@pytest.mark.parametrize("radius", [0.01, 0.03])
def test_sphere_mesh_matches_mujoco(radius):
    """Contact set, dist, pos and frame as MuJoCo at sphere positions around each
    hull: on rays from the hull's centre at distances spanning inside to apart."""
    meshes = _meshes()
    mjm = mujoco.MjModel.from_xml_string(_scene(meshes, radius))
    mjd = mujoco.MjData(mjm)
    m = model_from_mujoco(mjm)
    d0 = io.make_data(m)
    f = jax.jit(lambda d: driver.collision(m, d))
    rng = np.random.default_rng(0)
    sph = mjm.ngeom - 1
    n = {"apart": 0, "outside": 0, "inside": 0}
    for k in range(60):
        i = k % len(meshes)
        mujoco.mj_kinematics(mjm, mjd)
        gpos, gmat = mjd.geom_xpos[i].copy(), mjd.geom_xmat[i].reshape(3, 3)
        u = rng.standard_normal(3)
        u /= np.linalg.norm(u)
        verts = meshes[i] @ gmat.T + gpos
        reach = np.max((verts - gpos) @ u)                # support along u
        h = reach * rng.uniform(0.0, 1.0) if k % 6 == 0 else \
            reach + radius + rng.uniform(-0.8 * radius, MARGIN)
        mjd.qpos[:3] = gpos + h * u
        mjd.qpos[3:] = [1, 0, 0, 0]
        mujoco.mj_forward(mjm, mjd)
        d = f(geom_poses(d0, mjd))
        c = jax.tree_util.tree_map(np.asarray, d.contact)
        mine = [j for j in np.nonzero(c.valid)[0] if sph in c.geom[j]]
        theirs = [mjd.contact[j] for j in range(mjd.ncon) if sph in mjd.contact.geom[j]]
        assert len(mine) == len(theirs) <= 1, k
        if not theirs:
            continue
        j, mc = mine[0], theirs[0]
        tol = TOL_INSIDE if mc.dist < -radius else (TOL, TOL, TOL)
        assert abs(c.dist[j] - mc.dist) < tol[0], (k, c.dist[j], mc.dist)
        np.testing.assert_allclose(c.pos[j], mc.pos, atol=tol[1])
        np.testing.assert_allclose(c.frame[j][0], mc.frame[:3], atol=tol[2])
        n["inside" if mc.dist < -radius else "apart" if mc.dist > 0 else "outside"] += 1
    assert min(n.values()) >= 3, n


def test_tables_cover_group_meshes_only():
    """The tables of a collider group are padded to the group's own meshes: a large
    mesh elsewhere in the model does not pad them."""
    big = np.random.default_rng(1).standard_normal((400, 3))
    small = np.random.default_rng(2).standard_normal((30, 3))
    mjm = mujoco.MjModel.from_xml_string(f"""<mujoco><asset>
      <mesh name="big" vertex="{' '.join(map(str, big.ravel()))}"/>
      <mesh name="small" vertex="{' '.join(map(str, small.ravel()))}"/></asset>
      <worldbody><geom type="mesh" mesh="big" contype="0" conaffinity="0"/>
      <geom type="mesh" mesh="small"/><body><freejoint/><geom size=".1"/></body>
      </worldbody></mujoco>""")
    m = model_from_mujoco(mjm)
    full = convex_sphere.sphere_table(m)
    own = convex_sphere.sphere_table(m, [1])
    assert own["tplane"].shape[0] == 1
    assert own["tplane"].shape[1] < full["tplane"].shape[1]
    assert own["edge"].shape[1] < full["edge"].shape[1]


def test_sphere_mesh_gradient():
    """jax.grad of the contact distance and position with respect to the sphere's and
    the mesh's positions, the mesh's rotation and the radius, against central finite
    differences (float64), at a face, an edge/vertex and an inside (deep) contact."""
    from simjax.engine.collision.primitive import Geom
    meshes = _meshes()[:1]
    mjm = mujoco.MjModel.from_xml_string(_scene(meshes, 0.01))
    m = model_from_mujoco(mjm)
    tab = convex_sphere.sphere_table(m, [0])
    extra = {k: jnp.asarray(tab[k][0]) for k in ("tplane", "tedge", "edge")}
    mat0 = jax.scipy.linalg.expm(jnp.asarray([[0, -0.3, 0.2], [0.3, 0, -0.5],
                                              [-0.2, 0.5, 0.0]]))
    verts = np.asarray(mjm.mesh_vert[:mjm.mesh_vertnum[0]], np.float64)  # mesh frame
    far = np.asarray(mat0) @ verts[np.argmax(verts @ [1.0, 0.3, 0.2])]   # world

    def out(x):
        c, p2, w, r = x[:3], x[3:6], x[6:9], x[9]
        # rotation: the mesh frame turned by the small rotation vector w
        k = jnp.asarray([[0, -w[2], w[1]], [w[2], 0, -w[0]], [-w[1], w[0], 0]])
        rot = jax.scipy.linalg.expm(k) @ mat0
        pre = convex_sphere.sphere_mesh(Geom(c, jnp.eye(3), jnp.asarray([r, 0, 0])),
                                        Geom(p2, rot, jnp.zeros(3), extra=extra), 0.1)
        return jnp.concatenate([pre.dist, pre.pos[0], pre.normal[0]])

    f, jf, jr = jax.jit(out), jax.jit(jax.jacfwd(out)), jax.jit(jax.jacrev(out))
    kinds = set()
    for centre in (far * 1.3 + 0.004, 2.5 * far, 0.3 * far):
        x = jnp.asarray(np.r_[centre, 0.001, -0.002, 0.0005, 0.01, -0.02, 0.03, 0.01])
        jac = np.asarray(jf(x))
        np.testing.assert_allclose(np.asarray(jr(x)), jac, atol=1e-12)
        eps = 1e-7
        fd = np.stack([(np.asarray(f(x.at[i].add(eps))) - np.asarray(f(x.at[i].add(-eps))))
                       / (2 * eps) for i in range(x.shape[0])], 1)
        np.testing.assert_allclose(jac, fd, atol=1e-6)
        c = (x[:3] - x[3:6]) @ (jax.scipy.linalg.expm(jnp.asarray(
            [[0, -x[8], x[7]], [x[8], 0, -x[6]], [-x[7], x[6], 0]])) @ mat0)
        face, _, _ = convex_sphere._select(c, extra["tplane"], extra["tedge"], extra["edge"])
        inside = np.max(np.asarray(extra["tplane"][:, :3] @ c - extra["tplane"][:, 3])) < 0
        kinds.add("inside" if inside else "face" if bool(face) else "edge")
    assert kinds == {"inside", "face", "edge"}, kinds


def test_sphere_mesh_batched_passing_only():
    """Under vmap each pair's closest-feature search runs only on the worlds where the
    pair passes the broadphase (convex_sphere._select_passing, in blocks of
    SELECT_BLOCK worlds): the batch's contacts equal those of searching every pair in
    every world (exactly), with more passing worlds than one block, and reverse-mode
    derivatives pass through. (Compared batch to batch: with the backend optimisation
    off, the tests' setting, the batched program gave other depths than one world's
    for some centres inside a hull, with or without the passing-only search.)"""
    meshes = _meshes()
    mjm = mujoco.MjModel.from_xml_string(_scene(meshes, 0.01))
    mjd = mujoco.MjData(mjm)
    m = model_from_mujoco(mjm)
    d0 = io.make_data(m)
    rng = np.random.default_rng(5)
    worlds = []
    for k in range(2 * convex_sphere.SELECT_BLOCK + 7):
        mujoco.mj_kinematics(mjm, mjd)
        i = 0 if k % 2 else int(rng.integers(len(meshes)))   # mesh 0: several blocks
        u = rng.standard_normal(3)
        u /= np.linalg.norm(u)
        near = mjd.geom_xpos[i] + u * rng.uniform(0.0, 0.04)
        mjd.qpos[:3] = near if k % 5 else [0.1, 2.0, 0.0]    # some worlds: no pair
        mjd.qpos[3:] = [1, 0, 0, 0]
        mujoco.mj_forward(mjm, mjd)
        worlds.append(geom_poses(d0, mjd))
    batch = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *worlds)
    coll = lambda d: driver.collision(m, d).contact
    out = {}
    try:
        for passing in (True, False):
            convex_sphere._PASSING = passing
            out[passing] = jax.jit(jax.vmap(coll))(batch)
    finally:
        convex_sphere._PASSING = True
    assert int(np.asarray(out[True].valid).sum()) > convex_sphere.SELECT_BLOCK
    for name in ("valid", "dist", "pos", "frame", "geom"):
        np.testing.assert_array_equal(np.asarray(getattr(out[True], name)),
                                      np.asarray(getattr(out[False], name)), err_msg=name)

    def depth(xpos):
        c = jax.vmap(coll)(batch.replace(geom_xpos=xpos))
        return jnp.sum(jnp.where(c.valid, c.dist, 0.0))
    g = np.asarray(jax.jit(jax.grad(depth))(batch.geom_xpos))
    assert np.all(np.isfinite(g)) and np.any(g != 0)
