"""Per-island reductions of the primal solvers (:mod:`simjax.engine.solver`): MuJoCo
4.0.0 solves each constraint island (mj_island) on its own."""
import jax.numpy as jnp

from simjax.engine.math import reduce_fused, where


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
            ids = jnp.arange(n, dtype=jnp.int32)
            self.row, self.dof = row, dof
            if row is not None:
                self.rmask = row[:, None] == ids                 # (nefc, n)
            if dof is not None:
                self.dmask = dof[:, None] == ids                 # (nv, n)

    @staticmethod
    def _sum(mask, x):
        # exact segment sum (a select, not a product with a 0/1 matrix)
        x = x.reshape(x.shape[:1] + (1,) * (mask.ndim - 1) + x.shape[1:])
        m = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
        return reduce_fused(where(m, x, 0), 0)

    def rsum(self, x):
        """(nefc, ...) -> (n, ...): sums over each island's rows."""
        if self.n == 1:
            return reduce_fused(x, 0)[None]
        return self._sum(self.rmask, x)

    def ddot(self, a, b):
        """(n,) dot products of two (nv,) vectors over each island's dofs."""
        if self.n == 1:
            return jnp.dot(a, b)[None]
        return self._sum(self.dmask, a * b)

    def ddots(self, a, b):
        """(n, m) dot products of an (nv,) vector with the m columns of b (nv, m) over
        each island's dofs: one reduction for several dot products."""
        if self.n == 1:
            return reduce_fused(a[:, None] * b, 0)[None]
        return self._sum(self.dmask, a[:, None] * b)

    def norm(self, a):
        if self.n == 1:
            return jnp.linalg.norm(a)[None]
        return jnp.sqrt(self.ddot(a, a))

    @staticmethod
    def _expand(v, ids, fill):
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
        return self._sum(ids[:, None] == jnp.arange(self.n, dtype=jnp.int32), x)

    def bx(self, ids, v):
        return v if self.n == 1 else self._expand(v, ids, 0)
