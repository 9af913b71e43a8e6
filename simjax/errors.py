"""Errors raised by simjax."""
from __future__ import annotations


class MJCFError(ValueError):
    """A malformed or invalid MJCF model.

    Attributes: ``file`` (path or '<string>'), ``line`` (1-based, or None), ``element``
    (the element path, e.g. 'mujoco/worldbody/body[torso]/geom'), ``message``.
    """

    def __init__(self, message: str, file: str | None = None, line: int | None = None,
                 element: str | None = None):
        self.message = message
        self.file = file
        self.line = line
        self.element = element
        where = []
        if file is not None:
            where.append(f"file '{file}'")
        if line is not None:
            where.append(f"line {line}")
        if element:
            where.append(f"element '{element}'")
        prefix = (", ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)


class UnsupportedFeatureError(MJCFError):
    """The model uses a MuJoCo feature simjax does not implement; ``feature`` names it."""

    def __init__(self, feature: str, file: str | None = None, line: int | None = None,
                 element: str | None = None):
        self.feature = feature
        super().__init__(f"unsupported feature: {feature}", file, line, element)
