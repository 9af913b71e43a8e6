"""Constraint rows (make_constraint, impedance, reference) against MuJoCo 4.0.0.

Contacts are MuJoCo's own (copied into our contact buffer), so these tests cover the
rows built from them, not collision detection. Rows are matched by (efc_type, efc_id).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from constraint_helpers import (condim, match_rows, oracle_case, pendula_friction,
                                pendula_some_friction, tight)
from simjax.engine import constraint

DS = mujoco.mjtDisableBit

# (name, corpus model, model edit, state options); states chosen to have active rows

CASES = {
    "ant_pyramidal": ("gym_ant/ant.xml", tight(2), dict(z=0.2, seed=1)),
    "ant_elliptic": ("gym_ant/ant.xml", tight(2, cone=1), dict(z=0.2, seed=1)),
    "weld": ("warp_jdotv_weld_3d/weld_3d.xml", tight(2), dict(seed=3)),
    "ant_direct_solref": ("gym_ant/ant.xml", tight(2, extra=lambda mjm: (
        mjm.jnt_solref.__setitem__(slice(None), [-200.0, -5.0]),
        mjm.geom_solref.__setitem__(slice(None), [-1000.0, -30.0]))), dict(z=0.2, seed=1)),
    "ant_impratio_solimp": ("gym_ant/ant.xml", tight(2, extra=lambda mjm: (
        mjm.geom_solimp.__setitem__(slice(None), [0.8, 0.99, 0.05, 0.3, 3.0]),
        mjm.jnt_solimp.__setitem__(slice(None), [0.7, 0.95, 0.2, 0.6, 1.0]),
        setattr(mjm.opt, "impratio", 3.0))), dict(z=0.2, seed=1)),
    # rows for some dofs and tendons only (the model's friction-loss structure)
    "pendula_some_friction": ("mjx_pendula/pendula.xml", tight(2, extra=pendula_some_friction),
                              dict(qscale=1.5, seed=10)),
}

SLOW = {
    "ant_condim6_elliptic": ("gym_ant/ant.xml", tight(2, cone=1, extra=condim(6)),
                             dict(z=0.2, seed=1)),
    "ant_condim4_pyramidal": ("gym_ant/ant.xml", tight(2, extra=condim(4)),
                              dict(z=0.2, seed=1)),
    "pendula_ball_tendon_friction": ("mjx_pendula/pendula.xml",
                                     tight(2, extra=pendula_friction),
                                     dict(qscale=1.5, seed=10)),
    "trossen": ("menagerie_trossen_wx250s/scene.xml", tight(2), dict(qscale=1.0, seed=4)),
    "humanoid_limits": ("mujoco_humanoid/humanoid.xml", tight(2, contacts=False),
                        dict(qscale=0.8, seed=2)),
    "ant_refsafe_off": ("gym_ant/ant.xml", tight(2, extra=lambda mjm: (
        setattr(mjm.opt, "disableflags", mjm.opt.disableflags | DS.mjDSBL_REFSAFE),
        mjm.geom_solref.__setitem__(slice(None), [0.001, 0.5]),
        setattr(mjm.opt, "impratio", 3.0))), dict(z=0.2, seed=1)),
    "ant_elliptic_diagexact": ("gym_ant/ant.xml", tight(2, cone=1, extra=lambda mjm: setattr(
        mjm.opt, "enableflags", mjm.opt.enableflags | mujoco.mjtEnableBit.mjENBL_DIAGEXACT)),
        dict(z=0.2, seed=1)),
    "connect": ("warp_jdotv_connect_3d/connect_3d.xml", tight(2), dict(seed=3)),
    "humanoid_contacts": ("mujoco_humanoid/humanoid.xml", tight(2), dict(z=0.9, seed=5)),
    # foot 8 mm into the terrain: deeper than its radius, MuJoCo's EPA witness is inexact
    "barkour": ("mjx_barkour_v0/assets/barkour_v0_mjx.xml", tight(2), dict(z=0.215, seed=6)),
    "shadow_hand": ("mjx_shadow_hand/scene_right.xml", tight(2), dict(qscale=0.6, seed=7)),
    "hopper": ("gym_hopper/hopper.xml", tight(2), dict(z=0.2, seed=9)),
}

FIELDS = ("efc_pos", "efc_margin", "efc_frictionloss", "efc_diagA", "efc_R", "efc_D",
          "efc_vel", "efc_aref")


def check_rows(name, cases):
    rel, edit, opts = cases[name]
    mjm, m, mjd, slot, d = oracle_case(rel, edit, **opts)
    assert mjd.nefc > 0
    rows, extra = match_rows(mjd, d, slot)
    assert (rows >= 0).all(), f"missing rows {np.nonzero(rows < 0)[0]}"
    assert not extra.any(), f"extra active rows {np.nonzero(extra)[0]}"
    for f in ("ne", "nf", "nl", "nefc"):
        assert int(getattr(d, f)) == getattr(mjd, f), f
    for f in FIELDS:
        ours = np.asarray(getattr(d, f))[rows]
        theirs = np.asarray(getattr(mjd, f))
        err = np.abs(ours - theirs) / np.maximum(1.0, np.abs(theirs))
        assert err.max() < 1e-9, (f, err.max())
    kbip = np.asarray(d.efc_KBIP)[rows]
    ref = np.asarray(mjd.efc_KBIP).reshape(-1, 4)
    assert (np.abs(kbip - ref) / np.maximum(1.0, np.abs(ref))).max() < 1e-9
    jac = np.asarray(mjd.efc_J).reshape(mjd.nefc, -1)
    if jac.shape[1] == mjm.nv:          # dense Jacobian in MuJoCo
        assert np.abs(np.asarray(d.efc_J)[rows] - jac).max() < 1e-9
    else:
        dense = np.zeros((mjd.nefc, mjm.nv))
        mujoco.mju_sparse2dense(dense, mjd.efc_J, mjd.efc_J_rownnz, mjd.efc_J_rowadr,
                                mjd.efc_J_colind)
        assert np.abs(np.asarray(d.efc_J)[rows] - dense).max() < 1e-9
    # inactive rows are neutral
    off = ~np.asarray(d.efc_active)
    assert np.all(np.asarray(d.efc_J)[off] == 0)
    assert np.all(np.asarray(d.efc_D)[off] == 0)
    return mjd


@pytest.mark.parametrize("name", sorted(CASES))
def test_rows(name):
    check_rows(name, CASES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW))
def test_rows_slow(name):
    check_rows(name, SLOW)


def test_frictionloss_structure():
    """Friction-loss rows exist only where the model's structure has a loss; a concrete
    loss made non-zero elsewhere raises, and the re-derived structure gives its rows."""
    from simjax import types
    _, m = __import__("engine_helpers").load("gym_ant/ant.xml", constraints=True)
    assert not np.any(m.dof_hasfrictionloss)
    lay = constraint.layout(m, [])
    assert lay.nf == 0 and not any(b.kind == "frictiondof" for b in lay.blocks)
    loss = np.zeros(m.nv)
    loss[[6, 9]] = 0.1
    bad = m.replace(dof_frictionloss=jnp.asarray(loss))
    d = __import__("simjax").make_data(m)
    with pytest.raises(ValueError, match="dof 6"):
        # traced, not run op by op: the check is made on the concrete Model when
        # make_constraint is traced (eagerly the stages before it ran for 25 s)
        jax.jit(lambda d: __import__("simjax").forward(bad, d))(d)
    good = bad.replace(**types.frictionloss_structure(loss, np.zeros(0)))
    lay = constraint.layout(good, [])
    blk = [b for b in lay.blocks if b.kind == "frictiondof"]
    assert lay.nf == 2 and list(blk[0].ids) == [6, 9]
    # a Model without the masks (built elsewhere) keeps a row for every dof
    assert constraint.layout(m.replace(dof_hasfrictionloss=None), []).nf == m.nv


def test_eq_active_at_run_time():
    """Turning an equality off at run time removes its rows (as MuJoCo skips it)."""
    rel, edit, opts = CASES["weld"]
    mjm, m, mjd, slot, d = oracle_case(rel, edit, **opts)
    assert int(d.ne) == 6
    from constraint_helpers import canonical, smooth_jit
    d2 = smooth_jit(canonical(m), d.replace(eq_active=jnp.zeros_like(d.eq_active)))
    assert int(d2.ne) == 0
    assert np.all(np.asarray(d2.efc_J)[np.asarray(d2.efc_type) == constraint.EQUALITY] == 0)


def test_capacity_is_static():
    """Row capacity depends only on structure and contact slot dims."""
    _, m = __import__("engine_helpers").load("gym_ant/ant.xml", constraints=True)
    n0 = constraint.nefc_capacity(m, [])
    # no friction loss (no rows for it); limits: 8 hinges x 2 rows
    assert n0 == 2 * 8
    assert constraint.nefc_capacity(m, [3, 3, 1]) == n0 + 4 + 4 + 1
    m2 = m.replace(opt=m.opt.replace(cone=1))
    assert constraint.nefc_capacity(m2, [3, 6]) == n0 + 3 + 6


_BOX = """
<mujoco>
  <worldbody>
    <geom type="plane" size="1 1 .1"/>
    <body pos="0 0 .09">
      <freejoint/>
      <geom type="box" size=".1 .1 .1"/>
      <body pos=".2 0 0">
        <joint type="hinge" axis="0 1 0" range="-10 10"/>
        <geom type="capsule" size=".02" fromto="0 0 0 .2 0 0"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


@pytest.mark.parametrize("bit", ["CONTACT", "CONSTRAINT", "LIMIT"])
def test_data_rows_checked_against_the_model_options(bit):
    """A Data's constraint rows are a capacity fixed when it is made (MuJoCo sizes its
    rows per step): stepping it with a model whose options give other rows raises a
    ValueError that says what to do, both ways, and a Data made again steps."""
    import simjax
    from simjax.types import DisableBit
    m = simjax.load_model(_BOX)
    flag = int(getattr(DisableBit, bit))
    off = m.replace(opt=m.opt.replace(disableflags=m.opt.disableflags | flag))
    # (jitted: the check is made while the step is traced, where op by op every stage
    # before the constraint rows ran first, each operation compiled on its own)
    step = jax.jit(simjax.step)
    for model, data in ((off, simjax.make_data(m)), (m, simjax.make_data(off))):
        with pytest.raises(ValueError, match="constraint rows.*make_data"):
            step(model, data)
    d = step(off, simjax.make_data(off))
    assert np.isfinite(np.asarray(d.qacc)).all()
    assert (int(d.nefc) > 0) if bit == "LIMIT" else (int(d.nefc) == 0)
