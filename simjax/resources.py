"""Resource providers: every file the compiler reads goes through here.

A name ``scheme:rest`` (scheme of two or more characters, case-insensitive, colon
required) goes to the provider registered for ``scheme``; other names are looked up in
the ``assets`` dictionary given to :func:`simjax.load_model`, then on the file system.
Built in: the file system, in-memory assets and ``data:`` URIs (RFC 2397, base64 or
percent-encoded).
"""
from __future__ import annotations

import base64
import dataclasses
import os
import re
import urllib.parse
from typing import Callable, Mapping

from simjax.errors import MJCFError


@dataclasses.dataclass(frozen=True)
class ResourceProvider:
    """A user resource provider (mjpResourceProvider).

    ``prefix``: the URI scheme it serves. ``open(name) -> handle`` (raise or return None
    when absent), ``read(handle) -> bytes``, ``close(handle)``; optional
    ``getdir(name) -> str`` (directory part used to resolve relative names) and
    ``modified(handle, timestamp) -> bool``.
    """

    prefix: str
    open: Callable
    read: Callable
    close: Callable = lambda handle: None
    getdir: Callable | None = None
    modified: Callable | None = None


_PROVIDERS: dict[str, ResourceProvider] = {}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):")


def register(provider: ResourceProvider) -> None:
    """Register ``provider`` for its scheme; MJCFError if the scheme is taken or invalid."""
    prefix = provider.prefix.lower()
    if not re.fullmatch(r"[a-z][a-z0-9+.\-]+", prefix):
        raise MJCFError(f"invalid resource provider prefix '{provider.prefix}'")
    if prefix in _PROVIDERS or prefix == "data":
        raise MJCFError(f"a resource provider for '{prefix}:' is already registered")
    _PROVIDERS[prefix] = provider


def unregister(prefix: str) -> None:
    _PROVIDERS.pop(prefix.lower(), None)


def scheme_of(name: str) -> str | None:
    m = _SCHEME.match(name)
    if m is None:
        return None
    scheme = m.group(1).lower()
    if scheme == "data" or scheme in _PROVIDERS:
        return scheme
    return None


def _read_data_uri(name: str) -> bytes:
    header, sep, payload = name[5:].partition(",")
    if not sep:
        raise MJCFError(f"malformed data URI '{name[:40]}...'")
    if header.endswith(";base64"):
        try:
            return base64.b64decode(payload, validate=False)
        except ValueError as err:
            raise MJCFError(f"invalid base64 in data URI: {err}") from None
    return urllib.parse.unquote_to_bytes(payload)


def read(name: str, assets: Mapping[str, bytes] | None = None,
         base_dir: str | None = None) -> bytes:
    """Bytes of resource ``name``.

    Order: registered scheme, ``data:`` URI, the ``assets`` dictionary (by the name as
    written, then by its base name), then the file system (relative to ``base_dir``).
    Raises MJCFError naming the resource when it cannot be read.
    """
    scheme = scheme_of(name)
    if scheme == "data":
        return _read_data_uri(name)
    if scheme is not None:
        prov = _PROVIDERS[scheme]
        handle = prov.open(name)
        if handle is None:
            raise MJCFError(f"resource provider '{scheme}' could not open '{name}'")
        try:
            return bytes(prov.read(handle))
        finally:
            prov.close(handle)
    if assets:
        if name in assets:
            return _as_bytes(assets[name])
        base = os.path.basename(name)
        if base in assets:
            return _as_bytes(assets[base])
    path = name if (os.path.isabs(name) or base_dir is None) else os.path.join(base_dir, name)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise MJCFError(f"could not read resource '{name}' ({err.strerror}: {path})") from None


def _as_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def getdir(name: str) -> str:
    """Directory part of ``name`` (through the provider's ``getdir`` when it has one)."""
    scheme = scheme_of(name)
    if scheme is not None and scheme != "data":
        prov = _PROVIDERS[scheme]
        if prov.getdir is not None:
            return prov.getdir(name)
    if scheme == "data":
        return ""
    return os.path.dirname(name)
