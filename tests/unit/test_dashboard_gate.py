"""The dashboard's gate (``autotune.cli.dashboard.TokenGate``, docs/security.md H-W07): only
requests that carry the printed address's token, or the cookie it sets, reach
optuna-dashboard's application; another local user's request to its API is refused."""

from __future__ import annotations

from wsgiref.util import setup_testing_defaults

from autotune.cli.dashboard import COOKIE, TokenGate, new_token


def call(
    gate: TokenGate,
    path: str = "/api/studies",
    query: str = "",
    cookie: str = "",
    method: str = "GET",
) -> tuple[str, dict[str, str], bytes]:
    environ: dict = {"PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": method}
    if cookie:
        environ["HTTP_COOKIE"] = cookie
    setup_testing_defaults(environ)
    got: dict = {}

    def start_response(status, headers):
        got["status"], got["headers"] = status, dict(headers)

    body = b"".join(gate(environ, start_response))
    return got["status"], got["headers"], body


def test_h_w07_only_the_printed_token_reaches_optuna_dashboard():
    """H-W07."""
    reached = []

    def app(environ, start_response):
        reached.append((environ["REQUEST_METHOD"], environ["PATH_INFO"]))
        start_response("200 OK", [])
        return [b"studies"]

    token = new_token()
    gate = TokenGate(app, token)
    # another user, who knows the port: listing and deleting are refused
    for method, path in (("GET", "/api/studies"), ("DELETE", "/api/studies/1")):
        status, _, body = call(gate, path, method=method)
        assert status.startswith("403") and b"open the address" in body
    assert call(gate, query="token=wrong")[0].startswith("403")
    assert call(gate, cookie=f"{COOKIE}=wrong")[0].startswith("403")
    assert call(gate, cookie="garbage;;==")[0].startswith("403")
    assert reached == []
    # the printed address: a cookie, and the same page without the token
    status, headers, _ = call(gate, "/dashboard/studies/1", query=f"token={token}&x=1")
    assert status.startswith("302")
    assert headers["Location"] == "/dashboard/studies/1?x=1"
    assert headers["Set-Cookie"].startswith(f"{COOKIE}={token};")
    assert "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
    # then every request of the page carries the cookie
    status, _, body = call(gate, cookie=f"other=1; {COOKIE}={token}")
    assert status == "200 OK" and body == b"studies"
    assert reached == [("GET", "/api/studies")]
    assert len(token) >= 32 and new_token() != token
    # a path that would leave the server, or inject a header, stays a path of this server
    status, headers, _ = call(gate, "//evil.example/\r\nSet-Cookie: x=1", query=f"token={token}")
    assert headers["Location"].startswith("/evil.example/") and "\r" not in headers["Location"]
    assert "\n" not in headers["Location"]
    # each server's cookie is its own
    assert TokenGate(app, token, 8081).cookie != TokenGate(app, token, 8082).cookie
