"""Field-by-field comparison of a simjax Model with MuJoCo's compiled mjModel.

Every Model array with an mjModel counterpart of the same name and shape is compared:
integers exactly, floats within ``atol + rtol * |expected|`` (1e-6 each; MuJoCo stores
meshes in float32, so mesh_vert gets a float32-sized tolerance). Quaternions are compared
up to sign (q and -q are the same rotation); body_iquat and body_inertia, which are not
unique when principal moments coincide, are compared through the full inertia tensor.
"""
from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from mujoco_oracle import CORPUS  # noqa: E402

from simjax import types  # noqa: E402

RTOL = ATOL = 1e-6
_QUAT_FIELDS = {"body_quat", "geom_quat", "site_quat", "cam_quat", "mesh_quat", "key_mquat"}
_F32_FIELDS = {"mesh_vert": 2e-6, "cam_sensorsize": 1e-6, "cam_intrinsic": 1e-6,
               "hfield_data": 1e-6}


def corpus_models():
    """Relative paths of the corpus model files listed in manifest.csv."""
    import csv
    path = os.path.join(CORPUS, "manifest.csv")
    with open(path) as f:
        return [row["path"] for row in csv.DictReader(f)]


def _quat_close(a, b):
    a, b = a.reshape(-1, 4), b.reshape(-1, 4)
    d = np.minimum(np.abs(a - b).max(axis=1), np.abs(a + b).max(axis=1))
    return np.all(d <= ATOL + RTOL)


def _inertia_tensors(quat, diag):
    from simjax.mjcf.orientation import quat_to_mat
    out = []
    for q, d in zip(quat, diag):
        r = quat_to_mat(q)
        out.append(r @ np.diag(d) @ r.T)
    return np.array(out)


def compare(model, mjm):
    """Returns (matched names, mismatched {name: max abs error}, compared count)."""
    matched, mismatched = [], {}
    for name, kind, *_ in types.MODEL_FIELDS:
        if not hasattr(mjm, name):
            continue
        exp = np.asarray(getattr(mjm, name))
        got = getattr(model, name)
        if got is None:
            continue
        got = np.asarray(got)
        if exp.size != got.size:
            mismatched[name] = f"shape {got.shape} vs {exp.shape}"
            continue
        exp = exp.reshape(got.shape)
        if kind in "ib":
            ok = np.array_equal(got.astype(np.int64), exp.astype(np.int64))
            err = None if ok else int(np.sum(got.astype(np.int64) != exp.astype(np.int64)))
        elif name in _QUAT_FIELDS:
            ok = _quat_close(got, exp)
            err = None if ok else "quat"
        elif name in ("body_iquat", "body_inertia"):
            tg = _inertia_tensors(np.asarray(model.body_iquat), np.asarray(model.body_inertia))
            te = _inertia_tensors(mjm.body_iquat, mjm.body_inertia)
            scale = np.maximum(1.0, np.abs(te).max(axis=(1, 2), keepdims=True))
            ok = np.allclose(tg / scale, te / scale, rtol=RTOL, atol=ATOL)
            err = None if ok else float(np.abs(tg - te).max())
        else:
            tol = _F32_FIELDS.get(name, RTOL)
            ok = np.allclose(got, exp, rtol=tol, atol=tol) if exp.size else True
            err = None if ok else float(np.abs(got - exp).max())
        if ok:
            matched.append(name)
        else:
            mismatched[name] = err
    for name in ("meaninertia", "meanmass", "meansize", "extent", "center"):
        exp = np.asarray(getattr(mjm.stat, name))
        got = np.asarray(getattr(model.stat, name))
        if np.allclose(got, exp, rtol=RTOL, atol=ATOL):
            matched.append("stat." + name)
        else:
            mismatched["stat." + name] = float(np.abs(got - exp).max())
    return matched, mismatched, len(matched) + len(mismatched)


#: simjax name table (Model.names) -> (MuJoCo object type name, mjModel count field)
NAME_KINDS = {"body": ("mjOBJ_BODY", "nbody"), "joint": ("mjOBJ_JOINT", "njnt"),
              "geom": ("mjOBJ_GEOM", "ngeom"), "site": ("mjOBJ_SITE", "nsite"),
              "camera": ("mjOBJ_CAMERA", "ncam"), "mesh": ("mjOBJ_MESH", "nmesh"),
              "tendon": ("mjOBJ_TENDON", "ntendon"), "equality": ("mjOBJ_EQUALITY", "neq"),
              "pair": ("mjOBJ_PAIR", "npair"), "exclude": ("mjOBJ_EXCLUDE", "nexclude"),
              "actuator": ("mjOBJ_ACTUATOR", "nactuator"),
              "sensor": ("mjOBJ_SENSOR", "nsensor"),
              "numeric": ("mjOBJ_NUMERIC", "nnumeric"), "key": ("mjOBJ_KEY", "nkey")}


def mujoco_names(mjm, kind):
    """Names of MuJoCo's objects of ``kind`` (a Model.names key) in id order, '' when
    unnamed."""
    import mujoco
    t, count = NAME_KINDS[kind]
    typ = getattr(mujoco.mjtObj, t)
    return [mujoco.mj_id2name(mjm, typ, i) or "" for i in range(getattr(mjm, count))]


def mismatched_names(model, mjm):
    """Kinds whose names or order differ between a simjax Model and mjModel."""
    return [k for k in NAME_KINDS
            if list(model.names.get(k, [])) != mujoco_names(mjm, k)]


def same_model(xml):
    """(mjModel, simjax Model) of MJCF text ``xml``, asserting every comparable field and
    every kind of name equal."""
    import mujoco
    import simjax
    mjm = mujoco.MjModel.from_xml_string(xml)
    model = simjax.load_model(xml)
    _, bad, _ = compare(model, mjm)
    assert not bad, bad
    assert not mismatched_names(model, mjm)
    return mjm, model


def assert_same_trajectory(mjm, model, nstep, atol, seed=0):
    """Steps MuJoCo and simjax ``nstep`` times from random velocities; qpos and
    sensordata agree to ``atol``."""
    import jax
    import mujoco
    import simjax
    mjd = mujoco.MjData(mjm)
    mjd.qvel[:] = np.random.default_rng(seed).normal(size=mjm.nv)
    d = simjax.make_data(model).replace(qvel=jax.numpy.asarray(mjd.qvel))
    # called eagerly: one program per model, its values constants (smaller than with the
    # model an argument of jax.jit: this module checks the compiled model, not tracing)
    step = simjax.step
    for _ in range(nstep):
        mujoco.mj_step(mjm, mjd)
        d = step(model, d)
    np.testing.assert_allclose(np.asarray(d.qpos), mjd.qpos, atol=atol)
    np.testing.assert_allclose(np.asarray(d.sensordata), mjd.sensordata, atol=atol)
