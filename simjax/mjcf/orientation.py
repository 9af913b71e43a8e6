"""Orientation forms and small rotation utilities used at compile time (numpy only).

Quaternions are (w, x, y, z), as in MuJoCo. Semantics follow MuJoCo's
``mjs_resolveOrientation`` (user_util / user_api): quat, axisangle, xyaxes, zaxis and
euler (with ``compiler/eulerseq``), at most one of them per element.
"""
from __future__ import annotations

import numpy as np

ORIENT_ATTRS = ("quat", "axisangle", "xyaxes", "zaxis", "euler")
_MINVAL = 1e-14


def quat_normalize(q):
    q = np.asarray(q, dtype=np.float64)
    n = np.linalg.norm(q)
    if n < _MINVAL:
        return np.array([1.0, 0.0, 0.0, 0.0])
    return q / n


def quat_mul(a, b):
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return np.array([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw])


def quat_conj(q):
    return np.array([q[0], -q[1], -q[2], -q[3]])


def quat_to_mat(q):
    w, x, y, z = q
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def mat_to_quat(m):
    """Rotation matrix -> unit quaternion (MuJoCo's mju_mat2Quat branch structure)."""
    m = np.asarray(m, dtype=np.float64)
    tr = m[0, 0] + m[1, 1] + m[2, 2]
    if tr > 0:
        s = np.sqrt(tr + 1.0) * 2
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s,
             (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2]) * 2
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s,
             (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2]) * 2
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s,
             (m[1, 2] + m[2, 1]) / s]
    else:
        s = np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1]) * 2
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s,
             (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    return quat_normalize(q)


def rotate(q, v):
    return quat_to_mat(q) @ np.asarray(v, dtype=np.float64)


def axis_angle_quat(axis, angle):
    axis = np.asarray(axis, dtype=np.float64)
    n = np.linalg.norm(axis)
    if n < _MINVAL:
        raise ValueError("axisangle axis too small")
    axis = axis / n
    return np.concatenate([[np.cos(angle / 2)], np.sin(angle / 2) * axis])


def zaxis_quat(z):
    """Minimal rotation taking (0,0,1) to ``z`` (mjuu_z2quat)."""
    z = np.asarray(z, dtype=np.float64)
    n = np.linalg.norm(z)
    if n < _MINVAL:
        raise ValueError("zaxis too small")
    z = z / n
    axis = np.cross([0.0, 0.0, 1.0], z)
    s = np.linalg.norm(axis)
    if s < 1e-10:
        axis = np.array([1.0, 0.0, 0.0])
    else:
        axis = axis / s
    ang = np.arctan2(s, z[2])
    return np.concatenate([[np.cos(ang / 2)], np.sin(ang / 2) * axis])


def xyaxes_quat(xy):
    x = np.asarray(xy[:3], dtype=np.float64)
    y = np.asarray(xy[3:6], dtype=np.float64)
    nx = np.linalg.norm(x)
    if nx < _MINVAL:
        raise ValueError("xyaxes: x axis too small")
    x = x / nx
    y = y - x * np.dot(x, y)
    ny = np.linalg.norm(y)
    if ny < _MINVAL:
        raise ValueError("xyaxes: y axis too small or parallel to x")
    y = y / ny
    z = np.cross(x, y)
    return mat_to_quat(np.stack([x, y, z], axis=1))


def euler_quat(euler, seq: str, to_rad: float):
    """Quaternion from Euler angles with MuJoCo's sequence rules.

    Lowercase axes are intrinsic (post-multiplied), uppercase extrinsic
    (pre-multiplied).
    """
    q = np.array([1.0, 0.0, 0.0, 0.0])
    for angle, ax in zip(np.asarray(euler, dtype=np.float64) * to_rad, seq):
        axis = {"x": (1, 0, 0), "y": (0, 1, 0), "z": (0, 0, 1)}[ax.lower()]
        qi = np.concatenate([[np.cos(angle / 2)], np.sin(angle / 2) * np.array(axis)])
        q = quat_mul(q, qi) if ax.islower() else quat_mul(qi, q)
    return quat_normalize(q)


def resolve(attrs: dict, to_rad: float, eulerseq: str, err):
    """Quaternion of an element from its orientation attributes.

    ``attrs``: resolved attributes (quat/axisangle/xyaxes/zaxis/euler, None when
    unset). ``err(msg)`` builds the MJCFError to raise. Returns None when no
    orientation attribute is set.
    """
    given = [a for a in ORIENT_ATTRS if attrs.get(a) is not None]
    if len(given) > 1:
        raise err("multiple orientation specifiers: " + ", ".join(given))
    if not given:
        return None
    kind = given[0]
    val = np.asarray(attrs[kind], dtype=np.float64)
    try:
        if kind == "quat":
            if np.linalg.norm(val) < _MINVAL:
                raise ValueError("quaternion is zero")
            return quat_normalize(val)
        if kind == "axisangle":
            return axis_angle_quat(val[:3], val[3] * to_rad)
        if kind == "xyaxes":
            return xyaxes_quat(val)
        if kind == "zaxis":
            return zaxis_quat(val)
        return euler_quat(val, eulerseq, to_rad)
    except ValueError as e:
        raise err(f"invalid {kind}: {e}") from None


def frame_compose(pos1, quat1, pos2, quat2):
    """Pose (pos1, quat1) ∘ (pos2, quat2): child pose expressed in the parent of frame 1."""
    return pos1 + rotate(quat1, pos2), quat_normalize(quat_mul(quat1, quat2))
