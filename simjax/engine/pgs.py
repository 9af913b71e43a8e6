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

import jax
import jax.numpy as jnp
import numpy as np

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
        djj = jnp.sqrt(jnp.maximum(v[j], MINVAL))
        return low.at[:, j].set(jnp.where(idx >= j, v / djj, 0.0))

    return jax.lax.fori_loop(0, n, body, jnp.zeros_like(a))


def cho_solve(low, b):
    """Solve (L L') x = b for the factor of :func:`cholesky`; b (n,)."""
    n = low.shape[-1]

    def fwd(i, y):
        return y.at[i].set((b[i] - low[i] @ y) / low[i, i])

    y = jax.lax.fori_loop(0, n, fwd, jnp.zeros_like(b))

    def bwd(k, x):
        i = n - 1 - k
        return x.at[i].set((y[i] - low[:, i] @ x) / low[i, i])

    return jax.lax.fori_loop(0, n, bwd, jnp.zeros_like(b))


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
        delta = -val / jnp.where(deriv == 0, -1.0, deriv)
        small = delta < 1e-10
        x = jnp.where(done, x, xn)
        newla = jnp.where(done | stop | small | fail_now, la, la + delta)
        return newla, x, done | stop | small | fail_now, fail | fail_now

    la, x, _, fail = jax.lax.fori_loop(0, 20, body, (jnp.zeros((), b.dtype), jnp.zeros_like(b),
                                                     jnp.zeros((), bool), jnp.zeros((), bool)))
    x = jnp.where(fail, 0.0, x * d)
    return x, (la != 0) & ~fail


def _project_ellipsoid(fric, normal, mu, feasible):
    s = jnp.sum(fric * fric / (mu * mu))
    scl = jnp.sqrt(normal * normal / jnp.maximum(MINVAL, s))
    do = ~feasible | (s > normal * normal)
    return jnp.where(do, fric * scl, fric)


def _pgs(spec, p, force0, iterations, lay):
    """Projected Gauss-Seidel on the dual (mj_solPGS). Returns (force, niter, improvement)."""
    AR = _ar(p)
    b = p["efc_b"]
    nefc = spec.nefc
    diag = jnp.diag(AR)
    fl = p["floss"]
    scale = 1.0 / (p["meaninertia"] * max(1, spec.nv))
    tol = p["tolerance"]
    act = p["active"]
    in_ell = np.zeros(nefc, bool)
    for start, n, dim in spec.ell:
        in_ell[start:start + n * dim] = True
    scalar_rows = np.nonzero(~in_ell)[0]
    fric = spec.fric
    ineq = spec.ineq

    def scalar_sweep(force, imp):
        def body(k, s):
            force, imp = s
            i = jnp.asarray(scalar_rows)[k]
            res = b[i] + AR[i] @ force
            old = force[i]
            f = old - res / diag[i]
            f = jnp.where(jnp.asarray(fric)[i], jnp.clip(f, -fl[i], fl[i]), f)
            f = jnp.where(jnp.asarray(ineq)[i], jnp.maximum(f, 0.0), f)
            f = jnp.where(act[i], f, 0.0)
            delta = f - old
            change = 0.5 * delta * delta * diag[i] + delta * res
            f = jnp.where(change > 1e-10, old, f)
            change = jnp.where(change > 1e-10, 0.0, change)
            return force.at[i].set(f), imp - change
        return jax.lax.fori_loop(0, len(scalar_rows), body, (force, imp))

    def ell_sweep(force, imp):
        for (start, n, dim), mu, fr in zip(spec.ell, p["mu"], p["fr"]):
            def body(c, s, start=start, dim=dim, fr=fr):
                force, imp = s
                i = start + c * dim
                idx = i + jnp.arange(dim)
                rows = AR[idx]                                      # (dim, nefc)
                res = b[idx] + rows @ force
                old = force[idx]
                Ath = rows[:, idx]
                f = old
                # normal update when the normal force is (nearly) zero
                fn = jnp.maximum(old[0] - res[0] / Ath[0, 0], 0.0)
                f_norm = jnp.concatenate([fn[None], jnp.zeros(dim - 1, f.dtype)])
                # ray update otherwise
                v1 = Ath @ f
                den = jnp.dot(f, v1)
                x = -jnp.dot(f, res) / jnp.where(den >= MINVAL, den, 1.0)
                x = jnp.where(f[0] + x * f[0] < 0, -f[0] / jnp.where(f[0] == 0, 1.0, f[0]), x)
                f_ray = jnp.where(den >= MINVAL, f + x * f, f)
                f = jnp.where(old[0] < MINVAL, f_norm, f_ray)
                # friction update with the normal fixed
                ac = Ath[1:, 1:]
                bc = res[1:] - ac @ old[1:] + Ath[1:, 0] * (f[0] - old[0])
                frc = fr[c]
                v, activeq = _qcqp(ac, bc, frc, f[0])
                v = jnp.where(activeq, _project_ellipsoid(v, f[0], frc, False), v)
                v = jnp.where(f[0] < MINVAL, 0.0, v)
                f = jnp.concatenate([f[:1], v])
                f = jnp.where(act[i], f, 0.0)
                delta = f - old
                change = 0.5 * delta @ Ath @ delta + jnp.dot(delta, res)
                f = jnp.where(change > 1e-10, old, f)
                change = jnp.where(change > 1e-10, 0.0, change)
                return force.at[idx].set(f), imp - change
            force, imp = jax.lax.fori_loop(0, n, body, (force, imp))
        return force, imp

    def project(force):
        force = jnp.where(jnp.asarray(fric), jnp.clip(force, -fl, fl), force)
        force = jnp.where(jnp.asarray(ineq), jnp.maximum(force, 0.0), force)
        for (start, n, dim), mu, fr in zip(spec.ell, p["mu"], p["fr"]):
            blk = _ell_rows(force, start, n, dim)
            neg = blk[:, 0] < 0
            proj = jax.vmap(lambda fz, nn, m_: _project_ellipsoid(fz, nn, m_, True))(
                blk[:, 1:], blk[:, 0], fr)
            blk = jnp.where(neg[:, None], 0.0, jnp.concatenate([blk[:, :1], proj], 1))
            force = force.at[start:start + n * dim].set(blk.reshape(-1))
        return force

    def cond(s):
        return ~s["done"] & (s["iter"] < iterations)

    def body(s):
        force, prev, k = s["force"], s["prev"], s["k"]
        beta = jnp.where(s["iter"] > 0, (k - 1) / (k + 2.0), 0.0)
        use = beta > 0
        extr = project(force + beta * (force - prev))
        prev = jnp.where(use, force, force)
        force = jnp.where(use, extr, force)
        mom = force
        imp = jnp.zeros((), force.dtype)
        force, imp = scalar_sweep(force, imp)
        force, imp = ell_sweep(force, imp)
        imp = imp * scale
        corr = jnp.dot(force - mom, mom - prev)
        restart = (s["iter"] > 0) & (corr < 0)
        k = jnp.where(restart, 0, k + 1)
        return dict(force=force, prev=prev, k=k, iter=s["iter"] + 1, done=imp < tol, imp=imp)

    s = dict(force=force0, prev=force0, k=jnp.int32(0), iter=jnp.int32(0),
             done=jnp.zeros((), bool), imp=jnp.zeros((), force0.dtype))
    s = jax.lax.while_loop(cond, body, s)
    return s["force"], s["iter"], s["imp"]


def _noslip(spec, p, force, iterations, lay):
    """Noslip post-pass (mj_solNoSlip): friction-loss and contact-friction rows re-solved
    with the unregularised A = J M^-1 J', normal forces fixed. A fixed number of sweeps
    (``lax.scan`` with a convergence mask), so it is differentiated directly."""
    A = _ar(p) - jnp.diag(p["R"])
    b = p["efc_b"]
    fl = p["floss"]
    act = p["active"]
    tol = p["noslip_tolerance"]
    scale = 1.0 / (p["meaninertia"] * max(1, spec.nv))
    dinv = 1.0 / jnp.maximum(MINVAL, jnp.diag(A))
    fric_rows = jnp.asarray(np.nonzero(spec.fric)[0])
    pairs = [np.arange(blk.start, blk.start + blk.n * blk.k, 2)
             for blk in lay.blocks if blk.kind == "conpyr"]
    pairs = jnp.asarray(np.concatenate(pairs) if pairs else np.zeros(0, np.int64))

    def fric_body(k, s):
        force, imp = s
        i = fric_rows[k]
        r = b[i] + A[i] @ force
        old = force[i]
        f = jnp.clip(old - r * dinv[i], -fl[i], fl[i])
        f = jnp.where(act[i], f, old)
        dl = f - old
        return force.at[i].set(f), imp - (0.5 * dl * dl / dinv[i] + dl * r)

    def pyr_body(k, s):
        force, imp = s
        idx = pairs[k] + jnp.arange(2)
        r = b[idx] + A[idx] @ force
        old = force[idx]
        ac = A[idx][:, idx]
        bc = r - ac @ old
        mid = 0.5 * (old[0] + old[1])
        k1 = ac[0, 0] + ac[1, 1] - ac[0, 1] - ac[1, 0]
        k0 = mid * (ac[0, 0] - ac[1, 1]) + bc[0] - bc[1]
        y = -k0 / jnp.where(k1 < MINVAL, 1.0, k1)
        f = jnp.where(y < -mid, jnp.stack([0.0 * mid, 2 * mid]),
                      jnp.where(y > mid, jnp.stack([2 * mid, 0.0 * mid]),
                                jnp.stack([mid + y, mid - y])))
        f = jnp.where(k1 < MINVAL, jnp.stack([mid, mid]), f)
        f = jnp.where(act[idx[0]], f, old)
        dl = f - old
        change = 0.5 * dl @ ac @ dl + dl @ r
        bad = change > 1e-10
        return force.at[idx].set(jnp.where(bad, old, f)), imp - jnp.where(bad, 0.0, change)

    def sweep(force):
        s = (force, jnp.zeros((), force.dtype))
        s = jax.lax.fori_loop(0, fric_rows.shape[0], fric_body, s)
        s = jax.lax.fori_loop(0, pairs.shape[0], pyr_body, s)
        for (start, n, dim), mu, fr in zip(spec.ell, p["mu"], p["fr"]):
            def ell_body(c, s, start=start, dim=dim, fr=fr):
                force, imp = s
                i = start + c * dim
                idx = i + 1 + jnp.arange(dim - 1)
                r = b[idx] + A[idx] @ force
                old = force[idx]
                ac = A[idx][:, idx]
                bc = r - ac @ old
                v, on = _qcqp(ac, bc, fr[c], force[i])
                v = jnp.where(on, _project_ellipsoid(v, force[i], fr[c], False), v)
                v = jnp.where(force[i] < MINVAL, 0.0, v)
                v = jnp.where(act[i], v, old)
                dl = v - old
                change = 0.5 * dl @ ac @ dl + dl @ r
                bad = change > 1e-10
                return (force.at[idx].set(jnp.where(bad, old, v)),
                        imp - jnp.where(bad, 0.0, change))
            s = jax.lax.fori_loop(0, n, ell_body, s)
        return s

    extra = 0.5 * jnp.sum(force * force * jnp.where(act, p["R"], 0.0))

    def body(s, _):
        force, done, it, first = s
        new, imp = sweep(force)
        imp = (imp + jnp.where(first, extra, 0.0)) * scale
        force = jnp.where(done, force, new)
        it = it + jnp.where(done, 0, 1)
        return (force, done | (imp < tol), it, jnp.zeros((), bool)), None

    init = (force, jnp.zeros((), bool), jnp.int32(0), jnp.ones((), bool))
    (force, _, it, _), _ = jax.lax.scan(body, init, None, length=iterations)
    return force, it
