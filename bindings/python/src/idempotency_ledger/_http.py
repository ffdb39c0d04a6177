"""What the framework adapters share: which routes they protect, the
markers a handler sets, and how a failure is described to the core."""

from __future__ import annotations

import re
from typing import Any, Callable, MutableMapping, Optional, Sequence, Union

RouteSpec = Union[str, "re.Pattern[str]", Callable[[str], bool]]
#: `include`: "*" (every route the framework serves) or the routes to protect.
Include = Union[str, Sequence[RouteSpec]]

#: Set in the ASGI scope / WSGI environ / Django META by `mark_nothing_changed`.
NOTHING_CHANGED = "idempotency.nothing_changed"
#: Set where the framework refused the request before the handler ran.
DECLINED = "idempotency.declined"

_REQUIRED = object()


def mark_nothing_changed(scope_or_environ: MutableMapping[str, Any]) -> None:
    """Call from a handler that changed nothing (a validation failure, say):
    the middleware releases the reservation instead of storing the response,
    so a corrected retry with the same key runs. Pass the ASGI scope
    (`request.scope`), the WSGI environ, or Django's `request.META`."""
    scope_or_environ[NOTHING_CHANGED] = True


def mark_declined(scope_or_environ: MutableMapping[str, Any]) -> None:
    """Call where the framework refused the request before the handler ran
    (a validation or parsing error handler the adapter does not know): the
    reservation is released and the framework's answer sent unstored."""
    scope_or_environ[DECLINED] = True


def handler_result(marks: MutableMapping[str, Any]) -> str:
    """How a handler that answered ended, from the markers set meanwhile:
    `declined`, `nothing-changed` or `answered`."""
    if marks.get(DECLINED):
        return "declined"
    if marks.get(NOTHING_CHANGED):
        return "nothing-changed"
    return "answered"


def describe(error: BaseException) -> str:
    """A raised handler, as the core's log line names it."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class Routes:
    """Which paths a middleware protects: `include` minus `exclude`.

    `include` is required: "*" for every route the framework serves, or a
    list whose entries are path prefixes ("/orders"), compiled regular
    expressions (matched with `.match` against the path) or callables taking
    the path. `exclude` takes the same entries."""

    def __init__(self, include: Any, exclude: Optional[Sequence[RouteSpec]], adapter: str) -> None:
        if include is _REQUIRED or include is None:
            raise TypeError(
                f"{adapter} needs include=: the routes to protect, e.g. include=[\"/orders\"] "
                "(path prefixes, compiled regexes or callables), or include=\"*\" to protect every route"
            )
        if isinstance(include, str) and include != "*":
            raise TypeError(f'{adapter}: include={include!r} is not "*": give a list of routes, e.g. include=[{include!r}]')
        self.everything = include == "*"
        self.include: list[RouteSpec] = [] if self.everything else list(include)
        self.exclude = list(exclude or ())

    @staticmethod
    def _matches(spec: RouteSpec, path: str) -> bool:
        if isinstance(spec, str):
            return path.startswith(spec)
        if isinstance(spec, re.Pattern):
            return spec.match(path) is not None
        return bool(spec(path))

    def __call__(self, path: str) -> bool:
        if not self.everything and not any(self._matches(s, path) for s in self.include):
            return False
        return not any(self._matches(s, path) for s in self.exclude)


def status_line(status: int) -> str:
    """The WSGI status line for a status code."""
    import http

    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"
