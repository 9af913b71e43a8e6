"""Bounding volume hierarchies (simjax.mjcf.bvh) against MuJoCo 4.0.0's compiled ones."""
import mujoco
import numpy as np
import pytest

import simjax
from simjax.mjcf import bvh
from mujoco_oracle import corpus_path

_INT_FIELDS = ("body_bvhadr", "body_bvhnum", "mesh_bvhadr", "mesh_bvhnum", "bvh_depth",
               "bvh_child", "bvh_nodeid")


@pytest.mark.parametrize("rel", [
    "mjx_convex/convex.xml", "mujoco_car/car.xml", "menagerie_trossen_wx250s/scene.xml",
    "mjx_shadow_hand/scene_right.xml", "mujoco_plugin_sdf_torus/torus.xml",
    # the bolt's marching-cubes mesh has 388 degenerate faces (NaN circumcentres): its
    # tree is whatever libc++'s nth_element makes of them, reproduced step for step
    "mujoco_plugin_sdf_nutbolt/nutbolt.xml"])
def test_bvh_matches_mujoco(rel):
    """Every BVH field of our compiler equals MuJoCo's: structure exactly, mesh boxes
    bit for bit (built from the same double-precision vertices), body boxes to 1e-14
    (built from geom frames and boxes that carry the compiler's rounding; measured
    <= 2.2e-15)."""
    path = corpus_path(rel)
    m = simjax.load_model(path)
    mj = mujoco.MjModel.from_xml_path(path)
    assert (m.nbvh, m.nbvhstatic) == (mj.nbvh, mj.nbvhstatic)
    for name in _INT_FIELDS:
        got = np.asarray(getattr(m, name))
        np.testing.assert_array_equal(got, np.asarray(getattr(mj, name)).reshape(got.shape),
                                      err_msg=name)
    aabb = np.asarray(m.bvh_aabb)
    mesh0 = min([a for a in mj.mesh_bvhadr if a >= 0], default=mj.nbvh)
    np.testing.assert_array_equal(aabb[mesh0:], mj.bvh_aabb[mesh0:])
    np.testing.assert_allclose(aabb[:mesh0], mj.bvh_aabb[:mesh0], rtol=0, atol=1e-14)


def test_body_bvh_from_mujoco_arrays():
    """Body trees built from MuJoCo's own geom and body arrays equal its trees bit for
    bit (the tree code alone, without compiler rounding)."""
    mj = mujoco.MjModel.from_xml_path(corpus_path("mjx_shadow_hand/scene_right.xml"))
    for b in range(mj.nbody):
        g = np.arange(mj.body_geomadr[b], mj.body_geomadr[b] + mj.body_geomnum[b])
        t = bvh.body_tree(g, mj.geom_contype[g], mj.geom_conaffinity[g], mj.geom_pos[g],
                          mj.geom_quat[g], mj.geom_aabb[g], mj.body_ipos[b], mj.body_iquat[b])
        assert t.n == mj.body_bvhnum[b]
        s = slice(mj.body_bvhadr[b], mj.body_bvhadr[b] + t.n)
        np.testing.assert_array_equal(t.child, mj.bvh_child[s])
        np.testing.assert_array_equal(t.nodeid, mj.bvh_nodeid[s])
        np.testing.assert_array_equal(t.aabb, mj.bvh_aabb[s])


def test_nth_element_partitions():
    """The libc++ nth_element emulation is a selection for proper orderings."""
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 5, 7, 8, 50, 257):
        for _ in range(5):
            key = rng.integers(0, 10, n).tolist()
            v = list(range(n))
            nth = int(rng.integers(0, n))
            bvh.nth_element(v, nth, lambda i, j: (key[i], i) < (key[j], j))
            ref = sorted(range(n), key=lambda i: (key[i], i))
            assert v[nth] == ref[nth]
            assert sorted(v[:nth]) == sorted(ref[:nth])
