"""Resource providers: every file the compiler reads goes through here.

MuJoCo's resource-provider rules (mjpResourceProvider, "Resource providers" in the
programming guide): a name ``scheme:rest`` whose scheme (two or more characters,
case-insensitive; the colon is required) has a registered provider goes to that
provider, so ``https://x`` does not match an ``http`` provider. Other names are looked
up in the ``assets`` dictionary given to :func:`simjax.load_model`, then resolved
relative to the directory of the file that names them (the model's directory, which for
a model loaded through a provider is that provider's ``getdir`` of the model's name, so
relative meshes and includes of such a model come from the same provider), then on the
file system.

Built in: the file system, in-memory assets and ``data:`` URIs (RFC 2397:
``data:[<mediatype>][;base64],<data>``, base64 or percent-encoded). Users register
their own providers with :func:`register`.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import re
import urllib.parse
from typing import Callable, Mapping

from simjax.errors import MJCFError


@dataclasses.dataclass(frozen=True)
class ResourceProvider:
    """A resource provider (mjpResourceProvider).

    ``prefix``: the URI scheme it serves. Required: ``open(name) -> handle`` (return
    None or raise when the resource does not exist), ``read(handle) -> bytes``,
    ``close(handle)``. Optional: ``getdir(name) -> str``, the directory part of a name,
    used to resolve names relative to a resource (default: everything up to the last
    '/' or '\\'); ``modified(handle, timestamp) -> bool``, whether the resource changed
    since ``timestamp``. ``data``: an opaque value handed to no callback, kept for
    parity with mjpResourceProvider.data (closures are the Python idiom).
    """

    prefix: str
    open: Callable
    read: Callable
    close: Callable
    getdir: Callable | None = None
    modified: Callable | None = None
    data: object = None


_PROVIDERS: dict[str, ResourceProvider] = {}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):")


def register(provider: ResourceProvider) -> None:
    """Register ``provider`` for its scheme (mjp_registerResourceProvider).

    MJCFError if the prefix is not a valid URI scheme, is ``data`` (built in) or
    already registered, or a required callback is missing.
    """
    prefix = str(provider.prefix).lower()
    if not re.fullmatch(r"[a-z][a-z0-9+.\-]+", prefix):
        raise MJCFError(f"invalid resource provider prefix '{provider.prefix}' (a URI "
                        "scheme of two or more characters is required)")
    for cb in ("open", "read", "close"):
        if not callable(getattr(provider, cb)):
            raise MJCFError(f"resource provider '{prefix}' needs a callable '{cb}'")
    for cb in ("getdir", "modified"):
        if getattr(provider, cb) is not None and not callable(getattr(provider, cb)):
            raise MJCFError(f"resource provider '{prefix}': '{cb}' must be callable")
    if prefix == "data" or prefix in _PROVIDERS:
        raise MJCFError(f"a resource provider for '{prefix}:' is already registered")
    _PROVIDERS[prefix] = provider


def unregister(prefix: str) -> None:
    """Remove the provider registered for ``prefix`` (no-op when there is none)."""
    _PROVIDERS.pop(prefix.lower(), None)


def providers() -> list[str]:
    """Registered schemes, the built-in ``data`` first."""
    return ["data"] + sorted(_PROVIDERS)


def scheme_of(name: str) -> str | None:
    """The scheme of ``name`` if a provider (or the built-in data: reader) serves it."""
    m = _SCHEME.match(name)
    if m is None:
        return None
    scheme = m.group(1).lower()
    if scheme == "data" or scheme in _PROVIDERS:
        return scheme
    return None


# --------------------------------------------------------------------------- data URIs
_MEDIATYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+\-]+/[A-Za-z0-9!#$&^_.+\-]+$")


def data_uri_mediatype(name: str) -> str:
    """Media type of a data URI ('' when omitted, meaning text/plain)."""
    header = name[5:].partition(",")[0]
    return header.split(";")[0].strip().lower()


def _read_data_uri(name: str) -> bytes:
    """Payload of an RFC 2397 data URI; MJCFError naming the problem otherwise."""
    short = name if len(name) <= 48 else name[:45] + "..."
    header, sep, payload = name[5:].partition(",")
    if not sep:
        raise MJCFError(f"malformed data URI '{short}': no ',' before the data")
    params = header.split(";")
    media = params[0].strip()
    if media and not _MEDIATYPE.match(media):
        raise MJCFError(f"malformed data URI '{short}': invalid media type '{media}'")
    if params[-1].strip().lower() == "base64" and len(params) > 1:
        text = urllib.parse.unquote(payload)
        text = re.sub(r"\s+", "", text)
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as err:
            raise MJCFError(f"undecodable base64 data in data URI '{short}': {err}") from None
    try:
        return urllib.parse.unquote_to_bytes(payload)
    except Exception as err:  # noqa: BLE001 - report any decoding failure the same way
        raise MJCFError(f"undecodable data URI '{short}': {err}") from None


# --------------------------------------------------------------------------- reading
def _from_provider(scheme: str, name: str) -> bytes:
    prov = _PROVIDERS[scheme]
    try:
        handle = prov.open(name)
    except Exception as err:  # noqa: BLE001 - a provider's failure is the user's error
        raise MJCFError(f"resource provider '{scheme}' could not open '{name}': "
                        f"{err}") from None
    if handle is None or handle is False:
        raise MJCFError(f"resource provider '{scheme}' could not open '{name}'")
    try:
        data = prov.read(handle)
        if data is None or (isinstance(data, int) and data < 0):
            raise MJCFError(f"resource provider '{scheme}' could not read '{name}'")
        if isinstance(data, str):
            data = data.encode()
        return bytes(data)
    except MJCFError:
        raise
    except Exception as err:  # noqa: BLE001
        raise MJCFError(f"resource provider '{scheme}' could not read '{name}': "
                        f"{err}") from None
    finally:
        prov.close(handle)


def join(base_dir: str | None, name: str) -> str:
    """``name`` resolved against directory ``base_dir`` (names with a scheme and
    absolute paths are kept)."""
    if not base_dir or scheme_of(name) is not None or os.path.isabs(name):
        return name
    if scheme_of(base_dir) is not None:
        sep = "" if base_dir.endswith(("/", "\\", ":")) else "/"
        return base_dir + sep + name
    return os.path.join(base_dir, name)


def read(name: str, assets: Mapping[str, bytes] | None = None,
         base_dir: str | None = None) -> bytes:
    """Bytes of resource ``name`` (mju_openResource + mju_readResource).

    Order: a provider of the name's scheme (``data:`` built in); the ``assets``
    dictionary (by the name as written, then by its base name); then the name
    resolved against ``base_dir``: through the provider of ``base_dir``'s scheme when
    it has one, else on the file system. Raises MJCFError naming the resource when it
    cannot be opened, read or decoded.
    """
    scheme = scheme_of(name)
    if scheme == "data":
        return _read_data_uri(name)
    if scheme is not None:
        return _from_provider(scheme, name)
    if assets:
        if name in assets:
            return _as_bytes(assets[name])
        base = os.path.basename(name)
        if base in assets:
            return _as_bytes(assets[base])
    full = join(base_dir, name)
    dir_scheme = scheme_of(full)
    if dir_scheme == "data":
        raise MJCFError(f"could not read resource '{name}': a data URI has no directory")
    if dir_scheme is not None:
        return _from_provider(dir_scheme, full)
    try:
        with open(full, "rb") as f:
            return f.read()
    except OSError as err:
        hint = ""
        m = _SCHEME.match(name)
        if m is not None and len(m.group(1)) > 1:
            hint = (f"; no resource provider is registered for '{m.group(1).lower()}:' "
                    f"(registered: {', '.join(providers())})")
        raise MJCFError(f"could not read resource '{name}' ({err.strerror}: {full})"
                        f"{hint}") from None


def _as_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def getdir(name: str) -> str:
    """Directory part of ``name`` (mju_getResourceDir): the provider's ``getdir`` when
    it has one; otherwise everything up to the last '/' or '\\' (for a provider name,
    at least ``scheme:``). A data URI has no directory ('')."""
    scheme = scheme_of(name)
    if scheme == "data":
        return ""
    if scheme is not None:
        prov = _PROVIDERS[scheme]
        if prov.getdir is not None:
            return prov.getdir(name)
        cut = max(name.rfind("/"), name.rfind("\\"), len(scheme))
        return name[:cut + 1]
    return os.path.dirname(name)


def modified(name: str, timestamp: str) -> bool:
    """Whether resource ``name`` changed since ``timestamp`` (mju_isModifiedResource);
    True when its provider cannot tell, as MuJoCo assumes."""
    scheme = scheme_of(name)
    if scheme is None or scheme == "data":
        return scheme is None
    prov = _PROVIDERS[scheme]
    if prov.modified is None:
        return True
    handle = prov.open(name)
    try:
        return bool(prov.modified(handle, timestamp))
    finally:
        prov.close(handle)
