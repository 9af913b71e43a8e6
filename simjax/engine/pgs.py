"""Dual constraint solvers (MuJoCo's engine_solver): projected Gauss-Seidel (mj_solPGS)
and the noslip post-pass (mj_solNoSlip), with their block subproblems (mju_QCQP, the
friction-ellipsoid projection).

Both work on the dual problem of the convex constraint problem of
:mod:`simjax.engine.solver`: with AR = J M^-1 J' + diag(R) and b = J qacc_smooth - aref,

    f* = argmin_f  0.5 f' AR f + f' b   s.t. f in the friction / cone sets,

and qacc = qacc_smooth + M^-1 J' f*. ``p`` is the problem dictionary of
``solver._problem`` (plus ``efc_b``); ``spec`` its static row structure (``solver.Spec``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline, math
from simjax.engine.constraint import CONTACT_KINDS
from simjax.engine.math import reduce_fused, where
from simjax.engine.solver_worlds import any_world

MINVAL = 1e-15


def _ell_rows(x, start, n, dim):
    return x[start:start + n * dim].reshape(n, dim)


# --------------------------------------------------------------------------- dense algebra
def cholesky(a):
    """Lower Cholesky factor of a symmetric positive definite (n, n) matrix (pure JAX,
    one column per loop step; no LAPACK custom call)."""
    n = a.shape[-1]
    idx = jnp.arange(n)

    def body(j, low):
        v = a[:, j] - low @ low[j]
        djj = jnp.sqrt(math.maximum(v[j], MINVAL))
        return low.at[:, j].set(where(idx >= j, v / djj, 0.0))

    return inline.fori_loop(0, n, body, jnp.zeros_like(a))


def cho_solve(low, b):
    """Solve (L L') x = b for the factor of :func:`cholesky`; b (n,)."""
    n = low.shape[-1]

    def fwd(i, y):
        return y.at[i].set((b[i] - low[i] @ y) / low[i, i])

    y = inline.fori_loop(0, n, fwd, jnp.zeros_like(b))

    def bwd(k, x):
        i = n - 1 - k
        return x.at[i].set((y[i] - low[:, i] @ x) / low[i, i])

    return inline.fori_loop(0, n, bwd, jnp.zeros_like(b))


# --------------------------------------------------------------------------- PGS
def _ar(p):
    """AR = J M^-1 J' + diag(R) (mj_makeAR, dense)."""
    minvjt = p["solve_m"](p["J"].T)
    return p["J"] @ minvjt + jnp.diag(p["R"])


def _qcqp(a, b, d, r):
    """min 0.5 x'Ax + x'b  s.t.  sum (x_i/d_i)^2 <= r^2 (mju_QCQP): (x, constrained)."""
    n = b.shape[-1]
    bs = b * d
    As = a * d[:, None] * d[None, :]
    eye = jnp.eye(n, dtype=b.dtype)

    def step(la):
        al = As + la * eye
        low = cholesky(al)
        ok = jnp.all(jnp.diag(low) ** 2 > 1e-10) & jnp.all(jnp.isfinite(low))
        x = -cho_solve(low, bs)
        val = jnp.dot(x, x) - r * r
        tmp = cho_solve(low, x)
        deriv = -2.0 * jnp.dot(x, tmp)
        return x, ok, val, deriv

    def body(i, s):
        la, x, done, fail = s
        xn, ok, val, deriv = step(la)
        fail_now = ~done & ~ok
        stop = val < 1e-10
        delta = -val / where(deriv == 0, -1.0, deriv)
        small = delta < 1e-10
        x = where(done, x, xn)
        newla = where(done | stop | small | fail_now, la, la + delta)
        return newla, x, done | stop | small | fail_now, fail | fail_now

    la, x, _, fail = inline.fori_loop(0, 20, body, (jnp.zeros((), b.dtype), jnp.zeros_like(b),
                                                    jnp.zeros((), bool), jnp.zeros((), bool)))
    x = where(fail, 0.0, x * d)
    return x, (la != 0) & ~fail


def _project_ellipsoid(fric, normal, mu, feasible):
    """Friction ``fric`` (dim-1,) scaled onto the ellipsoid sum (f_j / mu_j)^2 = normal^2
    (projectEllipsoid); with ``feasible`` (a static bool) only when it lies outside."""
    s = jnp.sum(fric * fric / (mu * mu))
    scl = jnp.sqrt(normal * normal / math.maximum(MINVAL, s))
    do = (s > normal * normal) | (not feasible)
    return where(do, fric * scl, fric)


# --------------------------------------------------------------------------- visit order
# MuJoCo's PGS (solPGS) sweeps the constraint blocks (a scalar row, or all rows of an
# elliptic contact) of each island in a random order: before every sweep the block list
# is shuffled again in place (Fisher-Yates) with a PCG32 generator seeded identically
# for every island solve. In the natural order, Gauss-Seidel with Nesterov momentum can
# stall far from the optimum (measured: improvement stuck near 1 on legged robots with
# pyramidal contacts after 1000 sweeps), so the order is part of the method. simjax
# reproduces it exactly: the blocks of each island in MuJoCo's efc order (equality rows
# by id, friction loss (dofs, then tendons), limits (joints, then tendons), contacts in
# mj_collision's order), the same generator and shuffle, and islands (mj_island: trees
# joined by constraint rows) solved with their own momentum and termination.
_PCG_MULT64 = 6364136223846793005
_PCG_MULT = (_PCG_MULT64 >> 32, _PCG_MULT64 & 0xFFFFFFFF)      # (hi, lo) 32-bit words


def _mulhi32(a, b):
    """High 32 bits of the 64-bit product of uint32 arrays (16-bit limbs: exact)."""
    m16 = jnp.uint32(0xFFFF)
    a0, a1 = a & m16, a >> 16
    b0, b1 = b & m16, b >> 16
    p01, p10 = a0 * b1, a1 * b0
    mid = ((a0 * b0) >> 16) + (p01 & m16) + (p10 & m16)
    return a1 * b1 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)


def pcg32_next(hi, lo):
    """One step of PCG32 (XSH RR, increment 1) on a 64-bit state held as two uint32
    words (no 64-bit integers needed, so it runs without jax_enable_x64). Returns
    (output uint32, new hi, new lo); elementwise over arrays of generators."""
    mh, ml = jnp.uint32(_PCG_MULT[0]), jnp.uint32(_PCG_MULT[1])
    nlo = lo * ml
    nhi = _mulhi32(lo, ml) + lo * mh + hi * ml
    carry = nlo == jnp.uint32(0xFFFFFFFF)
    nlo = nlo + jnp.uint32(1)
    nhi = nhi + carry.astype(jnp.uint32)
    # output of the old state: xorshift high, then random rotation
    xlo = lo ^ ((lo >> 18) | (hi << 14))
    xhi = hi ^ (hi >> 18)
    xs = (xlo >> 27) | (xhi << 5)
    rot = hi >> 27
    out = (xs >> rot) | (xs << ((jnp.uint32(32) - rot) & jnp.uint32(31)))
    return out, nhi, nlo


#: generator state after seeding (state 0, increment 1, one step): state 1
PCG_SEED = (0, 1)


def _static_blocks(m, lay):
    """Static block table (numpy): first row, kind (0 scalar, 1 + index into the
    elliptic dims), dim, class (0 equality, 1 friction, 2 limit, 3 contact), key within
    the class (MuJoCo's row order), contact slot (-1 if none)."""
    start, kind, dim, cls, key, slot = [], [], [], [], [], []
    edims = sorted({b.dim for b in lay.blocks if b.kind == "conell"})
    nv, njnt = int(m.nv), int(m.njnt)
    base = {"connect": (0, 6, 0), "weld": (0, 6, 0), "jointeq": (0, 6, 0),
            "tendoneq": (0, 6, 0), "frictiondof": (1, 1, 0), "frictionten": (1, 1, nv),
            "limitjnt": (2, 2, 0), "limitball": (2, 2, 0), "limitten": (2, 2, njnt)}
    for b in lay.blocks:
        for e in range(b.n):
            el = int(b.ids[e])
            if b.kind == "conell":
                start.append(b.start + e * b.k)
                kind.append(1 + edims.index(b.dim))
                dim.append(b.dim)
                cls.append(3)
                key.append(0)
                slot.append(el)
                continue
            for r in range(b.k):
                start.append(b.start + e * b.k + r)
                kind.append(0)
                dim.append(1)
                if b.kind in base:
                    c, mul, off = base[b.kind]
                    cls.append(c)
                    key.append((el + off) * mul + r)
                    slot.append(-1)
                else:                                   # con1, conpyr: row within contact
                    cls.append(3)
                    key.append(r)
                    slot.append(el)
    arr = lambda x: np.asarray(x, np.int32)
    return arr(start), arr(kind), arr(dim), arr(cls), arr(key), arr(slot), tuple(edims)


def _row_trees(m, d, lay, nefc):
    """(nefc, ntree) incidence of rows and kinematic trees, as mj_island's
    unionConstraintTrees: contacts join the trees of their geoms' bodies, connect / weld
    the trees of their two bodies (not the Jacobian's), dof friction and joint limits
    the tree of their dof; the other rows (tendons, joint equalities) the trees of the
    dofs where their Jacobian is nonzero (MuJoCo's dense scan). Exact on the active
    rows (the only ones the islands use).

    Built block by block and concatenated (the blocks tile the rows in order): only the
    tendon and joint-equality rows look at the Jacobian, each through an ``any`` over
    the dofs of every tree. A Jacobian-wide product with the (nv, ntree) dof-tree
    matrix, or scatters into the rows, cost many times more under vmap."""
    ntree = int(m.ntree)
    dof_tree = np.asarray(m.dof_treeid).reshape(-1)
    trees = np.arange(ntree)
    body_tree = np.asarray(m.body_treeid).reshape(-1)
    geom_tree = body_tree[np.asarray(m.geom_bodyid).reshape(-1)]
    parts, row = [], 0
    for b in lay.blocks:
        assert b.start == row, "layout blocks must tile the rows in order"
        nrow = b.n * b.k
        row += nrow
        if b.kind in CONTACT_KINDS:
            g = _slots(d.contact.geom, b.ids)                                # (n, 2)
            t = where(g >= 0, jnp.asarray(geom_tree)[jnp.clip(g, 0, None)], -1)
            add = (t[:, :, None] == trees).any(1)                            # (n, ntree)
            parts.append(jnp.broadcast_to(add[:, None], (b.n, b.k, ntree)).reshape(nrow, ntree))
            continue
        if b.kind in ("connect", "weld"):
            o1 = np.asarray(m.eq_obj1id).reshape(-1)[b.ids]
            o2 = np.asarray(m.eq_obj2id).reshape(-1)[b.ids]
            site = np.asarray(m.eq_objtype).reshape(-1)[b.ids] == 6       # mjOBJ_SITE
            sb = np.asarray(m.site_bodyid).reshape(-1) if m.nsite else np.zeros(1, int)
            b1 = np.where(site, sb[np.where(site, o1, 0)], o1)
            b2 = np.where(site, sb[np.where(site, o2, 0)], o2)
            t = np.stack([body_tree[b1], body_tree[b2]], 1)
        elif b.kind == "frictiondof":
            t = dof_tree[np.asarray(b.ids)][:, None]
        elif b.kind in ("limitjnt", "limitball"):
            t = dof_tree[np.asarray(m.jnt_dofadr).reshape(-1)[b.ids]][:, None]
        else:
            # the Jacobian's nonzero dofs (an any over the dofs of each tree)
            nz = d.efc_J[b.start:b.start + nrow] != 0
            parts.append(jnp.any(nz[:, :, None] & (dof_tree[:, None] == trees), 1))
            continue
        add = (t[:, :, None] == trees).any(1)
        parts.append(jnp.asarray(np.repeat(add, b.k, 0)))
    assert row == nefc
    return jnp.concatenate(parts, 0) if parts else jnp.zeros((0, ntree), bool)


def _slots(x, ids):
    """``x[ids]`` for static slot indices ``ids``: a slice where they are consecutive
    (it fuses into the kernels that read it; a gather by constant indices was a kernel
    of its own)."""
    ids = np.asarray(ids)
    if len(ids) and np.array_equal(ids, np.arange(ids[0], ids[0] + len(ids))):
        return x[int(ids[0]):int(ids[0]) + len(ids)]
    return jnp.take(x, jnp.asarray(ids), axis=0)


def _islands(inc, active):
    """Island of every row (mj_island): trees joined by rows, numbered in ascending order
    of their smallest tree; returns (row island (nefc,), number of islands)."""
    ntree = inc.shape[1]
    inc = inc & active[:, None]
    if ntree == 2 and inc.shape[0] < 1 << 10:
        return _two_islands(inc)
    incf = inc.astype(jnp.float32)
    adj = (incf.T @ incf) > 0                                       # (ntree, ntree)
    live = reduce_fused(inc, 0, "any")
    big = jnp.int32(ntree)
    lab0 = where(live, jnp.arange(ntree, dtype=jnp.int32), big)

    def step(c):
        lab, _ = c
        new = jnp.min(where(adj, lab[None, :], big), 1)
        new = where(live, jnp.minimum(new, lab), big)
        new = new[jnp.clip(new, 0, ntree - 1)]                    # pointer jumping
        new = where(live, new, big)
        return new, jnp.any(new != lab)

    if ntree <= 2:
        # one step reaches the fixpoint (every tree is next to every other one): no loop
        lab, _ = step((lab0, jnp.ones((), bool)))
    else:
        lab, _ = inline.while_loop(lambda c: c[1], step, (lab0, jnp.ones((), bool)))
    root = live & (lab == jnp.arange(ntree))
    rank = jnp.cumsum(root.astype(jnp.int32)) - 1
    tree_isl = where(live, rank[jnp.clip(lab, 0, ntree - 1)], big)
    first = jnp.argmax(inc, 1)
    row_isl = where(jnp.any(inc, 1), tree_isl[first], big)
    return row_isl, tree_isl


def _two_islands(inc):
    """:func:`_islands` of two trees (``inc`` the active rows' incidence (nefc, 2),
    fewer than 1024 rows), in closed form: tree 0, where a row touches it, is island
    0; tree 1 joins it where a row touches both, else is island 0 or 1 as tree 0 is
    in no island or is; a row's island is that of the first tree it touches. One
    reduction over the rows (what trees are touched, and whether together) and
    selects: the label propagation's products, scan and first-tree search compiled
    about ten kernels under vmap (shadow hand's bench rollout 785 -> 775 kernels; the
    same integers)."""
    big = jnp.int32(2)
    t0, t1 = inc[:, 0], inc[:, 1]

    def field(x, shift):
        return x.astype(jnp.int32) << shift

    # the rows touching tree 0, tree 1 and both, counted in bit fields of one integer
    # sum (10 bits each): its operand elementwise, where a stack of the three flags
    # was a kernel of its own
    tot = reduce_fused(field(t0, 0) + field(t1, 10) + field(t0 & t1, 20), 0)
    live0, live1, joined = (((tot >> s) & 1023) != 0 for s in (0, 10, 20))
    isl1 = where(live1, where(joined, 0, live0.astype(jnp.int32)), big)
    tree_isl = jnp.stack([where(live0, 0, big), isl1])
    return where(t0, 0, where(t1, isl1, big)), tree_isl


def block_order(m, d, lay):
    """MuJoCo's PGS block structure for Data ``d`` (rows from make_constraint): a dict of
    static tables (``start``, ``kind``, ``dim``, elliptic ``edims``, ``nisl`` island
    capacity) and arrays: ``perm`` (nb,) blocks sorted by island then MuJoCo's efc
    order (active blocks first), ``bisl`` (nb,) island of each block (``nisl`` if
    inactive), ``nblk`` (nisl,) active blocks per island, ``first`` (nisl,) position
    of each island's first block in ``perm``, ``rowisl`` (nefc,) island of each row,
    ``dofisl`` (nv,) island of each dof (``nisl`` if in none)."""
    from simjax.engine.collision import driver
    from simjax.types import DisableBit
    nefc = lay.nefc
    start, kind, dim, cls, key, slot, edims = _static_blocks(m, lay)
    nb = len(start)
    active = d.efc_active
    bact = active[start]
    # contacts by mj_collision's order (their keys increase along it), then their rows
    ncap = d.contact.dist.shape[0]
    kbound = int(key.max(initial=0)) + 1
    if ncap and np.any(slot >= 0):
        ckeys, cbound = driver.contact_keys(m, d)
        if cbound * 16 > np.iinfo(np.int32).max:
            # keys too large for int32: the contacts' positions in that order instead
            order = driver.contact_order(m, d)
            ckeys = jnp.zeros(ncap, jnp.int32).at[order].set(
                jnp.arange(ncap, dtype=jnp.int32))
            cbound = ncap
        ckey = ckeys[jnp.asarray(np.maximum(slot, 0))] * 16 + jnp.asarray(key)
        bkey = where(jnp.asarray(slot >= 0), ckey, jnp.asarray(key))
        kbound = max(kbound, cbound * 16)
    else:
        bkey = jnp.asarray(key)
    islands = not (m.opt.disableflags & DisableBit.ISLAND) and int(m.ntree) > 0
    if islands:
        nisl = int(m.ntree)
        rowisl, tree_isl = _islands(_row_trees(m, d, lay, nefc), active)
        rowisl = jnp.minimum(rowisl, nisl)
        dofisl = jnp.minimum(tree_isl[np.asarray(m.dof_treeid).reshape(-1)], nisl)
    else:
        nisl = 1
        rowisl = where(active, 0, 1).astype(jnp.int32)
        dofisl = jnp.zeros(int(m.nv), jnp.int32)
    bisl = where(bact, rowisl[start], nisl)
    perm = _block_perm(bkey, cls, bisl, kbound, nisl)
    nblk = _island_sum(bisl, jnp.ones(bisl.shape, jnp.int32), nisl)
    first = jnp.cumsum(nblk) - nblk
    return dict(start=start, kind=kind, dim=dim, edims=edims, nisl=nisl, nb=nb,
                perm=perm, bisl=bisl, nblk=nblk, first=first, rowisl=rowisl, dofisl=dofisl)


def _island_sum(isl, x, nisl):
    """(nisl,) sums of ``x`` (n,) by island ``isl`` (n,) (entries of island ``nisl`` or
    more left out), as a select over the islands and one fused reduction: a
    scatter-add is a loop over every world's entries on XLA CPU. PGS's four (blocks
    per island, M's trace per island, each sweep's restart sums, noslip's removed
    regularisation) as scatter-adds against these, paired wall time, float32, batch
    1024: the Gymnasium humanoid's and humanoid-standup's steps 0.92x, the same
    outputs (the restart sums alone: 0.94-0.97x)."""
    return reduce_fused(where(isl[:, None] == jnp.arange(nisl), x[:, None],
                              jnp.zeros((), x.dtype)), 0)


def _block_perm(bkey, cls, bisl, kbound, nisl):
    """Blocks sorted by (island, class, key), ties (inactive blocks) by index: where
    the key times the block count fits int32, one sort of the key with the block's
    index in its low digits (the index is the remainder after the sort), else the
    stable argsort of the key where it fits, else a lexsort. XLA CPU sorts one operand
    several times faster than a key with its indices: 164 blocks, batch 1024, 2.8
    against 15.6 us per world; the Gymnasium humanoid's step 0.90x the wall time,
    humanoid-standup's 0.86x (paired, float32, batch 1024; the same orders)."""
    nb = bkey.shape[0]
    top = (nisl + 1) * 4 * kbound
    key = (bisl * 4 + jnp.asarray(cls)) * kbound + bkey if top <= np.iinfo(
        np.int32).max else None
    if _PACKED_SORT and top * nb <= np.iinfo(np.int32).max:
        return jnp.sort(key * nb + jnp.asarray(np.arange(nb, dtype=np.int32))) % nb
    if key is not None:
        return jnp.argsort(key, stable=True).astype(jnp.int32)
    return jnp.lexsort((bkey, jnp.asarray(cls), bisl)).astype(jnp.int32)


#: :func:`_block_perm` sorts the packed key where it fits (read at trace time; False:
#: the argsort, kept to compare)
_PACKED_SORT = True


def _shuffle(perm, gen, nblk, first):
    """Fisher-Yates shuffle of every island's segment of ``perm`` in place, as MuJoCo's
    shuffle_int, one generator per island (``gen`` = (hi, lo) uint32 (nisl,))."""
    hi, lo = gen
    pos_oob = perm.shape[0]

    def step(t, c):
        perm, hi, lo = c
        i = nblk - 1 - t
        go = i > 0
        out, nhi, nlo = pcg32_next(hi, lo)
        j = (out % jnp.maximum(i + 1, 1).astype(jnp.uint32)).astype(jnp.int32)
        pi, pj = first + i, first + j
        vi = perm[jnp.clip(pi, 0, pos_oob - 1)]
        vj = perm[jnp.clip(pj, 0, pos_oob - 1)]
        perm = perm.at[where(go, pi, pos_oob)].set(vj, mode="drop")
        perm = perm.at[where(go, pj, pos_oob)].set(vi, mode="drop")
        return perm, where(go, nhi, hi), where(go, nlo, lo)

    n = jnp.maximum(jnp.max(nblk, initial=0) - 1, 0)
    perm, hi, lo = inline.fori_loop(0, n, step, (perm, hi, lo))
    return perm, (hi, lo)


#: largest shuffle table :func:`_shuffle_table` builds (entries: a constant of the
#: program; the Gymnasium humanoid's, 41 compact rows and 50 iterations, has 88K) and
#: most numpy steps it takes to build it; beyond them the shuffle runs as a loop
_SHUFFLE_TABLE_MAX = 1 << 18
_SHUFFLE_TABLE_STEPS = 20000


def pcg32_next_u64(state):
    """:func:`pcg32_next` on 64-bit words (numpy uint64 arrays, wrapping): (output
    uint32, new state)."""
    with np.errstate(over="ignore"):
        x = ((state ^ (state >> np.uint64(18))) >> np.uint64(27)) & np.uint64(0xFFFFFFFF)
        rot = (state >> np.uint64(59)).astype(np.uint32)
        x = x.astype(np.uint32)
        out = (x >> rot) | (x << ((np.uint32(32) - rot) & np.uint32(31)))
        return out, state * np.uint64(_PCG_MULT64) + np.uint64(1)


@functools.lru_cache(maxsize=16)
def _shuffle_table(nmax, iterations):
    """MuJoCo's shuffled visit order as a table (numpy int32, (nmax + 1, iterations + 1,
    nmax)): entry [n, t, r] is the position, in the island's order before any shuffle,
    of the block at position r after t shuffles of an island of n blocks. Every island
    solve seeds its generator alike and the shuffle of n blocks draws n - 1 numbers, so
    the order after t shuffles depends on n and t alone: :func:`_shuffle`'s loop, run
    here once for every n at once (:func:`pcg32_next_u64`). None when the table would
    be larger than _SHUFFLE_TABLE_MAX or _SHUFFLE_TABLE_STEPS allow. Cached: every
    trace of the solver (RK4's four stages, say) reads the same table; not to be
    written to."""
    if ((nmax + 1) * (iterations + 1) * nmax > _SHUFFLE_TABLE_MAX
            or iterations * nmax > _SHUFFLE_TABLE_STEPS):
        return None
    n = np.arange(nmax + 1)
    state = np.full(nmax + 1, (PCG_SEED[0] << 32) | PCG_SEED[1], np.uint64)
    perm = np.tile(np.arange(nmax), (nmax + 1, 1))
    out = np.empty((nmax + 1, iterations + 1, nmax), np.int32)
    out[:, 0] = perm
    rows = np.arange(nmax + 1)
    for t in range(1, iterations + 1):
        for k in range(max(nmax - 1, 0)):
            i = n - 1 - k
            go = i > 0
            draw, nstate = pcg32_next_u64(state)
            state = np.where(go, nstate, state)
            j = (draw % np.maximum(i + 1, 1).astype(np.uint32)).astype(np.int64)
            ii = np.clip(i, 0, nmax - 1)
            vi, vj = perm[rows, ii], perm[rows, j % max(nmax, 1)]
            perm[rows[go], ii[go]] = vj[go]
            perm[rows[go], j[go]] = vi[go]
        out[:, t] = perm
    return out


def _shuffler(perm0, table, nblk, first, bisl, nisl):
    """``shuffled(it)``: the visit order (nb,) of every island after ``it`` shuffles (a
    traced count), from the unshuffled order ``perm0`` and :func:`_shuffle_table`'s
    ``table``: the loop of :func:`_shuffle` replaced by two gathers (each of its steps
    was several kernels, once per block and iteration). What does not depend on ``it``
    (each position's island, its size and the position within it) is made once."""
    nb = perm0.shape[0]
    pos = jnp.arange(nb, dtype=jnp.int32)
    pisl = bisl[perm0]                                   # island of each position
    k = jnp.minimum(pisl, nisl - 1)
    n, f = jnp.minimum(nblk[k], table.shape[0] - 1), first[k]
    rel = jnp.clip(pos - f, 0, table.shape[2] - 1)
    table = jnp.asarray(table)

    def shuffled(it):
        src = table[n, it, rel]
        return where(pisl < nisl, perm0[jnp.clip(f + src, 0, nb - 1)], perm0)
    return shuffled


# --------------------------------------------------------------------------- PGS
def _fric_table(spec, p, nefc, dmax, dtype):
    """(nefc, dmax - 1) friction coefficients of each elliptic contact at its first row
    (ones elsewhere)."""
    frtab = jnp.ones((nefc, max(1, dmax - 1)), dtype)
    for (start, n, dim), fr in zip(spec.ell, p["fr"]):
        frtab = frtab.at[start + dim * np.arange(n), :dim - 1].set(fr)
    return frtab


#: PGS on a compact copy of the rows (:func:`_pgs`): at most this many rows (None: the
#: scalar capacity of Newton's chunk 0, :func:`~simjax.engine.solver_gather.
#: row_capacity`; 0: never, every solve on the whole rows, kept to compare), read at
#: trace time
_COMPACT_ROWS = None


def _compact_capacity(spec):
    """Rows of :func:`_pgs`'s compact problem, or None where it does not apply: models
    with elliptic contacts (their blocks span several rows), or a capacity that is not
    below the rows'."""
    from simjax.engine.solver_gather import row_capacity
    if spec.ell or _COMPACT_ROWS == 0:
        return None
    cap = row_capacity(spec)[0] if _COMPACT_ROWS is None else int(_COMPACT_ROWS)
    return cap if cap < spec.nefc else None


def _pgs(spec, p, force0, iterations, lay, order):
    """Projected Gauss-Seidel on the dual (mj_solPGS, per island as mj_fwdConstraint):
    Nesterov momentum with gradient restarts (O'Donoghue and Candes 2015), blocks in
    MuJoCo's shuffled order (:func:`block_order`), per-island termination when the
    scaled cost improvement of a sweep falls below ``tolerance``. Returns (force,
    iterations per island (nisl,), last improvement per island (nisl,)). Inactive rows
    (padding: MuJoCo's rows are the active ones) start and stay at zero.

    The row capacity (every contact slot, both sides of every limit) is many times the
    active rows of a typical state (the Gymnasium humanoid: 164 rows, 9-36 active), and
    every block update reads a row of AR = J M^-1 J' + R over all of them, AR itself
    O(rows^2 nv). Where every block is a single row (no elliptic contacts), the solve
    runs on a compact copy: the first ``cap`` rows of the visit order (the active rows,
    by island and MuJoCo's order; :func:`_compact_capacity`), AR made for those only,
    and the forces written back. Where a world has more active rows than that (under
    vmap: any world of the batch, :func:`~simjax.engine.solver_worlds.any_world`) the
    solve runs on the whole rows. Both visit the same blocks in the same order; the
    products over the rows differ by the inactive rows' zero terms only (rounding)."""
    force0 = where(p["active"], force0, 0.0)
    cap = _compact_capacity(spec)
    if cap is None:
        return _pgs_solve(spec, p, force0, iterations, order)
    over = any_world(reduce_fused(order["nblk"], 0) > cap)
    return jax.lax.cond(over, lambda: _pgs_solve(spec, p, force0, iterations, order),
                        lambda: _pgs_compact(spec, p, force0, iterations, order, cap))


class _RowSpec:
    """The row structure :func:`_pgs_solve` reads (``nefc``, ``fric``, ``ineq``,
    ``ell``): a compact problem's masks are gathered (traced), not static."""

    def __init__(self, nefc, fric, ineq, ell):
        self.nefc, self.fric, self.ineq, self.ell = nefc, fric, ineq, ell


def _pgs_compact(spec, p, force0, iterations, order, cap):
    """:func:`_pgs` on the rows ``perm[:cap]`` (blocks of one row each): compact row
    ``c`` is the block at position ``c`` of the visit order, so the compact order
    starts as the identity and is shuffled as the full one (by position); the rows past
    the active ones are inactive, never visited, their forces zero."""
    rows = order["perm"][:cap]

    def take(x):
        return jnp.take(x, rows, axis=0)

    pc = dict(p, J=take(p["J"]), R=take(p["R"]), efc_b=take(p["efc_b"]),
              floss=take(p["floss"]), fr=())
    oc = dict(order, start=np.arange(cap, dtype=np.int32),
              kind=np.zeros(cap, np.int32), dim=np.ones(cap, np.int32),
              perm=jnp.arange(cap, dtype=jnp.int32), bisl=take(order["bisl"]),
              rowisl=take(order["rowisl"]))
    sc = _RowSpec(cap, take(jnp.asarray(spec.fric)), take(jnp.asarray(spec.ineq)), ())
    force, niter, imp = _pgs_solve(sc, pc, take(force0), iterations, oc)
    return force0.at[rows].set(force), niter, imp


def _pgs_solve(spec, p, force0, iterations, order):
    """:func:`_pgs` on the rows of ``spec`` (static, or :class:`_RowSpec`)."""
    AR = _ar(p)
    b = p["efc_b"]
    nefc = spec.nefc
    dtype = force0.dtype
    dinv = 1.0 / jnp.diag(AR)
    fl = p["floss"]
    tol = p["tolerance"]
    fric = jnp.asarray(spec.fric)
    ineq = jnp.asarray(spec.ineq)
    nisl = order["nisl"]
    rowisl = order["rowisl"]
    scale = _island_scale(p, order)
    bstart = np.asarray(order["start"])           # static tables: _block_sweep reads
    bkind = np.asarray(order["kind"])             # them without a gather where it can
    bisl = order["bisl"]
    edims = order["edims"]
    dmax = max((1,) + edims)
    frtab = _fric_table(spec, p, nefc, dmax, dtype)
    rng = jnp.arange(dmax)

    # a row's scalars in one table, one gather per visit: under vmap each gather of
    # one value per world was a kernel of its own (paired, float32, same values: the
    # Gymnasium humanoid's step 809 -> 749 us per world at batch 256, 817 -> 810 at
    # batch 1024; humanoidstandup 615 -> 574 at batch 256)
    stab = jnp.stack([b, dinv, fl, fric.astype(dtype), ineq.astype(dtype)], -1)

    def scalar(force, i):
        bi, di, fli, frici, ineqi = stab[i]
        res = bi + AR[i] @ force
        old = force[i]
        f = old - res * di
        f = where(frici > 0, jnp.clip(f, -fli, fli), f)
        f = where(ineqi > 0, jnp.maximum(f, 0.0), f)
        delta = f - old
        change = 0.5 * delta * delta * (1.0 / di) + delta * res
        bad = change > 1e-10
        out = where(rng == 0, where(bad, old, f), 0.0)
        return out, where(bad, 0.0, change)

    def elliptic(dim):
        def upd(force, i):
            idx = i + jnp.arange(dim)
            rows = AR[idx]                                          # (dim, nefc)
            res = b[idx] + rows @ force
            old = force[idx]
            Ath = rows[:, idx]
            frc = frtab[i, :dim - 1]
            # normal update when the normal force is (nearly) zero, else ray update
            fn = jnp.maximum(old[0] - res[0] * dinv[i], 0.0)
            f_norm = jnp.concatenate([fn[None], jnp.zeros(dim - 1, dtype)])
            den = jnp.dot(old, Ath @ old)
            x = -jnp.dot(old, res) / where(den >= MINVAL, den, 1.0)
            x = where(old[0] + x * old[0] < 0, -old[0] / where(old[0] == 0, 1.0,
                                                               old[0]), x)
            f_ray = where(den >= MINVAL, old + x * old, old)
            f = where(old[0] < MINVAL, f_norm, f_ray)
            # friction update with the normal fixed
            ac = Ath[1:, 1:]
            bc = res[1:] - ac @ old[1:] + Ath[1:, 0] * (f[0] - old[0])
            v, on = _qcqp(ac, bc, frc, f[0])
            v = where(on, _project_ellipsoid(v, f[0], frc, False), v)
            v = where(f[0] < MINVAL, 0.0, v)
            f = jnp.concatenate([f[:1], v])
            delta = f - old
            change = 0.5 * delta @ Ath @ delta + jnp.dot(delta, res)
            bad = change > 1e-10
            f = where(bad, old, f)
            return jnp.zeros(dmax, dtype).at[:dim].set(f), where(bad, 0.0, change)
        return upd

    branches = [scalar] + [elliptic(dim) for dim in edims]
    bdim = np.asarray(order["dim"])
    table = _shuffle_table(int(order["perm"].shape[-1]), int(iterations))
    if table is not None:
        shuffled = _shuffler(order["perm"], table, order["nblk"], order["first"], bisl,
                             nisl)

    def sweep(force, perm, done):
        return _block_sweep(force, done, perm, jnp.sum(order["nblk"]), bisl, bstart,
                            bkind, bdim, branches, nisl, nefc, dmax)

    def project(force):
        force = where(fric, jnp.clip(force, -fl, fl), force)
        force = where(ineq, jnp.maximum(force, 0.0), force)
        for (start, n, dim), fr in zip(spec.ell, p["fr"]):
            blk = _ell_rows(force, start, n, dim)
            neg = blk[:, 0] < 0
            proj = jax.vmap(lambda fz, nn, m_: _project_ellipsoid(fz, nn, m_, True))(
                blk[:, 1:], blk[:, 0], fr)
            blk = where(neg[:, None], 0.0, jnp.concatenate([blk[:, :1], proj], 1))
            force = force.at[start:start + n * dim].set(blk.reshape(-1))
        return force

    def seg(x):
        return _island_sum(rowisl, x, nisl)

    def row(x, fill):
        # each row's island value: selects over a few islands (one fused kernel with
        # its users), else a gather by island (paired wall time, float32, batch 1024,
        # one island: the Gymnasium humanoid's step 0.95x, humanoid-standup 0.96x)
        if nisl <= _ROW_SELECTS:
            out = jnp.full(rowisl.shape, fill, x.dtype)
            for k in range(nisl):
                out = where(rowisl == k, x[k], out)
            return out
        return jnp.concatenate([x, jnp.asarray([fill], x.dtype)])[rowisl]

    def cond(s):
        # unbatched under vmap (a done island's values stay as they are, so the batch
        # iterates until its last world is done, each world as alone): with a batched
        # flag vmap selected between every carried value and its update, every trip
        # (paired, float32, same values: the Gymnasium humanoid's step 624 -> 583 us
        # per world at batch 1024, with the sweep's loop below)
        return any_world(jnp.any(~s["done"])) & (s["iter"] < iterations)

    def body(s):
        force, prev, k, done = s["force"], s["prev"], s["k"], s["done"]
        beta = where(s["iter"] > 0, (k - 1) / (k + 2.0), 0.0)
        use = row((beta > 0) & ~done, False)
        keep = row(done, True)
        extr = project(force + row(beta, 0.0) * (force - prev))
        prev = where(keep, prev, force)
        force = where(use, extr, force)
        mom = force
        if table is None:
            perm, gen = _shuffle(s["perm"], s["gen"], where(done, 0, order["nblk"]),
                                 order["first"])
        else:
            # a done island's order changes here, but it is swept no more
            perm, gen = shuffled(s["iter"] + 1), s["gen"]
        force, imp = sweep(force, perm, done)
        imp = imp * scale
        corr = seg((force - mom) * (mom - prev))
        restart = (s["iter"] > 0) & (corr < 0)
        k = where(done, k, where(restart, 0, k + 1))
        niter = s["niter"] + (~done).astype(jnp.int32)
        last = where(done, s["imp"], imp)
        return dict(force=force, prev=prev, k=k, iter=s["iter"] + 1, perm=perm, gen=gen,
                    done=done | (imp < tol), imp=last, niter=niter)

    gen = (jnp.full(nisl, PCG_SEED[0], jnp.uint32), jnp.full(nisl, PCG_SEED[1], jnp.uint32))
    s = dict(force=force0, prev=force0, k=jnp.zeros(nisl, jnp.int32), iter=jnp.int32(0),
             perm=order["perm"], gen=gen, done=order["nblk"] == 0,
             imp=jnp.zeros(nisl, dtype), niter=jnp.zeros(nisl, jnp.int32))
    s = inline.while_loop(cond, body, s)
    return s["force"], s["niter"], s["imp"]


#: most islands for which PGS spreads per-island values over the rows by selects
_ROW_SELECTS = 4


def _island_scale(p, order):
    """1 / trace of each island's block of M (its dofs' diagonal inertias): MuJoCo 4.0.0
    divides the improvements (and gradients) of its per-island solvers by this, not by
    meaninertia * nv (measured: reported improvements are the cost decreases divided by
    exactly this trace, per island, and by trace(M) when islands are disabled)."""
    nisl = order["nisl"]
    trace = _island_sum(order["dofisl"], jnp.diag(p["M"]), nisl)
    return 1.0 / where(trace > 0, trace, 1.0)


def _noslip_ops(lay, order):
    """Static noslip operation of every PGS block (numpy): 0 none (equality, limit,
    frictionless contact and normal rows), 1 friction loss row, 2 first row of a pair
    of opposing pyramid edges, 3 + k elliptic contact of dims ``order['edims'][k]``."""
    nefc = lay.nefc
    rowop = np.zeros(nefc, np.int32)
    for b in lay.blocks:
        rows = b.start + np.arange(b.n * b.k)
        if b.kind in ("frictiondof", "frictionten"):
            rowop[rows] = 1
        elif b.kind == "conpyr":
            rowop[rows[(rows - b.start) % b.k % 2 == 0]] = 2
    kind = order["kind"]
    return np.where(kind > 0, 2 + kind, rowop[order["start"]]).astype(np.int32)


def _noslip(spec, p, force, iterations, lay, order, one=None):
    """Noslip post-pass (mj_solNoSlip, per island as MuJoCo 4.0.0): friction-loss and
    contact-friction rows re-solved by Gauss-Seidel with the unregularised
    A = J M^-1 J' (diagonal blocks clamped from below as MuJoCo), normal forces fixed.
    Each island sweeps its blocks in MuJoCo's efc order (friction loss, then contacts in
    collision order; no shuffling) and stops on its own once its improvement, scaled by
    1 / trace of its block of M, falls below ``noslip_tolerance``; the first sweep's
    improvement includes the removed regularisation cost 0.5 sum R f^2 of the island's
    rows. A fixed number of sweeps over all (static) blocks with masks (``lax.scan``), so
    it is differentiated directly. ``one`` (nefc,): rows of contacts of runtime dim 1
    in slots of more (adhesive, in the gap; None: none), frictionless, so not visited.
    Returns (force, sweeps per island (nisl,))."""
    A = _ar(p) - jnp.diag(p["R"])
    b = p["efc_b"]
    fl = p["floss"]
    act = p["active"]
    tol = p["noslip_tolerance"]
    dtype = force.dtype
    nefc = spec.nefc
    nisl = order["nisl"]
    scale = _island_scale(p, order)
    dinv = 1.0 / math.maximum(MINVAL, jnp.diag(A))
    edims = order["edims"]
    dmax = max((2,) + edims)
    frtab = _fric_table(spec, p, nefc, max((1,) + edims), dtype)

    def block(idx):
        ac = A[idx][:, idx]
        n = idx.shape[0]
        return ac + jnp.diag(math.maximum(1e-10, jnp.diag(ac)) - jnp.diag(ac)) if n else ac

    def cost_change(ac, new, old, r):
        dl = new - old
        change = 0.5 * dl @ ac @ dl + dl @ r
        bad = change > 1e-10
        return where(bad, old, new), where(bad, 0.0, change)

    def pad(v):
        return jnp.zeros(dmax, dtype).at[:v.shape[0]].set(v)

    def skip(force, i):
        return jnp.zeros(dmax, dtype), jnp.zeros((), dtype)

    def fric(force, i):
        r = b[i] + A[i] @ force
        old = force[i]
        f = math.clip_as_jnp(old - r * dinv[i], -fl[i], fl[i])
        dl = f - old
        return pad(f[None]), 0.5 * dl * dl / dinv[i] + dl * r

    def pair(force, i):
        idx = i + jnp.arange(2)
        r = b[idx] + A[idx] @ force
        old = force[idx]
        ac = block(idx)
        bc = r - ac @ old
        mid = 0.5 * (old[0] + old[1])
        k1 = ac[0, 0] + ac[1, 1] - ac[0, 1] - ac[1, 0]
        k0 = mid * (ac[0, 0] - ac[1, 1]) + bc[0] - bc[1]
        y = -k0 / where(k1 < MINVAL, 1.0, k1)
        zero = jnp.zeros((), dtype)
        f = where(y < -mid, jnp.stack([zero, 2 * mid]),
                  where(y > mid, jnp.stack([2 * mid, zero]),
                        jnp.stack([mid + y, mid - y])))
        f = where(k1 < MINVAL, jnp.stack([mid, mid]), f)
        f, change = cost_change(ac, f, old, r)
        return pad(f), change

    def elliptic(dim):
        def upd(force, i):
            idx = i + 1 + jnp.arange(dim - 1)
            r = b[idx] + A[idx] @ force
            old = force[idx]
            ac = block(idx)
            bc = r - ac @ old
            fr = frtab[i, :dim - 1]
            v, on = _qcqp(ac, bc, fr, force[i])
            v = where(on, _project_ellipsoid(v, force[i], fr, False), v)
            v = where(force[i] < MINVAL, 0.0, v)
            v, change = cost_change(ac, v, old, r)
            return pad(jnp.concatenate([force[i][None], v])), change
        return upd

    branches = [skip, fric, pair] + [elliptic(dim) for dim in edims]
    ops = jnp.asarray(_noslip_ops(lay, order))
    bstart = jnp.asarray(order["start"])
    if one is not None:
        ops = where(one[bstart], 0, ops)
    nwrite = jnp.asarray(np.asarray([0, 1, 2] + list(edims), np.int32))[ops]
    perm, bisl = order["perm"], order["bisl"]
    nb = order["nb"]

    def sweep(force, done):
        return _block_sweep(force, done, perm, nb, bisl, bstart, ops, nwrite, branches,
                            nisl, nefc, dmax)

    extra = _island_sum(order["rowisl"], 0.5 * force * force * where(act, p["R"], 0.0),
                        nisl)

    def body(s, _):
        force, done, it, first = s
        force, imp = sweep(force, done)
        imp = (imp + where(first, extra, 0.0)) * scale
        it = it + where(done, 0, 1)
        return (force, done | (imp < tol), it, jnp.zeros((), bool)), None

    init = (force, order["nblk"] == 0, jnp.zeros(nisl, jnp.int32), jnp.ones((), bool))
    (force, _, it, _), _ = inline.scan(body, init, None, length=iterations)
    return force, it


def _entry_of(table, i):
    """``table[i]`` for a per-block table: where the table is static (numpy), ``i``
    itself for the identity and the constant where every entry is one value, so that
    the visit reads no entry by each world's block index (a gather under vmap). Where
    every block is one row (the Gymnasium humanoid's), paired wall time, float32,
    batch 1024, against gathers from the tables: its step 0.97-0.99x, humanoid-standup
    0.97x; the same outputs."""
    if isinstance(table, np.ndarray):
        if np.array_equal(table, np.arange(table.shape[0])):
            return i
        if table.shape[0] and np.all(table == table[0]):
            return jnp.asarray(table[0], jnp.int32)
    return jnp.asarray(table)[i]


def _block_sweep(force, done, perm, nblocks, bisl, bstart, kind, nwrite, branches,
                 nisl, nefc, dmax):
    """One Gauss-Seidel sweep over constraint blocks (PGS and noslip).

    Visits blocks ``perm[:nblocks]`` in order; block ``b`` starts at row ``bstart[b]``,
    belongs to island ``bisl[b]``, is updated by ``branches[kind[b]](force, start)`` ->
    (new values (dmax,), cost change) and writes its first ``nwrite[b]`` rows. Islands
    with ``done`` set are left alone. Returns (force (nefc,), cost improvement per
    island (nisl,))."""
    rng = jnp.arange(dmax)
    isls = jnp.arange(nisl)

    def body(k, s):
        force, imp = s
        blk = perm[k]
        isl = bisl[blk]
        i = _entry_of(bstart, blk)
        vals, change = jax.lax.switch(_entry_of(kind, blk), branches, force, i)
        run = (isl < nisl) & ~done[jnp.minimum(isl, nisl - 1)]
        idx = where(run & (rng < _entry_of(nwrite, blk)), i + rng, nefc)
        force = force.at[idx].set(vals, mode="drop")
        # the island's improvement by a select over the islands, not a scatter (a loop
        # over the worlds under vmap; paired, float32, same values: the Gymnasium
        # humanoid's step 620 -> 604 us per world at batch 1024, 707 -> 674 at 256,
        # humanoid-standup 503 -> 501 at 1024). The force stays a scatter: as a
        # select over the rows XLA fused the block update into it, row by row
        imp = imp + where(run & (isls == isl), -change, 0.0)
        return force, imp

    init = (force, jnp.zeros(nisl, force.dtype))
    if isinstance(nblocks, int):
        return inline.fori_loop(0, nblocks, body, init)
    # a traced count (a world's active blocks): the visits past a world's count are of
    # inactive blocks, which write nothing, so the batch runs to its largest count with
    # an unbatched position (a batched trip count had vmap select the whole carry
    # between the body's output and input, every visit)
    def wbody(c):
        k, carry = c
        return k + 1, body(k, carry)

    _, out = inline.while_loop(lambda c: any_world(c[0] < nblocks), wbody,
                               (jnp.int32(0), init))
    return out
