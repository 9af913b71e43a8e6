"""The engine's entry points called eagerly run as one compiled program.

Outside a trace, jax runs a function op by op: each operation is compiled on its own
(once per shape and dtype, then cached) and dispatched alone. A MuJoCo user's habit,
``d = simjax.forward(m, d)`` on concrete arrays, then compiled hundreds of small programs
and dispatched thousands of operations. So :func:`simjax.forward`, :func:`simjax.step`
and :func:`simjax.inverse` called on concrete arrays, with jit enabled, run through
``jax.jit`` instead: one program per model object and Data shapes, compiled on the first
call with a model and reused by the later ones with the same model object (its arrays
are the program's constants, concrete at trace time as they are op by op; a model of
other values, ``m.replace(...)``, compiles its own). The pipeline and sensor stages that
:mod:`simjax.engine` exports (``fwd_position`` ... ``sensor_acc``, ``euler``, ``rk4``,
``implicit``) do the same there (the engine's own calls use its modules' functions,
unwrapped). Inside a trace (``jit``, ``vmap``, ``grad``, ...) and under
``jax.disable_jit()`` they trace in line as before. :func:`simjax.rollout` does the
same (:func:`program`); op by op its scan was traced and compiled again on every call.
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
"""
from __future__ import annotations

import functools
import inspect
import weakref

import jax

#: whether entry points called eagerly run as one ``jax.jit`` program, read at call time
#: (False: op by op, kept to compare)
WHOLE = True


def called_eagerly(args) -> bool:
    """Whether ``args`` (a tree) hold no tracer and jit is enabled, with
    :data:`WHOLE` on: a call to run as one compiled program."""
    if not WHOLE:
        return False
    if jax.config.jax_disable_jit:
        return False
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args))


def program(cache, fn, m, **jit_kwargs):
    """``jax.jit`` of ``fn(m, *args)`` for the model ``m``, made once per model object and
    kept in ``cache`` ({id: (weak reference to the model, jitted)}) while the model
    lives. The model's arrays are the program's constants, concrete when it is traced,
    as they are op by op: trace-time checks and choices that read them (a non-zero
    armature on a geom-wrapping tendon raises, a zero friction loss made non-zero
    raises, NumPy paths for concrete parameters) behave as before; passed as an
    argument they would be tracers."""
    key = id(m)
    entry = cache.get(key)
    if entry is not None and entry[0]() is m:
        return entry[1]
    # the entry leaves with its model (the callback runs before the id can be reused);
    # the program reaches the model through the weak reference only (a strong one, as
    # functools.partial's, would keep model and program alive for good)
    ref = weakref.ref(m, lambda _, key=key: cache.pop(key, None))
    jitted = jax.jit(lambda *args: fn(ref(), *args), **jit_kwargs)
    cache[key] = (ref, jitted)
    return jitted


def compiled_when_eager(check):
    """Decorator for ``fn(m, d, ...)``: called eagerly (:func:`called_eagerly`), it runs
    through :func:`program` (one ``jax.jit`` program per model object, Data and the
    other arguments its arguments), else ``fn`` itself; ``check(*args)`` first either
    way, so that arguments jit cannot take (MuJoCo's own MjModel, a Data of another
    model) raise its clear error rather than jit's. The programs are ``run.programs``
    ({id(model): (weak reference, jitted)})."""
    def wrap(fn):
        signature = inspect.signature(fn)
        programs = {}

        @functools.wraps(fn)
        def run(*args, **kwargs):
            if kwargs:
                # arguments by name (``step(m, d=data)``) as the positional ones
                args = signature.bind(*args, **kwargs).args
            check(*args)
            if called_eagerly(args):
                return program(programs, fn, args[0])(*args[1:])
            return fn(*args)

        run.programs = programs
        return run

    return wrap
