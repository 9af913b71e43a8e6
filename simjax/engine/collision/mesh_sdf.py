"""Collisions of a mesh geom with an SDF geom (MuJoCo's mjc_MeshSDF).

MuJoCo 4.0.0's method, with the mesh geom g1 and the SDF geom g2 (engine_collision_sdf.c),
all in g2's frame:

1. walk the mesh's bounding volume hierarchy depth first, second child first (a stack);
   a node is entered, and a leaf's face processed, only when the SDF distance at the
   centre of its box is below the box's half diagonal (the box's circumsphere meets
   the SDF);
2. a face is also skipped when the SDF is clear of a sphere around it
   (triangleIntersect: the circumsphere of the tetrahedron made of the face and its
   centroid pushed by a tenth of the SDF distance along the face normal; the
   triangle's circumcircle when that push is under 0.1; the SDF distance at the
   centroid against the first edge's length when the tetrahedron is degenerate);
3. from ``max(1, opt.sdf_initpoints)`` points of each remaining face (barycentric
   coordinates from the Halton sequence in bases 2 and 3, index from 1, reflected into
   the triangle), ``opt.sdf_iterations`` Frank-Wolfe steps over the face's corners
   (step k moves ``2 / (k + 2)`` of the way to the corner with the lowest
   gradient-weighted position, so the first step lands on a corner);
4. an end point inside the SDF is a candidate, depth its SDF distance; candidates are
   kept in visiting order until there are 50 (mjMAXCONPAIR), the rest dropped;
5. each candidate x becomes a contact unless within 1e-15 of an earlier contact or with
   a vanishing SDF gradient: normal n = minus the unit gradient (into the SDF), depth
   dist < 0, position x + dist / 2 * n (as MuJoCo 4.0.0 reports it).

Here every face of the mesh is processed at once, in the static order of step 1 (the
hierarchy is in the Model: ``bvh_child``, ``bvh_nodeid``, ``bvh_aabb`` at
``mesh_bvhadr``); a face's culling is the AND of the tests of its box and of all its
ancestors' boxes, so the walk becomes a fixed gather. The first 50 candidates are found
with a cumulative sum and the repeats dropped by a 50-step scan: fixed shapes and no
``while_loop``, so the collision jits, vmaps and differentiates. The cost is
``nface * sdf_initpoints * sdf_iterations`` gradient evaluations per pair, whatever
the culling.

Entry points: :func:`slots` (contact slots of a mesh-SDF pair) and :func:`collide_pair`.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline, math

MAXCONPAIR = 50       # mjMAXCONPAIR
MINVAL = 1e-15
MAXVAL = 1e10


def slots(m, g1: int) -> int:
    """Contact slots of a mesh (geom ``g1``) vs SDF pair: min(50, nface * initpoints)."""
    mesh = int(np.asarray(m.geom_dataid)[g1])
    nface = int(np.asarray(m.mesh_facenum)[mesh])
    return min(MAXCONPAIR, nface * max(1, int(m.opt.sdf_initpoints)))


@functools.lru_cache(maxsize=64)
def _walk(child: bytes, nodeid: bytes, n: int):
    """Static walk of one hierarchy (``n`` nodes, child (n, 2) and nodeid (n,) as
    int32 bytes): (faces (L,) in visiting order, their leaf nodes (L,), ancestors
    (L, D) node ids padded with the leaf itself)."""
    child = np.frombuffer(child, np.int32).reshape(n, 2)
    nodeid = np.frombuffer(nodeid, np.int32)
    faces, leaves, paths = [], [], []
    stack = [(0, ())]
    while stack:
        node, path = stack.pop()
        if nodeid[node] != -1:
            faces.append(int(nodeid[node]))
            leaves.append(node)
            paths.append(path)
            continue
        for c in child[node]:
            if c != -1:
                stack.append((int(c), path + (node,)))
    depth = max([len(p) for p in paths] + [1])
    anc = np.array([list(p) + [lf] * (depth - len(p)) for p, lf in zip(paths, leaves)],
                   np.int64).reshape(len(faces), depth)
    return np.array(faces, np.int64), np.array(leaves, np.int64), anc


def _halton(index: int, base: int) -> float:
    n0, f, hn = index, 1.0 / base, 0.0
    while n0 > 0:
        n1 = n0 // base
        hn += f * (n0 - n1 * base)
        f /= base
        n0 = n1
    return hn


def _barycentric(ninit: int) -> np.ndarray:
    """(ninit, 3) barycentric start weights of a face (Halton 2, 3 from index 1)."""
    out = []
    for sp in range(ninit):
        u, v = _halton(sp + 1, 2), _halton(sp + 1, 3)
        if u + v > 1:
            u, v = 1 - u, 1 - v
        out.append([1 - u - v, u, v])
    return np.array(out)


def mesh_data(m, g1: int):
    """Static data of the mesh of geom ``g1``: (vertices (nv, 3) numpy, faces in
    visiting order (L, 3), leaf nodes (L,), ancestors (L, D), box rows of the mesh's
    hierarchy (adr, num))."""
    mesh = int(np.asarray(m.geom_dataid)[g1])
    adr = int(np.asarray(m.mesh_bvhadr)[mesh])
    num = int(np.asarray(m.mesh_bvhnum)[mesh])
    va, nv = int(np.asarray(m.mesh_vertadr)[mesh]), int(np.asarray(m.mesh_vertnum)[mesh])
    fa, nf = int(np.asarray(m.mesh_faceadr)[mesh]), int(np.asarray(m.mesh_facenum)[mesh])
    vert = np.asarray(m.mesh_vert, np.float64).reshape(-1, 3)[va:va + nv]
    face = np.asarray(m.mesh_face).reshape(-1, 3)[fa:fa + nf]
    if adr < 0:
        return vert, np.zeros((0, 3), np.int64), np.zeros(0, np.int64), \
            np.zeros((0, 1), np.int64), (0, 0)
    child = np.ascontiguousarray(np.asarray(m.bvh_child, np.int32)[adr:adr + num])
    nodeid = np.ascontiguousarray(np.asarray(m.bvh_nodeid, np.int32)[adr:adr + num])
    faces, leaves, anc = _walk(child.tobytes(), nodeid.tobytes(), num)
    return vert, face[faces], leaves, anc, (adr, num)


def _triangle_intersect(tri, dist_fn):
    """triangleIntersect for faces ``tri`` (F, 3, 3) in the SDF frame: (F,) bool."""
    e0 = tri[:, 1] - tri[:, 0]
    e1 = tri[:, 2] - tri[:, 0]
    nrm = jnp.cross(e0, e1)
    nn = math.norm(nrm, axis=-1)
    small = nn < MINVAL
    nrm = jnp.where(small[:, None], jnp.array([1.0, 0.0, 0.0], tri.dtype),
                    nrm / jnp.where(small, 1.0, nn)[:, None])
    third = 1.0 / 3.0
    p = tri[:, 0] * third + tri[:, 1] * third + tri[:, 2] * third
    dc = jax.vmap(dist_fn)(p)
    h = -dc / 10.0
    # flat tetrahedron: circumcircle of the triangle
    a = math.norm(tri[:, 0] - tri[:, 1], axis=-1)
    b = math.norm(tri[:, 1] - tri[:, 2], axis=-1)
    c = math.norm(tri[:, 2] - tri[:, 0], axis=-1)
    s = (a + b + c) / 2.0
    # sqrt of the clamped square: max(area, MINVAL) as MuJoCo (NaN areas included)
    area = jnp.sqrt(jnp.maximum(s * (s - a) * (s - b) * (s - c), MINVAL * MINVAL))
    flat_hit = dc < (a * b * c) / (4.0 * area)
    # circumsphere of the triangle and its centroid pushed along the normal
    q = p - nrm * h[:, None]
    v = tri - q[:, None, :]
    cr = jnp.stack([jnp.cross(v[:, 1], v[:, 2]), jnp.cross(v[:, 2], v[:, 0]),
                    jnp.cross(v[:, 0], v[:, 1])], axis=1)
    vv = jnp.sum(v * v, axis=-1)
    center = jnp.sum(cr * vv[:, :, None], axis=1)
    denom = 2.0 * jnp.sum(v[:, 0] * cr[:, 0], axis=-1)
    degenerate = jnp.abs(denom) < MINVAL
    center = center / jnp.where(degenerate, 1.0, denom)[:, None]
    r = math.norm(center, axis=-1)
    sphere_hit = jax.vmap(dist_fn)(center + q) < r
    degen_hit = dc < math.norm(e0, axis=-1)
    return jnp.where(jnp.abs(h) < 0.1, flat_hit, jnp.where(degenerate, degen_hit, sphere_hit))


def _frank_wolfe(x, corners, grad_fn, niter: int):
    """stepFrankWolfe from ``x`` (3,) over ``corners`` (3, 3): a fixed-length scan."""
    def step(x, k):
        fun = corners @ grad_fn(x)
        # argmin keeps the first of equal values (MuJoCo's strict '<')
        s = corners[jnp.argmin(fun)]
        return x + (s - x) * (2.0 / (k + 2.0)), None
    steps = jnp.arange(niter, dtype=x.dtype)
    return inline.scan(step, x, steps)[0]


def collide_pair(dist_fn, grad_fn, static, pos1, mat1, pos2, mat2, vert, bvh_aabb,
                 ninit: int, niter: int):
    """Mesh (g1) vs SDF (g2) contacts of one pair.

    ``dist_fn``/``grad_fn``: the SDF's distance and gradient at a point (3,) of g2's
    frame; ``static``: :func:`mesh_data` without the vertices; ``pos``/``mat``: world
    poses (3,), (3, 3) of the geom frames; ``vert`` (nv, 3) mesh vertices (mesh frame
    = g1's frame); ``bvh_aabb`` (num, 6) boxes of the mesh's hierarchy. Returns
    ``(dist (k,), pos (k, 3), normal (k, 3), valid (k,))`` with k = min(50, L * ninit),
    normals from g1 into g2 in the world frame, empty slots invalid with dist 1e10.
    """
    faces, leaves, anc = static
    nface = len(faces)
    ninit = max(1, ninit)
    k = min(MAXCONPAIR, nface * ninit)
    dtype = jnp.result_type(pos1, float)
    if nface == 0:
        z = jnp.zeros((0,), dtype)
        return z, jnp.zeros((0, 3), dtype), jnp.zeros((0, 3), dtype), jnp.zeros(0, bool)
    rot = mat2.T @ mat1                 # g1 frame -> g2 frame
    off = mat2.T @ (pos1 - pos2)
    # box tests of every node (boxIntersect), then AND along each leaf's path
    box = jnp.asarray(bvh_aabb, dtype)
    centers = box[:, :3] @ rot.T + off
    hit = jax.vmap(dist_fn)(centers) < math.norm(box[:, 3:], axis=-1)
    active = jnp.all(hit[anc], axis=1) & hit[leaves]
    tri = jnp.asarray(vert, dtype)[faces] @ rot.T + off          # (L, 3, 3)
    active = active & _triangle_intersect(tri, dist_fn)
    bary = jnp.asarray(_barycentric(ninit), dtype)
    starts = jnp.einsum("sk,fkd->fsd", bary, tri)                  # (L, ninit, 3)
    x = jax.vmap(jax.vmap(lambda x0, c: _frank_wolfe(x0, c, grad_fn, niter),
                          in_axes=(0, None)))(starts, tri)
    depth = jax.vmap(jax.vmap(dist_fn))(x)
    cand = (active[:, None] & (depth < 0)).reshape(-1)
    x, depth = x.reshape(-1, 3), depth.reshape(-1)
    # the first k candidates in visiting order
    take = jnp.nonzero(cand, size=k, fill_value=0)[0]
    ok = jnp.arange(k) < jnp.minimum(jnp.sum(cand), k)
    x, depth = x[take], depth[take]
    g = jax.vmap(grad_fn)(x)
    gn = math.norm(g, axis=-1)
    good = ok & (gn >= MINVAL)

    def known(accepted, i):
        sep = math.norm(x - x[i], axis=-1)
        dup = jnp.any(accepted & (sep < MINVAL))
        acc = good[i] & ~dup
        return accepted.at[i].set(acc), acc
    _, valid = inline.scan(known, jnp.zeros(k, bool), jnp.arange(k))
    nloc = -g / jnp.where(gn >= MINVAL, gn, 1.0)[:, None]
    nworld = nloc @ mat2.T
    pos = x @ mat2.T + pos2 + 0.5 * depth[:, None] * nworld
    dist = jnp.where(valid, depth, MAXVAL)
    nworld = jnp.where(valid[:, None], nworld, jnp.array([1.0, 0.0, 0.0], dtype))
    return dist, pos, nworld, valid
