"""Broadphase and narrow phase of the collider groups (simjax.engine.collision.narrow):
the bounding-box filter, the capsules' segment test, groups skipped under vmap, groups
run in chunks and their pair capacity, against MuJoCo."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from engine_helpers import f32, geom_poses, normalize_quaternions
from simjax.engine import io
from simjax.engine.collision import broadphase, chunked, driver, narrow, pairs, primitive
from simjax.types import GeomType


_FILTER_SCENE = """<mujoco><worldbody>
  <body><freejoint/><geom type="box" size=".1 .05 .02" margin=".01"/></body>
  <body><freejoint/><geom type="capsule" size=".03 .1" margin=".01"/></body>
  <body><freejoint/><geom type="box" size=".04 .08 .06"/></body>
</worldbody></mujoco>"""


_SKIP_SCENE = """<mujoco><worldbody>
  <body><freejoint/><geom type="box" size=".1 .05 .02" margin=".01"/></body>
  <body><freejoint/><geom type="capsule" size=".03 .1" margin=".01"/></body>
</worldbody></mujoco>"""


def _filter_batch(n, xml=_FILTER_SCENE):
    """(mjModel, Model, plan, batched Data with n random close poses of a scene, the
    poses' qpos)."""
    from mujoco_oracle import model_from_mujoco
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    m = model_from_mujoco(mjm)
    p = driver.plan(m)
    rng = np.random.default_rng(0)
    ds, qs = [], []
    for _ in range(n):
        q = rng.standard_normal(mjm.nq)
        for b in range(mjm.nbody - 1):
            q[7 * b:7 * b + 3] = rng.uniform(0, 0.35 / np.sqrt(3), 3)
        qs.append(normalize_quaternions(mjm, q))
        mjd.qpos[:] = qs[-1]
        mujoco.mj_kinematics(mjm, mjd)
        ds.append(geom_poses(io.make_data(m), mjd))
    return mjm, m, p, jax.tree_util.tree_map(lambda *x: jnp.stack(x), *ds), qs


@pytest.mark.slow
def test_box_filter():
    """The bounding-box filter never rejects a pair whose collider finds a contact (300
    random poses of two boxes and a capsule within 0.35 of each other, margin 0.01 on
    two geoms) and rejects some that pass the sphere test."""
    _, m, p, batch, _ = _filter_batch(300)
    prm = driver.pair_params(m, p, jnp.float64)
    dm = prm["margin"] + prm["gap"]
    rejected = 0
    for grp in p.groups:
        if grp.fn in narrow.CHEAP:
            continue
        g1, g2 = p.g1[grp.cand], p.g2[grp.cand]
        dmg = dm[grp.cand]

        def one(d):
            pre = jax.vmap(grp.fn)(*narrow._group_args(m, d, grp.fn, g1, g2, dmg,
                                                       jnp.float64))
            return (broadphase._broadphase(m, d, g1, g2, dmg),
                    broadphase._box_filter(m, d, g1, g2, dmg), jnp.any(pre.valid, axis=1))
        sphere, box, hit = map(np.asarray, jax.jit(jax.vmap(one))(batch))
        assert not np.any(hit & sphere & ~box)
        rejected += int(np.sum(sphere & ~box & ~hit))
    assert rejected > 50


_SEGMENT_SCENE = """<mujoco><worldbody>
  <body><freejoint/><geom type="capsule" size=".02 .15" margin=".01"/></body>
  <body><freejoint/><geom type="capsule" size=".03 .1"/></body>
  <body><freejoint/><geom type="sphere" size=".04" margin=".005"/></body>
</worldbody></mujoco>"""


def test_segment_filter():
    """The capsules' segment test never rejects a pair whose collider finds a contact
    (300 random poses of two capsules and a sphere within 0.35 of each other, with
    margins), and rejects some that pass the sphere test."""
    _, m, p, batch, _ = _filter_batch(300, _SEGMENT_SCENE)
    prm = driver.pair_params(m, p, jnp.float64)
    dm = prm["margin"] + prm["gap"]
    rejected = 0
    for grp in p.groups:
        g1, g2 = p.g1[grp.cand], p.g2[grp.cand]
        dmg = dm[grp.cand]

        def one(d):
            pre = jax.vmap(grp.fn)(*narrow._group_args(m, d, grp.fn, g1, g2, dmg,
                                                       jnp.float64))
            cols = broadphase._pair_cols(broadphase._pair_table(m, d, g1, g2,
                                                                jnp.float64))
            return (broadphase._broadphase(m, d, g1, g2, dmg),
                    broadphase._segment_filter(m, g1, g2, dmg, cols),
                    jnp.any(pre.valid, axis=1))
        sphere, seg, hit = map(np.asarray, jax.jit(jax.vmap(one))(batch))
        assert not np.any(hit & sphere & ~seg)
        rejected += int(np.sum(sphere & ~seg & ~hit))
    assert rejected > 50


# ten sticks (capsules along x) side by side 0.3 apart: bounding spheres (radius 0.51)
# reach three neighbours on each side, segments one; sticks 0-1 and 8-9 touch
_LADDER = [0.0, 0.015, 0.3, 0.6, 0.9, 1.2, 1.5, 1.8, 2.1, 2.115]
_LADDER_SCENE = "<mujoco><worldbody>" + "".join(
    f'<body pos="0 {y} 0"><freejoint/><geom type="capsule" size=".01 .5" '
    'euler="0 90 0"/></body>' for y in _LADDER) + "</worldbody></mujoco>"


def _past_capacity(monkeypatch, xml, fn, ncand):
    """A one-world scene whose group of the cheap collider ``fn`` has ``ncand``
    candidate pairs and a pair capacity of 16 (``PAIRS_PER_SLOT`` 0, 40 contact slots),
    compacted to it (``_COMPACT_MIN`` 0):
    (mjModel, its MjData after mj_forward, Model, plan, the group, the contact dims'
    slots, Data at MuJoCo's poses)."""
    from mujoco_oracle import model_from_mujoco
    mjm = mujoco.MjModel.from_xml_string(xml)
    mjd = mujoco.MjData(mjm)
    mujoco.mj_forward(mjm, mjd)
    m = model_from_mujoco(mjm)
    p = driver.plan(m)
    grp = next(g for g in p.groups if g.fn is fn)
    monkeypatch.setattr(narrow, "PAIRS_PER_SLOT", 0)
    monkeypatch.setattr(narrow, "_COMPACT_MIN", 0)
    split = driver.dim_split(m, 40)
    assert narrow._pair_cap(m, p, grp, split) == 16 < len(grp.cand) == ncand
    return mjm, mjd, m, p, grp, split, geom_poses(io.make_data(m, ncon_max=40), mjd)


def _assert_one_world(mjm, mjd, got):
    """Unbatched collision output ``got`` at ``mjd``'s poses has MuJoCo's contacts."""
    _assert_mujoco_depths(mjm, jax.tree_util.tree_map(lambda x: x[None], got),
                          [mjd.qpos.copy()])


def test_segment_filter_keeps_contacts_past_pair_capacity(monkeypatch):
    """A compacted capsule-capsule group (45 candidates, capacity 16 here) whose sphere-
    passing pairs (26) exceed its capacity: tested by segment (11 pass), no contact
    pair is dropped and the contacts are MuJoCo's; by spheres alone the last touching
    pair (sticks 8-9) is past the capacity and its contacts are lost."""
    mjm, mjd, m, p, grp, split, d = _past_capacity(
        monkeypatch, _LADDER_SCENE, primitive.capsule_capsule, 45)
    assert mjd.ncon >= 4              # both touching pairs (two contacts each: parallel)
    prm = driver.pair_params(m, p, jnp.float64)
    dm = prm["margin"] + prm["gap"]
    counts = {}
    for on in (True, False):
        monkeypatch.setattr(narrow, "_SEGMENT_FILTER", on)
        counts[on] = int(jax.jit(
            lambda d: narrow.narrow_group(m, d, p, grp, dm, split)[2])(d))
        got = jax.jit(lambda d: driver.collision(m, d))(d)
        if on:
            _assert_one_world(mjm, mjd, got)
        else:
            assert 0 < int(got.ncon) < mjd.ncon
    assert counts == {True: 11, False: 26}


# twenty capsules above a plane, ten of them touching it
_PLANE_SCENE = '<mujoco><worldbody><geom type="plane" size="5 5 .1"/>' + "".join(
    f'<body pos="{0.3 * i} 0 {0.029 if i < 10 else 2.0}"><freejoint/>'
    '<geom type="capsule" size=".03 .1" euler="0 90 0"/></body>' for i in range(20)) + \
    "</worldbody></mujoco>"


def test_plane_group_past_pair_capacity(monkeypatch):
    """A compacted plane-capsule group (20 candidates, capacity 16 here, 10 passing the
    plane test): the segment test leaves a plane's pairs to the plane test (a plane has
    no bounding sphere), and the contacts are MuJoCo's."""
    mjm, mjd, m, _, _, _, d = _past_capacity(
        monkeypatch, _PLANE_SCENE, primitive.plane_capsule, 20)
    assert mjd.ncon == 20             # two contacts for each of the ten lying capsules
    _assert_one_world(mjm, mjd, jax.jit(lambda d: driver.collision(m, d))(d))


def _assert_mujoco_depths(mjm, got, qs, atol=1e-9):
    """Each world's contact count and depths (batched collision output ``got`` at the
    poses ``qs``) equal MuJoCo's (to ``atol``)."""
    mjd = mujoco.MjData(mjm)
    for i, q in enumerate(qs):
        mjd.qpos[:] = q
        mujoco.mj_forward(mjm, mjd)
        assert int(got.ncon[i]) == mjd.ncon
        dist = np.asarray(got.contact.dist[i])[np.asarray(got.contact.valid[i])]
        np.testing.assert_allclose(np.sort(dist), np.sort(mjd.contact.dist[:mjd.ncon]),
                                   rtol=0, atol=atol)


def test_group_skip():
    """A vmapped batch gives every world MuJoCo's contacts whether its collider groups
    run (some world in contact) or are skipped (no world: ``batch_max``); a box and a
    capsule (one non-cheap group, capsule-box)."""
    mjm, m, _, batch, qs = _filter_batch(4, _SKIP_SCENE)
    coll = jax.jit(jax.vmap(lambda d: driver.collision(m, d)))
    got = coll(batch)
    _assert_mujoco_depths(mjm, got, qs)
    assert int(np.sum(np.asarray(got.ncon))) > 0
    # geoms 10 apart along x: nothing within reach in any world (every group skipped)
    far = batch.replace(geom_xpos=batch.geom_xpos + jnp.asarray(
        np.arange(m.ngeom)[:, None] * [10.0, 0.0, 0.0]))
    assert int(np.sum(np.asarray(coll(far).ncon))) == 0


_CHUNK_SCENE = "<mujoco><worldbody>" + "".join(
    '<body><freejoint/><geom type="capsule" size=".03 .1" margin=".01"/></body>'
    '<body><freejoint/><geom type="box" size=".1 .05 .02"/></body>' for _ in range(5)) + \
    "</worldbody></mujoco>"


def test_group_chunks():
    """A costly group of more than ``CHUNK_MIN`` candidates (25 capsule-box pairs) runs
    its passing pairs chunk by chunk: every world gets MuJoCo's contacts (distances,
    positions, normals) in MuJoCo's order, with worlds passing more pairs than a chunk
    holds and worlds passing none in one batch."""
    from mujoco_oracle import model_from_mujoco
    mjm = mujoco.MjModel.from_xml_string(_CHUNK_SCENE)
    mjd = mujoco.MjData(mjm)
    m = model_from_mujoco(mjm)
    p = driver.plan(m)
    grp = next(g for g in p.groups if g.fn is primitive.capsule_box)
    assert chunked._chunks(grp.fn, len(grp.cand))
    rng = np.random.default_rng(1)
    ds, qs = [], []
    for i in range(8):
        q = normalize_quaternions(mjm, rng.standard_normal(mjm.nq))
        q = q.reshape(-1, 7)
        q[:, :3] = rng.uniform(0, 0.4 if i < 6 else 0.1, (len(q), 3))
        if i == 7:                                  # far apart: no pair passes
            q[:, 0] = 10.0 * np.arange(len(q))
        qs.append(q.ravel())
        mjd.qpos[:] = qs[-1]
        mujoco.mj_kinematics(mjm, mjd)
        ds.append(geom_poses(io.make_data(m, ncon_max=200), mjd))
    batch = jax.tree_util.tree_map(lambda *x: np.stack(x), *ds)   # numpy: no eager ops
    prm = driver.pair_params(m, p, jnp.float64)
    dm = prm["margin"] + prm["gap"]
    split = driver.dim_split(m, 200)
    # jitted, and reused at the same batch shape below: run eagerly, the group's ops
    # compile one by one (about 40 s)
    count_fn = jax.jit(jax.vmap(lambda d: narrow.narrow_group(m, d, p, grp, dm, split)[2]))
    collide = jax.jit(jax.vmap(lambda d: driver.collision(m, d)))
    count = count_fn(batch)
    assert int(np.max(count)) > chunked.CHUNK and int(np.min(count)) == 0
    got = collide(batch)
    order = jax.jit(jax.vmap(lambda d: driver.contact_order(m, d)))(got)
    for i, q in enumerate(qs):
        mjd.qpos[:] = q
        mujoco.mj_forward(mjm, mjd)
        n = mjd.ncon
        assert int(got.ncon[i]) == n
        k = np.asarray(order[i])[:n]
        con = got.contact
        np.testing.assert_array_equal(np.asarray(con.geom[i])[k], mjd.contact.geom[:n])
        # box-box pairs too: their clipped-face contacts in MuJoCo's order
        np.testing.assert_allclose(np.asarray(con.dist[i])[k], mjd.contact.dist[:n],
                                   rtol=0, atol=1e-9)
        np.testing.assert_allclose(np.asarray(con.pos[i])[k], mjd.contact.pos[:n],
                                   rtol=0, atol=1e-9)
        np.testing.assert_allclose(np.asarray(con.frame[i])[k][:, 0],
                                   mjd.contact.frame[:n, :3], rtol=0, atol=1e-9)
    assert int(np.sum(np.asarray(got.ncon))) > 0
    # a batch of copies of the far-apart world: no pair passes in the batch, the chunk
    # scan is skipped whole; its contacts are those of the mixed batch (MuJoCo's,
    # checked above)
    far = jax.tree_util.tree_map(lambda x: np.repeat(x[7:], len(qs), axis=0), batch)
    alone = collide(far)
    assert int(np.max(count_fn(far))) == 0
    for x, y in zip(jax.tree_util.tree_leaves(alone.contact),
                    jax.tree_util.tree_leaves(got.contact)):
        np.testing.assert_array_equal(np.asarray(x)[0], np.asarray(y)[7])


def test_group_chunks_capacity():
    """A group run in chunks keeps at most its pair capacity (``narrow._pair_cap``) of
    broadphase-passing pairs, as a compacted cheap group does: its output rows are that
    many (rounded up to whole chunks), and a world passing more pairs reports the
    overflow (WARN_CONTACTFULL); with room for every pair, none."""
    from mujoco_oracle import model_from_mujoco
    mjm = mujoco.MjModel.from_xml_string(_CHUNK_SCENE)
    mjd = mujoco.MjData(mjm)
    m = model_from_mujoco(mjm)
    p = driver.plan(m)
    grp = next(g for g in p.groups if g.fn is primitive.capsule_box)
    q = np.tile([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], mjm.nq // 7)
    mjd.qpos[:] = q                     # every body at the origin: all 25 pairs pass
    mujoco.mj_kinematics(mjm, mjd)
    prm = driver.pair_params(m, p, jnp.float64)
    dm = prm["margin"] + prm["gap"]
    for ncon_max, over in ((1, True), (200, False)):
        d = geom_poses(io.make_data(m, ncon_max=ncon_max), mjd)
        split = driver.dim_split(m, ncon_max)
        cap = narrow._pair_cap(m, p, grp, split)
        pre, rows, count, overflow, _ = jax.jit(
            lambda d: narrow.narrow_group(m, d, p, grp, dm, split))(d)
        assert int(count) == len(grp.cand)
        nrow = -(-min(cap, len(grp.cand)) // chunked.CHUNK) * chunked.CHUNK
        assert rows.shape == (nrow,) and pre.dist.shape[0] == nrow
        assert bool(overflow) == over


_JOIN_SCENE = """<mujoco><worldbody>
  <geom type="plane" size="2 2 .1"/>
  <body><freejoint/><geom type="sphere" size=".04"/></body>
  <body><freejoint/><geom type="sphere" size=".05 .2 .3"/></body>
  <body><freejoint/><geom type="capsule" size=".03 .1"/></body>
</worldbody></mujoco>"""


def test_joined_groups():
    """Sphere-sphere pairs run in the sphere-capsule group and plane-sphere pairs in the
    plane-capsule group (``narrow.AS_GROUP``; one sphere with unused sizes 0.2, 0.3):
    the contacts of 40 random close poses equal those of every collider run in its
    own group, field by field, and MuJoCo's count and depths (both kinds of pair in
    contact in some poses)."""
    mjm, m, p, batch, qs = _filter_batch(40, _JOIN_SCENE)
    fns = [g.fn for g in narrow.run_groups(p)]
    assert primitive.sphere_sphere not in fns and primitive.plane_sphere not in fns
    assert len(fns) == len(p.groups) - 2
    coll = jax.vmap(lambda d: driver.collision(m, d))
    got = jax.jit(coll)(batch)
    saved = narrow.AS_GROUP
    narrow.AS_GROUP = {}
    try:
        want = jax.jit(coll)(batch)
    finally:
        narrow.AS_GROUP = saved
    geom = np.asarray(got.contact.geom)[np.asarray(got.contact.valid)]
    assert {(0, 1), (0, 2), (1, 2)} <= {tuple(g) for g in geom.tolist()}
    for a, b in zip(jax.tree_util.tree_leaves(got.contact), jax.tree_util.tree_leaves(
            want.contact)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(got.ncon), np.asarray(want.ncon))
    _assert_mujoco_depths(mjm, got, qs)


# an irregular convex hexahedron (no symmetric faces), seven free copies: 21 mesh-mesh
# candidate pairs
_MESH_CHUNK_SCENE = (
    '<mujoco><asset><mesh name="hex" vertex="-.05 -.04 -.03  .06 -.05 -.02  .05 .05 -.04 '
    '-.04 .06 -.03  -.06 -.05 .04  .05 -.04 .05  .04 .06 .03  -.05 .04 .05"/></asset>'
    '<worldbody>' + '<body><freejoint/><geom type="mesh" mesh="hex"/></body>' * 7 +
    '</worldbody></mujoco>')


def _mesh_batch(scene, nworld, seed, spread, far=False):
    """A scene of free mesh bodies and ``nworld`` worlds of random poses (positions in
    [0, spread)^3; with ``far`` the last world's bodies 10 apart, no pair passing),
    geom poses from MuJoCo's kinematics: (mjm, m, qpos list, list of Data, the stacked
    batch)."""
    from mujoco_oracle import model_from_mujoco
    mjm = mujoco.MjModel.from_xml_string(scene)
    mjd = mujoco.MjData(mjm)
    m = model_from_mujoco(mjm)
    rng = np.random.default_rng(seed)
    qs, ds = [], []
    for i in range(nworld):
        q = normalize_quaternions(mjm, rng.standard_normal(mjm.nq)).reshape(-1, 7)
        q[:, :3] = rng.uniform(0, spread, (len(q), 3))
        if far and i == nworld - 1:
            q[:, 0] = 10.0 * np.arange(len(q))
        mjd.qpos[:] = q.ravel()
        mujoco.mj_kinematics(mjm, mjd)
        qs.append(q.ravel().copy())
        ds.append(geom_poses(io.make_data(m, ncon_max=200), mjd))
    return mjm, m, qs, ds, jax.tree_util.tree_map(lambda *x: np.stack(x), *ds)


def _mesh_chunk_batch():
    """_MESH_CHUNK_SCENE's model and 6 worlds (the last one far apart): (mjm, m, list
    of Data, the stacked batch)."""
    mjm, m, _, ds, batch = _mesh_batch(_MESH_CHUNK_SCENE, 6, 2, 0.3, far=True)
    return mjm, m, ds, batch


def test_mesh_scene_float32_keeps_every_pair():
    """Float32 collision of the mesh scene (the tests' XLA optimisation level 0) gives
    the float64 contacts' pairs and counts, depths to float32 rounding: the
    farthest-point pick of an edge patch once read a padding slot there (common.argmax,
    see test_argmax_argmin_read_one_stored_copy) and dropped a penetrating pair."""
    _, m, _, batch = _mesh_chunk_batch()
    ref = jax.jit(jax.vmap(lambda d: driver.collision(m, d)))(batch)
    m32 = f32(m)
    got = jax.jit(jax.vmap(lambda d: driver.collision(m32, d)))(f32(batch))
    np.testing.assert_array_equal(np.asarray(got.ncon), np.asarray(ref.ncon))
    for w in range(len(got.ncon)):
        def contacts(c):
            ok = np.asarray(c.valid[w])
            return sorted(zip(map(tuple, np.asarray(c.geom[w])[ok].tolist()),
                              np.asarray(c.dist[w], np.float64)[ok]))
        a, b = contacts(got.contact), contacts(ref.contact)
        assert [g for g, _ in a] == [g for g, _ in b], w
        np.testing.assert_allclose([x for _, x in a], [x for _, x in b], atol=2e-6)


def test_mesh_group_chunks(monkeypatch):
    """A mesh-mesh group of more than ``MESH_CHUNK_MIN`` candidates (21 pairs) runs its
    passing pairs chunk by chunk (``MESH_CHUNK`` pairs each), their hull tables gathered
    by geom id: every world's contacts (count, geoms, distances, positions, frames, in
    MuJoCo's order; a pair's own contacts by depth) equal those of every candidate run
    (``MESH_SAT_CHUNKS`` off, the former way) to 1e-12, with worlds passing several
    pairs and one passing none. (Within a pair the order is not compared: an edge
    patch's two points come in the order of the edge's end vertices, which tie in
    their projection on the normal to rounding.)"""
    mjm, m, ds, batch = _mesh_chunk_batch()
    p = driver.plan(m)
    mesh = (GeomType.MESH, GeomType.MESH)
    grp = next(g for g in p.groups if getattr(g.fn, "types", None) == mesh)
    assert len(grp.cand) == 21 and chunked._chunks(grp.fn, len(grp.cand))
    # a mesh pair's search is costly: two candidates already run in chunks, where a
    # group without mesh data waits for more than CHUNK_MIN
    assert chunked._chunks(grp.fn, 2) and not chunked._chunks(primitive.capsule_box, 2)
    assert chunked.chunk_of(grp.fn) == chunked.MESH_CHUNK
    prm = driver.pair_params(m, p, jnp.float64)
    dm = prm["margin"] + prm["gap"]
    split = driver.dim_split(m, 200)
    count = jax.jit(jax.vmap(lambda d: narrow.narrow_group(m, d, p, grp, dm, split)[2]))(
        batch)
    assert int(np.max(count)) > 2 and int(count[5]) == 0

    def collide():
        # a new function per switch value: the switch is read at trace time
        got = jax.jit(jax.vmap(lambda d: driver.collision(m, d)))(batch)
        return got, jax.jit(jax.vmap(lambda d: driver.contact_order(m, d)))(got)
    got, order = collide()
    monkeypatch.setattr(chunked, "MESH_SAT_CHUNKS", False)
    ref, rorder = collide()
    assert int(np.sum(np.asarray(got.ncon) > 1)) >= 2
    _assert_same_contacts(got, order, ref, rorder)


def _by_depth(c, i, k):
    """Contact slots ``k`` of world ``i`` (in MuJoCo's order) with each pair's contacts
    sorted by depth."""
    g = np.asarray(c.geom[i])[k]
    d = np.asarray(c.dist[i])[k]
    pair_rank = np.unique(g, axis=0, return_inverse=True)[1].ravel()
    first = {}
    for j, r in enumerate(pair_rank):
        first.setdefault(r, j)
    return k[np.lexsort((d, [first[r] for r in pair_rank]))]


def _assert_same_contacts(got, order, ref, rorder):
    """Two batched collision outputs (with their ``contact_order``) hold the same
    contacts to 1e-12, MuJoCo's order across pairs (a pair's own by depth: an edge
    patch's two points come in the order of the edge's end vertices, which tie in
    their projection on the normal to rounding)."""
    np.testing.assert_array_equal(np.asarray(got.ncon), np.asarray(ref.ncon))
    for i in range(len(got.ncon)):
        n = int(got.ncon[i])
        k = _by_depth(got.contact, i, np.asarray(order[i])[:n])
        rk = _by_depth(ref.contact, i, np.asarray(rorder[i])[:n])
        np.testing.assert_array_equal(np.asarray(got.contact.geom[i])[k],
                                      np.asarray(ref.contact.geom[i])[rk])
        for f in ("dist", "pos", "frame"):
            np.testing.assert_allclose(np.asarray(getattr(got.contact, f)[i])[k],
                                       np.asarray(getattr(ref.contact, f)[i])[rk],
                                       rtol=0, atol=1e-12)


def _ball_vertices(n=24, r=0.07):
    """n points on a sphere of radius r (a Fibonacci lattice, slightly squashed so no
    two hull faces are parallel by symmetry)."""
    k = np.arange(n) + 0.5
    z = 1 - 2 * k / n
    a = np.pi * (1 + 5 ** 0.5) * k
    p = np.stack([np.sqrt(1 - z * z) * np.cos(a), np.sqrt(1 - z * z) * np.sin(a), z], 1)
    return r * p * [1.0, 0.9, 0.8]


# five free copies of the hexahedron, a 14-vertex ball and a 24-vertex one: 21
# mesh-mesh candidates, 10 of two 8-vertex hulls, 5 of a hexahedron and the small ball,
# 6 with the large ball
_MESH_BUCKET_SCENE = _MESH_CHUNK_SCENE.replace(
    '</asset>', ''.join('<mesh name="%s" vertex="%s"/>' % (name, " ".join(
        f"{x:.6f}" for x in _ball_vertices(n, r).ravel()))
        for name, n, r in (("ball", 24, 0.07), ("bead", 14, 0.05))) + '</asset>').replace(
    '<body><freejoint/><geom type="mesh" mesh="hex"/></body>' * 7,
    '<body><freejoint/><geom type="mesh" mesh="hex"/></body>' * 5 +
    '<body><freejoint/><geom type="mesh" mesh="bead"/></body>'
    '<body><freejoint/><geom type="mesh" mesh="ball"/></body>')


def test_mesh_group_buckets(monkeypatch):
    """A mesh-mesh group of at least ``MESH_BUCKET_MIN`` (set to 16) candidates splits
    by hull size, again within its smaller part: the 6 pairs with the 24-vertex ball,
    then (at most 3/4 of 14 vertices) the 10 pairs of 8-vertex hexahedra apart from the
    5 of a hexahedron and the 14-vertex bead, three groups in MuJoCo's pair order each.
    The contacts (counts, geoms, depths, positions, frames, in MuJoCo's order) equal
    the unsplit group's to 1e-12 (a pair's own contacts by depth, as in
    test_mesh_group_chunks), and the counts and depths MuJoCo's, in worlds where pairs
    of two groups touch."""
    monkeypatch.setattr(pairs, "MESH_BUCKET_MIN", 16)
    monkeypatch.setattr(pairs, "MESH_BUCKETS", 3)
    monkeypatch.setattr(pairs, "_CACHE", {})
    mjm, m, qs, _, batch = _mesh_batch(_MESH_BUCKET_SCENE, 5, 5, 0.25)
    mesh = (GeomType.MESH, GeomType.MESH)
    p = driver.plan(m)
    groups = [g for g in p.groups if getattr(g.fn, "types", None) == mesh]
    did = np.asarray(m.geom_dataid)
    ball = int(np.flatnonzero(did == 1)[0])
    bead = int(np.flatnonzero(did == 2)[0])
    assert sorted(len(g.cand) for g in groups) == [5, 6, 10]

    def members(g):
        return set(p.g1[g.cand]) | set(p.g2[g.cand])
    by_len = {len(g.cand): members(g) for g in groups}
    assert ball in by_len[6] and ball not in by_len[5] | by_len[10]
    assert bead in by_len[5] and bead not in by_len[10]
    for g in groups:
        assert np.all(np.diff(p.rank[g.cand]) > 0)

    def collide():
        got = jax.jit(jax.vmap(lambda d: driver.collision(m, d)))(batch)
        return got, jax.jit(jax.vmap(lambda d: driver.contact_order(m, d)))(got)
    got, order = collide()
    # patch depths here differ from MuJoCo's by up to 1.5e-9 (relative 1.2e-7), hex-hex
    # pairs as well as the ball's, and the unsplit group's are the same to 1e-12: not
    # the split's doing
    _assert_mujoco_depths(mjm, got, qs, atol=2e-9)
    monkeypatch.setattr(pairs, "MESH_BUCKET_FRACTION", 0.0)
    monkeypatch.setattr(pairs, "_CACHE", {})
    assert sum(getattr(g.fn, "types", None) == mesh for g in driver.plan(m).groups) == 1
    ref, rorder = collide()
    group_of = {}
    for k, g in enumerate(groups):
        for a, b in zip(p.g1[g.cand], p.g2[g.cand]):
            group_of[(int(a), int(b))] = k
    touching = [{group_of[tuple(g)] for g in np.asarray(got.contact.geom[i])[
        np.asarray(got.contact.valid[i])].tolist()} for i in range(len(qs))]
    assert any(len(t) >= 2 for t in touching)
    assert set().union(*touching) == {0, 1, 2}
    _assert_same_contacts(got, order, ref, rorder)
