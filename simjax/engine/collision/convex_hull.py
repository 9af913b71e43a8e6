"""Static hull tables of mesh geoms for the convex colliders (convex.py,
convex_polytope.py, convex_cylinder.py, convex_sphere.py), built once per model in numpy
at trace time and cached by the meshes' vertex data.

- ``mesh_table``: per mesh, its convex hull's vertices, merged face normals and unique
  edge directions (the SAT axes), vertex adjacency, the hull's support values along its
  own face normals, and the hull polygons for multi-contact (clipping order, polygons at
  each vertex), formed as MuJoCo's compiler does (mjCMesh::MakePolygons, user_mesh.cc:
  hull triangles grouped by normal angles rounded to POLY_ANGLE_TOL, boundary traced per
  island).
- ``plane_table``: the lighter tables plane-mesh contacts read (mjc_PlaneConvex,
  engine_collision_convex.c): hull vertices and, per vertex and polygon at it, the
  greedy largest-area quadrilateral anchored there (what MuJoCo's polygonQuad picks).
- ``attach_meshes``: gives the mesh geoms of a collider group the rows of these tables
  they read.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from simjax.engine.collision import convex_edges
from simjax.types import GeomType as GT

_MESH_CACHE: dict = {}


def _hull(verts):
    """Hull vertices, merged face normals, unique edge directions, vertex adjacency."""
    from scipy.spatial import ConvexHull
    try:
        hull = ConvexHull(verts)
    except Exception:  # degenerate (flat) mesh: keep every vertex, no faces
        return verts, np.zeros((0, 3)), np.zeros((0, 3)), [[] for _ in verts], \
            np.arange(len(verts))
    idx = np.asarray(hull.vertices)
    remap = -np.ones(len(verts), np.int64)
    remap[idx] = np.arange(len(idx))
    normals = []
    for eq in hull.equations:
        n = eq[:3]
        if not any(np.dot(n, q) > 1 - 1e-9 for q in normals):
            normals.append(n)
    edges, adj = set(), [set() for _ in idx]
    for s in hull.simplices:
        for a, b in ((s[0], s[1]), (s[1], s[2]), (s[2], s[0])):
            ra, rb = remap[a], remap[b]
            adj[ra].add(rb)
            adj[rb].add(ra)
            edges.add((min(ra, rb), max(ra, rb)))
    hv = verts[idx]
    dirs = []
    for a, b in sorted(edges):
        e = hv[b] - hv[a]
        e = e / max(np.linalg.norm(e), 1e-300)
        if not any(abs(np.dot(e, q)) > 1 - 1e-9 for q in dirs):
            dirs.append(e)
    return hv, np.asarray(normals).reshape(-1, 3), np.asarray(dirs).reshape(-1, 3), \
        [sorted(a) for a in adj], idx


def _cross3(u, w):
    """Cross product of two 3-vectors in plain floats (np.cross costs microseconds per
    call, too slow for the hulls of large meshes)."""
    u0, u1, u2 = (float(x) for x in u)
    w0, w1, w2 = (float(x) for x in w)
    return (u1 * w2 - u2 * w1, u2 * w0 - u0 * w2, u0 * w1 - u1 * w0)


def _quad(hv, ids, a):
    """Greedy largest-area quadrilateral of polygon ``ids`` anchored at position ``a``
    (the anchor's three partners; a polygon of at most four vertices is kept whole)."""
    n = len(ids)
    if n <= 4:
        return [ids[(a + k) % n] for k in range(1, n)]

    pts = [tuple(float(x) for x in hv[v]) for v in ids]

    def area(i, j, k, q):
        u = [x - y for x, y in zip(pts[i], pts[k])]
        w = [x - y for x, y in zip(pts[j], pts[q])]
        return 0.5 * math.sqrt(sum(c * c for c in _cross3(u, w)))

    b, c, d = (a + 1) % n, (a + 2) % n, (a + 3) % n
    best = area(a, b, c, d)
    while True:
        dn = (d + 1) % n
        if area(a, b, c, dn) <= best:
            break
        d, best = dn, area(a, b, c, dn)
        while area(a, b, (c + 1) % n, d) > best:
            c = (c + 1) % n
            best = area(a, b, c, d)
        while area(a, (b + 1) % n, c, d) > best:
            b = (b + 1) % n
            best = area(a, b, c, d)
    return [ids[b], ids[c], ids[d]]


#: MuJoCo's polygon grouping tolerance (radians) for hull triangles (mjCMesh::MakePolygons)
POLY_ANGLE_TOL = 0.01


def _mj_polygons(hv):
    """Hull polygons as MuJoCo's compiler forms them (mjCMesh::MakePolygons): hull
    triangles grouped by their normal's azimuth/polar angles rounded to POLY_ANGLE_TOL,
    each group's boundary traced into counter-clockwise vertex cycles (one per connected
    island). The normal is that of the first three cycle vertices.
    Returns [(normal, [vertex ids])]."""
    from scipy.spatial import ConvexHull
    try:
        hull = ConvexHull(hv)
    except Exception:
        return []
    # every hull triangle at once (vectorised: meshes of SDF geoms have ~1e5)
    tri = np.asarray(hull.simplices, np.int64).copy()
    n = np.cross(hv[tri[:, 1]] - hv[tri[:, 0]], hv[tri[:, 2]] - hv[tri[:, 0]])
    flip = np.sum(n * hull.equations[:, :3], axis=1) < 0
    tri[flip] = tri[flip][:, [0, 2, 1]]
    n[flip] = -n[flip]
    norm = np.linalg.norm(n, axis=1)
    keep = norm >= 1e-15
    tri, n = tri[keep], n[keep] / norm[keep, None] + 0.0
    polar = np.abs(n[:, 2]) > 1 - 1e-7
    k0 = np.where(polar, 0.0, np.round(np.arctan2(n[:, 1], n[:, 0]) / POLY_ANGLE_TOL))
    k1 = np.where(polar, np.where(n[:, 2] < 0, np.round(np.pi / POLY_ANGLE_TOL), 0.0),
                  np.round(np.arccos(np.clip(n[:, 2], -1, 1)) / POLY_ANGLE_TOL))
    groups = {}
    for key, t in zip(zip(k0.tolist(), k1.tolist()), tri.tolist()):
        groups.setdefault(key, []).append(tuple(t))
    paths = []
    for tris in groups.values():
        if len(tris) == 1:                   # most groups: one triangle, from its min
            t = tris[0]
            k = t.index(min(t))
            paths.append([t[k], t[(k + 1) % 3], t[(k + 2) % 3]])
            continue
        edges = set()
        for a, b, c in tris:
            edges.update(((a, b), (b, c), (c, a)))
        succ = {}
        for u, v in edges:
            if (v, u) not in edges:
                succ.setdefault(u, []).append(v)
        seen = set()
        for start in sorted(succ):
            if start in seen:
                continue
            path, u = [start], start
            seen.add(start)
            while True:
                nxt = [v for v in succ.get(u, []) if v not in seen or v == start]
                if not nxt:
                    break
                u = nxt[0]
                if u == start:
                    break
                path.append(u)
                seen.add(u)
            if len(path) >= 3:
                paths.append(path)
    if not paths:
        return []
    first = np.asarray([p[:3] for p in paths])
    p0, p1, p2 = hv[first[:, 0]], hv[first[:, 1]], hv[first[:, 2]]
    nrm = np.cross(p1 - p0, p2 - p0)
    nrm = nrm / np.maximum(np.sqrt(np.sum(nrm * nrm, axis=1)), 1e-300)[:, None]
    return list(zip(nrm, paths))


def _clip_tables(hulls, V):
    """Per-mesh polygon tables for multi-contact: fvert (nmesh, F, PV) hull-vertex ids
    in clipping order (clockwise about the outward normal, as MuJoCo walks them), fnum
    (nmesh, F), fnormal (nmesh, F, 3), vface (nmesh, V, D) polygons at each vertex
    (-1 padded), npoly (nmesh,)."""
    polys = [_mj_polygons(hv) for hv in hulls]
    F = max([1] + [len(p) for p in polys])
    PV = max([3] + [len(ids) for p in polys for _, ids in p])
    D = 1
    vf = []
    for hv, p in zip(hulls, polys):
        lst = [[] for _ in range(len(hv))]
        for k, (_, ids) in enumerate(p):
            for v in ids:
                lst[v].append(k)
        D = max([D] + [len(x) for x in lst])
        vf.append(lst)
    nm = len(hulls)
    fvert = -np.ones((nm, F, PV), np.int64)
    fnum = np.zeros((nm, F), np.int64)
    fnormal = np.zeros((nm, F, 3))
    vface = -np.ones((nm, V, D), np.int64)
    for i, p in enumerate(polys):
        for k, (n, ids) in enumerate(p):
            fvert[i, k, :len(ids)] = ids[::-1]
            fnum[i, k] = len(ids)
            fnormal[i, k] = n
        for v, lst in enumerate(vf[i]):
            vface[i, v, :len(lst)] = lst
    return dict(fvert=fvert, fnum=fnum, fnormal=fnormal, vface=vface,
                npoly=np.asarray([len(p) for p in polys], np.int64))


def _mesh_key(m):
    """Cache key of a model's mesh vertex data (the static tables depend on nothing else)."""
    return (m.nmesh, hash(np.asarray(m.mesh_vert).tobytes()),
            hash(np.asarray(m.mesh_vertadr).tobytes()))


def _mesh_vertices(m):
    """Each mesh's vertices (float64, (vertnum, 3)), in mesh order."""
    verts = np.asarray(m.mesh_vert, np.float64).reshape(-1, 3)
    vadr, vnum = np.asarray(m.mesh_vertadr), np.asarray(m.mesh_vertnum)
    return [verts[vadr[i]:vadr[i] + vnum[i]] for i in range(m.nmesh)]


def _mesh_ids(m, ids):
    """The mesh ids a table covers, as a tuple (every mesh when ``ids`` is None)."""
    return tuple(range(m.nmesh)) if ids is None else tuple(int(i) for i in ids)


def mesh_table(m, ids=None):
    """Static padded hull data of the meshes ``ids`` (every mesh when None), row k for
    mesh ``ids[k]``, padded to the largest of these meshes only (so a collider group
    pays for its own meshes, not the model's largest): vert (n, V, 3), normal
    (n, F, 3), edge (n, E, 3), adj (n, V, D) (-1 padded), counts."""
    ids = _mesh_ids(m, ids)
    key = (_mesh_key(m), ids)
    tab = _MESH_CACHE.get(key)
    if tab is not None:
        return tab
    allv = _mesh_vertices(m)
    hulls = [_hull(allv[i]) for i in ids]
    nmesh = len(ids)
    V = max(len(h[0]) for h in hulls)
    F = max(max(len(h[1]) for h in hulls), 1)
    E = max(max(len(h[2]) for h in hulls), 1)
    D = max(max((len(a) for a in h[3]), default=1) for h in hulls)
    polys = [_mj_polygons(h[0]) if len(h[1]) else [] for h in hulls]
    PV = max([1] + [sum(v in ids for _, ids in pl) for pl, h in zip(polys, hulls)
                    for v in range(len(h[0]))])
    pnorm = np.zeros((nmesh, V, PV, 3))              # padding: masked by pquad < 0
    pquad = -np.ones((nmesh, V, PV, 3), np.int64)
    for i, pl in enumerate(polys):
        cnt = np.zeros(V, np.int64)
        for n, ids in pl:
            for pos, v in enumerate(ids):
                q = _quad(hulls[i][0], ids, pos)
                pnorm[i, v, cnt[v]] = n
                pquad[i, v, cnt[v], :len(q)] = q
                cnt[v] += 1
    vert = np.zeros((nmesh, V, 3))
    nrm = np.zeros((nmesh, F, 3))
    edg = np.zeros((nmesh, E, 3))
    adj = -np.ones((nmesh, V, D), np.int64)
    for i, (hv, hn, he, ha, _) in enumerate(hulls):
        vert[i] = hv[np.minimum(np.arange(V), len(hv) - 1)]        # pad: repeat
        if len(hn):
            nrm[i] = hn[np.minimum(np.arange(F), len(hn) - 1)]
        if len(he):
            edg[i] = he[np.minimum(np.arange(E), len(he) - 1)]
        for v, a in enumerate(ha):
            adj[i, v, :len(a)] = a
    # support values of each hull along its own face normals (+n, -n): static in the
    # mesh frame, so SAT scoring of these directions needs no (directions x vertices)
    # product at run time
    hface = np.zeros((nmesh, F, 2))
    for i in range(nmesh):
        pr = nrm[i] @ hulls[i][0].T                                 # (F, nv)
        hface[i] = np.stack([pr.max(1), (-pr).max(1)], 1)
    tab = dict(vert=vert, normal=nrm, edge=edg, adj=adj, pnorm=pnorm, pquad=pquad,
               hface=hface, nvert=np.asarray([len(h[0]) for h in hulls]))
    tab.update(_clip_tables([h[0] for h in hulls], V))
    _MESH_CACHE[key] = tab
    return tab


_PLANE_CACHE: dict = {}


def _hull_vertices(verts):
    from scipy.spatial import ConvexHull
    try:
        return verts[np.asarray(ConvexHull(verts).vertices)]
    except Exception:  # degenerate (flat) mesh: keep every vertex
        return verts


def plane_table(m, ids=None):
    """Static padded hull data for plane-mesh contacts only (what plane_convex reads),
    row k for mesh ``ids[k]`` (every mesh when None): vert (n, V, 3) hull vertices,
    and per vertex and hull polygon at it the polygon's normal pnorm (n, V, PV, 3) and
    the three partners of its greedy quadrilateral pquad (n, V, PV, 3) (-1 padded).
    Lighter than mesh_table (no edge or face-normal deduplication), so it serves large
    meshes such as the meshes of SDF geoms (tens of thousands of vertices)."""
    ids = _mesh_ids(m, ids)
    key = (_mesh_key(m), ids)
    tab = _PLANE_CACHE.get(key)
    if tab is not None:
        return tab
    allv = _mesh_vertices(m)
    hulls = [_hull_vertices(allv[i]) for i in ids]
    nmesh = len(ids)
    polys = [_mj_polygons(hv) for hv in hulls]
    V = max(len(hv) for hv in hulls)
    cnt = [np.zeros(len(hv), np.int64) for hv in hulls]
    for c, pl in zip(cnt, polys):
        for _, ids in pl:
            np.add.at(c, np.asarray(ids), 1)
    PV = max([1] + [int(c.max(initial=0)) for c in cnt])
    pnorm = np.zeros((nmesh, V, PV, 3))              # padding: masked by pquad < 0
    pquad = -np.ones((nmesh, V, PV, 3), np.int64)
    vert = np.zeros((nmesh, V, 3))
    for i, (hv, pl) in enumerate(zip(hulls, polys)):
        vert[i] = hv[np.minimum(np.arange(V), len(hv) - 1)]        # pad: repeat
        c = np.zeros(V, np.int64)
        for n, ids in pl:
            for pos, v in enumerate(ids):
                q = _quad(hv, ids, pos)
                pnorm[i, v, c[v]] = n
                pquad[i, v, c[v], :len(q)] = q
                c[v] += 1
    tab = dict(vert=vert, pnorm=pnorm, pquad=pquad)
    _PLANE_CACHE[key] = tab
    return tab


_SIZE_CACHE: dict = {}


def hull_sizes(m):
    """(nmesh,) vertex count of each mesh's convex hull (numpy; cached per mesh data)."""
    key = _mesh_key(m)
    out = _SIZE_CACHE.get(key)
    if out is None:
        out = np.asarray([len(_hull_vertices(v)) for v in _mesh_vertices(m)], np.int64)
        _SIZE_CACHE[key] = out
    return out


def _cast(xp, x, ftype):
    """Table ``x`` as an ``xp`` array, floats in ``ftype``."""
    return xp.asarray(x, ftype) if x.dtype.kind == "f" else xp.asarray(x)


def attach_meshes(m, fn, geo1, geo2, i1, i2, ftype, geoms=None, traced=False):
    """Give mesh geoms of a convex collider group their hull data (vert, extra).

    ``geoms``: the group's candidate geom ids (g1, g2) (static numpy); the tables then
    cover the group's meshes only (padded to the largest of them), else every mesh.
    ``traced``: the pairs are those of the geom ids ``i1``, ``i2`` (traced: a chunk of
    a group's passing pairs), gathered at run time, not the static ``geoms``.
    A collider with a ``mesh_tables`` attribute (``(table builder, names)``) gets
    those tables instead of the SAT ones."""
    types = getattr(fn, "types", None)
    if not types or GT.MESH not in types:
        return geo1, geo2
    dataid_np = np.asarray(m.geom_dataid)
    ids = None
    if geoms is not None:
        ids = sorted({int(dataid_np[g]) for t, gs in zip(types, geoms) if t == GT.MESH
                      for g in np.asarray(gs)})
    local = np.zeros(max(m.nmesh, 1), np.int64)
    local[list(_mesh_ids(m, ids))] = np.arange(len(_mesh_ids(m, ids)))
    plane = types[0] == GT.PLANE
    if hasattr(fn, "mesh_tables"):
        build, names = fn.mesh_tables
        tab = build(m, ids)
    elif plane:
        tab, names = plane_table(m, ids), ("pnorm", "pquad")
    else:
        tab = mesh_table(m, ids)
        names = ("normal", "edge", "hface", "fvert", "fnum", "fnormal", "vface", "npoly",
                 "nvert")
        counts = [tab["edge"].shape[1] if t == GT.MESH else 3 for t in types]
        if convex_edges.uses_search(*types, *counts):
            hulls = [v[:n] for v, n in zip(tab["vert"], tab["nvert"])]
            key = (_mesh_key(m), _mesh_ids(m, ids))
            tab = {**tab, **convex_edges.edge_table(hulls, key)}
            names += convex_edges.NAMES
    # row of each geom's mesh in the tables (static when the geoms are)
    lid = local[np.maximum(dataid_np, 0)]
    out = []
    for t, geo, ig, gs in zip(types, (geo1, geo2), (i1, i2), geoms or (None, None)):
        if t == GT.MESH:
            # only the tables this collider reads: the pairs' rows taken in NumPy when
            # the geoms are static (a constant; gathered in the program, each table's
            # rows were a kernel), else gathered by mesh row at run time
            if isinstance(gs, np.ndarray) and not traced:
                mid, xp = lid[gs], np
            else:
                mid, xp = jnp.asarray(lid)[ig], jnp
            extra = {k: _cast(xp, tab[k], ftype)[mid] for k in names}
            vert = _cast(xp, tab["vert"], ftype)[mid] if "vert" in tab else None
            geo = geo._replace(vert=vert, extra={**(geo.extra or {}), **extra})
        out.append(geo)
    return tuple(out)
