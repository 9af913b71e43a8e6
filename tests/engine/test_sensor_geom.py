"""Geom distance sensors (simjax.engine.sensor_geom, collision.gjk) against MuJoCo's
mj_geomDistance on random states of geomdist.xml."""
from __future__ import annotations

import os

import jax
import mujoco
import numpy as np
import pytest

from engine_helpers import random_state, set_state, to_data
from mujoco_oracle import model_from_mujoco
from sensor_helpers import SENSOR_MODELS, oracle
from simjax import load_model
from simjax.engine import forward, make_data
from simjax.errors import MJCFError, UnsupportedFeatureError

#: separated pairs: the collision functions' closest points are MuJoCo's to rounding;
#: GJK stops on a Frank-Wolfe gap of ccd_tolerance**2 / 2 for curved shapes (exact for
#: boxes and meshes), so its witness points are determined to about ccd_tolerance
#: (1e-6): seen 1e-12 at XLA's full optimisation, 3e-7 with the tests' backend
#: optimisation off, where rounding sends a cylinder-box pair on another last iterate
TOL_SEPARATED = 1e-6
#: penetrating GJK pairs: MuJoCo's EPA stops within ccd_tolerance of the depth, while
#: simjax's separating-axis search finds it to rounding (seen: depth 4e-7); EPA's
#: witness points are the barycentre of its last polytope face, not the surfaces'
#: exact witnesses (seen: 8e-3 apart on a sphere deep in an ellipsoid, normals 1e-3
#: on an ellipsoid-cylinder pair)
TOL_DEPTH = 1e-6
TOL_PEN_VECTOR = 1e-2


def _compare(mjm, m, nstate, seed=0):
    """(separated and penetrating value counts, worst errors) over random states."""
    mjd = mujoco.MjData(mjm)
    fwd = jax.jit(forward)
    d0 = make_data(m)
    rng = np.random.default_rng(seed)
    counts = {"sep": 0, "pen": 0}
    worst = {"sep": 0.0, "depth": 0.0, "vec": 0.0}
    for _ in range(nstate):
        state = random_state(mjm, rng, qscale=0.15)
        set_state(mjm, mjd, state)
        mujoco.mj_forward(mjm, mjd)
        sd = np.asarray(fwd(m, to_data(d0, state)).sensordata)
        for i in range(mjm.nsensor):
            a, n = mjm.sensor_adr[i], mjm.sensor_dim[i]
            ours, ref = sd[a:a + n], mjd.sensordata[a:a + n]
            pen = _penetrating(mjm, mjd, i)
            err = float(np.max(np.abs(ours - ref)))
            if not pen:
                counts["sep"] += 1
                worst["sep"] = max(worst["sep"], err)
            elif n == 1:
                counts["pen"] += 1
                worst["depth"] = max(worst["depth"], err)
            else:
                counts["pen"] += 1
                worst["vec"] = max(worst["vec"], err)
    return counts, worst


def _penetrating(mjm, mjd, i):
    """Whether MuJoCo's distance of sensor i's objects is negative (mj_geomDistance of
    every geom pair, as the sensor)."""
    def geoms(objtype, objid):
        if objtype == mujoco.mjtObj.mjOBJ_BODY:
            adr, num = mjm.body_geomadr[objid], mjm.body_geomnum[objid]
            return range(adr, adr + num)
        return [objid]
    cutoff = mjm.sensor_cutoff[i]
    best = cutoff
    for g1 in geoms(mjm.sensor_objtype[i], mjm.sensor_objid[i]):
        for g2 in geoms(mjm.sensor_reftype[i], mjm.sensor_refid[i]):
            best = min(best, mujoco.mj_geomDistance(mjm, mjd, g1, g2, cutoff, None))
    return best < 0


def test_geom_distance_sensors_match_mujoco():
    """Every path of mj_geomDistance (GJK pairs: boxes, meshes, curved shapes, shrunk
    spheres and capsules; collision functions of plane, sphere and capsule pairs; body
    sensors; reversed orders; zero cutoff) over 12 random states, separated and
    penetrating pairs both seen."""
    mjm = mujoco.MjModel.from_xml_path(os.path.join(SENSOR_MODELS, "geomdist.xml"))
    # contacts off in both (mj_sensorPos measures the pairs whatever the flag): the
    # forward then compiles the sensors' colliders alone, not the scene's contacts too
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
    mjm, m = oracle(mjm)
    counts, worst = _compare(mjm, m, nstate=12)
    assert counts["sep"] > 100 and counts["pen"] > 10, counts
    assert worst["sep"] <= TOL_SEPARATED, worst
    assert worst["depth"] <= TOL_DEPTH, worst
    assert worst["vec"] <= TOL_PEN_VECTOR, worst


def test_geom_distance_errors():
    """Height fields are refused by the compiler, as MuJoCo's; GJK pairs with native
    CCD disabled (MuJoCo: libccd's algorithms) raise UnsupportedFeatureError."""
    xml = """<mujoco><asset><hfield name="h" nrow="3" ncol="3" size="1 1 .1 .1"/></asset>
      <worldbody><geom name="hf" type="hfield" hfield="h"/>
      <body pos="0 0 .5"><freejoint/><geom name="e" type="ellipsoid" size=".1 .2 .3"/>
      <geom name="b" type="box" size=".1 .1 .1"/></body></worldbody>
      <sensor><distance geom1="{0}" geom2="{1}" cutoff="1"/></sensor></mujoco>"""
    with pytest.raises(MJCFError, match="height fields are not supported"):
        load_model(xml.format("hf", "e"))
    with pytest.raises(MJCFError, match="must be different"):
        load_model(xml.format("e", "e"))
    mjm = mujoco.MjModel.from_xml_string(xml.format("e", "b"))
    mjm.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_NATIVECCD
    m = model_from_mujoco(mjm)
    with pytest.raises(UnsupportedFeatureError, match="native CCD disabled"):
        jax.jit(forward)(m, make_data(m))


@pytest.mark.parametrize("pair", [
    ("ellipsoid", "box"), pytest.param(("capsule", "mesh"), marks=pytest.mark.slow)])
def test_geom_distance_gradient(pair):
    """jax.grad of a GJK pair's distance with respect to qpos (positions and
    orientations of both bodies) matches central finite differences."""
    size = {"ellipsoid": 'size=".1 .2 .3"', "box": 'size=".1 .15 .1"',
            "capsule": 'size=".05 .1"', "mesh": 'mesh="poly"'}
    # contacts off: the sensor alone is differentiated (and compiled)
    xml = f"""<mujoco><option><flag contact="disable"/></option>
      <asset><mesh name="poly" vertex="-.08 -.06 -.05  .09 -.05 -.04
      .01 .08 -.05  -.02 .01 .09  .05 .04 .03"/></asset><worldbody>
      <body><freejoint/><geom name="a" type="{pair[0]}" {size[pair[0]]}/></body>
      <body pos=".45 .1 .05" euler="20 30 40"><freejoint/>
      <geom name="b" type="{pair[1]}" {size[pair[1]]}/></body></worldbody>
      <sensor><distance geom1="a" geom2="b" cutoff="2"/></sensor></mujoco>"""
    m = load_model(xml)
    d0 = make_data(m)

    def dist(q):
        return forward(m, d0.replace(qpos=q)).sensordata[0]
    q = np.asarray(d0.qpos)
    g = np.asarray(jax.jit(jax.grad(dist))(q))
    f = jax.jit(dist)
    assert 0.05 < float(f(q)) < 2
    eps = 1e-6
    fd = []
    for i in range(len(q)):
        e = np.zeros(len(q))
        e[i] = eps
        fd.append((float(f(q + e)) - float(f(q - e))) / (2 * eps))
    np.testing.assert_allclose(g, fd, atol=1e-6)
