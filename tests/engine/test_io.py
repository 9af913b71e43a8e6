"""Data made for a model (simjax.engine.io): the shape check of the state and inputs
(check_data) that step, forward and inverse run before any work."""
from __future__ import annotations

import jax
import numpy as np
import pytest

import simjax


def _chain(nlink):
    """A planar chain of ``nlink`` hinged capsules, its first joint actuated."""
    link = ('<body pos=".2 0 0"><joint name="j{i}" type="hinge" axis="0 1 0"/>'
            '<geom type="capsule" size=".02" fromto="0 0 0 .2 0 0"/>')
    bodies = "".join(link.format(i=i) for i in range(nlink)) + "</body>" * nlink
    return (f"<mujoco><worldbody>{bodies}</worldbody>"
            '<actuator><motor joint="j0"/></actuator></mujoco>')


@pytest.mark.parametrize("fn", [simjax.step, simjax.forward, simjax.inverse])
def test_batch_without_vmap_is_named(fn):
    m = simjax.load_model(_chain(2))
    d = simjax.make_data(m)
    batch = jax.tree_util.tree_map(lambda x: np.stack([x] * 3), d)
    with pytest.raises(ValueError, match=r"Data\.time has shape \(3,\): a batch of 3 "
                                         r"worlds.*jax\.vmap"):
        fn(m, batch)
    # mapped, the same batch steps (compiled: op by op the step took 11 s)
    out = jax.jit(jax.vmap(lambda x: fn(m, x)))(batch)
    assert out.qpos.shape == (3, 2)


@pytest.mark.parametrize("fn", [simjax.step, simjax.forward, simjax.inverse])
def test_data_of_another_model_is_named(fn):
    m2, m3 = simjax.load_model(_chain(2)), simjax.load_model(_chain(3))
    with pytest.raises(ValueError, match=r"Data\.qpos has shape \(2,\) where the model "
                                         r"gives \(3,\).*make_data"):
        fn(m3, simjax.make_data(m2))


def test_checked_fields_are_the_inputs():
    from simjax.engine import io
    assert io.CHECKED_FIELDS[0] == "time" and io.CHECKED_FIELDS[-1] == "sensordata"
    inputs = {"qpos", "qvel", "act", "ctrl", "mocap_pos", "eq_active"}
    assert inputs <= set(io.CHECKED_FIELDS)
    assert "xpos" not in io.CHECKED_FIELDS


def test_mujoco_structs_are_named():
    """MuJoCo's mjModel / mjData passed where simjax's own are taken (simjax compiles
    the MJCF itself): a TypeError that says how to make simjax's."""
    mujoco = pytest.importorskip("mujoco")
    xml = _chain(2)
    mjm = mujoco.MjModel.from_xml_string(xml)
    m = simjax.load_model(xml)
    with pytest.raises(TypeError, match="MuJoCo's MjModel.*simjax.load_model"):
        simjax.make_data(mjm)
    with pytest.raises(TypeError, match="MuJoCo's MjModel.*simjax.load_model"):
        simjax.step(mjm, simjax.make_data(m))
    with pytest.raises(TypeError, match="MuJoCo's MjData.*simjax.make_data"):
        simjax.forward(m, mujoco.MjData(mjm))


def test_model_parameters_checked():
    """A Model parameter array of another shape (a replace gone wrong), or a batch of
    models passed without vmap, is named; mapped with vmap, the batch steps."""
    import jax.numpy as jnp
    m = simjax.load_model(_chain(2))
    d = simjax.make_data(m)
    with pytest.raises(ValueError, match=r"Model\.body_mass has shape \(2,\) where the "
                                         r"model gives \(3,\): mjModel's layout"):
        simjax.step(m.replace(body_mass=jnp.ones(2)), d)
    masses = jnp.linspace(1.0, 2.0, 4)[:, None] * m.body_mass
    with pytest.raises(ValueError, match=r"Model\.body_mass has shape \(4, 3\): a batch "
                                         r"of 4 models.*jax\.vmap"):
        simjax.forward(m.replace(body_mass=masses), d)
    qacc = jax.jit(jax.vmap(lambda bm: simjax.forward(m.replace(body_mass=bm), d).qacc))(
        masses)
    assert qacc.shape == (4, m.nv) and np.isfinite(np.asarray(qacc)).all()


def test_compiled_models_fit_the_layout():
    """check_model accepts what the compiler builds: a free body with contacts, meshes
    and a model with a plugin (all 33 corpus models passed when this was written)."""
    from simjax.engine import io
    from mujoco_oracle import corpus_path
    for rel in ("gym_ant/ant.xml", "mjx_shadow_hand/scene_right.xml",
                "mujoco_plugin_pid/pid.xml"):
        io.check_model(simjax.load_model(corpus_path(rel)))
