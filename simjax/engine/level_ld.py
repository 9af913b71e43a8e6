"""mj_factorM (and mj_solveM) for a CPU batch, level by level with the worlds on the
minor axis (one matrix: the single form of tree_level.factor_ld_pair and
tree_level.solve_ld_pair).

Where :func:`tree_linalg.factor_ld` would call LAPACK (a chunked loop of small dense
Cholesky calls, nv^3/3 operations per matrix, and a transposing copy of the batch) a
batch (under ``vmap``) is instead factorised with MuJoCo's tree L'DL one group of rows
per kernel (tree_level._level_ld_blocks, about sum(depth^2) operations). Stage alone
(float32, batch 1024, us CPU per world): factor shadow hand 1.2 against 2.2, barkour
0.65 against 0.98, ant 0.55 against 0.74; the humanoid (a root chain of 9 dofs, 15
groups) 2.3 against 2.4. Used where it pays in the whole step (``_ON``, ``_MAX_CHAIN``).
The solve may run on the packed factor as well (see
``_SOLVE``): stage alone the hand's 0.47 against the scan's 0.90 us, but in the whole
step it gained nothing measurable over the scan and cost 10 kernels more.
"""
from __future__ import annotations

import jax
import numpy as np

from simjax.engine import tree_level
from simjax.engine import tree_linalg as tl


def use_level(m) -> bool:
    """Whether :func:`factor_ld_packed` factorises a batch level by level: where
    tree_linalg.factor_ld would call LAPACK, on trees within the level plan's bounds
    and without a root chain (see ``_MAX_CHAIN``)."""
    return _ON and tree_level.level_plan_fits(m, _MAX_CHAIN)


def factor_ld_packed(m, a, lower=None, with_matrix=False):
    """(qLD of ``a``, its packed factor for :func:`solve_ld_packed` or None), and
    ``a`` as well with ``with_matrix``. ``lower``, if given, equals ``a`` on and below
    the diagonal and is read instead of it when the batch is factorised level by level
    (see smooth.crb_lower); it may instead be the factors of ``a``'s lower triangle
    (smooth.crb_lower's, see tree_level._pack_factors), ``a`` then None: the ``a``
    returned is made from them (batched, from the packed entries). Same results as
    tree_linalg.factor_ld up to rounding."""
    if not use_level(m):
        a = tl.from_factors(m, *lower)[0] if a is None else a
        out = tl.factor_ld(m, a), None, a
    else:
        out = _factor_bound(m)(a, tree_level._as_lower(a, lower))
        out = out if a is None else out + (a,)
    return out if with_matrix else out[:2]


def solve_ld_packed(m, packed, qld, b):
    """qM^-1 b from :func:`factor_ld_packed`'s outputs (packed factor and qLD); b (nv,).
    Batched, the solve runs on the packed factor; unbatched, as tree_linalg.solve_ld."""
    if not _SOLVE:
        return tl.solve_ld(m, qld, b)
    return _solve_bound(m)(packed, qld, b.astype(qld.dtype))


def _factor_bound(m):
    """:func:`factor_ld_packed`'s level factorisation for model ``m``: a custom_vmap
    (the layout needs the batch) inside a custom_jvp (the pure-JAX tangent). Called
    with ``a`` None and ``lower`` the factors of ``a``'s lower triangle, it computes
    ``a`` from them and returns it as a third output."""
    key = ("level_one", np.asarray(m.dof_parentid).tobytes())
    fn = tl._CACHE.get(key)
    if fn is not None:
        return fn
    plan, n = tree_level._level_plan(m), m.nv
    # unbatched (traced even where only the batched rule runs): jitted, traced once
    one = jax.jit(lambda a: tl.factor_ld(m, a))
    pack = jax.jit(lambda q: tree_level._pack_world(plan, q)[None])
    matrix = tree_level._matrix_fn(m)

    @jax.custom_batching.custom_vmap
    def single(a, lower):
        full = a is None
        a = matrix(*lower) if full else a
        q = one(a)
        return (q, pack(q)) + ((a,) if full else ())

    @single.def_vmap
    def _single_vmap(axis_size, in_batched, a, lower):
        lower = tree_level._batched(lower, in_batched[1], axis_size)
        out = tree_level._level_pair_batched(plan, n, lower, None, _lanes(axis_size))
        return out, (True,) * len(out)

    fn = jax.custom_jvp(single)

    @fn.defjvp
    def _jvp(primals, tangents):
        # ``lower`` equals ``a`` where it is read: the derivative is a's
        a, lower = primals
        da, dlower = tangents
        full = a is None
        if full:
            a, da = jax.jvp(matrix, lower, dlower)
        dq = tl.factor_ld_tangent(m, a, da)
        return fn(*primals), (dq, tree_level._pack_world(plan, dq)[None]) + (
            (da,) if full else ())
    tl._CACHE[key] = fn
    return fn


def _lanes(axis_size):
    """Worlds per lane block of the batched factorisation: ``_LANES`` for batches of at
    least four such blocks (padding then at most a quarter), else tree_level's."""
    return _LANES if axis_size >= 4 * _LANES else tree_level._LANES


def _solve_bound(m):
    """:func:`solve_ld_packed` for model ``m``: a custom_vmap (lane blocks) inside a
    custom_jvp (the derivative is the dense solve's)."""
    key = ("solve_one", np.asarray(m.dof_parentid).tobytes())
    fn = tl._CACHE.get(key)
    if fn is not None:
        return fn
    plan = tree_level._level_plan(m)
    one = jax.jit(lambda q, b: tl.solve_ld(m, q, b))

    @jax.custom_batching.custom_vmap
    def single(packed, qld, b):
        return one(qld, b)

    @single.def_vmap
    def _single_vmap(axis_size, in_batched, packed, qld, b):
        if not in_batched[0]:
            axes = [0 if f else None for f in in_batched[1:]]
            return jax.vmap(one, in_axes=axes)(qld, b), True
        return tree_level._packed_solves(m, plan, axis_size, packed, b, in_batched[2])[0], True

    fn = jax.custom_jvp(single)

    @fn.defjvp
    def _jvp(primals, tangents):
        # ``packed`` is qld repacked: the derivative is the dense solve's
        _, qld, b = primals
        _, dqld, db = tangents
        return fn(*primals), jax.jvp(one, (qld, b), (dqld, db))[1]
    tl._CACHE[key] = fn
    return fn


#: whether mj_factorM of a batch may run level by level (read at trace time; see
#: :func:`use_level`). Paired, whole bench step (float32, batch 1024, process CPU):
#: shadow hand run time 0.973 (0.91-1.03, 8 rounds) of LAPACK's, compile CPU 0.985
#: (0.94-1.04, 6 rounds), 3 kernels more and one loop less
_ON = True
#: longest root chain (tree_level._chain_plan: a free joint's dofs and the hinges below
#: it) of a tree factorised level by level. Paired, whole bench step (float32, batch
#: 1024): with chains up to 6 the barkour ran 2.3% and the ant 2.2% faster but barkour's
#: compile took 5.5% more CPU (8 kernels more: the chain's gather and reduction); the
#: humanoid's chain (9) is not faster stage alone
_MAX_CHAIN = 0
#: whether :func:`solve_ld_packed` solves on the packed factor (read at trace time;
#: False: tree_linalg.solve_ld on qLD). Paired, whole bench step, level factor and packed
#: solve against LAPACK and the scan: shadow hand run time 0.969 (the level factor with
#: the scan: 0.973), compile CPU 1.04 (hand) and 1.08 (barkour); 10 kernels more than
#: the scan
_SOLVE = False
#: worlds per lane block of the batched factorisation (read at trace time; see
#: :func:`_lanes`; tree_level._LANES, 8, to compare). A group of one row is then a
#: (G, 1, 8) kernel: LLVM vectorised it across the blocks with strided loads and
#: shuffles, and the shadow hand's such kernel (the first dof of the object's free
#: joint: 5 terms, slices of 5 other groups' blocks) was the costliest of its XLA
#: compile (5.1K lines of optimised LLVM IR; the one of XLA's 32 LLVM modules that
#: held it took 6-7 s by XLA's log, the others 0.5-1.5 s, loaded machine). With 32
#: worlds per block the minor loop is 32 long and contiguous. The same values: the
#: operations per world do not change. Shadow hand bench rollout (float32, batch 1024),
#: 32 / 8: XLA compile CPU 0.892 [0.813, 1.000] (7 fresh-process pairs) and 0.940
#: [0.889, 1.039] (6 alternated compiles in one process), load 8-12; run time 1.016
#: [0.863, 1.167] (16 rounds, load 9). The pair factorisation (tree_level._LANES) on
#: the humanoid: compile 0.980 [0.791, 1.140] (6 rounds), so it keeps 8
_LANES = 32

#: whether mj_factorM level by level takes qM's lower triangle as its factors
#: (smooth.crb_lower with ``factors``, read at trace time where smooth._LOWER_FACTORS
#: is on). Bench rollout (float32, batch 1024, process CPU, one process, alternated
#: rounds, load 7-10): the shadow hand ran 1.032 [0.851, 1.254] (12 rounds) and 1.044
#: [0.921, 1.366] (16) of the dense matrix's, reversed 1 / 0.943 [0.832, 1.081] (8),
#: though kinematics to qLD alone took 0.79 of it (16 rounds). Remeasured (load 4-8):
#: that stage 0.785 [0.672, 1.050] (16 rounds), 2.4 of its 10.3 us per world, about 2%
#: of the step (95-120 us): all the rollout can gain, and less than alternated rounds
#: resolve here (single rounds spread 0.4-1.5): 0.977 [0.852, 1.218] (16 rounds), 1.039
#: [0.404, 1.272] (40), 1.004 [0.370, 1.306] (30 with one XLA thread). No cause of a
#: loss was found: the optimised HLO differs only in qM's and the packing's kernels
#: (785 kernels each; qM's readers unchanged), the solver's iterations are capped at one
#: (the batched loop runs once either way) and match MuJoCo's (float32 and float64), and
#: profiler sums of the changed kernels moved by -1.2% and +0.7% of the rollout in two
#: runs. Off until a measurement at rest resolves 2%
_FACTORS = False
