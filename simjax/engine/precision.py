"""Full float32 matrix products on accelerators.

With jax's default matmul precision, XLA on NVIDIA GPUs (Ampere and later) computes
float32 products in TF32 (a 10-bit mantissa): a float32 humanoid step then differed
from float64 by 1.2e-3 in qpos after one step (NVIDIA H200, jax 0.11.2), against
< 1e-4 on CPU. So simjax's entry points trace their programs with
``jax.default_matmul_precision("highest")`` (full float32 products), unless:

- the default backend is the CPU, whose float32 products are full precision anyway
  (the traced program stays exactly as it was: no precision attribute is added);
- the user set a default matmul precision of their own (``jax_default_matmul_precision``
  or the context manager), which is left to apply.

The precision is recorded in every ``dot_general`` when it is bound (jax reads the
setting at trace time), so products traced inside the entry points keep it however the
program is later lowered, batched or differentiated.
"""
from __future__ import annotations

import functools

import jax

#: False: jax's default precision everywhere (for paired measurements)
ON = True


def wanted() -> bool:
    """Whether products traced now should be asked for full float32 precision."""
    return ON and jax.config.jax_default_matmul_precision is None and not _cpu()


def _cpu() -> bool:
    return jax.default_backend() == "cpu"


def full_f32(fn):
    """``fn`` traced with full float32 matrix products where :func:`wanted`."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not wanted():
            return fn(*args, **kwargs)
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return run
