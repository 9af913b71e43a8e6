"""Per-island reductions of the primal solvers (:mod:`simjax.engine.solver`): MuJoCo
4.0.0 solves each constraint island (mj_island) on its own."""
import jax
import jax.numpy as jnp

from simjax.engine.math import reduce_fused, where


#: :meth:`Islands._expand` selects up to this many islands' values by their ids, a
#: gather beyond
_SELECTS = 4


def _varying(ids, x):
    """``ids``, made to depend on ``x`` (an optimisation barrier): the comparisons of
    the ids (loop-invariant in the line search, where ``x`` is not) fuse into the
    kernels that use them, where XLA's loop-invariant code motion made each one a
    kernel of its own before the loop, materialised."""
    return jax.lax.optimization_barrier((ids, x))[0] if _VARYING else ids


#: :func:`_varying` is applied, read at trace time (False: not, kept to compare)
_VARYING = True


class Islands:
    """Per-island reductions for the primal solvers (MuJoCo 4.0.0 solves each constraint
    island, mj_island, on its own). The iterations keep full-size vectors; every scalar
    of an iteration (dot products, norms, line-search points, CG's beta) is an (n,)
    array, one entry per island: reductions sum over the island's dofs (``dof`` (nv,))
    or rows (``row`` (nefc,)); id ``n`` marks dofs / rows in no island. The problem is
    block diagonal over islands (M is block diagonal over kinematic trees and a row's
    Jacobian touches its island's dofs only), so full-size matrix products and the
    Newton factorisation act on every island separately. With one island (``n`` 1) the
    reductions are plain sums and dot products over everything."""

    def __init__(self, n, row=None, dof=None):
        # row or dof may be None where only the other side's reductions are used
        self.n = n
        if n > 1:
            self.row, self.dof = row, dof

    def _sum(self, ids, x):
        # exact segment sum (a select, not a product with a 0/1 matrix)
        mask = _varying(ids, x)[:, None] == jnp.arange(self.n, dtype=jnp.int32)
        x = x.reshape(x.shape[:1] + (1,) + x.shape[1:])
        m = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
        return reduce_fused(where(m, x, 0), 0)

    def rsum(self, x):
        """(nefc, ...) -> (n, ...): sums over each island's rows."""
        if self.n == 1:
            return reduce_fused(x, 0)[None]
        return self._sum(self.row, x)

    def ddot(self, a, b):
        """(n,) dot products of two (nv,) vectors over each island's dofs."""
        if self.n == 1:
            return jnp.dot(a, b)[None]
        return self._sum(self.dof, a * b)

    def ddots(self, a, b):
        """(n, m) dot products of an (nv,) vector with the m columns of b (nv, m) over
        each island's dofs: one reduction for several dot products."""
        if self.n == 1:
            return reduce_fused(a[:, None] * b, 0)[None]
        return self._sum(self.dof, a[:, None] * b)

    def norm(self, a):
        if self.n == 1:
            return jnp.linalg.norm(a)[None]
        return jnp.sqrt(self.ddot(a, a))

    @staticmethod
    def _expand(v, ids, fill):
        # a few islands: selects by the ids (elementwise, fused into their users; a
        # gather from the values with the fill appended is a kernel of its own with
        # the concatenation of its indices)
        n = v.shape[0]
        if n <= _SELECTS:
            ids = _varying(ids, v)
            out = jnp.full(ids.shape + v.shape[1:], fill, v.dtype)
            for i in range(n):
                out = where(ids == i, v[i], out)
            return out
        return jnp.concatenate([v, jnp.full((1,), fill, v.dtype)])[ids]

    def rx(self, v, fill):
        """(n,) island values on the rows ((1,), broadcasting, with one island)."""
        return v if self.n == 1 else self._expand(v, self.row, fill)

    def dx(self, v, fill):
        """(n,) island values on the dofs ((1,), broadcasting, with one island)."""
        return v if self.n == 1 else self._expand(v, self.dof, fill)

    def block(self, start, n, dim):
        """Island ids of the contacts of an elliptic block (None with one island)."""
        return None if self.n == 1 else self.row[start:start + n * dim:dim]

    def bsum(self, ids, x):
        """(contacts, ...) -> (n, ...) sums over each island's contacts of a block."""
        if self.n == 1:
            return reduce_fused(x, 0)[None]
        return self._sum(ids, x)

    def bx(self, ids, v):
        return v if self.n == 1 else self._expand(v, ids, 0)
