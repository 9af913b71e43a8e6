"""Merge results files measured in parts (e.g. several calls on one lent machine) into one.

Usage: python -m bench.merge OUT_STEM PART.json [PART.json ...]

Rows are kept in the order given; a later row for the same (model, batch, backend)
replaces an earlier one. The parts must come from one device; the merged file lists
every part's command. Writes OUT_STEM.json, .md and .png like ``python -m bench``.
"""
from __future__ import annotations

import json
import sys

from bench.run import _write, plot


def merge(parts):
    """(rows, meta) of the parts merged; ValueError if they come from different devices."""
    rows, metas = {}, []
    for path in parts:
        with open(path) as f:
            res = json.load(f)
        metas.append(res["meta"])
        for r in res["rows"]:
            rows[(r["model"], r["batch"], r["backend"])] = r
    devices = {m["device"] for m in metas}
    if len(devices) != 1:
        raise ValueError(f"parts from different devices: {sorted(devices)}")
    meta = dict(metas[0])
    meta["command"] = "`; `".join(m["command"] for m in metas)
    meta["wall_s"] = round(sum(m.get("wall_s", 0.0) for m in metas), 1)
    return list(rows.values()), meta


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(__doc__)
        return 2
    rows, meta = merge(argv[1:])
    print(_write(argv[0], rows, meta))
    plot(rows, argv[0] + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
