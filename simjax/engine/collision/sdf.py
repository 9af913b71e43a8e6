"""Collisions with signed-distance-field geoms (MuJoCo's mjc_SDF).

For a geom pair (g1, g2) where g2 is an SDF geom (``GeomType.SDF``, shape from its
plugin instance) and g1 an SDF or a primitive (sphere, capsule, ellipsoid, cylinder,
box, plane), MuJoCo's method (engine_collision_sdf.c; programming guide, "SDF"):

1. the intersection of the two geoms' AABBs (geom_aabb, in g1's frame) is sampled with
   ``opt.sdf_initpoints`` Halton points (bases 2, 3, 5);
2. from each, ``opt.sdf_iterations`` steps of gradient descent with backtracking line
   search (alpha from 2 halving to 1e-4, Armijo constant 0.1; a step that does not
   improve is undone and ends the descent, as MuJoCo 4.0.0 does) on
   A + B + |max(A, B)| (A, B: the two distances at the point);
3. one more descent step on max(A, B) (projection onto the intersection);
4. a point with max(A, B) <= 0 becomes a contact: depth max(A, B), normal the unit
   difference of the unit gradients (the mid-surface normal, pointing into g2),
   position the point moved by dist/2 along the normal (what MuJoCo 4.0.0 reports);
   repeated points are dropped.

The descents are fixed-length (masks instead of loops that stop early), so they jit,
vmap and differentiate; each step's line search finds its step size in a loop that
stops early on values without gradient, then makes the step once with gradient (the
step sizes 2^-k carry no derivative: the same derivatives as the masked trials).
Distances of primitives and their gradients follow MuJoCo's formulas (including its
radial interior field for boxes; square roots with a finite derivative at 0, so that
points on a cylinder's axis or inside it give finite derivatives); plugin SDFs use
their ``sdf_distance`` / ``sdf_gradient``.

Entry points:

- :func:`collide` (m, d, g1, g2) -> ``(dist (n,), pos (n, 3), frame (n, 3, 3),
  valid (n,))`` with n = opt.sdf_initpoints; ``frame`` rows: normal (from g1 into
  g2, world frame), then two tangents (mju_makeFrame); empty slots have
  ``valid = False`` and dist = 1e10.
- :func:`collide_pair`: the same from explicit poses and parameters with static shape
  descriptors, for vmapping over pairs of the same kind.
- :func:`collide_pairs` (m, d, g1s, g2s): many pairs, vmapped per kind (what the
  collision driver calls); :func:`slots`: contact slots per pair for a set of SDF
  pairs.

A mesh against an SDF geom (mjc_MeshSDF: Frank-Wolfe descents over the mesh's faces
in the order of its bounding volume hierarchy) is in
:mod:`simjax.engine.collision.mesh_sdf`; :func:`collide_pairs` dispatches those pairs
there (one kind per mesh and plugin).

A plane against an SDF geom is not collided here: as in MuJoCo 4.0 the plane meets
the SDF geom's mesh (mjc_PlaneConvex on its convex hull,
``convex.PLANE_SDF``).

Against MuJoCo 4.0.0 (float64): the torus scene's contacts agree to ~1e-14 and its
100-step trajectory to ~1e-13; the nut/bolt contacts to ~5e-8 (MuJoCo's nut and bolt
gradients are forward differences, simjax's exact), which the threaded contact
amplifies to ~1e-4 in qpos after 100 steps.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline, math
from simjax.errors import UnsupportedFeatureError
from simjax.types import GeomType

MAXVAL = 1e10
MINVAL = 1e-15


@dataclasses.dataclass(frozen=True)
class Shape:
    """Static description of one side of a pair: geom type, for SDF geoms the plugin
    name (the plugin's functions compute its distance), for mesh geoms the mesh id."""

    type: int
    plugin: str = ""
    mesh: int = -1


def halton(index: int, base: int) -> float:
    """Radical inverse of ``index`` in ``base`` (mju_Halton)."""
    n0, b = index, float(base)
    f, hn = 1.0 / b, 0.0
    while n0 > 0:
        n1 = n0 // base
        r = n0 - n1 * base
        hn += f * r
        f /= b
        n0 = n1
    return hn


def _halton_points(n):
    return np.array([[halton(j, 2), halton(j, 3), halton(j, 5)] for j in range(n)])


# --------------------------------------------------------------------------- distances
def _plugin(name):
    from simjax.plugins import registry
    found = registry.find(name)
    if found is None:
        raise UnsupportedFeatureError(f"sdf plugin '{name}' is not registered")
    return found[1]


def _radial(a, x, size):
    f = -size / a
    f = f / jnp.linalg.norm(f)
    return jnp.where(x < 0, -f, f)


def distance(shape: Shape, x, size, params):
    """Signed distance of point ``x`` (3,) in the geom frame (geomDistance)."""
    t = shape.type
    if t == GeomType.PLANE:
        return x[2]
    if t == GeomType.SPHERE:
        return math.norm(x) - size[0]
    if t == GeomType.BOX:
        a = jnp.abs(x) - size
        outside = jnp.any(a >= 0)
        out = math.norm(jnp.maximum(a, 0.0)) + jnp.minimum(jnp.max(a), 0.0)
        a_in = jnp.where(outside, -1.0, a)
        b = _radial(a_in, x, size)
        inside = -jnp.min(-a_in / jnp.abs(b)) * jnp.linalg.norm(b)
        return jnp.where(outside, out, inside)
    if t == GeomType.CAPSULE:
        a = x.at[2].add(-math.clip(x[2], -size[1], size[1]))
        return math.norm(a) - size[0]
    if t == GeomType.ELLIPSOID:
        a = x / size
        b = a / size
        k0, k1 = math.norm(a), math.norm(b)
        return k0 * (k0 - 1.0) / k1
    if t == GeomType.CYLINDER:
        a0 = math.safe_sqrt(x[0] * x[0] + x[1] * x[1]) - size[0]
        a1 = jnp.abs(x[2]) - size[1]
        return jnp.minimum(jnp.maximum(a0, a1), 0.0) + math.norm(
            jnp.stack([jnp.maximum(a0, 0.0), jnp.maximum(a1, 0.0)]))
    if t == GeomType.SDF:
        return inline.outside(_plugin(shape.plugin).sdf_distance)(params, x)
    raise UnsupportedFeatureError(f"sdf collisions with geom type {int(t)}")


def gradient(shape: Shape, x, size, params):
    """Gradient (3,) of the distance at ``x`` (geomGradient; MuJoCo's fields)."""
    t = shape.type
    if t == GeomType.PLANE:
        return jnp.array([0.0, 0.0, 1.0], x.dtype)
    if t == GeomType.SPHERE:
        return x / math.norm(x)
    if t == GeomType.BOX:
        a = jnp.abs(x) - size
        inside = jnp.max(a) < 0
        b = jnp.maximum(a, 0.0)
        c = jnp.where(inside, 1.0, math.norm(b))
        sgn = jnp.sign(x)
        out = jnp.where(a > 0, b / c * sgn, 0.0)
        return jnp.where(inside, _radial(jnp.where(inside, a, -1.0), x, size), out)
    if t == GeomType.CAPSULE:
        a = x.at[2].add(-math.clip(x[2], -size[1], size[1]))
        return a / math.norm(a)
    if t == GeomType.ELLIPSOID:
        a = x / size
        b = a / size
        k0, k1 = math.norm(a), math.norm(b)
        gk0 = b / k0
        gk1 = b / k1 / (size * size)
        g = gk0 * (2.0 * k0 - 1.0) / k1 - gk1 * k0 * (k0 - 1.0) / (k1 * k1)
        return g / math.norm(g)
    if t == GeomType.CYLINDER:
        c = math.safe_sqrt(x[0] * x[0] + x[1] * x[1])
        e = jnp.abs(x[2])
        a0, a1 = c - size[0], e - size[1]
        grada = jnp.stack([x[0] / jnp.maximum(c, 1 / MAXVAL), x[1] / jnp.maximum(c, 1 / MAXVAL),
                           x[2] / jnp.maximum(e, 1 / MAXVAL)])
        j0 = a0 > a1
        inside = jnp.where(j0, a0, a1) < 0
        g_in = jnp.where(j0, grada * jnp.array([1.0, 1.0, 0.0]), grada * jnp.array([0., 0., 1.]))
        b0, b1 = jnp.maximum(a0, 0.0), jnp.maximum(a1, 0.0)
        bn = jnp.maximum(math.safe_sqrt(b0 * b0 + b1 * b1), 1 / MAXVAL)
        g_out = grada * jnp.stack([b0, b0, b1]) / bn
        return jnp.where(inside, g_in, g_out)
    if t == GeomType.SDF:
        p = _plugin(shape.plugin)
        if p.sdf_gradient is not None:
            return inline.outside(p.sdf_gradient)(params, x)
        return jax.grad(lambda y: inline.outside(p.sdf_distance)(params, y))(x)
    raise UnsupportedFeatureError(f"sdf collisions with geom type {int(t)}")


# --------------------------------------------------------------------------- objectives
def _pair_fns(s2: Shape, s1: Shape, size2, size1, prm2, prm1, relmat, relpos):
    """A = distance to g2 at x (g2 frame), B = distance to g1 at y = R x + p."""
    def ab(x):
        y = relmat @ x + relpos
        return distance(s2, x, size2, prm2), distance(s1, y, size1, prm1)

    def grads(x):
        y = relmat @ x + relpos
        return gradient(s2, x, size2, prm2), relmat.T @ gradient(s1, y, size1, prm1)

    def collision(x):
        a, b = ab(x)
        return a + b + jnp.abs(jnp.maximum(a, b))

    def collision_grad(x):
        a, b = ab(x)
        g1, g2 = grads(x)
        return g1 + g2 + jnp.where(a > b, g1, g2) * jnp.where(jnp.maximum(a, b) > 0, 1.0, -1.0)

    def intersection(x):
        a, b = ab(x)
        return jnp.maximum(a, b)

    def intersection_grad(x):
        a, b = ab(x)
        g1, g2 = grads(x)
        return jnp.where(a > b, g1, g2)

    def midsurface_grad(x):
        g1, g2 = grads(x)
        g1 = g1 / math.norm(g1)
        g2 = g2 / math.norm(g2)
        d = g1 - g2
        n = math.norm(d)
        # mju_normalize3 turns a vanishing vector into (1, 0, 0)
        unit = jnp.where(n < MINVAL, jnp.array([1.0, 0.0, 0.0], d.dtype),
                         d / jnp.where(n < MINVAL, 1.0, n))
        return unit

    return collision, collision_grad, intersection, intersection_grad, midsurface_grad


def _descend(x, fun, grad, niter, fun_ng):
    """stepGradient: ``niter`` steps of backtracking gradient descent; returns the
    final point and its objective value (MAXVAL after a non-finite gradient).

    ``fun_ng``: ``fun`` of inputs without gradient. Each step's line search
    (:func:`_halvings`) runs on it in a loop that stops at the first accepted trial,
    and the accepted point is then made once, with gradient, from the trial's step
    size: the same points and derivatives as every trial run and the accepted one
    selected (the step sizes 2^-k carry no derivative). That way (all 15 trials run
    masked) the torus scene's collision took 2967 us CPU per world-step, this way
    2133 (batch 64, float32, settled states); the contacts and, in float64, their
    depths' and positions' derivatives were the same (to 1.8e-15 at 6 states). A step
    skipped by a conditional where every point of the batch had stopped
    (``solver_worlds.any_world``) gained nothing: the torus scene's 4-step rollout
    (batch 64, float32, settled states, paired in one process, Intel Xeon) 1.078 [0.93,
    1.225] of the time without it, 8 rounds."""
    def step(carry, _):
        x, dist, done = carry
        g = grad(x)
        bad = jnp.any(jnp.isnan(g) | (jnp.abs(g) > MAXVAL))
        dist0 = fun(x)
        alpha = _halvings(fun_ng, *jax.lax.stop_gradient((x, g, dist0)))
        xt = x - alpha * g
        dt = fun(xt)
        # no improvement: keep the previous point and stop (MuJoCo 4.0 behaviour)
        worse = dist0 < dt
        stop = done | bad | worse
        x_new = jnp.where(stop, x, xt)
        dist_new = jnp.where(done, dist, jnp.where(bad, MAXVAL, jnp.where(worse, dist0, dt)))
        done_new = stop
        return (x_new, dist_new, done_new), None
    init = (x, jnp.asarray(MAXVAL, x.dtype), jnp.asarray(False))
    (x, dist, _), _ = inline.scan(step, init, None, length=niter)
    return x, dist


def _halvings(fun, x, g, dist0):
    """The step size (2 halved k times) at which stepGradient's backtracking line
    search from ``x`` along ``-g`` stops: the first trial that meets the Armijo
    condition (constant 0.1), or the first alpha at or below 1e-4 (2 * 0.5^k > 1e-4
    for k <= 14: at most 15 trials). A loop that stops there (under vmap, when every
    point has). Points whose descent has stopped still search (their trials are
    dropped): starting them stopped gained nothing in one measurement each (the torus
    scene, batch 64, float32, settled states: 3922 us CPU per world-step without, 4280
    with)."""
    def trial(c):
        alpha, wolfe, _ = c
        alpha, wolfe = alpha * 0.5, wolfe * 0.5
        return alpha, wolfe, (alpha > 1e-4) & (fun(x - alpha * g) - dist0 > wolfe)
    init = (jnp.asarray(2.0, x.dtype), -0.1 * 2.0 * jnp.dot(g, g), jnp.asarray(True))
    return inline.while_loop(lambda c: c[2], trial, init)[0]


def make_frame(normal):
    """(3, 3) contact frame with rows normal, tangent1, tangent2 (mju_makeFrame)."""
    n = normal / math.norm(normal)
    y = jnp.where(jnp.abs(n[1]) < 0.5, jnp.array([0.0, 1.0, 0.0]), jnp.array([0.0, 0.0, 1.0]))
    y = y - n * jnp.dot(n, y)
    y = y / math.norm(y)
    return jnp.stack([n, y, jnp.cross(n, y)])


def collide_pair(s1: Shape, s2: Shape, pos1, mat1, pos2, mat2, aabb1, aabb2, size1, size2,
                 params1, params2, ninit: int, niter: int):
    """SDF contacts of one pair from explicit data (see :func:`collide`).

    ``s1``/``s2``: static shapes (s2 must be an SDF); ``pos``/``mat``: world poses
    (3,), (3, 3) of the geom frames; ``aabb``: geom_aabb rows (6,) (center, half
    sizes, geom frame); ``size``: geom_size (3,); ``params``: plugin parameters of SDF
    geoms (else anything). Returns ``(dist, pos, frame, valid)`` with ``ninit`` slots.
    """
    if s2.type != GeomType.SDF:
        raise UnsupportedFeatureError("sdf collision: the second geom must be an SDF")
    dtype = jnp.result_type(pos1, float)
    # relative poses: g2 in g1 frame (R21, p21) and g1 in g2 frame (R12, p12)
    r21 = mat1.T @ mat2
    p21 = mat1.T @ (pos2 - pos1)
    r12 = r21.T
    p12 = -(r12 @ p21)
    # AABB of each geom in g1's frame, then their intersection
    signs = jnp.asarray(np.array([[(i >> k) & 1 for k in range(3)] for i in range(8)],
                                 float) * 2 - 1, dtype)
    c1 = aabb1[:3] + signs * aabb1[3:]
    c2 = (aabb2[:3] + signs * aabb2[3:]) @ r21.T + p21
    lo = jnp.maximum(c1.min(0), c2.min(0))
    hi = jnp.minimum(c1.max(0), c2.max(0))
    overlap = jnp.all(hi >= lo)
    pts = lo + (hi - lo) * jnp.asarray(_halton_points(ninit), dtype)       # g1 frame
    starts = pts @ r12.T + p12                                           # g2 frame
    col, col_g, inter, inter_g, mid_g = _pair_fns(s2, s1, size2, size1, params2, params1,
                                                  r21, p21)
    # the objectives of the inputs without gradient, for the line searches' loops
    col_ng, _, inter_ng, _, _ = _pair_fns(s2, s1, *jax.lax.stop_gradient(
        (size2, size1, params2, params1, r21, p21)))

    def one(x):
        x, _ = _descend(x, col, col_g, niter, col_ng)
        x, dist = _descend(x, inter, inter_g, 1, inter_ng)
        return x, dist, -mid_g(x)
    x, dist, normal = jax.vmap(one)(starts)
    ok = overlap & (dist <= 0) & jnp.all(jnp.isfinite(normal), axis=1)
    # drop repeated points (isknown: within MINVAL of an earlier accepted point)
    sep = jnp.linalg.norm(x[:, None, :] - x[None, :, :], axis=-1)
    earlier = jnp.tril(jnp.ones((ninit, ninit), bool), -1)
    dup = jnp.any(earlier & (sep < MINVAL) & ok[None, :], axis=1)
    valid = ok & ~dup
    nworld = normal @ mat2.T
    pos = x @ mat2.T + pos2 + 0.5 * dist[:, None] * nworld   # MuJoCo 4.0.0's midpoint
    frame = jax.vmap(make_frame)(jnp.where(valid[:, None], nworld, jnp.array([1.0, 0, 0])))
    dist = jnp.where(valid, dist, MAXVAL)
    return dist, pos, frame, valid


def shape_of(m, g: int) -> Shape:
    """Static Shape of geom ``g`` (its plugin's name for SDF geoms)."""
    t = int(np.asarray(m.geom_type)[g])
    if t == GeomType.MESH:
        return Shape(t, mesh=int(np.asarray(m.geom_dataid)[g]))
    if t != GeomType.SDF:
        return Shape(t)
    inst = int(np.asarray(m.geom_plugin)[g])
    if inst < 0:
        raise UnsupportedFeatureError("sdf geom without a plugin (mesh octree SDF)")
    return Shape(t, m.plugin_specs[inst].plugin)


def plugin_params(m, g):
    """Parameters of geom ``g``'s plugin instance (() without one)."""
    inst = int(np.asarray(m.geom_plugin)[g])
    return m.plugin_params[inst] if inst >= 0 else ()


def collide(m, d, g1: int, g2: int):
    """SDF contacts between geoms ``g1`` and ``g2`` (static ids; g2 an SDF geom) at
    the poses in ``d``: ``(dist, pos, frame, valid)``, opt.sdf_initpoints slots (a
    mesh g1: min(50, nface * sdf_initpoints) slots, mjc_MeshSDF)."""
    if int(np.asarray(m.geom_type)[g1]) == GeomType.MESH:
        return tuple(x[0] for x in collide_pairs(m, d, [g1], [g2]))
    aabb = jnp.asarray(m.geom_aabb).reshape(-1, 6)
    size = jnp.asarray(m.geom_size).reshape(-1, 3)
    return collide_pair(shape_of(m, g1), shape_of(m, g2), d.geom_xpos[g1], d.geom_xmat[g1],
                        d.geom_xpos[g2], d.geom_xmat[g2], aabb[g1], aabb[g2], size[g1],
                        size[g2], plugin_params(m, g1), plugin_params(m, g2),
                        int(m.opt.sdf_initpoints), int(m.opt.sdf_iterations))


def _stack_params(trees):
    return jax.tree_util.tree_map(lambda *x: jnp.stack([jnp.asarray(v) for v in x]), *trees)


def slots(m, g1, g2) -> int:
    """Contact slots per pair of the SDF pairs ``g1``, ``g2`` (static id arrays): the
    widest of ``opt.sdf_initpoints`` (mjc_SDF) and min(50, nface * sdf_initpoints)
    (mjc_MeshSDF) over the pairs' kinds."""
    from simjax.engine.collision import mesh_sdf
    gtype = np.asarray(m.geom_type)
    out = [int(m.opt.sdf_initpoints) if gtype[a] != GeomType.MESH else mesh_sdf.slots(m, a)
           for a in np.asarray(g1, np.int64)]
    return max(out + [0])


def _mesh_kind(m, d, s1, s2, a, b, p2, ninit, niter):
    """Mesh (s1) vs SDF (s2) pairs ``a``, ``b`` of one kind (same mesh, same plugin):
    (dist, pos, frame, valid) with mesh_sdf.slots columns."""
    from simjax.engine.collision import mesh_sdf
    static = mesh_sdf.mesh_data(m, int(a[0]))
    vert, (adr, num) = static[0], static[4]
    box = jnp.asarray(m.bvh_aabb).reshape(-1, 6)[adr:adr + num]
    size = jnp.asarray(m.geom_size).reshape(-1, 3)

    def one(pos1, mat1, pos2, mat2, size2, prm2):
        dist_fn = lambda x: distance(s2, x, size2, prm2)
        grad_fn = lambda x: gradient(s2, x, size2, prm2)
        dist, pos, nrm, valid = mesh_sdf.collide_pair(
            dist_fn, grad_fn, static[1:4], pos1, mat1, pos2, mat2, vert, box, ninit, niter)
        frame = jax.vmap(make_frame)(nrm)
        return dist, pos, frame, valid
    return jax.vmap(one)(d.geom_xpos[a], d.geom_xmat[a], d.geom_xpos[b], d.geom_xmat[b],
                         size[b], p2)


def _pad(out, k):
    """Pad (dist, pos, frame, valid) of n pairs to ``k`` slots with empty ones."""
    dist, pos, frame, valid = out
    extra = k - dist.shape[1]
    if extra == 0:
        return out
    n = dist.shape[0]
    return (jnp.concatenate([dist, jnp.full((n, extra), MAXVAL, dist.dtype)], 1),
            jnp.concatenate([pos, jnp.zeros((n, extra, 3), pos.dtype)], 1),
            jnp.concatenate([frame, jnp.broadcast_to(jnp.eye(3, dtype=frame.dtype),
                                                     (n, extra, 3, 3))], 1),
            jnp.concatenate([valid, jnp.zeros((n, extra), bool)], 1))


def collide_pairs(m, d, g1, g2):
    """SDF contacts of many pairs (static id arrays ``g1``, ``g2`` (n,)): pairs of the
    same kind (both Shapes) are vmapped through one :func:`collide_pair` (or, for a
    mesh, :func:`simjax.engine.collision.mesh_sdf.collide_pair`), so the program grows
    with the number of kinds, not of pairs. Returns ``(dist (n, k), pos (n, k, 3),
    frame (n, k, 3, 3), valid (n, k))`` with k = :func:`slots`, rows in the order of
    the pairs.

    Every pair runs, whether or not it passes the broadphase (the caller drops the
    contacts of those that do not). Measured and not taken: a kind skipped (a branch
    on ``chunked.batch_max``) where none of its pairs passes in any world. The torus
    scene's settled states (MuJoCo's state after 400 steps: 6 of its 12 pairs pass
    the bounding spheres, none of the 3 torus-plane pairs) gave 0.954 [0.837, 1.273]
    of the time without it (4-step rollouts, batch 64, float32, 8 paired rounds), the
    medians of the two 4917 against 4667 us per world-step: no gain seen; float32
    outputs moved by rounding (qvel 1.5e-8)."""
    g1, g2 = np.asarray(g1, np.int64), np.asarray(g2, np.int64)
    aabb = jnp.asarray(m.geom_aabb).reshape(-1, 6)
    size = jnp.asarray(m.geom_size).reshape(-1, 3)
    ninit, niter = int(m.opt.sdf_initpoints), int(m.opt.sdf_iterations)
    width = slots(m, g1, g2)
    kinds: dict = {}
    for k, (a, b) in enumerate(zip(g1, g2)):
        kinds.setdefault((shape_of(m, int(a)), shape_of(m, int(b))), []).append(k)
    outs, order = [], []
    for (s1, s2), ks in kinds.items():
        a, b = g1[ks], g2[ks]
        p2 = _stack_params([plugin_params(m, int(x)) for x in b])
        if s1.type == GeomType.MESH:
            if s2.type != GeomType.SDF:
                raise UnsupportedFeatureError("sdf collision: the second geom must be an SDF")
            outs.append(_pad(_mesh_kind(m, d, s1, s2, a, b, p2, ninit, niter), width))
            order += ks
            continue
        p1 = _stack_params([plugin_params(m, int(x)) for x in a])
        fn = lambda *args: collide_pair(s1, s2, *args, ninit, niter)
        outs.append(_pad(jax.vmap(fn)(d.geom_xpos[a], d.geom_xmat[a], d.geom_xpos[b],
                                      d.geom_xmat[b], aabb[a], aabb[b], size[a], size[b],
                                      p1, p2), width))
        order += ks
    inv = np.argsort(np.asarray(order))
    return tuple(jnp.concatenate([o[i] for o in outs])[inv] for i in range(4))
