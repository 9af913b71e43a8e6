"""The engine's entry points called eagerly run as one compiled program.

Outside a trace, jax runs a function op by op: each operation is compiled on its own
(once per shape and dtype, then cached) and dispatched alone. A MuJoCo user's habit,
``d = simjax.forward(m, d)`` on concrete arrays, then compiled hundreds of small
programs and dispatched thousands of operations. So :func:`simjax.forward`,
:func:`simjax.step` and :func:`simjax.inverse` called on concrete arrays, with jit
enabled, run through ``jax.jit`` instead: one program per model structure and Data
shapes, compiled on the first call and reused by the later ones (a model of other
values but the same structure reuses it; the model is an argument of the program, not
a constant inside it). The pipeline and sensor stages that :mod:`simjax.engine` exports
(``fwd_position`` ... ``sensor_acc``, ``euler``, ``rk4``, ``implicit``) do the same
there (the engine's own calls use its modules' functions, unwrapped). Inside a trace
(``jit``, ``vmap``, ``grad``, ...) and under ``jax.disable_jit()`` they trace in line
as before. :func:`simjax.rollout` reads the same switch: called eagerly, its scan was
traced and compiled again on every call (the cartpole, 20 steps: 3.0-4.0 s a call), and
is now compiled on the first (3.9 s) and reused (3-5 ms).

Measured (2-core Intel Xeon, a fresh process each, jaxlib 0.10.2, float32, the
initial state; first call, then the next two), op by op -> one program:
MuJoCo's humanoid ``forward`` 27.7 s, 1.63 s, 1.41 s -> 4.1 s, 3 ms, 3 ms; its ``step``
32.2 s, 1.80 s, 1.99 s -> 4.7 s, 3 ms, 3 ms; the cartpole of ``models/`` ``forward``
8.4 s, 0.61 s, 0.62 s -> 2.2 s, 2 ms, 1 ms and ``step`` 3.8 s, 2.1 s, 1.9 s -> 2.9 s, 2
ms, 2 ms (op by op, every call traced its loops again).
"""
from __future__ import annotations

import functools
import inspect

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


def compiled_when_eager(check):
    """Decorator: ``fn(*args)`` through ``jax.jit(fn)`` when called eagerly
    (:func:`called_eagerly`), else ``fn`` itself; ``check(*args)`` first either way,
    so that arguments jit cannot take (MuJoCo's own MjModel, a Data of another
    model) raise its clear error rather than jit's. ``fn`` must take only arrays and
    pytrees of arrays (Model, Data): they become the compiled program's arguments.
    The jitted function is ``run.jitted`` (its compile cache:
    ``run.jitted._cache_size()``)."""
    def wrap(fn):
        jitted = jax.jit(fn)
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            if kwargs:
                # arguments by name (``step(m, d=data)``) as the positional ones
                args = signature.bind(*args, **kwargs).args
            check(*args)
            if called_eagerly(args):
                return jitted(*args)
            return fn(*args)

        run.jitted = jitted
        return run

    return wrap
