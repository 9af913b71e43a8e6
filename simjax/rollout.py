"""Rollouts: many steps under one ``lax.scan`` (the JAX analogue of mujoco.rollout).

``rollout`` advances one world and composes with ``jit``/``vmap``/``grad``; batch worlds
with ``jax.vmap`` (over ``data`` and/or ``ctrl``, and over Model leaves for domain
randomisation). ``rollout_batch`` is the top-level batched entry point: it jits the
vmapped rollout and, given ``devices``, shards the batch axis across them (a separate
function because sharding commits to a top-level jit with placed inputs, which a
traceable single-world function cannot do). Gradients flow through the
whole trajectory; with ``checkpoint`` (default) each step is rematerialised in the
backward pass, so reverse-mode memory holds one Data per step instead of every
intermediate of every step.

On CPU, ``rollout_batch`` also splits the batch into one chunk per core and runs the
chunks at once, from threads (:func:`concurrent`): one XLA:CPU program over the whole
batch keeps its second core idle for a good part of the step (its loops, reductions,
library calls and small kernels run on one thread, and a kernel split over both threads
waits for the slower half), while two programs running at once fill both cores.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import eager
from simjax.engine.forward import step as _step
from simjax.engine.gc_pause import gc_paused


class Trajectory(NamedTuple):
    """States after each step, stacked on a leading time axis (length nstep)."""

    qpos: Any        # (nstep, nq)
    qvel: Any        # (nstep, nv)
    act: Any         # (nstep, na)
    time: Any        # (nstep,)
    sensordata: Any  # (nstep, nsensordata)


@gc_paused
def rollout(model, data, ctrl=None, nstep=None, checkpoint=True, return_data=False):
    """Step ``data`` ``nstep`` times, applying ``ctrl[t]`` before step t (mj_step each).

    model: Model; data: Data (one world); ctrl: (nstep, nu) controls, or None to keep
    ``data.ctrl`` (then ``nstep`` is required); ValueError for another shape. Returns
    a :class:`Trajectory` of the states after every step, or ``(trajectory,
    final_data)`` if ``return_data``.
    ``checkpoint`` rematerialises steps in reverse-mode autodiff to save memory.
    Called eagerly (outside ``jit``, under ``vmap`` and ``grad`` too), it runs as one
    ``jax.jit`` program, compiled once per model (its arrays), shapes, ``checkpoint`` and
    ``return_data`` (:mod:`simjax.engine.eager`).
    """
    if ctrl is None:
        if nstep is None:
            raise ValueError("rollout needs ctrl or nstep")
        ctrl = jnp.broadcast_to(data.ctrl, (nstep,) + data.ctrl.shape)
    elif jnp.ndim(ctrl) != 2 or jnp.shape(ctrl)[1] != model.nu:
        raise ValueError(f"rollout: ctrl must be (nstep, nu={model.nu}), got "
                         f"{tuple(jnp.shape(ctrl))}")
    elif nstep is not None and nstep != ctrl.shape[0]:
        raise ValueError(f"ctrl has {ctrl.shape[0]} steps, nstep is {nstep}")
    if eager.called_eagerly((model, data, ctrl)):
        # called eagerly: one compiled program, reused by later calls (op by op, the
        # scan's body was traced and compiled again on every call: simjax.engine.eager)
        return eager.program(_PROGRAMS, _rollout, model, static_argnums=(2, 3))(
            data, ctrl, checkpoint, return_data)
    return _rollout(model, data, ctrl, checkpoint, return_data)


def _rollout(model, data, ctrl, checkpoint, return_data):
    """:func:`rollout` of validated arguments (``ctrl`` (nstep, nu))."""
    def body(d, u):
        d = _step(model, d.replace(ctrl=u.astype(d.ctrl.dtype)))
        return d, Trajectory(d.qpos, d.qvel, d.act, d.time, d.sensordata)

    if checkpoint:
        body = jax.checkpoint(body)
    final, traj = jax.lax.scan(body, _batched_with(data, (model, ctrl)), ctrl)
    return (traj, final) if return_data else traj


#: rollout's programs for eager calls (simjax.engine.eager.program)
_PROGRAMS = eager.Programs()


def _batched_with(tree, like):
    """``tree``'s values; under ``vmap``, every leaf batched wherever a leaf of ``tree``
    or ``like`` is (outside vmap, or where every leaf is batched: ``tree`` itself).

    A scan under vmap whose initial state is batched only in part finds the rest of the
    state batched after a step, and batches its traced body again, once per round
    until nothing changes. The ant's 10-step rollout of 64 worlds (CPU seconds of its
    trace, one run each): qpos alone batched (``jax.vmap(lambda q: rollout(model,
    data.replace(qpos=q), ...))``) 3.6-4.5 -> 2.5, body_mass alone 6.7 -> 2.9, every
    leaf batched 2.1 either way (two equations more, the same optimised program);
    states, gradients and tangents bit-identical. Which leaves vmap batches is read
    at trace time by a custom vmap rule (its operands behind a custom jvp: a custom
    vmap rule does not differentiate); each unbatched leaf is then ``select(flag, x,
    x)`` with the rule's batched flag: ``x`` to jvp, transposition and XLA. A flag
    made from every leaf by ordinary operations cost 1100-1300 traced equations more
    (the ant, the humanoid). Where vmap batches the trace later (a jit inside the
    vmap), the rule has not run yet and ``tree`` is returned as it is."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    seen = []

    @jax.custom_batching.custom_vmap
    def probe(values):
        return jnp.zeros((), bool)

    @probe.def_vmap
    def _rule(size, flags, values):
        seen.append(flags[0][:len(leaves)])
        return jnp.zeros((size,), bool), True

    @jax.custom_jvp
    def probe_values(values):
        return probe(values)

    @probe_values.defjvp
    def _jvp(primals, tangents):
        # the flag's tangent is float0 (a bool); probe sees the primals alone
        return probe(*primals), np.zeros((), jax.dtypes.float0)

    flag = probe_values(leaves + jax.tree_util.tree_leaves(like))
    if not seen or all(seen[0]):
        return tree
    return jax.tree_util.tree_unflatten(treedef, [
        x if batched else jax.lax.select(jnp.broadcast_to(flag, jnp.shape(x)), x, x)
        for x, batched in zip(leaves, seen[0])])


# --------------------------------------------------------------------------- batches
BATCH_AXIS = "batch"


def _mesh(devices):
    """A 1-D Mesh with axis ``"batch"`` from a Mesh (returned as is) or devices."""
    from jax.sharding import Mesh
    if isinstance(devices, Mesh):
        if len(devices.axis_names) != 1:
            raise ValueError(f"rollout_batch needs a 1-D mesh, got axes {devices.axis_names}")
        return devices
    devices = list(devices)
    if not devices:
        raise ValueError("rollout_batch: devices is empty")
    return Mesh(np.asarray(devices, dtype=object), (BATCH_AXIS,))


def _axes_key(model_axes):
    """Hashable form of a Model in_axes pytree (None or int per leaf)."""
    if model_axes is None:
        return None
    leaves, treedef = jax.tree_util.tree_flatten(model_axes, is_leaf=lambda x: x is None)
    return treedef, tuple(leaves)


# Measured and not taken: donating the batch's Data to the program (``donate_argnums``),
# so that XLA need not copy it into the step loop's carry. On the bench's batched
# rollout of the ant (jit(vmap(fori_loop(step))), batch 1024, float32, paired in one
# process) the program's copies went 194 -> 115, but it ran 1.12x [1.07, 1.20] slower
# over 4 steps a call (8 rounds) and 1.17x [1.00, 1.29] over 16 (6 rounds).
@functools.lru_cache(maxsize=64)
def _batched_fn(axes_key, nstep, checkpoint, return_data, mesh):
    """jit(vmap(rollout)) for one configuration; with a mesh, batch-sharded in and out."""
    if axes_key is None:
        model_axes = None
    else:
        model_axes = jax.tree_util.tree_unflatten(axes_key[0], axes_key[1])

    def run(model, data, ctrl):
        one = functools.partial(rollout, nstep=nstep, checkpoint=checkpoint,
                                return_data=return_data)
        return jax.vmap(one, in_axes=(model_axes, 0, 0 if ctrl is not None else None))(
            model, data, ctrl)

    if mesh is None:
        return jax.jit(run), None
    from jax.sharding import NamedSharding, PartitionSpec
    batched = NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))
    replicated = NamedSharding(mesh, PartitionSpec())
    if axes_key is None:
        model_sharding = replicated
    else:
        model_sharding = jax.tree_util.tree_unflatten(
            axes_key[0], [replicated if a is None else batched for a in axes_key[1]])
    fn = jax.jit(run, in_shardings=(model_sharding, batched, batched),
                 out_shardings=batched)
    return fn, (batched, replicated)


def _put(tree, sharding):
    return jax.tree_util.tree_map(lambda x: jax.device_put(x, sharding), tree)


# ------------------------------------------------------------- concurrent chunks (CPU)
#: the smallest chunk the automatic thread count splits a batch into. Two chunks at once
#: against one program over their batch (bench rollouts, float32, 2 cores, one run
#: each): chunks of 32 worlds ant 2.25x, barkour 0.97x; of 64: 1.17x, 1.43x; of 128:
#: 1.40x, 1.23x; of 256: barkour 1.63x. Smaller batches pay more per world for each
#: kernel (barkour as one program: 24.5 us per world-step at 64 worlds, 16.6 at 512);
#: on machines with many cores, where a batch splits into many small chunks, this
#: was not measured
MIN_CHUNK = 32

_POOL = None
_POOL_LOCK = threading.Lock()
#: hashes of the (function id, signature) of the calls :func:`concurrent` has seen: a
#: new one is compiled first, in the caller, so that its compile happens once (hashes,
#: not the signatures, which hold Models' static arrays; a collision would only let a
#: first call compile in two threads at once)
_SEEN = set()


def _pool(n):
    """A thread pool of at least ``n`` workers, shared by every :func:`concurrent`."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < n:
            old, _POOL = _POOL, ThreadPoolExecutor(max_workers=n,
                                                   thread_name_prefix="simjax-chunk")
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


def _config_snapshot():
    """(the caller's thread-local jax settings as (state, value) pairs, the caller's
    trace context), or (None, None) where jax lacks these internals.

    jax's settings entered as context managers (``jax.enable_x64(True)``,
    ``jax.default_matmul_precision``, ...) hold for the thread that entered them
    alone: a worker thread would trace and run ``fn`` without them (float64 inputs
    truncated to float32, among others)."""
    try:
        from jax._src import config as jc
        local = [(st, st.get_local()) for st in jc.config_states.values()]
        unset = jc.config_ext.unset
        return [(st, v) for st, v in local if v is not unset], jc.trace_context()
    except Exception:         # pragma: no cover (another jax's internals)
        return None, None


#: returned by a worker whose settings could not be made the caller's
_MISMATCH = object()


def _call_as(fn, args, local, context):
    """``fn(*args)`` waited for, in a worker thread with the caller's settings
    (:func:`_config_snapshot`); :data:`_MISMATCH` where they differ still."""
    from jax._src import config as jc
    with contextlib.ExitStack() as stack:
        for st, v in local:
            stack.enter_context(st(v))
        if jc.trace_context() != context:
            return _MISMATCH
        return jax.block_until_ready(fn(*args))


def _signature(fn, args):
    leaves, treedef = jax.tree_util.tree_flatten(args)
    return id(fn), treedef, tuple((np.shape(x), str(getattr(x, "dtype", type(x))))
                                  for x in leaves)


def concurrent(fn, chunks):
    """``[fn(*args) for args in chunks]``, the calls run at once, one thread each.

    fn: a jitted (or AOT-compiled) function; chunks: a list of argument tuples, usually
    the chunks of one batch (:func:`split_batch`). Each call is waited for
    (``jax.block_until_ready``) in its own thread. On CPU the calls then run side by
    side on the cores: XLA:CPU runs a program in the thread that calls it, spreading
    only its larger loop kernels over its thread pool, so one program over a batch
    uses about 1.2-1.7 of 2 cores (the bench's ant 1.48, barkour 1.72) while two
    programs over its halves use both. Measured on the bench's rollouts (2 cores,
    batch 1024 as two chunks of 512, float32): wall time per world-step ant 55.5 ->
    37.2 us, humanoid 50.7 -> 34.1, barkour 13.6 -> 10.4, shadow hand 24.3 -> 19.7;
    four or eight chunks no faster than two. Nor was each thread's chunk cut again into
    calls run one after the other (the humanoid's rollout, batch 1024, each thread
    stepping two calls of 256 worlds against one of 512; paired in one process, Intel
    Xeon: wall time 0.973 [0.809, 1.168], 24 pairs), although the constraint solve
    alone ran 88 us per world at batch 256 against 104-131 at 1024 on the same states.
    On a GPU the calls queue on one device and gain nothing.

    The first call with a new signature (argument shapes and types) compiles a jitted
    ``fn`` once, in the caller (``fn.lower(...).compile()``, whose program the calls
    then find in jit's caches), and runs every chunk at once; another function has its
    first chunk run alone (it may compile on its first call), then the rest. The worker
    threads run under the caller's jax settings (its thread-local context managers,
    such as ``jax.enable_x64``); where they cannot be carried over, the calls run one
    by one in the caller. Returns the list of results in the order of ``chunks``.
    Exceptions propagate from the first failing call.
    """
    chunks = [tuple(c) for c in chunks]
    if not chunks:
        return []
    if len(chunks) == 1:
        return [jax.block_until_ready(fn(*chunks[0]))]
    out, rest = [], chunks
    if not isinstance(fn, jax.stages.Compiled):       # (a compiled program: nothing to do)
        key = hash(_signature(fn, chunks[0]))
        if key not in _SEEN:
            if hasattr(fn, "lower"):
                # a jit: compiled here, once; its calls in the threads find the program
                fn.lower(*chunks[0]).compile()
            else:
                # another function: its first chunk alone (it may compile on that call)
                rest, out = chunks[1:], [jax.block_until_ready(fn(*chunks[0]))]
            _SEEN.add(key)
    if rest:
        local, context = _config_snapshot()
        if local is None:
            # the caller's settings cannot be carried over: run here, one by one
            return out + [jax.block_until_ready(fn(*a)) for a in rest]
        pool = _pool(len(rest))
        futures = [pool.submit(_call_as, fn, a, local, context) for a in rest]
        got = [f.result() for f in futures]
        out += [jax.block_until_ready(fn(*a)) if r is _MISMATCH else r
                for a, r in zip(rest, got)]
    return out


def split_batch(tree, n):
    """``tree`` cut into ``n`` equal chunks along the leading axis of every leaf (the
    leaves' leading sizes are equal and divisible by ``n``; ValueError otherwise)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
    if len(sizes) != 1 or None in sizes or next(iter(sizes)) % n:
        raise ValueError(f"split_batch: leading sizes {sorted(map(str, sizes))} do not "
                         f"split into {n} equal chunks")
    size = next(iter(sizes)) // n
    return [jax.tree_util.tree_unflatten(treedef, [_rows(x, i * size, (i + 1) * size)
                                                   for x in leaves]) for i in range(n)]


def _on_host(x):
    """Whether ``x`` is a concrete jax array held whole on one CPU device (a sharded one
    is cut by jax, its chunks sharded as jax makes them)."""
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
        return False
    devices = x.devices()
    return len(devices) == 1 and next(iter(devices)).platform == "cpu"


def _rows(x, lo, hi):
    """Rows lo:hi of the leaf ``x``. A CPU array is cut as a NumPy view and put back
    (a copy of the rows): sliced by jax, op by op, every leaf shape compiled a program
    of its own on a batch's first cut (the ant's Data: 107 leaves, 1.18 s at 2 chunks
    against 0.02 s cut so; 0.05 s either way once compiled)."""
    if _on_host(x):
        # committed to its device where x was (as jax's slice of it is)
        return jax.device_put(np.asarray(x)[lo:hi], x.sharding if x.committed else None)
    return x[lo:hi]


def concat_batch(trees):
    """The chunks ``trees`` (equal structure) joined along their leading axis: one
    compiled program for the whole pytree (cached by its structure and shapes; op by op,
    each leaf shape compiled its own: the ant's Data of 2 chunks 0.89 -> 0.34 s on the
    first call)."""
    if len(trees) == 1:
        return trees[0]
    return _concat(list(trees))


@jax.jit
def _concat(trees):
    return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *trees)


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:        # pragma: no cover (not Linux)
        return os.cpu_count() or 1


def auto_threads(nbatch, tree=()):
    """The chunk count :func:`rollout_batch` uses by default: 1 unless every leaf of
    the pytree ``tree`` (the batch's inputs) is a concrete array on a CPU device; then
    the largest count up to the usable cores that divides ``nbatch`` into chunks of at
    least :data:`MIN_CHUNK`."""
    for x in jax.tree_util.tree_leaves(tree):
        if isinstance(x, jax.core.Tracer) or not isinstance(x, jax.Array):
            return 1
        if any(d.platform != "cpu" for d in x.devices()):
            return 1
    for t in range(min(_cores(), nbatch // MIN_CHUNK), 1, -1):
        if nbatch % t == 0:
            return t
    return 1


def chunk_count(nbatch, tree, threads=None):
    """``threads`` checked against the batch size ``nbatch`` (ValueError unless it is
    positive and divides it), or for None :func:`auto_threads` of ``tree``."""
    if threads is None:
        return auto_threads(nbatch, tree)
    n = int(threads)
    if n < 1 or nbatch % n:
        raise ValueError(f"threads={threads} must be positive and divide the batch size "
                         f"{nbatch}")
    return n


def rollout_batch(model, data, ctrl=None, nstep=None, devices=None, model_axes=None,
                  checkpoint=True, return_data=False, threads=None):
    """Roll out a batch of worlds at once: ``jit(vmap(rollout))``, optionally sharded.

    data: Data whose every leaf has a leading batch axis of size B (build it with
    ``jax.vmap``, e.g. ``jax.vmap(lambda q: data.replace(qpos=q))(qpos_batch)``).
    ctrl: (B, nstep, nu) controls, or None to hold each world's ``data.ctrl`` for
    ``nstep`` steps. model_axes: optional ``in_axes`` pytree for the Model (None per
    shared leaf, 0 per batched leaf, e.g.
    ``jax.tree_util.tree_map(lambda _: None, m).replace(body_mass=0)``) for domain
    randomisation; batched Model leaves then carry the same leading axis B.

    devices: None runs on the default device. A list of ``jax.Device`` (e.g.
    ``jax.devices()``, which under ``jax.distributed.initialize`` spans every host) or a
    1-D ``jax.sharding.Mesh`` shards the batch axis over them: data, ctrl and batched
    Model leaves are placed with ``NamedSharding(mesh, PartitionSpec("batch"))``, shared
    Model leaves are replicated, and the jitted rollout returns outputs sharded the same
    way (each device steps B / ndevice worlds; no communication between devices). B must
    be a multiple of the number of devices (ValueError otherwise).

    threads: chunks of the batch run at once, one thread each (:func:`concurrent`;
    ignored with ``devices``). None: on CPU as many as the usable cores where they
    divide B into chunks of at least :data:`MIN_CHUNK` worlds (:func:`auto_threads`),
    else 1. Each chunk's program holds the temporaries of its own worlds, and the
    outputs are joined into one array per leaf afterwards (one copy of them); the
    values are those of the whole batch run at once.

    Returns a :class:`Trajectory` with leaves (B, nstep, ...), or
    ``(trajectory, final_data)`` if ``return_data``. Compiled functions are cached per
    (model_axes, nstep, checkpoint, return_data, mesh); the Model's static structure is
    part of jit's own cache key. This function jits at the top level; inside your own
    ``jit``/``grad`` use ``jax.vmap(rollout)`` instead.
    """
    batch = {x.shape[0] if x.ndim else None for x in jax.tree_util.tree_leaves(data)}
    if len(batch) != 1 or None in batch:
        raise ValueError("rollout_batch: every Data leaf needs the same leading batch "
                         f"axis; found leading sizes {sorted(map(str, batch))}")
    (nbatch,) = batch
    if ctrl is not None:
        ctrl = jnp.asarray(ctrl)
        if ctrl.ndim != 3 or ctrl.shape[0] != nbatch or ctrl.shape[2] != model.nu:
            raise ValueError(f"rollout_batch: ctrl must be (B={nbatch}, nstep, "
                             f"nu={model.nu}), got {ctrl.shape}")
        if nstep is not None and nstep != ctrl.shape[1]:
            raise ValueError(f"ctrl has {ctrl.shape[1]} steps, nstep is {nstep}")
        nstep = None
    elif nstep is None:
        raise ValueError("rollout_batch needs ctrl or nstep")
    mesh = None if devices is None else _mesh(devices)
    fn, shardings = _batched_fn(_axes_key(model_axes), nstep, bool(checkpoint),
                                bool(return_data), mesh)
    if mesh is None:
        n = chunk_count(nbatch, (data, ctrl), threads)
        if n > 1:
            return _rollout_chunks(fn, model, data, ctrl, model_axes, n)
    if mesh is not None:
        ndev = mesh.devices.size
        if nbatch % ndev:
            raise ValueError(f"rollout_batch: batch size {nbatch} is not a multiple of "
                             f"the {ndev} devices it is sharded over")
        batched, replicated = shardings
        data = _put(data, batched)
        ctrl = None if ctrl is None else jax.device_put(ctrl, batched)
        if model_axes is None:
            model = _put(model, replicated)
        else:
            model = jax.tree_util.tree_map(
                lambda ax, x: jax.device_put(x, replicated if ax is None else batched),
                model_axes, model, is_leaf=lambda x: x is None)
    return fn(model, data, ctrl)


def _rollout_chunks(fn, model, data, ctrl, model_axes, n):
    """``fn(model, data, ctrl)`` over ``n`` chunks of the batch at once, joined."""
    datas = split_batch(data, n)
    ctrls = [None] * n if ctrl is None else split_batch(ctrl, n)
    if model_axes is None:
        models = [model] * n
    else:
        # the batched Model leaves are cut with the batch; the shared ones are kept
        size = datas[0].qpos.shape[0]
        sizes = jax.tree_util.tree_map(lambda ax, x: None if ax is None else np.shape(x)[0],
                                       model_axes, model, is_leaf=lambda x: x is None)
        if any(k != size * n for k in jax.tree_util.tree_leaves(sizes)):
            raise ValueError(f"rollout_batch: the batched Model leaves need the leading "
                             f"batch size {size * n}")
        models = [jax.tree_util.tree_map(
            lambda ax, x, i=i: x if ax is None else _rows(x, i * size, (i + 1) * size),
            model_axes, model, is_leaf=lambda x: x is None) for i in range(n)]
    outs = concurrent(fn, list(zip(models, datas, ctrls)))
    return concat_batch(outs)
