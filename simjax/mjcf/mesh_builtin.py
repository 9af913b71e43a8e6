"""Builtin meshes: ``<mesh builtin="..." params="...">`` (mjs_makeMesh and mjCMesh's
MakeSphere, MakeHemisphere, MakeSupersphere, MakeSupertorus, MakeCone, MakeWedge and
MakeRect in MuJoCo's user_mesh.cc).

Each generator returns the user vertices (float32, (n, 3): MuJoCo stores them as floats),
the user faces ((k, 3) or None: the convex hull then makes them) and the inertia mode the
builtin imposes (the plate is a shell) or None. The arithmetic follows MuJoCo's in
precision and order (float for the icosphere's subdivision, double cast to float
elsewhere), so the vertices are the same floats. Parameter checks raise MJCFError with
MuJoCo's messages.
"""
from __future__ import annotations

import math

import numpy as np

from simjax.errors import MJCFError

_F = np.float32


def make(builtin: str, params):
    """(vertices (n, 3) float32, faces (k, 3) int or None, forced inertia or None,
    normals (3 n, 3) float32 or None) of the builtin mesh ``builtin`` with ``params``.
    Only the wedge and the plate come with normals: three per vertex, the vertex's
    tangent frame (normal, tangent 1, tangent 2), as MuJoCo's usernormal. Raises
    MJCFError for bad parameters."""
    p = [float(x) for x in np.atleast_1d(np.asarray(params, np.float64))]
    fn, count, message = _BUILTINS[builtin]
    if len(p) != count:
        raise MJCFError(message)
    vert, face, inertia, *normal = fn(*p)
    vert = np.asarray(vert, _F).reshape(-1, 3)
    face = None if face is None else np.asarray(face, np.int64).reshape(-1, 3)
    normal = np.asarray(normal[0], _F).reshape(-1, 3) if normal else None
    return vert, face, inertia, normal


# ----------------------------------------------------------------------------- spheres
def _hemisphere(res):
    res = int(res)
    if res < 0:
        raise MJCFError("Hemisphere resolution cannot be negative")
    if res > 10:
        raise MJCFError("Hemisphere resolution cannot be greater than 10")
    north = np.array([0.0, 0.0, 1.0])
    equator = np.array([[1.0, 0, 0], [0, 1.0, 0], [-1.0, 0, 0], [0, -1.0, 0]])
    nvert = 1 + 2 * (res + 1) * (res + 2) + 1          # poles' rows and the cap centre
    vert = np.zeros((nvert, 3))
    vert[0] = north
    v = 1
    for row in range(res + 1):
        for side in range(4):
            factor = (row + 1) / (res + 1)
            start = north + factor * (equator[side] - north)
            end = north + factor * (equator[(side + 1) % 4] - north)
            delta = (end - start) / (row + 1)
            for i in range(row + 1):
                q = start + i * delta
                vert[v] = q / math.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2])
                v += 1
    face = [0, 1, 2, 0, 2, 3, 0, 3, 4, 0, 4, 1]
    for row in range(res):
        start_curr, count_curr = 2 * row * (row + 1) + 1, 4 * (row + 1)
        start_next, count_next = start_curr + count_curr, 4 * (row + 2)
        for side in range(4):
            for i in range(row + 2):
                vc, vn = i + (row + 1) * side, i + (row + 2) * side
                a, b = start_curr + vc % count_curr, start_curr + (vc + 1) % count_curr
                c, d = start_next + vn % count_next, start_next + (vn + 1) % count_next
                face += [a, c, d]
                if i < row + 1:
                    face += [a, d, b]
    start, count = 2 * res * (res + 1) + 1, 4 * (res + 1)
    for i in range(count):                             # bottom cap around the centre
        face += [start + i, nvert - 1, start + (i + 1) % count]
    return vert, face, None


_ICOSA_FACES = [0, 11, 5, 0, 5, 1, 0, 1, 7, 0, 7, 10, 0, 10, 11, 1, 5, 9, 5, 11, 4, 11,
                10, 2, 10, 7, 6, 7, 1, 8, 3, 9, 4, 3, 4, 2, 3, 2, 6, 3, 6, 8, 3, 8, 9, 4, 9,
                5, 2, 4, 11, 6, 2, 10, 8, 6, 7, 9, 8, 1]


def _sphere(subdiv):
    subdiv = int(subdiv)
    if subdiv < 0:
        raise MJCFError("Sphere subdivision cannot be negative")
    if subdiv > 4:
        raise MJCFError("Sphere subdivision cannot be greater than 4")
    phi = _F((1.0 + np.sqrt(5.0)) / 2.0)
    one, zero = _F(1), _F(0)
    base = [[-one, phi, zero], [one, phi, zero], [-one, -phi, zero], [one, -phi, zero],
            [zero, -one, phi], [zero, one, phi], [zero, -one, -phi], [zero, one, -phi],
            [phi, zero, -one], [phi, zero, one], [-phi, zero, -one], [-phi, zero, one]]
    # the norm in double from a float square (as MuJoCo), each float divided in double
    norm = np.sqrt(1.0 + float(phi * phi))
    vert = [[_F(float(c) / norm) for c in v] for v in base]
    face = list(_ICOSA_FACES)
    half = _F(2)
    for _ in range(subdiv):
        cache = {}

        def mid(a, b):
            key = (min(a, b), max(a, b))
            if key not in cache:
                m = [(vert[a][k] + vert[b][k]) / half for k in range(3)]
                n = np.sqrt(m[0] * m[0] + m[1] * m[1] + m[2] * m[2])
                cache[key] = len(vert)
                vert.append([c / n for c in m])
            return cache[key]
        new = []
        for j in range(0, len(face), 3):
            v1, v2, v3 = face[j:j + 3]
            m12, m23, m31 = mid(v1, v2), mid(v2, v3), mid(v3, v1)
            new += [v1, m12, m31, v2, m23, m12, v3, m31, m23, m12, m23, m31]
        face = new
    return np.array(vert, _F), face, None


# the C library's functions (Python's math module), not numpy's vectorised ones, which
# may round differently
def _aux_c(w, m):
    c = math.cos(w)
    return math.copysign(math.pow(abs(c), m), c)


def _aux_s(w, m):
    s = math.sin(w)
    return math.copysign(math.pow(abs(s), m), s)


def _supersphere(res, e, n):
    res = int(res)
    if res < 3:
        raise MJCFError("Supersphere resolution must be greater than 2")
    if e < 0:
        raise MJCFError("Supersphere 'e' cannot be negative")
    if n < 0:
        raise MJCFError("Supersphere 'n' cannot be negative")
    vert = [[0.0, 0.0, -1.0]]
    for i in range(1, res):
        v = -math.pi / 2 + i * math.pi / res
        for j in range(res):
            u = -math.pi + (j * 2) * math.pi / res
            vert.append([_aux_c(v, n) * _aux_c(u, e), _aux_c(v, n) * _aux_s(u, e),
                         _aux_s(v, n)])
    vert.append([0.0, 0.0, 1.0])
    face = []
    for j in range(res):
        face += [0, 1 + (j + 1) % res, 1 + j]
    for i in range(res - 2):
        for j in range(res):
            v1, v2 = 1 + i * res + j, 1 + i * res + (j + 1) % res
            v4, v3 = 1 + (i + 1) * res + j, 1 + (i + 1) * res + (j + 1) % res
            face += [v1, v2, v4, v2, v3, v4]
    last, pole = 1 + (res - 2) * res, len(vert) - 1
    for j in range(res):
        face += [last + j, last + (j + 1) % res, pole]
    return vert, face, None


def _supertorus(res, radius, s, t):
    res = int(res)
    if res < 3:
        raise MJCFError("Supertorus resolution must be greater than 3")
    if radius <= 0 or radius > 1:
        raise MJCFError("Supertorus radius must be in (0, 1]")
    if s <= 0:
        raise MJCFError("Supertorus 's' must be greater than 0")
    if t <= 0:
        raise MJCFError("Supertorus 't' must be greater than 0")
    vert, face = [], []
    for i in range(res):
        for j in range(res):
            u, v = 2 * math.pi * i / res, 2 * math.pi * j / res
            ring = 1 + radius * _aux_c(v, s)
            vert.append([ring * _aux_c(u, t), ring * _aux_s(u, t), radius * _aux_s(v, s)])
    for i in range(res):
        for j in range(res):
            i1, j1 = (i + 1) % res, (j + 1) % res
            v1, v2, v3, v4 = i * res + j, i1 * res + j, i1 * res + j1, i * res + j1
            face += [v1, v2, v4, v2, v3, v4]
    return vert, face, None


# ----------------------------------------------------------------------------- others
def _cone(nedge, radius):
    nedge = int(nedge)
    vert = [[math.cos(2 * i * math.pi / nedge), math.sin(2 * i * math.pi / nedge), -1.0]
            for i in range(nedge)]
    if radius > 0:
        vert += [[radius * math.cos(2 * i * math.pi / nedge),
                  radius * math.sin(2 * i * math.pi / nedge), 1.0]
                 for i in range(nedge, 2 * nedge)]
    else:
        vert.append([0.0, 0.0, 1.0])
    return vert, None, None


def _linspace(lower, upper, n):
    """LinSpace of user_mesh.cc: by repeated addition (not numpy's formula)."""
    inc = (upper - lower) / (n - 1) if n > 1 else 0.0
    out = []
    for _ in range(n):
        out.append(lower)
        lower += inc
    return out


def _fovea(x, gamma):
    if not gamma:
        return x
    g = max(0.0, min(1.0, gamma))
    return g * math.pow(x, 5) + (1 - g) * x


def _wedge(res0, res1, fov0, fov1, gamma):
    res0, res1 = int(res0), int(res1)
    if fov0 <= 0 or fov0 > 180:
        raise MJCFError("fov[0] must be a float between (0, 180] degrees")
    if fov1 <= 0 or fov1 > 90:
        raise MJCFError("`fov[1]` must be a float between (0, 90] degrees")
    if res0 <= 0 or res1 <= 0:
        raise MJCFError("Horizontal and vertical resolutions must be positive")
    if gamma < 0 or gamma > 1:
        raise MJCFError("`gamma` must be a nonnegative float between [0, 1]")
    xs = [_fovea(x, gamma) * (fov0 * math.pi / 180) for x in _linspace(-1.0, 1.0, res0 + 1)]
    ys = [_fovea(y, gamma) * (fov1 * math.pi / 180) for y in _linspace(-1.0, 1.0, res1 + 1)]
    vert, normal = [], []
    for i in range(res0):
        for j in range(res1):
            a, e = 0.5 * (xs[i + 1] + xs[i]), 0.5 * (ys[j + 1] + ys[j])
            ce = 1.0 * math.cos(e)
            vert.append([ce * math.sin(a), 1.0 * math.sin(e), -ce * math.cos(a)])
            normal += _tangent_frame(a, e)
    return vert, None, None, normal


def _unit(v):
    """mjuu_normvec: left alone below length^2 1e-14 or within 1e-14 of unit length."""
    n2 = 0.0
    for x in v:
        n2 += x * x
    if n2 < 1e-14:
        return v
    n = math.sqrt(n2)
    return [x / n for x in v] if abs(n - 1) > 1e-14 else v


def _tangent_frame(a, e, r=1.0):
    """[normal, tangent along azimuth, tangent along elevation] of a wedge vertex at
    azimuth a, elevation e (TangentFrame of user_mesh.cc)."""
    ta = _unit([r * math.cos(e) * math.cos(a), 0.0, r * math.cos(e) * math.sin(a)])
    te = _unit([-r * math.sin(e) * math.sin(a), r * math.cos(e), r * math.sin(e) * math.cos(a)])
    n = [te[1] * ta[2] - te[2] * ta[1], te[2] * ta[0] - te[0] * ta[2],
         te[0] * ta[1] - te[1] * ta[0]]
    return [n, ta, te]


def _plate(res0, res1):
    res0, res1 = int(res0), int(res1)
    if res0 <= 0 or res1 <= 0:
        raise MJCFError("Horizontal and vertical resolutions must be positive")
    dx, dy = 2.0 / res0, 2.0 / res1
    vert = [[-1 + (i + 0.5) * dx, -1 + (j + 0.5) * dy, -1.0]
            for i in range(res0) for j in range(res1)]
    normal = [np.eye(3)] * len(vert)           # each vertex: the axes as its frame
    face = []
    for i in range(1, res0):
        for j in range(1, res1):
            a, b = (i - 1) * res1 + j - 1, i * res1 + j - 1
            c, d = (i - 1) * res1 + j, i * res1 + j
            face += [a, b, c, d, c, b]
    return vert, face, "shell", normal


#: generator, parameter count, MuJoCo's message for a wrong count
_BUILTINS = {
    "sphere": (_sphere, 1, "Sphere mesh type requires 1 parameter"),
    "hemisphere": (_hemisphere, 1, "Hemisphere mesh type requires 1 parameter"),
    "supersphere": (_supersphere, 3, "Supersphere mesh type requires 3 parameters"),
    "supertorus": (_supertorus, 4, "Supertorus mesh type requires 4 parameters"),
    "cone": (_cone, 2, "Cone mesh type requires 2 parameters"),
    "wedge": (_wedge, 5, "Wedge builtin mesh types require 5 parameters"),
    "plate": (_plate, 2, "Plate builtin mesh type requires 2 parameters"),
}
