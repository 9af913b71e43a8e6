"""Resource providers: data: URIs, user providers (a zip archive), errors."""
import base64
import io
import os
import urllib.parse
import zipfile

import mujoco
import numpy as np
import pytest

import simjax
from simjax import MJCFError, resources

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TET_OBJ = (b"v 0 0 0\nv 0.2 0 0\nv 0 0.3 0\nv 0 0 0.1\nv 0.05 0.05 0.3\n"
           b"f 1 3 2\nf 1 2 4\nf 1 4 3\nf 2 3 5\nf 2 5 4\nf 3 4 5\n")

MODEL = """<mujoco>
  <include file="parts/options.xml"/>
  <asset>
    <mesh name="tet" file="{mesh}"/>
    <hfield name="h" file="{hfield}" size="1 1 .1 .05"/>
    <texture name="t" type="2d" file="{texture}"/>
  </asset>
  <worldbody>
    <geom type="hfield" hfield="h"/>
    <body pos="0 0 1"><freejoint/><geom type="mesh" mesh="tet"/></body>
  </worldbody>
</mujoco>"""
OPTIONS = b'<mujoco><option timestep="0.004"/></mujoco>'


def _png(shape=(4, 5)):
    from PIL import Image
    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


FIELDS = ("body_mass", "body_inertia", "body_ipos", "mesh_vert", "hfield_data", "geom_size",
          "geom_aabb")


def _same(m, ref):
    assert m.opt.timestep == ref.opt.timestep
    for f in FIELDS:
        np.testing.assert_allclose(np.asarray(getattr(m, f)), np.asarray(getattr(ref, f)),
                                   rtol=1e-12, atol=1e-12, err_msg=f)


@pytest.fixture()
def files(tmp_path):
    """The model unpacked on disk: (path, MuJoCo's compiled model)."""
    (tmp_path / "parts").mkdir()
    (tmp_path / "meshes").mkdir()
    (tmp_path / "parts" / "options.xml").write_bytes(OPTIONS)
    (tmp_path / "meshes" / "tet.obj").write_bytes(TET_OBJ)
    (tmp_path / "h.png").write_bytes(_png())
    (tmp_path / "t.png").write_bytes(_png((8, 8, 3)))
    path = tmp_path / "model.xml"
    path.write_text(MODEL.format(mesh="meshes/tet.obj", hfield="h.png", texture="t.png"))
    return str(path), mujoco.MjModel.from_xml_path(str(path))


def test_file_model_matches_mujoco(files):
    path, mjm = files
    _same(simjax.load_model(path), mjm)


@pytest.mark.parametrize("encoding", ["base64", "base64-wrapped", "percent"])
def test_mesh_as_data_uri(files, encoding):
    path, mjm = files
    if encoding == "percent":
        uri = "data:model/obj," + urllib.parse.quote(TET_OBJ)
    else:
        b64 = base64.b64encode(TET_OBJ).decode()
        if encoding == "base64-wrapped":      # RFC 2045 line breaks are ignored
            b64 = "\n".join(b64[i:i + 20] for i in range(0, len(b64), 20))
        uri = "data:model/obj;base64," + b64
    text = open(path).read().replace("meshes/tet.obj", uri)
    with open(path, "w") as f:
        f.write(text)
    _same(simjax.load_model(path), mjm)


def test_model_through_zip_provider(files, tmp_path):
    from examples.zip_provider import register_zip_provider
    path, mjm = files
    archive = tmp_path / "robot.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for rel in ("model.xml", "parts/options.xml", "meshes/tet.obj", "h.png", "t.png"):
            z.write(tmp_path / rel, "robot/" + rel)
    register_zip_provider()
    try:
        m = simjax.load_model(f"ZIP:{archive}!robot/model.xml")   # scheme: any case
        _same(m, mjm)
        with pytest.raises(MJCFError, match="could not open"):
            simjax.load_model(f"zip:{archive}!robot/missing.xml")
        # a relative asset missing from the archive is reported through the provider
        with zipfile.ZipFile(archive, "a") as z:
            z.writestr("robot/bad.xml", MODEL.format(mesh="nope.obj", hfield="h.png",
                                                     texture="t.png"))
        with pytest.raises(MJCFError, match=r"zip' could not open 'zip:.*robot/nope.obj'"):
            simjax.load_model(f"zip:{archive}!robot/bad.xml")
    finally:
        resources.unregister("zip")


def test_scheme_needs_colon_and_exact_prefix(tmp_path):
    seen = []
    prov = resources.ResourceProvider(
        prefix="http", open=lambda n: seen.append(n) or b"<mujoco/>", read=lambda h: h,
        close=lambda h: None)
    resources.register(prov)
    try:
        assert resources.scheme_of("HTTP://host/a.xml") == "http"
        assert resources.scheme_of("https://host/a.xml") is None     # https is not http
        assert resources.scheme_of("http/a.xml") is None             # colon required
        simjax.load_model("Http://host/a.xml")
        assert seen == ["Http://host/a.xml"]
        with pytest.raises(MJCFError, match="no resource provider is registered for "
                                            "'https:'"):
            simjax.load_model("https://host/a.xml")
    finally:
        resources.unregister("http")


def test_getdir_default_and_relative_include():
    store = {"mem:models/a/main.xml": b'<mujoco><include file="../common/opt.xml"/>'
                                      b'<worldbody/></mujoco>',
             "mem:models/common/opt.xml": OPTIONS}
    prov = resources.ResourceProvider(prefix="mem", open=store.get, read=lambda h: h,
                                      close=lambda h: None)
    resources.register(prov)
    try:
        assert resources.getdir("mem:models/a/main.xml") == "mem:models/a/"
        assert resources.getdir("mem:main.xml") == "mem:"
        store["mem:models/a/../common/opt.xml"] = OPTIONS
        m = simjax.load_model("mem:models/a/main.xml")
        assert float(m.opt.timestep) == 0.004
    finally:
        resources.unregister("mem")


def test_register_errors():
    ok = dict(open=lambda n: n, read=lambda h: b"", close=lambda h: None)
    with pytest.raises(MJCFError, match="invalid resource provider prefix"):
        resources.register(resources.ResourceProvider(prefix="a", **ok))
    with pytest.raises(MJCFError, match="already registered"):
        resources.register(resources.ResourceProvider(prefix="DATA", **ok))
    with pytest.raises(MJCFError, match="needs a callable 'read'"):
        resources.register(resources.ResourceProvider(prefix="abc", open=ok["open"],
                                                      read=None, close=ok["close"]))


def test_provider_failures_are_clear_errors():
    def boom(handle):
        raise OSError("disk on fire")
    resources.register(resources.ResourceProvider(prefix="bad", open=lambda n: 1, read=boom,
                                                  close=lambda h: None))
    try:
        with pytest.raises(MJCFError, match="could not read 'bad:x.xml': disk on fire"):
            simjax.load_model("bad:x.xml")
    finally:
        resources.unregister("bad")


@pytest.mark.parametrize("uri,match", [
    ("data:model/obj;base64,@@@@", "undecodable base64"),
    ("data:model/obj;base64", "no ','"),
    ("data:not a type;base64,AAAA", "invalid media type"),
])
def test_undecodable_data_uri(uri, match):
    xml = f'<mujoco><asset><mesh name="m" file="{uri}"/></asset></mujoco>'
    with pytest.raises(MJCFError, match=match) as info:
        simjax.load_model(xml)
    assert info.value.line == 1


def test_data_uri_model_file():
    xml = b'<mujoco><option timestep="0.003"/></mujoco>'
    m = simjax.load_model("data:text/xml;base64," + base64.b64encode(xml).decode())
    assert float(m.opt.timestep) == 0.003
