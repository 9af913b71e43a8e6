"""A resource provider that reads models and their assets from a zip archive.

Names look like ``zip:/path/to/archive.zip!member/path.xml``. Relative names inside a
model loaded this way (``<include>``, meshes, height fields, textures) resolve against
the model's directory inside the archive, so a zipped model loads like an unpacked one::

    import simjax
    from examples.zip_provider import register_zip_provider
    register_zip_provider()
    model = simjax.load_model("zip:/tmp/robot.zip!robot/scene.xml")
"""
from __future__ import annotations

import posixpath
import zipfile

from simjax import resources

PREFIX = "zip"


def _split(name: str):
    """(archive path, member path) of ``zip:<archive>!<member>``."""
    body = name[len(PREFIX) + 1:]
    archive, sep, member = body.partition("!")
    if not sep:
        raise ValueError(f"'{name}' has no '!' separating the archive from the member")
    member = posixpath.normpath(member.replace("\\", "/").lstrip("/"))
    return archive, member


def _open(name):
    archive, member = _split(name)
    try:
        with zipfile.ZipFile(archive) as z:
            return z.read(member)          # the handle is the member's bytes
    except (OSError, KeyError, zipfile.BadZipFile):
        return None                        # not found: the compiler reports it


def _getdir(name):
    archive, member = _split(name)
    head = posixpath.dirname(member)
    return f"{PREFIX}:{archive}!{head + '/' if head else ''}"


def _modified(handle, timestamp):
    return True


PROVIDER = resources.ResourceProvider(prefix=PREFIX, open=_open, read=lambda h: h,
                                      close=lambda h: None, getdir=_getdir,
                                      modified=_modified)


def register_zip_provider():
    """Register the ``zip:`` provider (idempotent)."""
    if resources.scheme_of(PREFIX + ":x") is None:
        resources.register(PROVIDER)
    return PROVIDER
