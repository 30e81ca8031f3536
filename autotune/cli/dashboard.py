"""``autotune dashboard``: optuna-dashboard, reachable only by whoever holds the address it
printed.

optuna-dashboard's API lists, renames and deletes studies with no authentication, and on a
shared login node every local user reaches loopback. So the server is optuna-dashboard's own
WSGI application (``optuna_dashboard.wsgi``) behind a gate (``TokenGate``): a fresh token
(``secrets``, 192 bits) is in the address ``autotune dashboard`` prints; the first request that
carries it (``?token=...``) is answered with a cookie holding it (``HttpOnly``,
``SameSite=Strict``, for this server's path) and a redirect to the same page without it, so
the browser's later requests, the page's own API calls included, carry the cookie. Any request
with neither the token nor the cookie gets 403 and a one-line page saying what to open. The
token is compared in constant time. It is the server's process's, for its life only.

Served by the standard library's WSGI server, on the host and port the command checked
(``cli.stored.check_listen``).
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

__all__ = ["COOKIE", "TokenGate", "new_token", "serve"]

#: The cookie that carries the token after the first request.
COOKIE = "autotune_dashboard"
#: The query parameter of the printed address.
PARAM = "token"

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def new_token() -> str:
    return secrets.token_urlsafe(24)


class TokenGate:
    """A WSGI middleware: ``app`` only for requests with ``token`` (module doc)."""

    def __init__(self, app: WSGIApp, token: str, port: int = 0) -> None:
        self.app = app
        self.token = token
        #: The cookie's name, this server's own: cookies are not kept apart by port, so two
        #: dashboards on one host would overwrite each other's.
        self.cookie = f"{COOKIE}_{port}" if port else COOKIE

    def _holds(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        query = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        given = next((v for k, v in query if k == PARAM), None)
        if self._holds(given):  # the printed address: set the cookie, drop the token
            rest = urlencode([(k, v) for k, v in query if k != PARAM])
            # the same page, as a path of this server only (no scheme, host, CR or LF)
            where = "/" + quote(environ.get("PATH_INFO", "/").lstrip("/"))
            where += f"?{rest}" if rest else ""
            cookie = f"{self.cookie}={self.token}; HttpOnly; SameSite=Strict; Path=/"
            start_response("302 Found", [("Location", where), ("Set-Cookie", cookie)])
            return [b""]
        jar = SimpleCookie()
        try:
            jar.load(environ.get("HTTP_COOKIE", ""))
        except Exception:  # noqa: BLE001 - a malformed cookie header is no token
            jar = SimpleCookie()
        held = jar.get(self.cookie)
        if self._holds(held.value if held is not None else None):
            return self.app(environ, start_response)
        body = (
            b"autotune dashboard: open the address `autotune dashboard` printed (it holds this "
            b"server's token)\n"
        )
        start_response(
            "403 Forbidden",
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
        )
        return [body]


def serve(url: str, *, host: str, port: int, token: str) -> None:
    """optuna-dashboard for the storage at ``url`` behind the gate, until interrupted (Ctrl-C
    ends it quietly, as ``optuna_dashboard.run_server`` does): the standard library's WSGI
    server, as optuna-dashboard's own uses, without a log line per request."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from optuna_dashboard import wsgi

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
            pass

    server = make_server(host, port, TokenGate(wsgi(url), token, port), handler_class=Quiet)
    with server, contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
