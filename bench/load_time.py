"""Time simjax.load_model against mujoco.MjModel.from_xml_path on corpus models.

Usage: python bench/load_time.py [--repeat N]

Per model: simjax's first load in this process (what a user waits for: models that
need the engine at load time, such as arm26's muscle length ranges, compile programs
then), its best of N loads (those programs reused), and MuJoCo's best of N.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import simjax  # noqa: E402  (this checkout's simjax)

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                      "corpus")
MODELS = ["mujoco_humanoid/humanoid.xml", "gym_ant/ant.xml",
          "mjx_shadow_hand/scene_right.xml", "mjx_barkour_v0/assets/barkour_v0_mjx.xml",
          "menagerie_trossen_wx250s/scene.xml",
          "mjx_tendon_wrap_sidesite/wrap_sidesite.xml", "mujoco_arm26/arm26.xml"]


def _times(fn, repeat):
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    try:
        import mujoco
    except ImportError:
        mujoco = None
    print(f"{'model':45s} {'simjax first [s]':>17s} {'simjax best [s]':>16s} "
          f"{'mujoco [s]':>11s}")
    for rel in MODELS:
        path = os.path.join(CORPUS, rel)
        if not os.path.exists(path):
            print(f"{rel:45s} (not found)")
            continue
        ts = _times(lambda: simjax.load_model(path), args.repeat)
        tm = min(_times(lambda: mujoco.MjModel.from_xml_path(path), args.repeat)) \
            if mujoco else float("nan")
        print(f"{rel:45s} {ts[0]:17.3f} {min(ts):16.3f} {tm:11.3f}")


if __name__ == "__main__":
    main()
