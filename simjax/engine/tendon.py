"""Tendons: lengths, Jacobians and wrap paths (mj_tendon, mju_wrap).

Fixed tendons are linear in joint positions. Spatial tendons are chains of sites,
optionally wrapping around spheres and cylinders (with an optional side site choosing
the side, or forcing an inside wrap when the side site is within the geom) and split by
pulleys that divide the length of what follows.

Everything is vectorised: the static structure of every spatial tendon is flattened
(once per model structure, in numpy) into *segments* (site to site, possibly over one
wrapping geom) and *path items* (what each segment, pulley or end site contributes to
``wrap_xpos``); geometry is then computed for all segments at once and summed into
tendons with static one-hot matrices. Whether a segment wraps is decided at run time
(``jnp.where``), as are the number of path points it contributes.

Outputs (mjData names): ``ten_length`` (ntendon,), ``ten_J`` (ntendon, nv) dense,
``ten_wrapadr``, ``ten_wrapnum`` (ntendon,), ``wrap_obj`` (2 nwrap,) (-2 pulley, -1 site,
else the wrapping geom id), ``wrap_xpos`` (2 nwrap, 3) world frame; path entries past
the last used one are zero.
"""
from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline, math
from simjax.engine import tables as body_tables
from simjax.engine.solver_worlds import any_world
from simjax.errors import UnsupportedFeatureError
from simjax.types import WrapType

_CACHE: dict = {}
_GEOM = (WrapType.SPHERE, WrapType.CYLINDER)


@dataclasses.dataclass(frozen=True, eq=False)
class TendonTables:
    """Static tendon structure (numpy)."""

    fixed_member: np.ndarray   # (ntendon, nwrap) 1 where a joint wrap belongs to the tendon
    fixed_wraps: np.ndarray    # (k,) wrap ids of joint wraps
    # segments: site s0 -> [geom g] -> site s1, with pulley divisor wrap_prm[div] (-1: 1)
    seg_tendon: np.ndarray     # (ns,)
    seg_s0: np.ndarray
    seg_s1: np.ndarray
    seg_geom: np.ndarray       # (ns,) geom id or -1
    seg_cyl: np.ndarray        # (ns,) bool: wrapping geom is a cylinder
    seg_side: np.ndarray       # (ns,) wrap id whose wrap_prm holds the side site, or -1
    seg_div: np.ndarray        # (ns,) wrap id of the pulley divisor, or -1
    # path items, in wrap_xpos order: 0 pulley, 1 end site, 2 segment
    item_kind: np.ndarray      # (ni,)
    item_tendon: np.ndarray    # (ni,)
    item_ref: np.ndarray       # (ni,) site id (end site) or segment index (segment)


def tables(m) -> TendonTables:
    """Checked, cached tendon tables of ``m``."""
    names = ("tendon_adr", "tendon_num", "wrap_type", "wrap_objid", "geom_type")
    key = (m.ntendon, m.nwrap) + tuple(
        hashlib.sha1(np.ascontiguousarray(getattr(m, n)).tobytes()).hexdigest()
        for n in names)
    tab = _CACHE.get(key)
    if tab is None:
        tab = _CACHE[key] = _build(m)
    return tab


def _build(m) -> TendonTables:
    wtype = np.asarray(m.wrap_type)
    wobj = np.asarray(m.wrap_objid)
    adr_, num_ = np.asarray(m.tendon_adr), np.asarray(m.tendon_num)
    gtype = np.asarray(m.geom_type)
    member = np.zeros((m.ntendon, m.nwrap))
    seg = {k: [] for k in ("tendon", "s0", "s1", "geom", "cyl", "side", "div")}
    items = {k: [] for k in ("kind", "tendon", "ref")}
    for t in range(m.ntendon):
        adr, num = int(adr_[t]), int(num_[t])
        if num and wtype[adr] == WrapType.JOINT:
            member[t, adr:adr + num] = 1.0
            continue
        div, j = -1, 0
        while j < num - 1:
            t0, t1 = wtype[adr + j], wtype[adr + j + 1]
            if t0 == WrapType.PULLEY or t1 == WrapType.PULLEY:
                if t0 == WrapType.PULLEY:
                    div = adr + j
                    items["kind"].append(0), items["tendon"].append(t), items["ref"].append(-1)
                j += 1
                continue
            if t0 != WrapType.SITE:
                raise UnsupportedFeatureError(f"tendon {t}: spatial path element {j} of "
                                              f"wrap type {int(t0)} where a site is expected")
            geom, side = -1, -1
            s1 = wobj[adr + j + 1]
            if t1 in _GEOM:
                geom, side = int(wobj[adr + j + 1]), adr + j + 1
                s1 = wobj[adr + j + 2]
            elif t1 != WrapType.SITE:
                raise UnsupportedFeatureError(f"tendon {t}: wrap type {int(t1)}")
            items["kind"].append(2), items["tendon"].append(t)
            items["ref"].append(len(seg["tendon"]))
            for k, v in (("tendon", t), ("s0", wobj[adr + j]), ("s1", s1), ("geom", geom),
                         ("cyl", geom >= 0 and gtype[geom] == 5), ("side", side),
                         ("div", div)):
                seg[k].append(v)
            j += 2 if geom >= 0 else 1
            if j == num - 1 or wtype[adr + j + 1] == WrapType.PULLEY:
                items["kind"].append(1), items["tendon"].append(t), items["ref"].append(s1)
    i64 = lambda v, dt=np.int64: np.asarray(v, dt)  # noqa: E731
    return TendonTables(
        fixed_member=member, fixed_wraps=np.nonzero(wtype == WrapType.JOINT)[0],
        seg_tendon=i64(seg["tendon"]), seg_s0=i64(seg["s0"]), seg_s1=i64(seg["s1"]),
        seg_geom=i64(seg["geom"]), seg_cyl=i64(seg["cyl"], bool), seg_side=i64(seg["side"]),
        seg_div=i64(seg["div"]), item_kind=i64(items["kind"]),
        item_tendon=i64(items["tendon"]), item_ref=i64(items["ref"]))


# --------------------------------------------------------------------------- wrapping
def _norm2(x, y):
    return math.safe_sqrt(x * x + y * y)


def _normalize2(x, y):
    """2D mju_normalize: (1, 0) below MINVAL."""
    n = _norm2(x, y)
    small = n < math.MINVAL
    s = jnp.where(small, 1.0, n)
    return jnp.where(small, 1.0, x / s), jnp.where(small, 0.0, y / s)


def _intersect(p1, p2, p3, p4):
    """Whether 2D segments p1-p2 and p3-p4 intersect (points as (x, y) tuples)."""
    det = (p4[1] - p3[1]) * (p2[0] - p1[0]) - (p4[0] - p3[0]) * (p2[1] - p1[1])
    ok = jnp.abs(det) >= math.MINVAL
    sdet = jnp.where(ok, det, 1.0)
    a = ((p4[0] - p3[0]) * (p1[1] - p3[1]) - (p4[1] - p3[1]) * (p1[0] - p3[0])) / sdet
    b = ((p2[0] - p1[0]) * (p1[1] - p3[1]) - (p2[1] - p1[1]) * (p1[0] - p3[0])) / sdet
    return ok & (a >= 0) & (a <= 1) & (b >= 0) & (b <= 1)


def _acos(x):
    return jnp.arccos(math.clip_as_jnp(x, -1.0, 1.0))


def _asin(x):
    return jnp.arcsin(math.clip_as_jnp(x, -1.0, 1.0))


def _cross2(ax, ay, bx, by):
    return ax * by - ay * bx


def _wrap_circle(end, side, has_side, radius):
    """Shortest (or side-selected) wrap of a 2D segment around a circle at the origin.

    end: 4-tuple (x0, y0, x1, y1) of (n,) arrays; side: (sx, sy) side direction;
    has_side: (n,) bool. Returns (length or -1, (ax, ay, bx, by) tangent points).

    Without a side site the straight segment wraps only when it crosses the circle,
    around the side giving the shorter path. With a side site (MuJoCo 4.0 semantics,
    established against the 4.0 library): seen from the centre, the end points split
    the directions into the sector of angle < pi between them and its complement; the
    path sweeps the complement (wrapping even when the straight segment misses the
    circle) exactly when the direction opposite the side site lies in the small
    sector, and otherwise the small sector (straight when the segment misses). The
    path thus never passes the side of the geom opposite the side site.
    """
    x0, y0, x1, y1 = end
    sq0, sq1, sqr = x0 * x0 + y0 * y0, x1 * x1 + y1 * y1, radius * radius
    fail = (sq0 < sqr) | (sq1 < sqr) | (radius < math.MINVAL)
    dx, dy = x1 - x0, y1 - y0
    dd = dx * dx + dy * dy
    fail = fail | (dd < math.MINVAL)
    a = math.clip_as_jnp(-(dx * x0 + dy * y0) / jnp.where(dd < math.MINVAL, 1.0, dd), 0.0, 1.0)
    tx, ty = a * dx + x0, a * dy + y0
    miss = tx * tx + ty * ty > sqr
    r0 = math.safe_sqrt(sq0 - sqr)
    r1 = math.safe_sqrt(sq1 - sqr)
    s0 = jnp.where(fail, 1.0, sq0)
    s1 = jnp.where(fail, 1.0, sq1)
    # sgn +1: clockwise path (tangent point clockwise of end 0), -1: counter-clockwise
    sols, goods = [], []
    for sgn in (1.0, -1.0):
        sol = ((x0 * sqr + sgn * radius * y0 * r0) / s0, (y0 * sqr - sgn * radius * x0 * r0) / s0,
               (x1 * sqr - sgn * radius * y1 * r1) / s1, (y1 * sqr + sgn * radius * x1 * r1) / s1)
        # no side: prefer the closer tangent points, never tangents that cross
        ex, ey = sol[0] - sol[2], sol[1] - sol[3]
        cut = _intersect((x0, y0), (sol[0], sol[1]), (x1, y1), (sol[2], sol[3]))
        sols.append(sol)
        goods.append(jnp.where(cut, -10000.0, -(ex * ex + ey * ey)))
    # MuJoCo takes the first solution only when strictly better: a tie (a path through
    # the centre, both tangents alike) goes counter-clockwise
    ccw_plain = ~(goods[0] > goods[1])
    # side: orientation of the small sector, and whether -side lies in it
    small_ccw = _cross2(x0, y0, x1, y1) > 0
    nx, ny = -side[0], -side[1]
    c0n, cn1 = _cross2(x0, y0, nx, ny), _cross2(nx, ny, x1, y1)
    in_small = jnp.where(small_ccw, (c0n >= 0) & (cn1 >= 0), (c0n <= 0) & (cn1 <= 0))
    ccw = jnp.where(has_side, small_ccw ^ in_small, ccw_plain)
    fail = fail | jnp.where(has_side, miss & ~in_small, miss)
    pnt = tuple(jnp.where(ccw, v, u) for u, v in zip(*sols))
    ax, ay = _normalize2(pnt[0], pnt[1])
    bx, by = _normalize2(pnt[2], pnt[3])
    angle = _acos(ax * bx + ay * by)
    turn = _cross2(pnt[0], pnt[1], pnt[2], pnt[3])
    long_way = jnp.where(ccw, turn < 0, turn > 0)
    angle = jnp.where(long_way, 2 * jnp.pi - angle, angle)
    return jnp.where(fail, -1.0, radius * angle), pnt


def _wrap_inside(end, radius):
    """Wrap from inside a circle (side site within the geom).

    The tangent point solves f(z) = asin(A z) + asin(B z) - 2 asin(z) + G = 0 for
    z in (0, 1) with A = r/|end0|, B = r/|end1| and G the angle between the end points.
    MuJoCo 4.0's points lie within ~3e-7 rad of the exact root but on no Newton iterate
    of its published loop (tolerance 1e-6 on f) that could be reproduced, so simjax
    returns the exact root (:func:`_inside_root`; f(0) = G > 0; when f(1 - 1e-7) > 0
    there is no root and the mid direction is used, as MuJoCo does).

    Returns (0 or -1, (ax, ay, bx, by)) with both points equal.
    """
    niter, zinit = 60, 1 - 1e-7
    x0, y0, x1, y1 = end
    len0, len1 = _norm2(x0, y0), _norm2(x1, y1)
    dx, dy = x1 - x0, y1 - y0
    dd = dx * dx + dy * dy
    fail = ((len0 <= radius) | (len1 <= radius) | (radius < math.MINVAL) |
            (len0 < math.MINVAL) | (len1 < math.MINVAL))
    a = -(dx * x0 + dy * y0) / jnp.where(dd > math.MINVAL, dd, 1.0)
    inseg = (dd > math.MINVAL) & (a > 0) & (a < 1)
    fail = fail | (inseg & (_norm2(x0 + a * dx, y0 + a * dy) <= radius))
    # fallback: the mid direction on the circle
    mx, my = _normalize2(0.5 * (x0 + x1), 0.5 * (y0 + y1))
    mx, my = mx * radius, my * radius
    sl0 = jnp.where(fail, 1.0, len0)
    sl1 = jnp.where(fail, 1.0, len1)
    A, B = radius / sl0, radius / sl1
    cosg = (len0 * len0 + len1 * len1 - dd) / (2 * sl0 * sl1)
    fail = fail | (cosg < -1 + math.MINVAL)
    default = cosg > 1 - math.MINVAL
    g = _acos(cosg)
    default = default | (_inside_f(jnp.full_like(radius, zinit), A, B, g) > 0)
    t = _inside_root(A, B, g, zinit, niter)
    z = jnp.sin(t)
    use_a = x0 * y1 - y0 * x1 > 0
    vx, vy = _normalize2(jnp.where(use_a, x0, x1), jnp.where(use_a, y0, y1))
    ang = t - jnp.where(use_a, _asin(A * z), _asin(B * z))
    px = radius * (jnp.cos(ang) * vx - jnp.sin(ang) * vy)
    py = radius * (jnp.sin(ang) * vx + jnp.cos(ang) * vy)
    px, py = jnp.where(default, mx, px), jnp.where(default, my, py)
    return jnp.where(fail, -1.0, 0.0), (px, py, px, py)


def _inside_f(z, A, B, g):
    """The inside wrap's equation asin(A z) + asin(B z) - 2 asin(z) + G."""
    return _asin(A * z) + _asin(B * z) - 2 * _asin(z) + g


def _inside_f_angle(t, A, B, g):
    """:func:`_inside_f` at z = sin(t), and its derivative in t, (F, dF/dt)."""
    s, c = jnp.sin(t), jnp.cos(t)

    def term(k):
        ks = k * s
        return _asin(ks), k * c / math.maximum(math.MINVAL, math.safe_sqrt(1 - ks * ks))
    (fa, da), (fb, db) = term(A), term(B)
    return fa + fb - 2 * t + g, da + db - 2


def _inside_root(A, B, g, zinit, niter):
    """The angle t = asin(z) of the root z of :func:`_inside_f` in (0, zinit) for each
    segment, (n,). In t the equation is smooth up to the bracket's end, where in z its
    derivative grows without bound near 1. Newton steps safeguarded by bisection on the
    bracket (0, asin(zinit)), from its middle, run in a loop until no segment's iterate
    moves by more than a few ulps (at most ``niter``). Counted in float64 with NumPy:
    in t, a median of 5 steps, 99% within 11, at most 55 (12904 roots of random A, B in
    (0.01, 0.999), G in (1e-4, 3.1)); in z from zinit (60 fixed steps before), a median
    of 9, 10% over 40, up to 60 (3353 roots, A, B in (0.05, 0.95), G in (0.01, 3)).
    wrap_sidesite (batch 1024, float32): smooth position 32.7 -> 13.5 us per world-step,
    the corpus survey's rollout 73K -> 167-173K steps/s.

    Its derivative is the implicit one, not the loop's: the loop runs on values without
    gradient, and the output is its root t* plus the derivative (not the value) of one
    more Newton step from it, -F(t*)/F'(t*): in A, B and G, -(dF/dtheta)/F' at the root
    (implicit function theorem). So no loop is on the differentiated path."""
    As, Bs, gs = (jax.lax.stop_gradient(v) for v in (A, B, g))
    tol = 4 * jnp.finfo(jnp.result_type(A)).eps

    def body(c):
        it, t, lo, hi, _ = c
        f, df = _inside_f_angle(t, As, Bs, gs)
        lo = jnp.where(f > 0, t, lo)
        hi = jnp.where(f > 0, hi, t)
        step = t - f / jnp.where(df < -math.MINVAL, df, -1.0)
        ok = (df < -math.MINVAL) & (step > lo) & (step < hi)
        new = jnp.where(f == 0, t, jnp.where(ok, step, 0.5 * (lo + hi)))
        moving = jnp.any(jnp.abs(new - t) > tol * t)
        return it + 1, new, lo, hi, moving

    hi = jnp.full_like(As, np.arcsin(zinit))
    lo = jnp.zeros_like(As)
    init = (jnp.zeros((), jnp.int32), 0.5 * hi, lo, hi, jnp.ones((), bool))
    t = inline.while_loop(lambda c: c[4] & (c[0] < niter), body, init)[1]
    f, df = _inside_f_angle(t, A, B, g)
    ok = df < -math.MINVAL
    step = -jnp.where(ok, f / jnp.where(ok, df, -1.0), 0.0)
    # the step's derivative, not its value (t where the loop stopped short, at niter)
    return t + (step - jax.lax.stop_gradient(step))


def wrap(x0, x1, xpos, xmat, radius, is_cyl, side, has_side):
    """Wrap of the straight path x0-x1 around spheres / cylinders (mju_wrap), vectorised.

    x0, x1: (n, 3) world end points; xpos (n, 3), xmat (n, 3, 3) geom frames; radius
    (n,); is_cyl (n,) bool (static or traced); side (n, 3) world side-site positions,
    used where has_side (n,) bool (a NumPy array when known at trace time: all false,
    the inside wrap is not traced). Returns (wlen (n,), -1 where the path does not wrap;
    w0, w1 (n, 3) world tangent points).
    """
    p0 = math.matTvec(xmat, x0 - xpos)
    p1 = math.matTvec(xmat, x1 - xpos)
    fail = (math.norm(p0) < math.MINVAL) | (math.norm(p1) < math.MINVAL)
    # sphere: 2D frame in the plane through the centre and both points
    ax0, _ = math.normalize(p0)
    normal, nrm = math.normalize(math.cross(p0, p1))
    aa = jnp.abs(ax0)
    i1 = (aa[:, 1] > aa[:, 0]) & (aa[:, 1] > aa[:, 2])
    i2 = (aa[:, 2] > aa[:, 0]) & (aa[:, 2] > aa[:, 1])
    alt = jnp.stack([jnp.where(i1 | i2, 1.0, 0.0), jnp.where(i1, 0.0, 1.0),
                     jnp.where(i2, 0.0, 1.0)], -1)
    alt_normal, _ = math.normalize(math.cross(ax0, alt))
    normal = jnp.where((nrm < math.MINVAL)[:, None], alt_normal, normal)
    ax1, _ = math.normalize(math.cross(normal, ax0))
    cyl = jnp.asarray(is_cyl)[:, None]
    ex = jnp.zeros_like(p0).at[:, 0].set(1.0)
    ey = jnp.zeros_like(p0).at[:, 1].set(1.0)
    ax0 = jnp.where(cyl, ex, ax0)
    ax1 = jnp.where(cyl, ey, ax1)
    end = (math.dot(p0, ax0), math.dot(p0, ax1), math.dot(p1, ax0), math.dot(p1, ax1))
    s = math.matTvec(xmat, side - xpos)
    sx, sy = _normalize2(math.dot(s, ax0), math.dot(s, ax1))
    sd = (sx * radius, sy * radius)
    len_c, pc = _wrap_circle(end, sd, has_side, radius)
    if isinstance(has_side, np.ndarray) and not has_side.any():
        return _finish(p0, p1, ax0, ax1, xpos, xmat, is_cyl, fail, len_c, pc)
    inside = has_side & (math.norm(s) < radius)
    len_i, pi = _wrap_inside_where_needed(end, radius, inside)
    wlen = jnp.where(inside, len_i, len_c)
    pnt = tuple(jnp.where(inside, u, v) for u, v in zip(pi, pc))
    return _finish(p0, p1, ax0, ax1, xpos, xmat, is_cyl, fail, wlen, pnt)


def _wrap_inside_where_needed(end, radius, inside):
    """:func:`_wrap_inside` under a ``lax.cond`` that skips it when no segment wraps
    from inside (``inside`` (n,) bool); under ``vmap`` the predicate is made unbatched
    (:func:`~simjax.engine.solver_worlds.any_world`), so the branch stays a branch: it
    runs for the whole batch when one world needs it. Its Newton steps are a loop of
    their own (60 fixed steps when measured), which cost most of the run time of a short
    batch (arm26's length-range simulation, 12 worlds x 1000 steps: 1.64 -> 0.69 s
    without it, no segment inside).
    Skipped, its outputs are -1 (no wrap), never selected."""
    def skip(end, radius):
        none = jnp.full_like(radius, -1.0)
        return none, (none,) * 4
    return jax.lax.cond(any_world(jnp.any(inside)), _wrap_inside, skip, end, radius)


def _finish(p0, p1, ax0, ax1, xpos, xmat, is_cyl, fail, wlen, pnt):
    """:func:`wrap`'s tangent points in 3D and its outputs, from the 2D wrap (``wlen``,
    ``pnt``) in the plane (ax0, ax1) of the geom frame."""
    fail = fail | (wlen < 0)
    r0 = ax0 * pnt[0][:, None] + ax1 * pnt[1][:, None]
    r1 = ax0 * pnt[2][:, None] + ax1 * pnt[3][:, None]
    # cylinder: heights interpolated along the unrolled path, length includes the rise
    l0 = _norm2(p0[:, 0] - r0[:, 0], p0[:, 1] - r0[:, 1])
    l1 = _norm2(p1[:, 0] - r1[:, 0], p1[:, 1] - r1[:, 1])
    tot = l0 + wlen + l1
    tot = jnp.where(tot == 0, 1.0, tot)
    z0 = p0[:, 2] + (p1[:, 2] - p0[:, 2]) * l0 / tot
    z1 = p0[:, 2] + (p1[:, 2] - p0[:, 2]) * (l0 + wlen) / tot
    cyl1 = jnp.asarray(is_cyl)
    r0 = r0.at[:, 2].set(jnp.where(cyl1, z0, r0[:, 2]))
    r1 = r1.at[:, 2].set(jnp.where(cyl1, z1, r1[:, 2]))
    wlen = jnp.where(cyl1, math.safe_sqrt(wlen * wlen + (z1 - z0) ** 2), wlen)
    w0 = xpos + math.matvec(xmat, r0)
    w1 = xpos + math.matvec(xmat, r1)
    return jnp.where(fail, -1.0, wlen), w0, w1


# --------------------------------------------------------------------------- tendons
def _point_rows(m, d, bodies, points, w):
    """Rows (n, nv) of w_i . jacp(bodies_i, points_i): the generalised force of world
    forces w (n, 3) applied at points on (static) bodies."""
    dtype = d.qpos.dtype
    anc = jnp.asarray(body_tables.get(m).anc_dof, dtype)[bodies]
    off = points - d.subtree_com[np.asarray(m.body_rootid)[bodies]]
    # products summed over the 3 components (as math.matvec): vmapped, the two matrix
    # products were batched dots, a small matrix product per world on CPU (arm26, 1024
    # worlds: six such dots; the tendon stage 5.8 -> 4.6 ms)
    lin = jnp.sum(w[:, None, :] * d.cdof[None, :, 3:], -1)
    ang = jnp.sum(math.cross(off, w)[:, None, :] * d.cdof[None, :, :3], -1)
    return anc * (lin + ang)


def tendon(m, d):
    """Tendon lengths, Jacobians and paths (mj_tendon) for fixed and spatial tendons.

    Requires kinematics and com_pos. Sets ten_length (ntendon,), ten_J (ntendon, nv)
    (d length / d qpos in velocity coordinates), ten_wrapadr, ten_wrapnum, wrap_obj and
    wrap_xpos (see module doc).
    """
    if not m.ntendon:
        return d
    tab = tables(m)
    dtype = d.qpos.dtype
    prm = jnp.asarray(m.wrap_prm, dtype).reshape(m.nwrap)
    length = jnp.zeros(m.ntendon, dtype)
    ten_j = jnp.zeros((m.ntendon, m.nv), dtype)
    if len(tab.fixed_wraps):
        w = tab.fixed_wraps
        jid = np.asarray(m.wrap_objid)[w]
        memb = jnp.asarray(tab.fixed_member[:, w], dtype)
        qj = math.take(d.qpos, np.asarray(m.jnt_qposadr)[jid])
        length = length + memb @ (prm[w] * qj)
        onehot = np.zeros((len(w), m.nv))
        onehot[np.arange(len(w)), np.asarray(m.jnt_dofadr)[jid]] = 1.0
        ten_j = ten_j + memb @ (prm[w][:, None] * jnp.asarray(onehot, dtype))
    out = {}
    if len(tab.seg_tendon):
        seg_len, rows, rows_t, paths = _spatial(m, d, tab, prm)
        onehot = np.zeros((m.ntendon, len(tab.seg_tendon)))
        onehot[tab.seg_tendon, np.arange(len(tab.seg_tendon))] = 1.0
        length = length + jnp.asarray(onehot, dtype) @ seg_len
        onehot = np.zeros((m.ntendon, len(rows_t)))
        onehot[rows_t, np.arange(len(rows_t))] = 1.0
        ten_j = ten_j + jnp.asarray(onehot, dtype) @ rows
        out.update(paths)
    else:
        z = jnp.zeros(m.ntendon, jnp.int32)
        out.update(ten_wrapadr=z, ten_wrapnum=z)
    return d.replace(ten_length=length, ten_J=ten_j, **out)


def _spatial(m, d, tab, prm):
    """Segment lengths, Jacobian rows (with their tendon ids) and wrap paths."""
    dtype = d.qpos.dtype
    ns = len(tab.seg_tendon)
    sbody = np.asarray(m.site_bodyid)
    gbody = np.asarray(m.geom_bodyid)
    p0 = d.site_xpos[tab.seg_s0]
    p1 = d.site_xpos[tab.seg_s1]
    div = jnp.where(tab.seg_div >= 0, prm[np.maximum(tab.seg_div, 0)], 1.0)
    straight = math.norm(p1 - p0)
    wrapped = jnp.zeros(ns, bool)
    w0 = w1 = p0
    seg_len = straight
    gi = np.nonzero(tab.seg_geom >= 0)[0]
    if len(gi):
        g = tab.seg_geom[gi]
        sidep = prm[np.maximum(tab.seg_side[gi], 0)]
        sid = jnp.round(sidep).astype(jnp.int32)
        has_side = (sid >= 0) & (tab.seg_side[gi] >= 0) if np.any(tab.seg_side[gi] >= 0) \
            else np.zeros(len(gi), bool)
        side = d.site_xpos[jnp.clip(sid, 0, max(m.nsite - 1, 0))] if m.nsite else p0[gi]
        radius = jnp.asarray(m.geom_size, dtype).reshape(m.ngeom, 3)[g, 0]
        wl, a, b = wrap(p0[gi], p1[gi], d.geom_xpos[g], d.geom_xmat[g], radius,
                        tab.seg_cyl[gi], side, has_side)
        ok = wl >= 0
        wrapped = wrapped.at[gi].set(ok)
        w0 = w0.at[gi].set(a)
        w1 = w1.at[gi].set(b)
        wlen = jnp.zeros(ns, dtype).at[gi].set(jnp.where(ok, wl, 0.0))
        seg_len = jnp.where(wrapped, math.norm(w0 - p0) + wlen + math.norm(p1 - w1), straight)
    seg_len = seg_len / div

    # Jacobian: each straight piece between points on different bodies contributes
    # dir . (jacp(end) - jacp(start)) / divisor
    b0, b1 = sbody[tab.seg_s0], sbody[tab.seg_s1]
    bg = np.where(tab.seg_geom >= 0, gbody[np.maximum(tab.seg_geom, 0)], -1)
    pieces = [(np.arange(ns), p0, p1, b0, b1, ~wrapped)]
    if len(gi):
        pieces.append((gi, p0[gi], w0[gi], b0[gi], bg[gi], wrapped[gi]))
        pieces.append((gi, w1[gi], p1[gi], bg[gi], b1[gi], wrapped[gi]))
    rows, rows_t = [], []
    for idx, a, b, ba, bb, active in pieces:
        keep = ba != bb
        if not keep.any():
            continue
        idx, a, b, ba, bb, active = idx[keep], a[keep], b[keep], ba[keep], bb[keep], \
            active[keep]
        direction, _ = math.normalize(b - a)
        w = direction * (jnp.where(active, 1.0, 0.0) / div[idx])[:, None]
        rows.append(_point_rows(m, d, bb, b, w) - _point_rows(m, d, ba, a, w))
        rows_t.append(tab.seg_tendon[idx])
    if rows:
        rows, rows_t = jnp.concatenate(rows), np.concatenate(rows_t)
    else:
        rows, rows_t = jnp.zeros((0, m.nv), dtype), np.zeros(0, np.int64)
    return seg_len, rows, rows_t, _paths(m, d, tab, p0, w0, w1, wrapped)


def _paths(m, d, tab, p0, w0, w1, wrapped):
    """ten_wrapadr, ten_wrapnum, wrap_obj, wrap_xpos from the path items."""
    dtype = d.qpos.dtype
    kind, ref = tab.item_kind, tab.item_ref
    ni = len(kind)
    seg = np.where(kind == 2, ref, 0)
    is_seg = kind == 2
    count = jnp.where(is_seg & wrapped[seg], 3, 1).astype(jnp.int32)
    start = jnp.cumsum(count) - count
    site_pos = d.site_xpos[np.where(kind == 1, ref, 0)] if m.nsite else jnp.zeros((ni, 3), dtype)
    first = jnp.where((kind == 0)[:, None], 0.0,
                      jnp.where(is_seg[:, None], p0[seg], site_pos))
    pts = jnp.stack([first, w0[seg], w1[seg]], 1)                    # (ni, 3, 3)
    geom = np.where(is_seg, tab.seg_geom[seg], -1)
    obj = np.stack([np.where(kind == 0, -2, -1), geom, geom], 1)     # (ni, 3)
    size = 2 * m.nwrap
    idx = start[:, None] + jnp.arange(3)
    idx = jnp.where(jnp.arange(3) < count[:, None], idx, size)      # unused: dropped
    xpos = jnp.zeros((size, 3), dtype).at[idx.ravel()].set(pts.reshape(-1, 3), mode="drop")
    wobj = jnp.zeros(size, jnp.int32).at[idx.ravel()].set(
        jnp.asarray(obj.ravel(), jnp.int32), mode="drop")
    onehot = np.zeros((m.ntendon, ni), np.int32)
    onehot[tab.item_tendon, np.arange(ni)] = 1
    num = jnp.asarray(onehot) @ count
    adr = jnp.cumsum(num) - num
    return dict(ten_wrapadr=adr.astype(jnp.int32), ten_wrapnum=num.astype(jnp.int32),
                wrap_obj=wobj, wrap_xpos=xpos)


# --------------------------------------------------------------------------- bias
def armature(m, dtype, xp=jnp):
    """Tendon armature incl. what actuators pass to their tendon (ntendon,), in ``xp``
    (jax.numpy, or NumPy for a concrete model: :func:`_armature_np`)."""
    from simjax.engine import smooth
    arm = xp.asarray(m.tendon_armature, dtype).reshape(m.ntendon)
    if m.nactuator:
        share = smooth._actuator_share(m, "tendon")
        if share.any():
            arm = arm + xp.asarray(share, dtype) @ (
                xp.asarray(m.actuator_armature, dtype) * smooth._gear2(m, dtype, xp))
    return arm


def _armature_np(m, dtype):
    """:func:`armature` in NumPy where the model's arrays are concrete, else None. Read
    from the model's own arrays: inside a jit that closes over the model (an eager call,
    :mod:`simjax.engine.eager`) they are concrete, while jax.numpy's results are
    traced."""
    try:
        return armature(m, np.dtype(dtype), np)
    except jax.errors.TracerArrayConversionError:
        return None


def _point_acc(m, d, bodies, points):
    """jacDot(point) @ qvel (n, 3) and the point velocities (n, 3) (mj_jacDot,
    mj_objectVelocity), for world points on static bodies."""
    dtype = d.qpos.dtype
    tab = body_tables.get(m)
    jtype = np.asarray(m.jnt_type)
    dof_j = np.asarray(m.dof_jntid)
    off_in_jnt = np.arange(m.nv) - np.asarray(m.jnt_dofadr)[dof_j]
    is_quat = (jtype[dof_j] == 1) | ((jtype[dof_j] == 0) & (off_in_jnt >= 3))
    # ball and free rotational dofs: cdof derivative from the body's current velocity
    cdd = d.cdof_dot
    if is_quat.any():
        alt = math.motion_cross(d.cvel[np.asarray(m.dof_bodyid)], d.cdof)
        cdd = jnp.where(is_quat[:, None], alt, cdd)
    anc = jnp.asarray(tab.anc_dof, dtype)[bodies]                       # (n, nv)
    com = d.subtree_com[np.asarray(m.body_rootid)[bodies]]
    off = points - com
    cv = d.cvel[bodies]
    pvel = cv[:, 3:] + math.cross(cv[:, :3], off)                       # (n, 3)
    qv = d.qvel[:, None]
    acc = (anc @ (qv * cdd[:, 3:]) + math.cross(anc @ (qv * cdd[:, :3]), off) +
           math.cross(anc @ (qv * d.cdof[:, :3]), pvel))
    return acc, pvel


def tendon_bias(m, d):
    """Bias force of tendon armature (mj_tendonBias): ten_J' a (ten_Jdot qvel), (nv,).

    Fixed tendons have Jdot = 0. Spatial tendons: per straight piece between sites on
    different bodies, the derivative of dir . (jacp1 - jacp0) along qvel (mj_tendonDot).
    MuJoCo does not define Jdot for tendons wrapping geoms (mj_tendonDot raises a fatal
    error when such a tendon has armature): simjax raises UnsupportedFeatureError at
    trace time when that armature is known to be non-zero, and returns NaN forces for it
    when the armature is traced, rather than a silent approximation.
    """
    dtype = d.qpos.dtype
    if not m.ntendon or not m.nv:
        return jnp.zeros(m.nv, dtype)
    tab = tables(m)
    arm = armature(m, dtype)
    arm_np = _armature_np(m, dtype)
    if arm_np is not None and not np.any(arm_np):
        return jnp.zeros(m.nv, dtype)
    if not len(tab.seg_tendon):
        return jnp.zeros(m.nv, dtype)
    geom_ten = np.zeros(m.ntendon, bool)
    geom_ten[tab.seg_tendon[tab.seg_geom >= 0]] = True
    if arm_np is not None and np.any(geom_ten & (arm_np != 0)):
        bad = np.nonzero(geom_ten & (arm_np != 0))[0].tolist()
        raise UnsupportedFeatureError(
            f"armature on tendons wrapping geoms (tendons {bad}): their Jacobian time "
            "derivative is undefined in MuJoCo")
    prm = jnp.asarray(m.wrap_prm, dtype).reshape(m.nwrap)
    sbody = np.asarray(m.site_bodyid)
    sites = np.nonzero(tab.seg_geom < 0)[0]
    b0, b1 = sbody[tab.seg_s0[sites]], sbody[tab.seg_s1[sites]]
    sites = sites[b0 != b1]
    dot = jnp.zeros(m.ntendon, dtype)
    if len(sites):
        s0, s1 = tab.seg_s0[sites], tab.seg_s1[sites]
        p0, p1 = d.site_xpos[s0], d.site_xpos[s1]
        a0, v0 = _point_acc(m, d, sbody[s0], p0)
        a1, v1 = _point_acc(m, d, sbody[s1], p1)
        dirn, n = math.normalize(p1 - p0)
        dvel = v1 - v0
        perp = (dvel - dirn * math.dot(dirn, dvel)[:, None]) * jnp.where(
            n > math.MINVAL, 1.0 / jnp.where(n > math.MINVAL, n, 1.0), 0.0)[:, None]
        div = jnp.where(tab.seg_div[sites] >= 0, prm[np.maximum(tab.seg_div[sites], 0)], 1.0)
        seg = (math.dot(dirn, a1 - a0) + math.dot(perp, dvel)) / div
        onehot = np.zeros((m.ntendon, len(sites)))
        onehot[tab.seg_tendon[sites], np.arange(len(sites))] = 1.0
        dot = jnp.asarray(onehot, dtype) @ seg
    if geom_ten.any():
        dot = jnp.where(jnp.asarray(geom_ten) & (arm != 0), jnp.nan, dot)
    return (arm * dot) @ d.ten_J
