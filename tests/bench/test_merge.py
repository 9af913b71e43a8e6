"""Merging results files measured in parts."""
import json

import pytest

merge = pytest.importorskip("bench.merge")


def _part(tmp_path, name, device, command, rows):
    p = tmp_path / f"{name}.json"
    meta = dict(device=device, cpu="x86_64", jax="0", mujoco="4.0.0", date="2026-11-26",
                command=command, wall_s=10.0)
    p.write_text(json.dumps(dict(meta=meta, rows=rows)))
    return str(p)


def test_merge_parts_later_rows_win(tmp_path):
    a = _part(tmp_path, "a", "gpu", "python -m bench --models ant",
              [dict(model="ant", batch=4096, backend="simjax", sps=1.0),
               dict(model="ant", batch=4096, backend="mjx", error="timeout 60s (forward)")])
    b = _part(tmp_path, "b", "gpu", "python -m bench --models ant --backends mjx",
              [dict(model="ant", batch=4096, backend="mjx", sps=2.0)])
    rows, meta = merge.merge([a, b])
    by = {r["backend"]: r for r in rows}
    assert by["simjax"]["sps"] == 1.0 and by["mjx"]["sps"] == 2.0 and len(rows) == 2
    assert meta["command"] == ("python -m bench --models ant`; `"
                               "python -m bench --models ant --backends mjx")
    assert meta["wall_s"] == 20.0
    stem = str(tmp_path / "merged")
    assert merge.main([stem, a, b]) == 0
    table = open(stem + ".md").read()
    assert "| ant | 4096 | 1 | 2 |" in table


def test_merge_refuses_mixed_devices(tmp_path):
    a = _part(tmp_path, "a", "gpu", "x", [])
    b = _part(tmp_path, "b", "cpu-2cores", "y", [])
    with pytest.raises(ValueError, match="different devices"):
        merge.merge([a, b])
