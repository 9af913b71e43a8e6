"""MuJoCo's tree L'DL of a CPU batch, level by level with the worlds on the minor axis.

Where :func:`tree_linalg.factor_ld` would call LAPACK, :func:`factor_ld_pair`
factorises a batch (under ``vmap``) of two matrices (mj_factorM and mj_Euler's implicit
damping) one group of rows of a height level per kernel, and :func:`solve_ld_pair`
solves with both factors in that layout. This module holds the level plan (the groups
of rows eliminated together, their packed layout and the root chain, see
:func:`_level_plan`), the batched factorisation (:func:`_level_ld_blocks`,
:func:`_level_pair_batched`) and the solves on packed factors
(:func:`_level_solve_blocks`, :func:`_packed_solves`), the per-model ``custom_vmap``
inside ``custom_jvp`` entry points (their tangents are :mod:`tree_linalg`'s pure-JAX
factorisation's and dense solves') and the bounds on the trees factorised this way
(:func:`level_plan_fits`). level_ld has the single-matrix form.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simjax.engine import inline, lapack_chol
from simjax.engine.math import take, where
from simjax.engine.tree_linalg import (
    _CACHE, _UNROLL_NV, factor_ld, factor_ld_tangent, from_factors, solve_ld)

#: worlds per lane block of :func:`factor_ld_pair`'s batched layout
_LANES = 8


@dataclasses.dataclass(frozen=True, eq=False)
class _LevelPlan:
    groups: tuple           # per group: (dofs, width, terms); see _level_plan
    offsets: tuple          # each group's first packed entry
    src: np.ndarray         # packed entry -> index into the flattened (nv * nv) matrix
    real: np.ndarray        # packed entry -> whether it is a tree entry (else padding)
    dense: np.ndarray       # (nv * nv,) dense entry -> packed entry (last: zero)
    pairs: int              # (dof, proper descendant) pairs: the factorisation's terms
    chain: int = 0          # trailing groups that are the root's chain of single dofs
    # the other rows below the chain: runs of rows of one group whose entries for the
    # chain are in the same columns (see _chain_plan)
    chain_runs: tuple = ()


def _level_plan(m) -> _LevelPlan:
    """The groups of rows :func:`_level_ld_blocks` eliminates together.

    A group is a run of dofs of one height level whose proper descendants line up: the
    t-th descendant (index order) of every dof of the group lies in one earlier group,
    in consecutive rows, the same number of levels of depth below it (as for the
    isomorphic limbs of a body). Each row holds the tree entries of its dof (ancestors
    from the root, then the dof) right-aligned in the group's width, zero-padded on the
    left: a dof's pivot is in the last column, its entry for the ancestor ``delta``
    levels up in column ``width - 1 - delta``, so every term of a group is a slice of
    an earlier group's block. Widths are raised where needed for those slices to stay
    inside the blocks. A group's packed entries go column by column, its rows side by
    side within a column (the block layout of :func:`_level_ld_blocks`).
    """
    parent = np.asarray(m.dof_parentid)
    key = ("level", parent.tobytes())
    plan = _CACHE.get(key)
    if plan is not None:
        return plan
    n = len(parent)
    depth = np.zeros(n, np.int64)
    height = np.zeros(n, np.int64)
    chain = []
    for k in range(n):
        chain.append((chain[parent[k]] if parent[k] >= 0 else ()) + (k,))
        depth[k] = len(chain[k]) - 1
    desc = [[] for _ in range(n)]
    for k in range(n):
        for a in chain[k][:-1]:
            desc[a].append(k)
    for k in range(n - 1, -1, -1):
        if parent[k] >= 0:
            height[parent[k]] = max(height[parent[k]], height[k] + 1)
    # groups, leaves first: their dofs and terms [(source group, first row, delta)]
    rows, terms, where = [], [], {}
    for h in range(height.max() + 1):
        follow = None                     # the signature that continues the group
        for i in np.nonzero(height == h)[0]:
            sig = [(where[k][0], where[k][1], int(depth[k] - depth[i])) for k in desc[i]]
            if sig != follow:
                rows.append([])
                terms.append(sig)
            where[i] = (len(rows) - 1, len(rows[-1]))
            rows[-1].append(int(i))
            follow = [(g, r + 1, dl) for g, r, dl in sig]
    width = [int(max(depth[i] for i in r)) + 1 for r in rows]
    for g in range(len(rows) - 1, -1, -1):                 # sources are earlier groups
        for s, _, dl in terms[g]:
            width[s] = max(width[s], width[g] + dl)
    offsets, src, real = [], [], []
    dense = np.full(n * n, -1)
    for r, w in zip(rows, width):
        offsets.append(len(src))
        for p in range(w):
            for i in r:
                pad = w - 1 - depth[i]
                c = chain[i][p - pad] if p >= pad else i
                if p >= pad:
                    dense[i * n + c] = len(src)
                src.append(i * n + c)
                real.append(p >= pad)
    dense[dense < 0] = len(src)
    groups = tuple((tuple(r), w, tuple(t)) for r, w, t in zip(rows, width, terms))
    plan = _LevelPlan(groups=groups, offsets=tuple(offsets), src=np.asarray(src),
                      real=np.asarray(real), dense=dense, pairs=sum(map(len, desc)),
                      **_chain_plan(parent, depth, chain, rows, width))
    _CACHE[key] = plan
    return plan


def _chain_plan(parent, depth, chain, rows, width):
    """The root chain of :func:`_level_plan`'s groups (see :func:`_chain_schur`): the
    trailing groups of one dof each, every dof the parent of the one in the group
    before, starting at a root (the humanoid's free joint and abdomen: 9 dofs, with
    180 of its 195 terms); {} when there is none worth it."""
    ng = len(rows)
    c = 0
    while (c < ng and len(rows[ng - 1 - c]) == 1 and depth[rows[ng - 1 - c][0]] == c
           and width[ng - 1 - c] == c + 1
           and (c == 0 or parent[rows[ng - 1 - c][0]] == rows[ng - c][0])):
        c += 1
    if c < _CHAIN_MIN or c == ng:
        return {}
    ids = [rows[ng - 1 - p][0] for p in range(c)]             # by depth
    # the other rows below the chain, as runs of rows of a group sharing their chain
    # entries' columns: (group, first row, end row, first column, chain ancestors)
    runs = []
    for j in range(ng - c):
        for r, i in enumerate(rows[j]):
            a = sum(d in ids for d in chain[i][:-1])
            if not a:
                continue
            col0 = int(width[j] - 1 - depth[i])
            if runs and runs[-1][0] == j and runs[-1][2] == r and runs[-1][3:] == (col0, a):
                runs[-1] = (j, runs[-1][1], r + 1, col0, a)
            else:
                runs.append((j, r, r + 1, col0, a))
    if not runs:
        return {}
    return dict(chain=c, chain_runs=tuple(runs))


#: shortest root chain :func:`_chain_schur` takes over
_CHAIN_MIN = 3


def _chain_schur(plan, blocks, w):
    """The terms of the rows below the root chain (of :func:`_level_plan`) that are
    not in it, in the chain's rows: sum over such dofs k of L_kp D_k L_kq for chain
    depths p, q, (G, chain, chain, W) (the full square; rows use their lower part).

    ``blocks``: the finished blocks of the groups before the chain. The chain's own
    groups then only subtract each other's terms. One term per chain row and
    descendant (as the other groups have) was most of the humanoid's program (180 of
    195 terms, in 9 of its 15 group kernels, 12 to 26 terms each: about 1300 of the
    step's 3800 jaxpr equations). Here the rows' entries for the chain are gathered
    once (a kernel XLA does not recompute for each of the square's entries, which it
    did for a gather per entry, 0.6x slower) and multiplied and summed in one
    reduction kernel, whose result XLA does not recompute in the chain's kernels
    (slices and concatenations of the blocks in place of the gather made XLA write
    out every slice separately)."""
    g = blocks[0].shape[0]
    c = plan.chain
    nother = len(plan.groups) - c
    flat = jnp.concatenate([b.reshape(g, -1, w) for b in blocks[:nother]] +
                           [jnp.zeros((g, 1, w), blocks[0].dtype)], 1)
    # a group's entry (column col, row r of its k rows) is at base + col * k + r
    base = np.cumsum([0] + [b.shape[1] * b.shape[2] // w for b in blocks[:nother]])
    zero = base[-1]
    li, di = [], []
    for j, r0, r1, col0, a in plan.chain_runs:
        k, ws = len(plan.groups[j][0]), plan.groups[j][1]
        for r in range(r0, r1):
            li.append([base[j] + (col0 + p) * k + r if p < a else zero for p in range(c)])
            di.append(base[j] + (ws - 1) * k + r)
    lk = flat[:, np.asarray(li)]                          # (G, K, c, W)
    dk = flat[:, np.asarray(di)][:, :, None]              # (G, K, 1, W): pivots
    return jnp.sum((lk * dk)[:, :, :, None] * lk[:, :, None, :], 1)


def _level_ld_blocks(plan, pk):
    """MuJoCo's L'DL of packed matrices ``pk`` (G, S, W): S the plan's packed entries,
    W worlds side by side (the minor axis). Returns the packed qLD (G, S + 1, W): L's
    entries, D in each row's last column, padding, and a trailing zero.

    Left-looking, one group of rows at a time (leaves first): with L'DL = M, the
    entries of row i are R_i = M_i - sum over descendants k of L_ki D_k L_k (the
    ancestors' part of row k), D_i the last of them and L_i = R_i / D_i (padding stays
    zero). A group of k rows is a (G, width, k W) block, its rows' worlds side by side
    on the minor axis: every term is one slice of an earlier block (see
    :func:`_level_plan`), so a group is one elementwise XLA kernel without
    concatenation whose minor loop (k W long) LLVM vectorises. Rows of a level computed
    separately and concatenated, as before, made XLA emit scalar kernels that took
    several times as long to compile. Each block ends in a division, which XLA does not
    duplicate into its consumers, so no group is computed twice. Written with ``lax``
    operations, which trace faster than ``jnp`` indexing. The rows of a root chain
    (a free joint's dofs and the single hinges below it) subtract the terms of the
    other dofs below them in one piece (:func:`_chain_schur`); their sum is then
    added up in another order than MuJoCo's (same results up to rounding).
    """
    g, w = pk.shape[0], pk.shape[2]
    blocks = []
    first = len(plan.groups) - plan.chain if plan.chain and _CHAIN else len(plan.groups)
    for j, ((dofs, width, terms), off) in enumerate(zip(plan.groups, plan.offsets)):
        k = len(dofs)
        shape = (g, width, k * w)
        num = lax.slice_in_dim(pk, off, off + k * width, axis=1).reshape(shape)
        if j >= first:
            # a row of the root chain (depth width - 1): the terms of the dofs below
            # it that are not in the chain at once (_chain_schur), then the chain's
            if j == first:
                schur = _chain_schur(plan, blocks, w)
            num = lax.sub(num, schur[:, width - 1, :width])
            terms = [t for t in terms if t[0] >= first]
        for s, r0, dl in terms:
            q = blocks[s]
            ws, lo, hi = q.shape[1], r0 * w, (r0 + k) * w
            # the term's rows and columns in one slice each (the same slices compiled;
            # equations traced: shadow hand 60 fewer, humanoid 51)
            coef = lax.mul(lax.slice(q, (0, ws - 1 - dl, lo), (g, ws - dl, hi)),
                           lax.slice(q, (0, ws - 1, lo), (g, ws, hi)))
            vec = lax.slice(q, (0, ws - dl - width, lo), (g, ws - dl, hi))
            num = lax.sub(num, lax.mul(lax.broadcast_in_dim(coef, shape, (0, 1, 2)), vec))
        # the pivot spread over the row but 1 at the pivot itself (D stays as is); a
        # select, not a broadcast, so that XLA keeps one division per entry instead of
        # a reciprocal kernel per row
        last = lax.broadcast_in_dim(np.arange(width) == width - 1, shape, (1,))
        piv = lax.broadcast_in_dim(lax.slice_in_dim(num, width - 1, width, axis=1), shape,
                                   (0, 1, 2))
        blocks.append(lax.div(num, lax.select(last, jnp.ones(shape, num.dtype), piv)))
    flat = [b.reshape(g, -1, w) for b in blocks]
    return jnp.concatenate(flat + [jnp.zeros((g, 1, w), pk.dtype)], 1)


def _level_pair_batched(plan, n, a, diag, lanes=None):
    """(qLD of a, qLD of a + diag(diag), packed) for a batch: a (B, n, n), diag (B, n);
    with diag None, (qLD of a, packed). ``packed``: (B, r, S + 1), r the number of
    factors. ``a`` may instead be given as the factors of its lower triangle (a tuple,
    see :func:`_pack_factors`): the dense symmetric matrix (B, n, n) made from its
    packed entries is then a last output. ``lanes``: worlds per lane block (default
    ``_LANES``)."""
    factors = isinstance(a, tuple)
    b = (a[0] if factors else a).shape[0]
    w = lanes or _LANES
    pad = -b % w
    if pad and factors:
        # zero products and unit armature: identity matrices
        f, cdof, arm = a
        arm = arm if arm.ndim == 2 else jnp.broadcast_to(arm, (b, n))
        a = (jnp.pad(f, ((0, pad), (0, 0), (0, 0))), jnp.pad(cdof, ((0, pad), (0, 0), (0, 0))),
             jnp.pad(arm, ((0, pad), (0, 0)), constant_values=1))
    elif pad:
        a = jnp.concatenate([a, jnp.broadcast_to(jnp.eye(n, dtype=a.dtype), (pad, n, n))])
    if pad and diag is not None:
        diag = jnp.concatenate([diag, jnp.zeros((pad, n), diag.dtype)])
    g = (b + pad) // w
    # pack the tree entries with the worlds of a block on the minor axis
    if factors:
        pk = _pack_factors(plan, n, a, g, w)
    else:
        pk = take(_pad1(a.reshape(g, w, n * n).transpose(0, 2, 1)),
                  np.where(plan.real, plan.src, n * n), 1)
    if diag is not None:
        # diag's entries gathered onto the packed diagonal, a zero appended for the others
        dg = take(_pad1(diag.reshape(g, w, n).transpose(0, 2, 1)), _diag_index(plan, n), 1)
        pk = jnp.concatenate([pk, lax.add(pk, dg)])
    q = _level_ld_blocks(plan, pk)
    r = q.shape[0] // g
    # the packed factors per world (B, r, S + 1): a layout change that
    # :func:`solve_ld_pair`'s batched rule undoes, so that XLA removes both where the
    # solve is their only reader
    packed = q.reshape(r, g, q.shape[1], w).transpose(1, 3, 0, 2).reshape(g * w, r, -1)

    def dense(part, idx):  # packed -> dense (B, n, n), worlds back on the major axis
        out = take(part, idx, 1).transpose(0, 2, 1).reshape(g * w, n, n)
        return out[:b] if pad else out
    out = tuple(dense(q[i * g:(i + 1) * g], plan.dense) for i in range(r)) + (
        packed[:b] if pad else packed,)
    if not factors:
        return out
    # the full symmetric matrix from its packed tree entries (each entry of the
    # strictly upper triangle the packed entry of its transpose; the others zero: a
    # padding entry of the packed layout, else one appended)
    pz = pk[:g] if diag is not None else pk
    zero = np.nonzero(~plan.real)[0]
    if not zero.size:
        zero = [pz.shape[1]]
        pz = jnp.concatenate([pz, jnp.zeros((g, 1, w), pk.dtype)], 1)
    return out + (dense(pz, _sym_index(plan, n, zero[0])),)


def _sym_index(plan, n, zero):
    """(n * n,) dense entry (i, j) -> the packed entry of (max(i, j), min(i, j)) if a
    tree entry, else ``zero``."""
    sym = np.full(n * n, zero)
    for p in np.nonzero(plan.real)[0]:
        i, j = divmod(int(plan.src[p]), n)
        sym[i * n + j] = sym[j * n + i] = p
    return sym


def _diag_index(plan, n):
    """Packed entry -> its dof where it is on the diagonal, else n (past the dofs)."""
    return np.where(plan.real & (plan.src % (n + 1) == 0), plan.src // n, n)


def _pad1(x, axis=1):
    """``x`` with a zero appended on ``axis``: the entry gathered where no value is."""
    cfg = [(0, 0, 0)] * x.ndim
    cfg[axis] = (0, 1, 0)
    return lax.pad(x, np.zeros((), x.dtype), cfg)


def _pack_factors(plan, n, factors, g, w):
    """The packed tree entries (G, S, W) of matrices given as the factors of their
    lower triangles (smooth.crb_lower): f and cdof (B, n, 6), armature (n,) or (B, n);
    entry (i, j) is f_i . cdof_j, plus the armature where i = j (right on the tree
    entries, the only ones packed).

    The six products are summed in the lane layout (worlds of a block on the minor
    axis), from f and cdof moved there, one broadcast expression that XLA fuses into
    the packing's gather; the dense matrix (qM) is then made from the packed entries
    (:func:`_level_pair_batched`). Else qM is a batched (n, 6) x (6, n) product
    mirrored into its upper triangle and packed from there: those two kernels and the
    packing cost about as much again as this packing and the unpacking of qM
    (humanoid, batch 1024, float32: 4.3 against 2.9 us per world in a kernel
    benchmark). Written with whole-array ``lax`` operations (one broadcast product,
    one split into the six terms) and one gather per index table: few traced
    equations."""
    f, cdof, arm = factors
    # f with a zero row appended: dof n, whose products the padding entries gather
    shape = (g, 6, n + 1, n, w)

    def lanes(x, dims):  # (B, k, 6) -> (G, 6, k, W), broadcast over the other dof
        return lax.broadcast_in_dim(x.reshape(g, w, -1, 6).transpose(0, 3, 2, 1), shape,
                                    dims)
    terms = lax.split(lax.mul(lanes(_pad1(f), (0, 1, 2, 4)), lanes(cdof, (0, 1, 3, 4))),
                      (1,) * 6, axis=1)
    q = terms[0]
    for t in terms[1:]:
        q = lax.add(q, t)
    pk = take(q.reshape(g, (n + 1) * n, w), np.where(plan.real, plan.src, n * n), 1)
    # the armature gathered onto the packed diagonal, a zero appended for the others
    if arm.ndim == 1:
        # one for all worlds (model constants)
        return lax.add(pk, lax.broadcast_in_dim(take(_pad1(arm, 0), _diag_index(plan, n)),
                                                pk.shape, (1,)))
    return lax.add(pk, take(_pad1(arm.reshape(g, w, n).transpose(0, 2, 1)),
                            _diag_index(plan, n), 1))


def _pack_world(plan, qld):
    """One world's packed factor (S + 1,) from its dense qLD (n, n): the layout of
    :func:`_level_ld_blocks`'s output (padding and the trailing entry zero)."""
    vals = qld.reshape(-1)[plan.src]
    return jnp.concatenate([where(plan.real, vals, 0), jnp.zeros(1, qld.dtype)])


def _chain_steps(c):
    """The steps of :func:`_chain_lanes` for a chain of c dofs: rows (index into its
    vectors, dof k, 1 for the division by D else 0)."""
    steps = ([(k, 0) for k in range(c - 1, 0, -1)] + [(0, 1)] +
             [(k, 0) for k in range(c - 1)])
    return np.asarray([(i, k, dv) for i, (k, dv) in enumerate(steps)], np.int32)


def _chain_vectors(lidx):
    """Indices (into a packed factor) of :func:`_chain_lanes`'s vectors, (steps, c),
    from the chain's dense index ``lidx`` (c, c) (strictly lower; the packed zero
    elsewhere): row k of L for the steps of L' x = b (its entries for k's ancestors),
    zeros for the division, column k of L for the steps of L x = y (the entries of
    k's descendants)."""
    c = lidx.shape[0]
    zero = lidx[0, 0]
    return np.concatenate([lidx[k][None] for k in range(c - 1, 0, -1)] +
                          [np.full((1, c), zero)] +
                          [lidx[:, k][None] for k in range(c - 1)])


def _chain_lanes(vecs, diag, b):
    """Solve L' diag(D) L x = b for the dense root chain in lane blocks: ``vecs``
    (G, steps, c, W) the vector of each step (:func:`_chain_vectors`), diag (G, c,
    W), b (G, c, W). :func:`_solve_ld_scan`'s steps (the same operations) in one
    loop: L' x = b leaves first, the division by D, L x = y root first (a second loop
    is a second set of XLA kernels). The vectors are zero outside the entries a step
    uses, so a step reads one vector and needs no mask."""
    def step(x, ikd):
        i, k, dv = ikd[0], ikd[1], ikd[2]
        vec = lax.dynamic_index_in_dim(vecs, i, 1, keepdims=False)
        xk = lax.broadcast_in_dim(lax.dynamic_index_in_dim(x, k, 1), x.shape, (0, 1, 2))
        y = lax.sub(x, lax.mul(vec, xk))
        return lax.select(lax.broadcast_in_dim(dv == 1, x.shape, ()), lax.div(x, diag),
                          y), None

    return inline.scan(step, b, _chain_steps(b.shape[1]))[0]


def _solve_tables(m, plan):
    """Static index tables of :func:`_level_solve_blocks` (cached per tree)."""
    key = ("solve_tables", _CHAIN, np.asarray(m.dof_parentid).tobytes())
    out = _CACHE.get(key)
    if out is not None:
        return out
    parent = np.asarray(m.dof_parentid)
    chain = []
    for i in range(len(parent)):
        chain.append((chain[parent[i]] if parent[i] >= 0 else ()) + (i,))
    groups = plan.groups
    ng = len(groups)
    c = plan.chain if _CHAIN else 0
    first = ng - c
    ids = [groups[ng - 1 - p][0][0] for p in range(c)]      # the chain's dofs by depth
    out = dict(first=first, ids=np.asarray(ids, np.int64))
    # the root chain's dense block from the packed factor: row q (group ng - 1 - q,
    # width q + 1) has its entry for depth p at offset + p; D at p = q
    if c:
        off = [plan.offsets[ng - 1 - q] for q in range(c)]
        lidx = np.full((c, c), plan.src.size)                 # the trailing zero
        for q in range(c):
            lidx[q, :q] = off[q] + np.arange(q)
        out["chain_vecs"] = _chain_vectors(lidx)
        out["chain_diag"] = np.asarray([off[q] + q for q in range(c)])
        # rows below the chain: their entries for the chain and pivots (in the packed
        # factor) and their u values (in the non-chain groups' u, concatenated)
        ubase = np.cumsum([0] + [len(groups[j][0]) for j in range(first)])
        li, di, ui = [], [], []
        for j, r0, r1, col0, na in plan.chain_runs:
            k, width = len(groups[j][0]), groups[j][1]
            for r in range(r0, r1):
                li.append([plan.offsets[j] + (col0 + p) * k + r if p < na
                           else plan.src.size for p in range(c)])
                di.append(plan.offsets[j] + (width - 1) * k + r)
                ui.append(ubase[j] + r)
        out.update(below_low=np.asarray(li), below_diag=np.asarray(di),
                   below_u=np.asarray(ui))
    # the down pass: per non-chain group, its rows' ancestors in a pool of x values
    # (the chain by depth, then the later groups' rows, then a zero)
    where = {}
    for j in range(first):
        for r, i in enumerate(groups[j][0]):
            where[int(i)] = (j, r)
    anc = []
    for j in range(first):
        dofs, width, _ = groups[j]
        later = list(range(first - 1, j, -1))
        base = dict(zip(later, c + np.cumsum([0] + [len(groups[t][0]) for t in later])))
        zero = c + sum(len(groups[t][0]) for t in later)
        idx = np.full((width - 1, len(dofs)), zero)
        for r, i in enumerate(dofs):
            up = chain[i][:-1]
            for col, a in enumerate(up):
                if a in where:
                    ja, ra = where[a]
                    src = base[ja] + ra
                else:
                    src = ids.index(a)
                idx[width - 1 - len(up) + col, r] = src
        anc.append(idx if width > 1 else None)
    out["anc"] = tuple(anc)
    _CACHE[key] = out
    return out


def _level_solve_blocks(plan, tabs, q, b):
    """Solve with packed factors, worlds on the minor axis: q (G, S + 1, W) from
    :func:`_level_ld_blocks`, b (G / r, n, W) the right-hand sides of each of the r
    factorisations stacked in q; returns x (G, n, W), rows in the order of
    :func:`_solve_order`.

    The groups below the root chain one at a time, as the factorisation (a small
    kernel each, no loop), reading only the tree's entries: L' w = b leaves first,
    every term a slice of an earlier group's block, with w_k = D_k u_k of the finished
    groups and u = w / D (the division ends each group's kernel, so XLA does not
    recompute it in the later ones). The root chain (see :func:`_chain_plan`): the
    terms of the rows below it in one reduction, then its dense block solved with
    :func:`_chain_lanes`. Then L x = u for the other groups root first, x_i = u_i -
    sum_a L_ia x_a over the row's ancestors, gathered from the finished groups and
    summed in one reduction per group (whose result XLA does not recompute either).
    Written with ``lax`` operations: with jnp's operators (91 for the humanoid) it took
    a fifth of the smooth step's trace, 3.6 times what it takes now. Same results as
    :func:`solve_ld` up to rounding."""
    g, w = q.shape[0], q.shape[2]
    first = tabs["first"]
    groups = plan.groups[:first]
    nrep = g // b.shape[0]

    def rep(x):           # b's worlds for each of the factorisations in q
        return lax.concatenate([x] * nrep, 0) if nrep > 1 else x
    blocks, rhs = [], []
    for (dofs, width, _), off in zip(groups, plan.offsets):
        k = len(dofs)
        blk = lax.slice_in_dim(q, off, off + k * width, axis=1)
        blocks.append(blk.reshape(g, width, k * w))
        rhs.append(rep(b[:, np.asarray(dofs)].reshape(-1, k * w)))
    cols = {}

    def column(j, c):     # column c of group j's block (G, k W)
        if (j, c) not in cols:
            cols[j, c] = lax.index_in_dim(blocks[j], c, 1, keepdims=False)
        return cols[j, c]

    def rows(x, r0, k):
        if r0 == 0 and k * w == x.shape[1]:
            return x
        return lax.slice_in_dim(x, r0 * w, (r0 + k) * w, axis=1)
    u = []
    for j, (dofs, width, terms) in enumerate(groups):                  # L' w = b
        k = len(dofs)
        acc = rhs[j]
        for s, r0, dl in terms:
            ws = blocks[s].shape[1]
            acc = lax.sub(acc, lax.mul(rows(column(s, ws - 1 - dl), r0, k), lax.mul(
                rows(column(s, ws - 1), r0, k), rows(u[s], r0, k))))
        u.append(lax.div(acc, column(j, width - 1)))
    ids = tabs["ids"]
    c = len(ids)
    xc = None
    if c:
        flat_u = lax.concatenate([v.reshape(g, -1, w) for v in u], 1)
        wk = lax.mul(q[:, tabs["below_diag"]], flat_u[:, tabs["below_u"]])  # (G, K, W)
        low = q[:, tabs["below_low"]]                                      # (G, K, c, W)
        terms = _sum1(lax.mul(low, lax.broadcast_in_dim(wk, low.shape, (0, 1, 3))))
        xc = _chain_lanes(q[:, tabs["chain_vecs"]], q[:, tabs["chain_diag"]],
                          lax.sub(rep(b[:, ids]), terms))
    x = [None] * first
    for j in range(first - 1, -1, -1):                                  # L x = u
        dofs, width, _ = groups[j]
        idx = tabs["anc"][j]
        if idx is None:
            x[j] = u[j]
            continue
        later = [x[t].reshape(g, -1, w) for t in range(first - 1, j, -1)]
        pool = lax.concatenate(([xc] if c else []) + later +
                               [lax.full((g, 1, w), 0, q.dtype)], 1)
        xa = pool[:, idx.reshape(-1)].reshape(g, width - 1, len(dofs) * w)
        x[j] = lax.sub(u[j], _sum1(lax.mul(
            lax.slice_in_dim(blocks[j], 0, width - 1, axis=1), xa)))
    return lax.concatenate([xv.reshape(g, -1, w) for xv in x] + ([xc] if c else []), 1)


def _sum1(x):
    """``x`` summed over axis 1 (jnp.sum's reduction, traced without jnp)."""
    return lax.reduce(x, np.zeros((), x.dtype), lax.add, (1,))


def _solve_order(plan, tabs):
    """The dofs of :func:`_level_solve_blocks`'s output rows."""
    groups = plan.groups[:tabs["first"]]
    return np.concatenate([np.asarray(dofs) for dofs, _, _ in groups] + [tabs["ids"]])


def _packed_solves(m, plan, axis_size, packed, b, b_batched):
    """x (r, B, n): a batch of right-hand sides b (B, n) (or one, (n,), if not
    ``b_batched``) solved with each of r packed factors, ``packed`` (B, r, S + 1), on
    the packed factors with the worlds on the minor axis (:func:`_level_solve_blocks`)."""
    n, r = m.nv, packed.shape[1]
    w = _LANES
    pad = -axis_size % w
    g = (axis_size + pad) // w
    b = b if b_batched else jnp.broadcast_to(b, (axis_size,) + b.shape)
    if pad:
        # worlds of ones (unit factors) and zero right-hand sides: finite, unread
        packed = jnp.pad(packed, ((0, pad), (0, 0), (0, 0)), constant_values=1)
        b = jnp.pad(b, ((0, pad), (0, 0)))
    q = packed.reshape(g, w, r, -1).transpose(2, 0, 3, 1).reshape(r * g, -1, w)
    bl = b.reshape(g, w, n).transpose(0, 2, 1)
    tabs = _solve_tables(m, plan)
    x = _level_solve_blocks(plan, tabs, q, bl)
    # worlds back on the major axis, then the dofs in order (a gather of rows)
    x = x.reshape(r, g, n, w).transpose(0, 1, 3, 2).reshape(r, g * w, n)
    return x[:, :axis_size, np.argsort(_solve_order(plan, tabs))]


def _solve_pair_bound(m):
    """:func:`solve_ld_pair` for model ``m``: a custom_vmap (lane blocks) inside a
    custom_jvp (the derivative is the dense solves')."""
    key = ("solve_pair", np.asarray(m.dof_parentid).tobytes())
    fn = _CACHE.get(key)
    if fn is not None:
        return fn
    plan = _level_plan(m)

    # one solve, jitted: traced once for both factors (the unbatched program is traced
    # even where only the batched rule runs)
    one = jax.jit(lambda q, b: solve_ld(m, q, b))

    def dense(q0, q1, b):
        return one(q0, b), one(q1, b)

    @jax.custom_batching.custom_vmap
    def pair(packed, q0, q1, b):
        return dense(q0, q1, b)

    @pair.def_vmap
    def _pair_vmap(axis_size, in_batched, packed, q0, q1, b):
        if not in_batched[0]:
            axes = [0 if f else None for f in in_batched[1:]]
            return jax.vmap(dense, in_axes=axes)(q0, q1, b), (True, True)
        x = _packed_solves(m, plan, axis_size, packed, b, in_batched[3])
        return (x[0], x[1]), (True, True)

    fn = jax.custom_jvp(pair)

    @fn.defjvp
    def _jvp(primals, tangents):
        # ``packed`` is q0 and q1 repacked: the derivative is the dense solves'
        _, q0, q1, b = primals
        _, dq0, dq1, db = tangents
        return fn(*primals), jax.jvp(dense, (q0, q1, b), (dq0, dq1, db))[1]
    _CACHE[key] = fn
    return fn


def solve_ld_pair(m, packed, qld0, qld1, b):
    """(qM^-1 b, (qM + diag)^-1 b) from :func:`factor_ld_pair_packed`'s outputs (its
    packed factors and the dense ones, qld0 and qld1); b (nv,). Batched (under vmap),
    both solves run together on the packed factors with the worlds on the minor axis
    (:func:`_level_solve_blocks`); unbatched, as :func:`solve_ld`."""
    return _solve_pair_bound(m)(packed, qld0, qld1, b.astype(qld0.dtype))


def _level_pair_bound(m):
    """factor_ld_pair's batched level factorisation for model ``m`` (its tree is
    static): a custom_vmap (the layout needs the batch) inside a custom_jvp (the
    tangent is the pure-JAX factorisation's, as for the LAPACK path). Called with
    ``a`` None and ``lower`` the factors of ``a``'s lower triangle, it computes ``a``
    from them and returns it as a fourth output."""
    key = ("pair", np.asarray(m.dof_parentid).tobytes())
    fn = _CACHE.get(key)
    if fn is not None:
        return fn
    plan, n = _level_plan(m), m.nv

    # one factorisation and one packing, jitted: traced once for both matrices (the
    # unbatched program is traced even where only the batched rule runs); factor_ld
    # adds a zero diagonal where none is given
    one = jax.jit(lambda a, diag: factor_ld(m, a, add_diag=diag))
    pack = jax.jit(lambda q: _pack_world(plan, q))
    matrix = _matrix_fn(m)

    @jax.custom_batching.custom_vmap
    def pair(a, lower, diag):
        # unbatched: one matrix is not worth a lane block
        full = a is None
        a = matrix(*lower) if full else a
        q0, q1 = one(a, jnp.zeros_like(diag)), one(a, diag)
        return (q0, q1, jnp.stack([pack(q0), pack(q1)])) + ((a,) if full else ())

    @pair.def_vmap
    def _pair_vmap(axis_size, in_batched, a, lower, diag):
        # the level factorisation reads only tree entries (on and below the diagonal):
        # those of ``lower``, whose expression may be cheaper than a's
        lower = _batched(lower, in_batched[1], axis_size)
        diag = _batched(diag, in_batched[2], axis_size)
        out = _level_pair_batched(plan, n, lower, diag)
        return out, (True,) * len(out)

    fn = jax.custom_jvp(pair)

    @fn.defjvp
    def _jvp(primals, tangents):
        # ``lower`` equals ``a`` where it is read: the derivative is a's
        a, lower, diag = primals
        da, dlower, ddiag = tangents
        out = fn(a, lower, diag)
        full = a is None
        if full:
            a, da = jax.jvp(matrix, lower, dlower)
        d0, d1 = factor_ld_tangent(m, a, da), factor_ld_tangent(m, a, da, diag, ddiag)
        return out, (d0, d1, jnp.stack([_pack_world(plan, d0), _pack_world(plan, d1)])) + (
            (da,) if full else ())
    _CACHE[key] = fn
    return fn


def _matrix_fn(m):
    """tree_linalg.from_factors' full matrix for model ``m``, jitted (traced once)."""
    key = ("from_factors", np.asarray(m.dof_parentid).tobytes())
    fn = _CACHE.get(key)
    if fn is None:
        fn = _CACHE[key] = jax.jit(lambda f, cdof, arm: from_factors(m, f, cdof, arm)[0])
    return fn


def _batched(x, batched, axis_size):
    """``x`` batched over ``axis_size`` where ``batched`` says it is not: an array, or
    factors (f, cdof, armature; see :func:`_pack_factors`), whose armature stays as
    it is (model constants, one for all worlds)."""
    if isinstance(x, tuple):
        return tuple(_batched(v, f, axis_size) for v, f in zip(x[:2], batched[:2])) + x[2:]
    return x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)


def _as_lower(a, lower):
    """``lower`` for the level factorisation: ``a`` if None, else in ``a``'s dtype
    (factors, see :func:`_pack_factors`, where ``a`` is None: as they are)."""
    if lower is None:
        return a
    if isinstance(lower, tuple):
        return lower if a is None else tuple(v.astype(a.dtype) for v in lower)
    return lower.astype(a.dtype)


def factor_ld_pair(m, a, add_diag, lower=None):
    """(qLD of ``a``, qLD of ``a + diag(add_diag)``): mj_factorM and the factorisation
    of mj_Euler's implicit damping, in one program. ``lower``, if given, equals ``a``
    on and below the diagonal; the batched level factorisation reads it instead of
    ``a`` (see smooth.crb_lower). ``lower`` may instead be the factors of ``a``'s
    lower triangle (smooth.crb_lower's, see :func:`_pack_factors`), ``a`` then None.

    On CPU, for trees where :func:`factor_ld` would call LAPACK, a batch (under
    ``vmap``) is factorised level by level in pure JAX, both matrices together (one set
    of kernels for the two). MuJoCo's tree L'DL does about sum(depth^2) operations per
    matrix where LAPACK's dense Cholesky does nv^3/3, and LAPACK's small-matrix call
    costs about 1.5 us for nv = 27; the level factorisation vectorises over the worlds.
    Its XLA program (one kernel per group of rows, see :func:`_level_plan`, plus
    packing and unpacking) takes longer to compile than the LAPACK loop, so it is used
    where it serves two factorisations. Same results as two :func:`factor_ld` calls up
    to rounding.
    """
    return factor_ld_pair_packed(m, a, add_diag, lower)[:2]


def factor_ld_pair_packed(m, a, add_diag, lower=None, with_matrix=False):
    """:func:`factor_ld_pair`, and both factors packed for :func:`solve_ld_pair`
    ((2, S + 1) per matrix pair), or None where the pair is not factorised level by
    level: (qLD, qLD of a + diag(add_diag), packed or None). ``with_matrix``: ``a`` as
    a fourth output (given as factors, ``a`` None: the matrix made from them; batched,
    from the packed entries, see :func:`_level_pair_batched`)."""
    dtype = (lower[0] if a is None else a).dtype
    add_diag = add_diag.astype(dtype)
    if level_plan_fits(m):
        out = _level_pair_bound(m)(a, _as_lower(a, lower), add_diag)
        out = out if a is None else out + (a,)
    else:
        a = from_factors(m, *lower)[0] if a is None else a
        out = factor_ld(m, a), factor_ld(m, a, add_diag=add_diag), None, a
    return out if with_matrix else out[:3]


def level_plan_fits(m, max_chain=None):
    """Whether a CPU batch of ``m``'s inertia matrices may be factorised level by level
    (:func:`factor_ld_pair`, level_ld.factor_ld_packed): where :func:`factor_ld` would
    call LAPACK, on trees within ``_LEVEL_MAX_GROUPS`` / ``_LEVEL_MAX_TERMS`` and, if
    ``max_chain`` is given, with a root chain of at most that many dofs."""
    if not (m.nv > _UNROLL_NV and lapack_chol.enabled(m.nv)):
        return False
    plan = _level_plan(m)
    return (len(plan.groups) <= _LEVEL_MAX_GROUPS and plan.pairs <= _LEVEL_MAX_TERMS
            and (max_chain is None or plan.chain <= max_chain))


#: bounds on the trees :func:`factor_ld_pair` factorises level by level: its program
#: has a kernel per group of rows (at least one per height level) and a vector term
#: per group and descendant, and its compile time grows with both (MuJoCo's humanoid:
#: 15 groups, 195 terms for 216 (dof, descendant) pairs); deeper or larger trees keep
#: LAPACK
_LEVEL_MAX_GROUPS = 16
_LEVEL_MAX_TERMS = 512
#: whether the root chain's rows start from :func:`_chain_schur` (read at trace time)
_CHAIN = True
