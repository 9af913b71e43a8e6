"""Print, per corpus model, whether simjax compiles it and which Model fields match MuJoCo.

Usage: python tests/conformance/report.py [substring ...]
"""
from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # this checkout's simjax

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import mujoco  # noqa: E402

import simjax  # noqa: E402
from compare import CORPUS, compare, corpus_models  # noqa: E402


def main(filters):
    total_ok = 0
    rows = corpus_models()
    for rel in rows:
        if filters and not any(f in rel for f in filters):
            continue
        path = os.path.join(CORPUS, rel)
        try:
            mjm = mujoco.MjModel.from_xml_path(path)
        except Exception as e:  # the oracle itself rejects the file
            print(f"{rel:60s} mujoco fails: {e}")
            continue
        t0 = time.perf_counter()
        try:
            model = simjax.load_model(path)
        except simjax.UnsupportedFeatureError as e:
            print(f"{rel:60s} unsupported: {e.feature}")
            continue
        except Exception as e:
            print(f"{rel:60s} FAILED: {type(e).__name__}: {e}")
            continue
        dt = time.perf_counter() - t0
        matched, bad, n = compare(model, mjm)
        total_ok += not bad
        names = ", ".join(f"{k}({v})" for k, v in bad.items())
        print(f"{rel:60s} {len(matched):4d}/{n:4d} {100 * len(matched) / n:6.2f}%  "
              f"{dt:5.2f}s  {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
