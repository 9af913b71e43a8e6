"""Bounding volume hierarchies of bodies and meshes (numpy only).

MuJoCo's compiler (``mjCBoundingVolumeHierarchy``, user_objects.cc) builds one binary
tree per body (leaves: the body's colliding geoms, boxes in the body's inertial frame)
and one per mesh (leaves: the mesh's faces, boxes in the mesh frame). The tree is
built top down:

- a node's box is the axis-aligned box of its elements' boxes (each element box is
  given as centre and half sizes; its 8 corners, rotated by the element's orientation
  and moved by its position relative to the tree frame when the element has one),
  inflated by ``mjEPS`` along flat axes, stored as centre and half sizes;
- a node with one element is a leaf holding the element's id;
- otherwise the elements are split at the median (``n // 2`` go left) along the node's
  longest axis (a later axis wins only when longer by at least ``mjEPS``), ordered by
  the position of the element's reference point (geom position, face circumcentre) in
  the tree frame, positions within ``mjEPS`` ordered by element index;
- nodes are numbered in depth-first pre-order, left subtree first.

The median split's order is total wherever positions are not chained by near ties (a
within mjEPS of b within mjEPS of c, with a and c further apart), so the tree does not
depend on how the partial sort (``std::nth_element``) arranges elements; positions
within mjEPS of their neighbour in sorted order are taken as one cluster ordered by
element index. Every floating-point
operation is done in the order MuJoCo does it, so the boxes agree bit for bit.

:func:`build` returns a :class:`Tree` (the mjModel rows of one hierarchy);
:func:`mesh_tree` and :func:`body_tree` prepare the elements of a mesh and a body.
"""
from __future__ import annotations

import dataclasses
import numpy as np

_MJEPS = 1e-14        # mjEPS of the compiler (user_util.h)


@dataclasses.dataclass
class Tree:
    """One hierarchy in mjModel layout: ``aabb`` (n, 6) centre and half sizes (bvh_aabb),
    ``child`` (n, 2) local node ids, -1 for none (bvh_child), ``nodeid`` (n,) element id
    of leaves, -1 for inner nodes (bvh_nodeid), ``depth`` (n,) level (bvh_depth)."""

    aabb: np.ndarray
    child: np.ndarray
    nodeid: np.ndarray
    depth: np.ndarray

    @property
    def n(self) -> int:
        return len(self.nodeid)


def empty() -> Tree:
    return Tree(np.zeros((0, 6)), np.zeros((0, 2), np.int32), np.zeros(0, np.int32),
                np.zeros(0, np.int32))


def rot_vec_quat(vec: np.ndarray, q) -> np.ndarray:
    """Rotate rows of ``vec`` (k, 3) by unit quaternion ``q`` (mjuu_rotVecQuat's
    arithmetic, including its zero-vector and identity shortcuts)."""
    vec = np.asarray(vec, np.float64)
    if q[0] == 1 and q[1] == 0 and q[2] == 0 and q[3] == 0:
        return vec.copy()
    x, y, z = vec[:, 0], vec[:, 1], vec[:, 2]
    t0 = q[0] * x + q[2] * z - q[3] * y
    t1 = q[0] * y + q[3] * x - q[1] * z
    t2 = q[0] * z + q[1] * y - q[2] * x
    res = np.stack([x + 2 * (q[2] * t2 - q[3] * t1),
                    y + 2 * (q[3] * t0 - q[1] * t2),
                    z + 2 * (q[1] * t1 - q[2] * t0)], axis=1)
    zero = (x == 0) & (y == 0) & (z == 0)
    res[zero] = 0.0
    return res


def build(ids, aabb, pos, quat=None, ipos=(0.0, 0.0, 0.0),
          iquat=(1.0, 0.0, 0.0, 0.0)) -> Tree:
    """Hierarchy of elements ``ids`` (n,) with boxes ``aabb`` (n, 6) (centre, half
    sizes, element frame), reference points ``pos`` (n, 3) and orientations ``quat``
    (n, 4) or None (boxes already in the tree's parent frame), for a tree whose frame
    is (``ipos``, ``iquat``) in that parent frame (MakeBVH)."""
    ids = np.asarray(ids, np.int64)
    n = len(ids)
    if n == 0:
        return empty()
    aabb = np.asarray(aabb, np.float64).reshape(n, 6)
    pos = np.asarray(pos, np.float64).reshape(n, 3)
    ipos = np.asarray(ipos, np.float64)
    qinv = (iquat[0], -iquat[1], -iquat[2], -iquat[3])
    lpos = rot_vec_quat(pos - ipos, qinv)
    # element boxes as min / max corners in the tree frame
    lo_c = aabb[:, :3] - aabb[:, 3:]
    hi_c = aabb[:, :3] + aabb[:, 3:]
    corners = np.stack([np.where(np.array([v & 1, v & 2, v & 4], bool), hi_c, lo_c)
                        for v in range(8)], axis=1)            # (n, 8, 3)
    if quat is not None:
        quat = np.asarray(quat, np.float64).reshape(n, 4)
        rel = pos - ipos
        out = np.empty_like(corners)
        for i in range(n):
            box = rot_vec_quat(corners[i], quat[i]) + rel[i]
            out[i] = rot_vec_quat(box, qinv)
        corners = out
    elo, ehi = corners.min(axis=1), corners.max(axis=1)

    return _levels(ids, elo, ehi, lpos)


def _levels(ids, elo, ehi, lpos) -> Tree:
    """MakeBVH, one tree level at a time: every node of a level is a run of the element
    permutation ``perm``; its pre-order index follows from its parent's (a node of k
    elements roots 2k - 1 nodes, so a right child comes 2m after its parent)."""
    n = len(ids)
    nnode = 2 * n - 1
    aabb = np.zeros((nnode, 6))
    child = np.full((nnode, 2), -1, np.int32)
    nodeid = np.full(nnode, -1, np.int32)
    depth = np.zeros(nnode, np.int32)
    perm = np.arange(n)
    start, size, pre = np.array([0]), np.array([n]), np.array([0])
    nan_el = np.isnan(lpos).any(axis=1)
    rank = np.concatenate([_rank(lpos[:, ax]) for ax in range(3)])
    elo_t, ehi_t = np.ascontiguousarray(elo.T), np.ascontiguousarray(ehi.T)

    def nan_seg(order, start, size):
        hit = np.concatenate([[0], np.cumsum(nan_el[order])])
        return hit[start + size] > hit[start]
    lev = 0
    while len(start):
        lo, hi = _segment_minmax(elo_t, ehi_t, perm, start, size)
        flat = np.abs(lo - hi) < _MJEPS
        lo = np.where(flat, lo - _MJEPS, lo)
        hi = np.where(flat, hi + _MJEPS, hi)
        aabb[pre] = np.concatenate([(hi + lo) / 2, (hi - lo) / 2], axis=1)
        depth[pre] = lev
        leaf = size == 1
        nodeid[pre[leaf]] = ids[perm[start[leaf]]]
        inner = ~leaf
        start, size, pre, lo, hi = start[inner], size[inner], pre[inner], lo[inner], hi[inner]
        if not len(start):
            break
        edges = hi - lo
        axis = np.zeros(len(start), np.int64)
        axis = np.where(edges[:, 1] >= edges[:, 0] + _MJEPS, 1, axis)
        axis = np.where(edges[:, 2] >= edges[np.arange(len(start)), axis] + _MJEPS, 2, axis)
        perm_before = perm.copy()
        # order each inner run by its elements' rank along the run's axis
        seg = np.repeat(np.arange(len(start)), size)
        pos = _runs(start, size)
        el = perm[pos]
        perm[pos] = el[np.argsort(seg * n + rank[axis[seg] * n + el])]
        m = size // 2
        # runs holding an element without a position (a degenerate face's circumcentre
        # is NaN): MuJoCo's comparator is no ordering there, so the split is whatever
        # std::nth_element makes of the run in its current order; redo those exactly
        if nan_el.any():
            for r in np.nonzero(nan_seg(perm_before, start, size))[0]:
                a, k = int(start[r]), int(size[r])
                run = list(perm_before[a:a + k])
                nth_element(run, int(m[r]), _comparator(lpos[:, int(axis[r])]))
                perm[a:a + k] = run
        child[pre, 0] = pre + 1
        child[pre, 1] = pre + 2 * m
        start = np.concatenate([start, start + m])
        size = np.concatenate([m, size - m])
        pre = np.concatenate([pre + 1, pre + 2 * m])
        lev += 1
    return Tree(aabb, child, nodeid, depth)


def _rank(key: np.ndarray) -> np.ndarray:
    """Rank (n,) of each element in MuJoCo's element order along one axis: by position,
    positions within mjEPS of their neighbour in sorted order (clusters) by element
    index, as are equal positions."""
    n = len(key)
    order = np.argsort(key, kind="stable")
    gap = np.diff(key[order])
    if np.any((gap > 0) & (gap <= _MJEPS)):
        new = np.ones(n, bool)
        new[1:] = ~(gap <= _MJEPS)
        order = order[np.lexsort((order, np.cumsum(new)))]
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    return rank


def _comparator(key: np.ndarray):
    """MuJoCo's element order along one axis: ``less(i, j)`` for element indices."""
    key = key.tolist()

    def less(i, j):
        a, b = key[i], key[j]
        if abs(a - b) > _MJEPS:
            return a < b
        return i < j
    return less


def nth_element(v: list, nth: int, less) -> None:
    """``std::nth_element(v.begin(), v.begin() + nth, v.end(), less)`` in place, step for
    step as LLVM's libc++ does it (the C++ library MuJoCo's Linux builds link), so that
    the result is the same for comparators that are no strict weak ordering: median of
    first, middle and last; a partition that keeps elements equivalent to the median
    out of the lower part; selection sort for up to 7 elements."""
    first, last = 0, len(v)

    def swap(i, j):
        v[i], v[j] = v[j], v[i]

    def sort3(x, y, z):
        if not less(v[y], v[x]):
            if not less(v[z], v[y]):
                return 0
            swap(y, z)
            if less(v[y], v[x]):
                swap(x, y)
                return 2
            return 1
        if less(v[z], v[y]):
            swap(x, z)
            return 1
        swap(x, y)
        if less(v[z], v[y]):
            swap(y, z)
            return 2
        return 1

    while True:
        if nth == last:
            return
        n = last - first
        if n <= 1:
            return
        if n == 2:
            if less(v[last - 1], v[first]):
                swap(first, last - 1)
            return
        if n == 3:
            sort3(first, first + 1, last - 1)
            return
        if n <= 7:
            for f in range(first, last - 1):
                k = f
                for j in range(f + 1, last):
                    if less(v[j], v[k]):
                        k = j
                if k != f:
                    swap(f, k)
            return
        m = first + n // 2
        lm1 = last - 1
        nswap = sort3(first, m, lm1)
        i, j = first, lm1
        if not less(v[i], v[m]):
            # the first element is not below the median: look for a guard from above
            found = False
            while True:
                j -= 1
                if i == j:
                    break
                if less(v[j], v[m]):
                    found = True
                    break
            if found:
                swap(i, j)
                nswap += 1
            else:
                # nothing below the median: split into [== first) and (> first]
                i = first + 1
                j = last - 1
                if not less(v[first], v[j]):
                    while True:
                        if i == j:
                            return
                        if less(v[first], v[i]):
                            swap(i, j)
                            nswap += 1
                            i += 1
                            break
                        i += 1
                if i == j:
                    return
                while True:
                    while not less(v[first], v[i]):
                        i += 1
                    j -= 1
                    while less(v[first], v[j]):
                        j -= 1
                    if i >= j:
                        break
                    swap(i, j)
                    nswap += 1
                    i += 1
                if nth < i:
                    return
                first = i
                continue
        i += 1
        if i < j:
            while True:
                while less(v[i], v[m]):
                    i += 1
                j -= 1
                while not less(v[j], v[m]):
                    j -= 1
                if i >= j:
                    break
                swap(i, j)
                nswap += 1
                if m == i:
                    m = j
                i += 1
        if i != m and less(v[m], v[i]):
            swap(i, m)
            nswap += 1
        if nth == i:
            return
        if nswap == 0:
            # already partitioned: done if the part holding nth is sorted
            lo, hi = (first, i) if nth < i else (i, last)
            k, prev = lo, lo
            done = False
            while True:
                k += 1
                if k == hi:
                    done = True
                    break
                if less(v[k], v[prev]):
                    break
                prev = k
            if done:
                return
        if nth < i:
            last = i
        else:
            first = i + 1


def _runs(start, size):
    """Concatenation of arange(start[i], start[i] + size[i])."""
    total = int(size.sum())
    off = np.repeat(start - np.concatenate([[0], np.cumsum(size)[:-1]]), size)
    return np.arange(total) + off


def _segment_minmax(elo_t, ehi_t, perm, start, size):
    """Min of ``elo`` and max of ``ehi`` (given transposed, (3, n)) over each run of
    ``perm``: (k, 3) each."""
    idx = perm[_runs(start, size)]
    bounds = np.concatenate([[0], np.cumsum(size)[:-1]])
    lo = np.stack([np.minimum.reduceat(np.take(r, idx), bounds) for r in elo_t], axis=1)
    hi = np.stack([np.maximum.reduceat(np.take(r, idx), bounds) for r in ehi_t], axis=1)
    return lo, hi


def face_centers(dvert: np.ndarray, face: np.ndarray) -> np.ndarray:
    """Circumcentres of the faces (mjCMesh::MakeCenter), (nface, 3)."""
    v0, v1, v2 = dvert[face[:, 0]], dvert[face[:, 1]], dvert[face[:, 2]]
    a, b = v0 - v2, v1 - v2

    def cross(u, v):
        return np.stack([u[:, 1] * v[:, 2] - u[:, 2] * v[:, 1],
                         u[:, 2] * v[:, 0] - u[:, 0] * v[:, 2],
                         u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0]], axis=1)

    def dot(u, v):
        return u[:, 0] * v[:, 0] + u[:, 1] * v[:, 1] + u[:, 2] * v[:, 2]

    nrm = cross(a, b)
    na2, nb2 = dot(a, a), dot(b, b)
    area = np.sqrt(dot(nrm, nrm))
    vec = na2[:, None] * b - nb2[:, None] * a
    res = cross(vec, nrm)
    with np.errstate(invalid="ignore", divide="ignore"):
        return res / ((2 * area) * area)[:, None] + v2


def mesh_tree(dvert: np.ndarray, face: np.ndarray) -> Tree:
    """Hierarchy of a mesh's faces from its processed double-precision vertices
    (mjCMesh::SetBoundingVolume + CreateBVH): leaf ids are face indices."""
    face = np.asarray(face, np.int64)
    if len(face) == 0:
        return empty()
    tri = dvert[face]                                           # (nface, 3, 3)
    lo, hi = tri.min(axis=1), tri.max(axis=1)
    aabb = np.concatenate([.5 * (lo + hi), .5 * (hi - lo)], axis=1)
    return build(np.arange(len(face)), aabb, face_centers(dvert, face))


def body_tree(geom_ids, contype, conaffinity, pos, quat, aabb, ipos, iquat) -> Tree:
    """Hierarchy of a body's geoms (mjCBody::ComputeBVH): geoms with contype and
    conaffinity both 0 are left out; leaf ids are geom ids. ``pos``/``quat``: geom
    frames in the body frame; ``aabb``: geom boxes in the geom frame; ``ipos``/``iquat``:
    the body's inertial frame."""
    keep = (np.asarray(contype) != 0) | (np.asarray(conaffinity) != 0)
    if not np.any(keep):
        return empty()
    return build(np.asarray(geom_ids)[keep], np.asarray(aabb)[keep], np.asarray(pos)[keep],
                 np.asarray(quat)[keep], ipos, iquat)
