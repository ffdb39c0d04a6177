"""What the middleware share: route selection and the NothingChanged marker."""

from __future__ import annotations

import re
from typing import Any, Callable, MutableMapping, Optional, Sequence, Union

RouteSpec = Union[str, "re.Pattern[str]", Callable[[str], bool]]

#: Key set in the ASGI scope / WSGI environ / Django META by `mark_nothing_changed`.
NOTHING_CHANGED = "idempotency.nothing_changed"


def mark_nothing_changed(scope_or_environ: MutableMapping[str, Any]) -> None:
    """Call from a handler that changed nothing (a validation failure, say):
    the middleware releases the reservation instead of storing the response,
    so a corrected retry with the same key runs. Pass the ASGI scope
    (`request.scope`), the WSGI environ, or Django's `request.META`."""
    scope_or_environ[NOTHING_CHANGED] = True


class Routes:
    """Which paths a middleware protects: `include` (default: every path)
    minus `exclude`. Each entry is a path prefix ("/api/"), a compiled
    regular expression (matched with `.match` against the path), or a
    callable taking the path."""

    def __init__(self, include: Optional[Sequence[RouteSpec]] = None, exclude: Optional[Sequence[RouteSpec]] = None) -> None:
        self.include = list(include) if include is not None else None
        self.exclude = list(exclude or ())
        self.everything = self.include is None and not self.exclude

    @staticmethod
    def _matches(spec: RouteSpec, path: str) -> bool:
        if isinstance(spec, str):
            return path.startswith(spec)
        if isinstance(spec, re.Pattern):
            return spec.match(path) is not None
        return bool(spec(path))

    def __call__(self, path: str) -> bool:
        if self.everything:
            return True
        if self.include is not None and not any(self._matches(s, path) for s in self.include):
            return False
        return not any(self._matches(s, path) for s in self.exclude)


def status_line(status: int) -> str:
    import http

    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"
