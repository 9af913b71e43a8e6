"""The engine's entry points called eagerly run as one compiled program.

Outside a trace, jax runs a function op by op: each operation is compiled on its own
(once per shape and dtype, then cached) and dispatched alone. A MuJoCo user's habit,
``d = simjax.forward(m, d)`` on concrete arrays, then compiled hundreds of small programs
and dispatched thousands of operations. So :func:`simjax.forward`, :func:`simjax.step`
and :func:`simjax.inverse` called on concrete arrays, with jit enabled, run through
``jax.jit`` instead: one program per model (its arrays, :func:`program`) and Data
shapes, compiled on the first call with a model and reused by the later ones with the
same arrays (the program's constants, concrete at trace time as they are op by op; a
model of other values, ``m.replace(...)``, compiles its own). The pipeline and sensor
stages that :mod:`simjax.engine` exports (``fwd_position`` ... ``sensor_acc``,
``euler``, ``rk4``, ``implicit``) do the same there (the engine's own calls use its
modules' functions, unwrapped). :func:`simjax.rollout` does the same (:func:`program`);
op by op its scan was traced and compiled again on every call. So do the support
queries (``jac`` ... ``energy_vel``, :mod:`simjax.engine.support`), with their object ids
static arguments (``compiled_when_eager(ids=...)``): the humanoid's ``solve_m`` took
120-175 ms a call op by op (its loops over the tree's levels), 0.1-0.2 ms as a program.

Under transformations that evaluate eagerly (``jax.vmap``, ``jax.grad``, ``jax.jvp``,
``jax.jacfwd`` ... outside any ``jit``; :func:`eager_transforms`) the program is called
too: jax batches or differentiates a ``jit`` program as a whole, and runs the result
compiled, where op by op it transformed and dispatched every operation alone. A model
batched or differentiated there passes its traced arrays as the program's arguments
(its concrete ones stay constants). Inside a staged trace (``jit``, ``scan``,
``checkpoint``, ...) and under ``jax.disable_jit()`` they trace in line as before.

Checks on values that the engine derives by jax.numpy from the model are traced inside
the program: read from the model's own arrays they stay concrete (as
``tendon._armature_np`` does).

Measured (2-core Intel Xeon, a fresh process each, jaxlib 0.10.2, float32, the
initial state; first call, then the next two), op by op -> one program: MuJoCo's
humanoid ``forward`` 27.7 s, 1.63 s, 1.41 s -> 3.4 s, 3 ms, 4 ms; its ``step`` 32.2 s,
1.80 s, 1.99 s -> 4.4 s, 3 ms, 3 ms; its ``fwd_position`` 21.4 s, 0.20 s -> 2.1 s, 3
ms; the cartpole of ``models/`` ``forward`` 8.4 s, 0.61 s, 0.62 s -> 1.9 s, 2 ms, 2 ms
and ``step`` 3.8 s, 2.1 s, 1.9 s -> 2.1 s, 3 ms, 2 ms (op by op, every call traced its
loops again); its ``rollout`` of 20 steps 4.0 s, 3.0 s, 3.4 s -> 2.1 s, 2 ms, 2 ms.
With the model an argument of the program instead (one program per model structure),
the humanoid's ``forward`` took 4.1 s, and checks on the model's values were skipped
(a traced model).

Under ``jax.vmap`` (in_axes (None, 0), 8 worlds) the humanoid's ``step`` 34.6 s, 2.1 s,
2.1 s -> 4.4 s, 9 ms, 8 ms; the cartpole's 3.8 s, 2.5 s, 2.9 s -> 2.4 s, 8 ms, 9 ms.
``jax.grad`` of a loss through three ``step`` calls: humanoid 89.4 s, 12.3 s, 12.1 s ->
27.5 s, 0.10 s, 0.10 s; cartpole 18.7 s, 16.7 s, 18.9 s -> 13.0 s, 50 ms, 47 ms. The
same with respect to ``dof_damping`` (``m.replace(dof_damping=...)`` inside the loss,
the model's damping traced): humanoid 90.8 s, 11.8 s, 11.4 s -> 32.1 s, 0.12 s, 0.11 s;
cartpole 18.3 s, 15.5 s, 18.3 s -> 12.5 s, 45 ms, 48 ms.
"""
from __future__ import annotations

import functools
import inspect
import weakref

import jax
import numpy as np

#: whether entry points called eagerly run as one ``jax.jit`` program, read at call time
#: (False: op by op, kept to compare)
WHOLE = True


def called_eagerly(args) -> bool:
    """Whether a call on ``args`` (a tree, the model first) is to run as one compiled
    program: :data:`WHOLE` on, jit enabled, and the call made eagerly, or under
    transformations that evaluate eagerly (:func:`eager_transforms`: ``jax.vmap``,
    ``jax.grad``, ``jax.jvp`` ... outside any ``jit``). Under those a ``jax.jit``
    program is batched or differentiated as a whole and runs compiled; op by op every
    operation was transformed and dispatched on its own."""
    if not WHOLE:
        return False
    if jax.config.jax_disable_jit:
        return False
    base = eager_transforms() if TRANSFORMS else None
    if base is None:
        # TRANSFORMS off, or a jax that does not expose its traces: concrete arguments
        # only, as before
        return not any(isinstance(x, jax.core.Tracer)
                       for x in jax.tree_util.tree_leaves(args))
    return base


#: whether calls under transformations that evaluate eagerly (:func:`eager_transforms`)
#: run the program too, read at call time (False: only calls on concrete arguments, the
#: others in line, kept to compare)
TRANSFORMS = True


#: the traces between a call and eager evaluation under which a ``jax.jit`` program is
#: transformed whole and evaluated compiled (vmap's batching, forward-mode and
#: reverse-mode differentiation); any other (a ``jit`` or ``scan`` being traced, a
#: ``checkpoint``, ``shard_map``, ...) keeps the call in line
_EAGER_TRACES = ("EvalTrace", "BatchTrace", "JVPTrace", "LinearizeTrace")


def eager_transforms():
    """Whether the current trace and every trace below it (``parent_trace``) are eager
    evaluation or transformations of it (:data:`_EAGER_TRACES`): no ``jit``, ``scan``
    or other staging is being traced. None where jax does not expose its current trace
    (``jax._src.core.trace_ctx``, jax 0.4.36 on)."""
    from jax._src import core
    ctx = getattr(core, "trace_ctx", None)
    if ctx is None:
        return None
    trace = ctx.trace
    while trace is not None:
        if type(trace).__name__ not in _EAGER_TRACES:
            return False
        trace = getattr(trace, "parent_trace", None)
    return True


#: programs kept per entry point (the most recently used first to stay): each holds its
#: model's arrays and its compiled code
KEEP = 4


class Programs(dict):
    """An entry point's programs (:func:`program`): {(model structure, ids of its
    concrete arrays, None where traced): (the arrays, jitted)}, oldest first; and
    ``objects``, {id(model): (weak reference to the model, key)} for models of concrete
    arrays, so that a call with a model object seen before finds its program without
    flattening the model (the humanoid: the lookup 162 -> 7 us, its eager ``step``
    1.25-1.37 -> 1.19 ms a call, best of five runs of 200 calls)."""

    def __init__(self):
        super().__init__()
        self.objects = {}


def program(cache, fn, m, static_argnums=()):
    """``fn(m, *args)`` as a ``jax.jit`` program, made once per model (its structure and
    its arrays, by identity) and kept in ``cache`` (:class:`Programs`) with the
    :data:`KEEP` programs used last; returns a function of ``args``
    (``static_argnums`` counted among them). The model's concrete arrays are the
    program's constants, concrete when it is traced, as they are op by op: trace-time
    checks and choices that read them (a non-zero armature on a geom-wrapping tendon
    raises, a zero friction loss made non-zero raises, NumPy paths for concrete
    parameters) behave as before; passed as arguments they would be tracers. The
    model's traced arrays (a model batched by ``vmap`` or differentiated by ``grad``)
    are the program's arguments, tracers at trace time as they are in line.

    The key is the model's concrete arrays and where its traced ones are, not the model
    object: ``jax.vmap`` hands the function a new Model of the same arrays on every call
    (an unbatched argument is flattened and rebuilt). The entry holds the arrays, so
    their ids stay theirs while it lives."""
    seen = cache.objects.get(id(m))
    if seen is not None and seen[0]() is m and seen[1] in cache:
        key, free = seen[1], []
    else:
        leaves, treedef = jax.tree_util.tree_flatten(m)
        traced = tuple(isinstance(x, jax.core.Tracer) for x in leaves)
        key = (treedef, tuple(None if t else id(x) for x, t in zip(leaves, traced)))
        free = [x for x, t in zip(leaves, traced) if t]
        if key not in cache:
            cache[key] = _jitted(fn, leaves, treedef, traced, static_argnums)
            while len(cache) > KEEP:
                cache.pop(next(iter(cache)))
        if not free:
            # the entry leaves when the model does (the callback runs before its id can
            # be reused)
            cache.objects[id(m)] = (weakref.ref(
                m, lambda _, i=id(m): cache.objects.pop(i, None)), key)
    # most recently used last
    entry = cache[key] = cache.pop(key)
    return functools.partial(entry[1], free)


def _jitted(fn, leaves, treedef, traced, static_argnums):
    """:func:`program`'s entry: (the concrete arrays held, jit of fn whose first argument
    is the list of traced arrays)."""
    held = [None if t else x for x, t in zip(leaves, traced)]

    def call(free, *args):
        # the model: its held arrays, the traced ones from the program's arguments
        it = iter(free)
        return fn(treedef.unflatten([next(it) if t else x for x, t in zip(held, traced)]),
                  *args)

    return held, jax.jit(call, static_argnums=tuple(i + 1 for i in static_argnums))


def compiled_when_eager(check, ids=()):
    """Decorator for ``fn(m, d, ...)``: called eagerly (:func:`called_eagerly`), it runs
    through :func:`program` (one ``jax.jit`` program per model, Data and the other
    arguments its arguments), else ``fn`` itself; ``check(*args)`` first either
    way, so that arguments jit cannot take (MuJoCo's own MjModel, a Data of another
    model) raise its clear error rather than jit's. The programs are ``run.programs``,
    {positions of the static ids: :func:`program`'s cache} (``()`` without static ids).

    ``ids``: names of ``fn``'s object id parameters. Where concrete (a Python or NumPy
    integer, a concrete jax integer array, a sequence of them) they are the program's
    static arguments, as a Python int or a tuple of ints, so that ``fn`` sees them
    concrete as it does op by op: it checks their range (an IndexError) and indexes by
    them statically. A program is compiled per id (the same id again reuses it)."""
    def wrap(fn):
        signature = inspect.signature(fn)
        names = list(signature.parameters)
        id_pos = tuple(names.index(n) - 1 for n in ids)      # among the args after m
        programs = {}

        @functools.wraps(fn)
        def run(*args, **kwargs):
            if kwargs:
                # arguments by name (``step(m, d=data)``) as the positional ones
                args = signature.bind(*args, **kwargs).args
            check(*args)
            if not called_eagerly(args):
                return fn(*args)
            rest = list(args[1:])
            static = []
            for i in id_pos:
                if i < len(rest) and _is_ids(rest[i]):
                    rest[i] = _as_static(rest[i])
                    static.append(i)
            cache = programs.setdefault(tuple(static), Programs())
            return program(cache, fn, args[0], tuple(static))(*rest)

        run.programs = programs
        return run

    return wrap


def _is_ids(x):
    """Whether ``x`` is concrete integer ids (not bools): a Python or NumPy integer, a
    NumPy or concrete jax array of integers, or a non-empty sequence of integers."""
    if isinstance(x, (list, tuple)):
        return bool(x) and all(_is_ids(y) and np.ndim(y) == 0 for y in x)
    if isinstance(x, (bool, np.bool_, jax.core.Tracer)):
        return False
    if isinstance(x, (int, np.integer)):
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and np.dtype(dtype).kind in "iu"


def _as_static(x):
    """Concrete ids ``x`` (:func:`_is_ids`) as a Python int, or a tuple of ints."""
    k = np.asarray(x)
    return int(k) if k.ndim == 0 else tuple(int(v) for v in k.reshape(-1))
