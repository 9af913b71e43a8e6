"""Spatial helpers of simjax.engine.math against MuJoCo's mju_* functions (float64)."""
import mujoco
import numpy as np
import pytest

from simjax.engine import math

RNG = np.random.default_rng(7)
N = 64


def _quats(n):
    q = RNG.standard_normal((n, 4))
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def test_cross_matches_mujoco_exactly():
    a, b = RNG.standard_normal((N, 3)), RNG.standard_normal((N, 3))
    ref = np.empty((N, 3))
    for i in range(N):
        mujoco.mju_cross(ref[i], a[i], b[i])
    # same products and differences per component: bit-identical
    np.testing.assert_array_equal(np.asarray(math.cross(a, b)), ref)


def test_quat_mul_matches_mujoco():
    a, b = _quats(N), RNG.standard_normal((N, 4))
    ref = np.empty((N, 4))
    for i in range(N):
        mujoco.mju_mulQuat(ref[i], a[i], b[i])
    np.testing.assert_allclose(np.asarray(math.quat_mul(a, b)), ref, rtol=0, atol=1e-15)


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_quat_to_mat_matches_mujoco(scale):
    q = _quats(N)
    q[:, 1:] *= scale                   # near-identity rotations too
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    ref = np.empty((N, 9))
    for i in range(N):
        mujoco.mju_quat2Mat(ref[i], q[i])
    out = np.asarray(math.quat_to_mat(q)).reshape(N, 9)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-15)


def test_quat_to_mat_batched_shapes():
    q = _quats(6).reshape(2, 3, 4)
    assert math.quat_to_mat(q).shape == (2, 3, 3, 3)
    assert math.quat_mul(q, q).shape == (2, 3, 4)
    assert math.cross(q[..., 1:], q[..., :3]).shape == (2, 3, 3)
