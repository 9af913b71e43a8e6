"""Geom volumes, geom inertias and principal-axis decomposition (numpy only).

Formulas follow MuJoCo's ``mjCGeom::GetVolume`` / ``mjCGeom::SetInertia`` (solid and
shell variants) and ``mjCBody::InertiaFromGeom``; the principal axes come from a
quaternion Jacobi iteration of MuJoCo's ``mjuu_eig3`` (in :mod:`simjax.mjcf.mesh`), so
that ``body_iquat`` matches MuJoCo's, not just the inertia tensor.
"""
from __future__ import annotations

import numpy as np

from simjax.mjcf.orientation import quat_to_mat
from simjax.types import GeomType

MINVAL = 1e-15
EPS = 1e-14


def geom_volume(gtype: int, size, shell: bool) -> float:
    """Volume (solid) or surface area (shell) of a primitive geom; 0 for others."""
    r = size[0]
    if gtype == GeomType.SPHERE:
        return 4 * np.pi * r ** 2 if shell else 4 * np.pi * r ** 3 / 3
    if gtype == GeomType.CAPSULE:
        h = 2 * size[1]
        return (4 * np.pi * r * r + 2 * np.pi * r * h) if shell else \
            np.pi * (r * r * h + 4 * r ** 3 / 3)
    if gtype == GeomType.CYLINDER:
        h = 2 * size[1]
        return (2 * np.pi * r * r + 2 * np.pi * r * h) if shell else np.pi * r * r * h
    if gtype == GeomType.ELLIPSOID:
        a, b, c = size
        if shell:  # Thomsen's approximation of the ellipsoid surface
            p = 1.6075
            t = (a * b) ** p + (b * c) ** p + (c * a) ** p
            return 4 * np.pi * (t / 3) ** (1 / p)
        return 4 * np.pi * a * b * c / 3
    if gtype in (GeomType.BOX, GeomType.HFIELD):
        a, b, c = size
        return 8 * (a * b + b * c + c * a) if shell else 8 * a * b * c
    return 0.0


def geom_inertia(gtype: int, size, mass: float, shell: bool) -> np.ndarray:
    """Diagonal inertia (3,) of a primitive geom of ``mass`` in its own frame."""
    s = np.asarray(size, dtype=np.float64)
    if gtype == GeomType.SPHERE:
        return np.full(3, (2 / 3 if shell else 2 / 5) * mass * s[0] ** 2)
    if gtype == GeomType.CAPSULE:
        return _capsule_inertia(s[0], s[1], mass, shell)
    if gtype == GeomType.CYLINDER:
        return _cylinder_inertia(s[0], s[1], mass, shell)
    if gtype == GeomType.ELLIPSOID:
        return _ellipsoid_inertia(s, mass, shell)
    if gtype in (GeomType.BOX, GeomType.HFIELD):
        return _box_inertia(s, mass, shell)
    return np.zeros(3)


def _capsule_inertia(r, hh, mass, shell):
    h = 2 * hh
    if not shell:
        ms = mass * 4 * r / (4 * r + 3 * h)
        mc = mass - ms
        ixx = mc * (3 * r * r + h * h) / 12 + 2 * ms * r * r / 5 + ms * h * (3 * r + 2 * h) / 8
        izz = mc * r * r / 2 + 2 * ms * r * r / 5
        return np.array([ixx, ixx, izz])
    a_s = 4 * np.pi * r * r
    a_c = 2 * np.pi * r * h
    ms = mass * a_s / (a_s + a_c)
    mc = mass - ms
    hs_com = r / 2
    hs_pos = hh + hs_com
    ixx = mc * (6 * r * r + h * h) / 12 + 2 * ms * r * r / 3 + ms * (hs_pos ** 2 - hs_com ** 2)
    izz = mc * r * r + 2 * ms * r * r / 3
    return np.array([ixx, ixx, izz])


def _cylinder_inertia(r, hh, mass, shell):
    h = 2 * hh
    if not shell:
        ixx = mass * (3 * r * r + h * h) / 12
        return np.array([ixx, ixx, mass * r * r / 2])
    a_d = np.pi * r * r
    a_c = 2 * np.pi * r * h
    md = mass * a_d / (2 * a_d + a_c)
    mc = mass - 2 * md
    ixx = mc * (6 * r * r + h * h) / 12 + 2 * (md * r * r / 4 + md * hh * hh)
    izz = mc * r * r + 2 * md * r * r / 2
    return np.array([ixx, ixx, izz])


def _ellipsoid_solid(s, mass):
    s2 = s * s
    return mass * np.array([s2[1] + s2[2], s2[0] + s2[2], s2[0] + s2[1]]) / 5


def _ellipsoid_inertia(s, mass, shell):
    if not shell:
        return _ellipsoid_solid(s, mass)
    # thin shell: difference of two solid ellipsoids of equal density
    eps = 1e-6
    va = 4 * np.pi * np.prod(s) / 3
    se = s + eps
    vb = 4 * np.pi * np.prod(se) / 3
    density = mass / (vb - va)
    s2 = s * s
    ia = va * density * np.array([s2[1] + s2[2], s2[0] + s2[2], s2[0] + s2[1]]) / 5
    return _ellipsoid_solid(se, vb * density) - ia


def _box_inertia(s, mass, shell):
    s2 = s * s
    if not shell:
        return mass * np.array([s2[1] + s2[2], s2[0] + s2[2], s2[0] + s2[1]]) / 3
    lx, ly, lz = 2 * s
    a0, a1, a2 = lx * ly, ly * lz, lz * lx
    tot = 2 * (a0 + a1 + a2)
    m0, m1, m2 = mass * a0 / tot, mass * a1 / tot, mass * a2 / tot
    ix = m0 * ly * ly / 12 + m1 * (ly * ly + lz * lz) / 12 + m2 * lz * lz / 12
    iy = m0 * lx * lx / 12 + m1 * lz * lz / 12 + m2 * (lx * lx + lz * lz) / 12
    iz = m0 * (lx * lx + ly * ly) / 12 + m1 * ly * ly / 12 + m2 * lx * lx / 12
    return 2 * np.array([m0 * s2[2] + m2 * s2[1] + ix,
                         m0 * s2[2] + m1 * s2[0] + iy,
                         m1 * s2[0] + m2 * s2[1] + iz])


# ----------------------------------------------------------------- tensors and axes
def global_inertia(diag, quat) -> np.ndarray:
    """Full 3x3 tensor of a diagonal inertia rotated by ``quat``."""
    r = quat_to_mat(quat)
    return r @ np.diag(diag) @ r.T


def offcenter(mass, d) -> np.ndarray:
    """Parallel-axis term mass * (|d|^2 I - d d^T)."""
    d = np.asarray(d, dtype=np.float64)
    return mass * (np.dot(d, d) * np.eye(3) - np.outer(d, d))


def eig3(mat):
    """Principal axes of a symmetric 3x3 matrix as (eigenvalues desc, quaternion).

    MuJoCo 4.0's quaternion Jacobi iteration (``mjuu_eig3``), shared with mesh inertia.
    """
    from simjax.mjcf.mesh import eig3 as _eig3
    val, quat = _eig3(np.asarray(mat, dtype=np.float64).reshape(-1))
    return np.asarray(val, dtype=np.float64), np.asarray(quat, dtype=np.float64)


def full_inertia(full6):
    """(diag(3), quat(4)) from fullinertia "Ixx Iyy Izz Ixy Ixz Iyz"; ValueError if not PD."""
    a = np.asarray(full6, dtype=np.float64)
    mat = np.array([[a[0], a[3], a[4]], [a[3], a[1], a[5]], [a[4], a[5], a[2]]])
    eigval, quat = eig3(mat)
    if eigval[2] < EPS:
        raise ValueError("inertia must have positive eigenvalues")
    return eigval, quat


def combine(masses, positions, quats, inertias):
    """Body (mass, ipos, inertia, iquat) from several geoms (InertiaFromGeom)."""
    masses = np.asarray(masses, dtype=np.float64)
    if len(masses) == 1:
        return masses[0], np.asarray(positions[0]), np.asarray(inertias[0]), \
            np.asarray(quats[0])
    mass = masses.sum()
    if mass < EPS:
        raise ValueError("body mass is too small, cannot compute center of mass")
    com = (masses[:, None] * np.asarray(positions)).sum(0) / mass
    total = np.zeros((3, 3))
    for m, p, q, inert in zip(masses, positions, quats, inertias):
        total += global_inertia(inert, q) + offcenter(m, np.asarray(p) - com)
    full6 = [total[0, 0], total[1, 1], total[2, 2], total[0, 1], total[0, 2], total[1, 2]]
    eigval, quat = full_inertia(full6)
    return mass, com, eigval, quat
