"""Load-time tendon geometry in numpy (reference_wrap, reference._tendons) against the
engine's wrap and against MuJoCo 4.0 (float64)."""
import jax
import mujoco
import numpy as np
import pytest

from engine_helpers import (arm26_original_sidesites, corpus_path, dense_ten_j, load,
                            random_state, rel_err)
from simjax.engine import reference, reference_wrap, tendon

MODELS = [
    "mjx_tendon_pulley_fixed_site_wrap/pulley_fixed_site_wrap.xml",
    "mjx_tendon_wrap_sidesite/wrap_sidesite.xml",
    "mujoco_arm26/arm26.xml",
    "mjx_actuator_tendon_force_clamp/tendon_force_clamp.xml",
]


def _segments(rng, n):
    """Random wrap problems: end points 0.05-2 from the centre (some inside the
    geom), radii 0.1-0.5, spheres and cylinders, no side / a side site outside / a
    side site inside the geom, random frames."""
    def around(scale):
        v = rng.standard_normal((n, 3))
        return v / np.linalg.norm(v, axis=1, keepdims=True) * scale[:, None]
    gpos = rng.standard_normal((n, 3))
    q = rng.standard_normal((n, 4))
    gmat = np.array([reference.quat_to_mat(x / np.linalg.norm(x)) for x in q])
    x0 = gpos + around(rng.uniform(0.05, 2.0, n))
    x1 = gpos + around(rng.uniform(0.05, 2.0, n))
    # every third pair nearly opposite: segments through the geom
    x1[::3] = 2 * gpos[::3] - x0[::3] + 0.05 * rng.standard_normal((len(x0[::3]), 3))
    radius = rng.uniform(0.1, 0.5, n)
    side_kind = rng.integers(0, 3, n)             # 0 none, 1 outside, 2 inside
    side = gpos + around(np.where(side_kind == 2, 0.5, 3.0) * radius)
    return x0, x1, gpos, gmat, radius, rng.random(n) < 0.4, side, side_kind > 0


def test_wrap_matches_engine():
    """reference_wrap.wrap against tendon.wrap (jitted, float64) on 3000 random
    problems covering every branch: whether the path wraps agrees everywhere, lengths
    and tangent points to 1e-12 (both compute the same formulas)."""
    rng = np.random.default_rng(0)
    args = _segments(rng, 3000)
    with jax.enable_x64(True):
        wl, w0, w1 = (np.asarray(x) for x in jax.jit(tendon.wrap)(*args))
    x0, x1, gpos, gmat, radius, cyl, side, has_side = args
    wrapped = {"sphere": 0, "cylinder": 0, "inside": 0}
    for i in range(len(x0)):
        ln, a, b = reference_wrap.wrap(x0[i], x1[i], gpos[i], gmat[i], radius[i], cyl[i],
                                       side[i] if has_side[i] else None)
        assert (ln >= 0) == (wl[i] >= 0), i
        if ln >= 0:
            np.testing.assert_allclose([ln, *a, *b], [wl[i], *w0[i], *w1[i]], rtol=0,
                                       atol=1e-12, err_msg=str(i))
            inside = has_side[i] and np.linalg.norm(side[i] - gpos[i]) < radius[i]
            wrapped["inside" if inside else "cylinder" if cyl[i] else "sphere"] += 1
    assert min(wrapped.values()) >= 100, wrapped


def test_wrap_under_vmap_where_some_worlds_wrap_from_inside():
    """tendon.wrap vmapped over 8 worlds of 40 problems each, side sites outside the
    geoms in worlds 0-3 (its inside wrap skipped by its lax.cond when the batch is
    those worlds alone) and some inside in worlds 4-7: every world's values equal the
    numpy wrap's (1e-12), for the whole batch and for worlds 0-3 alone."""
    rng = np.random.default_rng(2)
    args = [np.reshape(a, (8, 40) + np.shape(a)[1:]) for a in _segments(rng, 320)]
    x0, x1, gpos, gmat, radius, cyl, side, has_side = args
    out = (np.linalg.norm(side - gpos, axis=-1) >= radius)
    has_side[:4] &= out[:4]                   # worlds 0-3: no side site inside
    assert not np.any(has_side[:4] & ~out[:4]) and np.any(has_side[4:] & ~out[4:])
    with jax.enable_x64(True):
        fn = jax.jit(jax.vmap(tendon.wrap))
        whole = [np.asarray(x) for x in fn(*args)]
        first = [np.asarray(x) for x in fn(*(a[:4] for a in args))]
    for w in range(8):
        for i in range(40):
            ln, a, b = reference_wrap.wrap(x0[w, i], x1[w, i], gpos[w, i], gmat[w, i],
                                           radius[w, i], cyl[w, i],
                                           side[w, i] if has_side[w, i] else None)
            for got in (whole, first) if w < 4 else (whole,):
                assert (ln >= 0) == (got[0][w, i] >= 0), (w, i)
                if ln >= 0:
                    np.testing.assert_allclose([ln, *a, *b], [got[0][w, i], *got[1][w, i],
                                               *got[2][w, i]], rtol=0, atol=1e-12)


def _mujoco_tendons(mjm, mjd, qpos):
    mjd.qpos[:] = qpos
    mujoco.mj_kinematics(mjm, mjd)
    mujoco.mj_comPos(mjm, mjd)
    mujoco.mj_tendon(mjm, mjd)
    return mjd.ten_length.copy(), dense_ten_j(mjm, mjd)


@pytest.mark.parametrize("rel", MODELS + ["arm26-original-sidesites"])
def test_tendons_match_mujoco(rel):
    """reference._tendons (lengths, dense Jacobians) against mj_tendon at qpos0 and 20
    random poses. Tolerance 1e-6 relative to max(1, |value|), as the engine's tendon
    tests: inside wraps differ from MuJoCo 4.0 by up to ~1e-8 (the exact root, see
    tendon._wrap_inside); everything else agrees to ~1e-14, checked on the tendons
    that wrap no geom from inside."""
    if rel == "arm26-original-sidesites":
        mjm, m = load("mujoco_arm26/arm26.xml", edit=arm26_original_sidesites)
    else:
        mjm, m = load(rel)
    mjd = mujoco.MjData(mjm)
    rng = np.random.default_rng(1)
    poses = [mjm.qpos0] + [random_state(mjm, rng, qscale=2.0)["qpos"] for _ in range(20)]
    worst = 0.0
    for q in poses:
        ln, J = reference._tendons(m, reference._Kin(m, q), q)
        ln_mj, J_mj = _mujoco_tendons(mjm, mjd, q)
        worst = max(worst, rel_err(ln, ln_mj), rel_err(J, J_mj))
    assert worst <= 1e-6, worst
    if "sidesite" not in rel:      # no side site within a geom in these models
        assert worst <= 1e-12, worst


def test_load_evaluates_wrapping_tendons_without_the_engine(monkeypatch):
    """A model whose only engine-bound part was its wrapping tendons loads without
    jitting the engine (which took about 1.9 s of each load), and its tendon
    constants still match MuJoCo's."""
    import simjax
    monkeypatch.setattr(reference, "_engine_eval", lambda *a: pytest.fail("engine used"))
    path = corpus_path("mjx_tendon_wrap_sidesite/wrap_sidesite.xml")
    mjm = mujoco.MjModel.from_xml_path(path)
    m = simjax.load_model(path)
    for name in ("tendon_length0", "tendon_invweight0", "tendon_lengthspring",
                 "actuator_length0", "actuator_acc0"):
        np.testing.assert_allclose(np.asarray(getattr(m, name)).reshape(-1),
                                   getattr(mjm, name).reshape(-1), rtol=1e-6, atol=1e-6,
                                   err_msg=name)
