"""Height-field assets (mjCHField::Compile in user_objects.cc). numpy/Pillow only.

Sources of elevation: a PNG file (grey level of each pixel), MuJoCo's custom binary file
(int32 nrow, int32 ncol, float32 data[nrow*ncol]) or the inline ``elevation`` attribute
with ``nrow``/``ncol``. Rows of PNG images and of the XML attribute are listed top to
bottom; MuJoCo stores row 0 at the bottom (-y), so both are flipped. The custom binary
format is stored as is. The data is then normalised to [0, 1] in float32 arithmetic:
``(x - min) / (max - min)`` when ``max - min > 1e-14``, else ``x - min``.
"""
from __future__ import annotations

import dataclasses
import io
import os

import numpy as np

from simjax.errors import MJCFError
from simjax.mjcf.mesh import read_asset

_MJEPS = 1e-14


@dataclasses.dataclass
class HFieldData:
    """A compiled height field as mjModel stores it.

    ``nrow``, ``ncol``: grid size (hfield_nrow/ncol). ``size`` (4,): radius_x, radius_y,
    elevation_z, base_z [m] (hfield_size). ``data`` (nrow*ncol,) float64 holding float32
    values in [0, 1], row-major with row 0 at -y (hfield_data).
    """

    nrow: int
    ncol: int
    size: np.ndarray
    data: np.ndarray
    name: str = ""


def load_hfield(attrs: dict, model_dir, meshdir, strippath, assets) -> HFieldData:
    """Compile one ``<hfield>`` asset.

    ``attrs``: name, file, content_type, nrow, ncol, elevation, size (4). Files are read
    through :func:`simjax.resources.read` with the mesh path rules (hfields use meshdir).
    Raises MJCFError naming the height field.
    """
    file = attrs.get("file") or None
    name = attrs.get("name") or (_stem(file) if file else "")
    try:
        return _load(attrs, name, file, model_dir, meshdir, strippath, assets)
    except MJCFError as err:
        raise MJCFError(f"hfield '{name}': {err.message}") from None


def _stem(file: str) -> str:
    base = file[max(file.rfind("/"), file.rfind("\\")) + 1:]
    dot = base.rfind(".")
    return base if dot < 0 else base[:dot]


def _load(attrs, name, file, model_dir, meshdir, strippath, assets) -> HFieldData:
    nrow = int(attrs.get("nrow") or 0)
    ncol = int(attrs.get("ncol") or 0)
    elevation = attrs.get("elevation")
    elevation = None if elevation is None or len(elevation) == 0 else \
        np.asarray(elevation, dtype=np.float64).ravel()
    size = np.asarray(attrs.get("size", [0, 0, 0, 0]), dtype=np.float64).ravel()
    if size.size != 4:
        raise MJCFError("hfield size must have 4 numbers")

    data = None
    if elevation is not None:
        if nrow * ncol != elevation.size:
            raise MJCFError("elevation data length must match nrow*ncol")
        # the XML lists the top row first; MuJoCo stores the bottom row first
        data = elevation.astype(np.float32).reshape(nrow, ncol)[::-1].ravel()
    elif nrow > 0 and ncol > 0 and not file:
        data = np.zeros(nrow * ncol, dtype=np.float32)  # a flat field, as MuJoCo makes
    if np.any(size <= 0):
        raise MJCFError("size parameter is not positive in hfield")
    if file:
        if nrow or ncol or data is not None:
            raise MJCFError("hfield specified from file and manually")
        nrow, ncol, data = _load_file(file, attrs.get("content_type") or "", model_dir,
                                      meshdir, strippath, assets)
    if nrow < 1 or ncol < 1 or data is None or data.size == 0:
        raise MJCFError("hfield not specified")
    return HFieldData(nrow=nrow, ncol=ncol, size=size, data=_normalise(data, file),
                      name=name)


def _normalise(data: np.ndarray, file) -> np.ndarray:
    data = data.astype(np.float32)
    emin, emax = data.min(), data.max()
    if not emin <= emax:
        raise MJCFError(f"invalid data range in hfield '{file or ''}'")
    data = data - emin
    if float(emax - emin) > _MJEPS:
        data = data / (emax - emin)
    return data.astype(np.float64)


def _content_type(file: str, content_type: str) -> str:
    if content_type:
        return content_type.split(";")[0].strip().lower()
    ext = os.path.splitext(file)[1].lower()
    return {".png": "image/png", ".stl": "model/stl", ".obj": "model/obj",
            ".msh": "model/vnd.mujoco.msh", ".ktx": "image/ktx"}.get(
        ext, "image/vnd.mujoco.hfield")


def _load_file(file, content_type, model_dir, meshdir, strippath, assets):
    ctype = _content_type(file, content_type)
    if ctype not in ("image/png", "image/vnd.mujoco.hfield"):
        raise MJCFError(f"unsupported content type: '{ctype}'")
    raw = read_asset(file, model_dir, meshdir, strippath, assets)
    if ctype == "image/png":
        return _load_png(raw, file)
    return _load_custom(raw, file)


def _load_custom(raw: bytes, file: str):
    if len(raw) < 8:
        raise MJCFError(f"hfield missing header '{file}'")
    nrow, ncol = (int(x) for x in np.frombuffer(raw, dtype="<i4", count=2))
    if nrow < 1 or ncol < 1:
        raise MJCFError(f"non-positive hfield dimensions in file '{file}'")
    if len(raw) != nrow * ncol * 4 + 8:
        raise MJCFError(f"unexpected file size in file '{file}'")
    return nrow, ncol, np.frombuffer(raw, dtype="<f4", count=nrow * ncol, offset=8).copy()


def _load_png(raw: bytes, file: str):
    """Grey level of each pixel, as lodepng decodes to 8-bit grey, rows flipped."""
    grey = png_grey8(raw, file)
    nrow, ncol = grey.shape
    return nrow, ncol, grey[::-1].astype(np.float32).ravel()


def png_grey8(raw: bytes, file: str) -> np.ndarray:
    """(height, width) uint8 grey image, converted the way lodepng does (LCT_GREY, 8 bit).

    lodepng keeps the grey channel of grey images, takes the high byte of 16-bit
    samples, and for colour images uses the red channel (it does not mix channels).
    """
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(raw))
        img.load()
    except Exception as err:  # noqa: BLE001 - Pillow raises many types
        raise MJCFError(f"error decoding PNG file '{file}': {err}") from None
    mode = img.mode
    if mode in ("L", "LA"):
        arr = np.asarray(img.getchannel(0))
    elif mode.startswith("I;16") or mode == "I":
        arr = (np.asarray(img).astype(np.int64) >> 8).clip(0, 255).astype(np.uint8)
    elif mode == "1":
        arr = np.asarray(img.convert("L"))
    else:
        arr = np.asarray(img.convert("RGBA"))[..., 0]
    return np.ascontiguousarray(arr, dtype=np.uint8)
