"""What the local API answers at its edges: browsers (CORS), routes it does not serve, bodies
over their limit, requests without the API key, and the error dialect of Ollama's routes.

- **CORS.** Web pages of the origins in the setting `cors_origins` (none by default; a "*"
  stands for any port, the scheme's default (none written) too, `http://localhost:*`, or for
  a domain's first labels, `https://*.example.com`) may call the API from a browser: their
  preflights are answered, their responses carry the headers. So may desktop apps' own pages,
  as Ollama lets them and its plugins expect (`APP_ORIGINS`: Obsidian's app://obsidian.md, VS
  Code's webviews, Tauri apps), which are not web sites. Any other origin gets no CORS header,
  so the browser keeps the response from the page. "*" (any page) is refused when an API key is
  set: every page the user opens could then spend the key's access. Preflights are answered
  before the API key is checked, as browsers send them bare.
- **Pages the user did not allow.** A browser sends some requests across sites without asking
  first (a form's POST), and a page can rebind its own name to 127.0.0.1. So a request that
  says it comes from a page (`Origin`) not allowed above is refused (403, with the API's
  error saying how to allow it), its preflight included, whatever its method (but a page of
  this server's own, FastAPI's), and without an API key (the server then listens on this
  machine only) so is one addressed to any host name but this machine's (`Host`: localhost,
  a loopback address, 0.0.0.0).
  Clients that are not browsers send no `Origin` and address the host they connect to.
- **Text that is not Unicode.** JSON may write half of a UTF-16 surrogate pair (`"\\ud800"`),
  which no tokenizer takes: such a body is refused (400) before any route reads it.
- **Unknown routes.** Every route kvdesk does not serve is answered in the API's error JSON
  naming it (`POST /v1/audio/speech: not served by kvdesk`; where the routes are, for a path
  under neither API's prefix), and a known route asked with the
  wrong method says which methods it takes: never a bare "Not Found".
- **Bodies and keys.** A body over its route's limit gets 413 however it arrives
  (`BodyLimit`); a body sent with no content type, as curl's form default or as text, is read
  as the JSON it is (`JsonBody`); with an API key, a request without it gets 401 (`KeyGuard`).
- **Ollama's errors.** Under /api/ the server's errors (OpenAI's `{"error": {"message"...}}`,
  wherever they were raised: the API key, the body limit, validation) become Ollama's
  `{"error": "message"}`, which Ollama's clients read.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import re
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware

from ..errors import EngineError
from ..settings import ORIGIN
from . import schemas as s
from .failures import json_response

log = logging.getLogger(__name__)

MAX_BODY = 16 << 20  # a prompt of millions of characters; uploads have their own limit
MAX_UPLOAD = 210 << 20  # a document (documents.MAX_FILE_BYTES) and its form's framing


class BodyLimit:
    """Refuses a request body over its route's limit with 413, whether it says its length up
    front or arrives in chunks (counted as it is read)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = scope["path"] == "/v1/kvdesk/documents" and Headers(scope=scope).get(
            "content-type", "").lower().startswith("multipart/form-data")
        limit = MAX_UPLOAD if upload else MAX_BODY
        size = dict(scope["headers"]).get(b"content-length")
        if size is not None and (not size.isdigit() or int(size) > limit):
            return await json_response(413, _too_large(limit))(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                # An HTTPException, not an ApiError: FastAPI turns anything else raised
                # while it reads a body into a 400.
                raise HTTPException(413, _too_large(limit)["error"]["message"])
            return message

        return await self.app(scope, counted, send)


class JsonBody:
    """Reads a body sent with no content type, curl's `-d` default (form-encoded) or as text,
    as the JSON it is: Ollama's documented examples send it so, Ollama reads any, and every
    body here is JSON but an upload's (multipart, kept as it is)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            kind = Headers(scope=scope).get("content-type", "").split(";")[0].strip().lower()
            if kind in ("", "application/x-www-form-urlencoded", "text/plain"):
                headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        return await self.app(scope, receive, send)


# Liveness checks left open with an API key: Ollama has no keys, so its plugins' health checks
# send none, and a 401 there reads as "not running" rather than as a key to set. They answer
# a fixed text and the version only: nothing of the model, the data or the machine.
OPEN = {("GET", "/"), ("HEAD", "/"), ("GET", "/api/version"), ("HEAD", "/api/version")}


class KeyGuard:
    """With an API key, refuses a request without `Authorization: Bearer KEY` (401), but
    for the liveness checks (`OPEN`).

    Plain ASGI, as `BodyLimit` is: a Starlette `BaseHTTPMiddleware` reads the body in a task
    group, which would wrap BodyLimit's 413 in an exception group that FastAPI answers 400."""

    def __init__(self, app, api_key: str | None):
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.api_key is not None and \
                (scope["method"], scope["path"]) not in OPEN:
            scheme, _, given = Headers(scope=scope).get("authorization", "").partition(" ")
            # (the scheme's name is case-insensitive: RFC 9110)
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    given.strip().encode(), self.api_key.encode()):
                return await json_response(401, s.error(
                    "a valid API key is needed: Authorization: Bearer KEY",
                    "invalid_request_error", "invalid_api_key"))(scope, receive, send)
        return await self.app(scope, receive, send)


def _too_large(limit: int) -> dict:
    return s.error(f"the request body is over {limit >> 20} MB", code="request_too_large")

OLLAMA_PREFIX = "/api/"
# The schemes of desktop apps' own pages (Electron's app://, Tauri's, VS Code's webviews and
# files), allowed as Ollama allows them by default: Obsidian's and editors' plugins call from
# them. A web site's page is never of these.
APP_ORIGINS = ("app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")


def allowed_origins(origins: tuple[str, ...]) -> re.Pattern:
    """The origins a page may call from: `origins` (`cors_origins`, as settings checked them:
    a "*" for the port, any or none, or for the first labels of a domain) and the apps'
    (APP_ORIGINS, a "*" for the host); "*" alone, any."""
    if "*" in origins:
        return re.compile(r".*")

    def pattern(origin: str) -> str:
        scheme, host, port = ORIGIN.fullmatch(origin).group("scheme", "host", "port")
        host = ("[^/:]*" if host == "*" else r"(?:[^/:.]+\.)+" + re.escape(host[2:])
                if host.startswith("*.") else re.escape(host))
        return re.escape(scheme) + "://" + host + (
            "" if not port else r"(?::\d+)?" if port == "*" else ":" + re.escape(port))

    return re.compile("|".join(f"(?:{pattern(o)})" for o in (*origins, *APP_ORIGINS)))


def install(api: FastAPI, *, origins: tuple[str, ...], api_key: str | None) -> None:
    if "*" in origins and api_key is not None:
        raise EngineError("cors_origins: \"*\" would let every web page the user opens use "
                          "the API key; list the origins that may (such as "
                          "http://localhost:3000)")
    if "*" in origins:
        log.warning("cors_origins \"*\": every web page you open in a browser may use this "
                    "server: read your documents and chats, delete them, and attach files "
                    "from the folders of server_attach_folders; list the origins that may "
                    "instead (such as http://localhost:3000)")

    async def unknown(request: Request, e: HTTPException):
        route = f"{request.method} {request.url.path}"
        if e.status_code == 405:  # the router says which methods the path takes
            return json_response(405, s.error(f"{route}: this route takes "
                                              f"{(e.headers or {}).get('Allow', '')}",
                                              code="method_not_allowed"))
        # (a path under either API's prefix is not helped by being sent to it)
        under_api = request.url.path.rstrip("/") in ("/v1", "/api") or \
            request.url.path.startswith(("/v1/", OLLAMA_PREFIX))
        hint = ("README's \"Every endpoint\" lists the routes it serves" if under_api else
                "OpenAI's routes are under /v1, Ollama's under /api; README lists them")
        return json_response(404, s.error(f"{route}: not served by kvdesk ({hint})",
                                          code="unknown_route"))

    # By status, so they take precedence over the API's handler of HTTP errors in general,
    # whenever a route is added: no route raises these, only the router when none matches.
    api.add_exception_handler(404, unknown)
    api.add_exception_handler(405, unknown)
    pages = allowed_origins(origins)
    # Outside the key's check, so an allowed page's preflights (sent without it) are answered.
    api.add_middleware(CORSMiddleware, allow_origins=["*"] if "*" in origins else [],
                       allow_origin_regex=pages.pattern, allow_methods=["GET", "POST", "DELETE"],
                       allow_headers=["*"], allow_credentials=False, max_age=600)
    # Outside CORS: a refused page's preflight gets the same 403 and error as its request.
    api.add_middleware(PageGuard, pages=pages, api_key=api_key)
    api.add_middleware(OllamaErrors)  # outermost: the guard's refusals in Ollama's shape too


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class TextCheck:
    """Refuses a JSON body whose strings hold a lone surrogate (the module's docstring). Inside
    the body limit and the API key: it reads whole only a body within the route's limit, from
    a client allowed to send one."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        kind = Headers(scope=scope).get("content-type", "").split(";")[0].strip().lower()
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH") or \
                not (kind == "application/json" or kind.endswith("+json")):
            return await self.app(scope, receive, send)
        messages, body = [], bytearray()
        while True:
            try:
                message = await receive()
            except HTTPException as e:  # the body limit's 413, raised as the body is read
                return await json_response(e.status_code, s.error(
                    e.detail, code="request_too_large" if e.status_code == 413 else None)
                )(scope, receive, send)
            messages.append(message)
            body.extend(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        if _SURROGATE.search(body) and (where := _lone_surrogate(bytes(body))):
            return await json_response(400, s.error(f"{where}: the text holds half of a UTF-16 "
                                            "surrogate pair, which is not Unicode", param=where)
                               )(scope, receive, send)
        replay = iter(messages)

        async def replayed():
            return next(replay, None) or await receive()

        return await self.app(scope, replayed, send)


def _lone_surrogate(body: bytes) -> str | None:
    """The place ("messages.0.content") of the first string in a JSON body that is not valid
    Unicode; None when there is none (or the body is not JSON: the route says so)."""
    try:
        stack = [((), json.loads(body))]
    except ValueError:
        return None
    while stack:
        at, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return ".".join(map(str, at)) or "body"
        elif isinstance(value, dict):
            stack.extend(((*at, k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend(((*at, i), v) for i, v in reversed(list(enumerate(value))))
    return None


class PageGuard:
    """Refuses a web page's request it was not allowed to make (the module's docstring)."""

    def __init__(self, app, pages: re.Pattern, api_key: str | None):
        self.app, self.pages, self.api_key = app, pages, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            origin, host = headers.get("origin"), headers.get("host")
            why = None
            if origin is not None and not self.pages.fullmatch(origin) \
                    and not _same_origin(origin, host):
                why = (f"requests from the web page {origin} are not allowed: list it in the "
                       "setting cors_origins to let it use kvdesk")
            elif self.api_key is None and host is not None and not _loopback(host):
                why = (f"requests addressed to {host} are not answered: without an API key "
                       "kvdesk answers only requests to this machine (localhost, 127.0.0.1)")
            if why:
                refused = json_response(403, s.error(why, code="forbidden"))
                return await refused(scope, receive, send)
        return await self.app(scope, receive, send)


def _same_origin(origin: str, host: str | None) -> bool:
    """Whether a page's origin is this server itself, on this machine (FastAPI's own pages):
    its host and port are the request's own loopback Host."""
    where = urlsplit(origin)
    return host is not None and where.scheme in ("http", "https") and _loopback(host) \
        and where.netloc.lower() == host.lower()


def _loopback(host: str) -> bool:
    """Whether a Host header names this machine: localhost, a loopback address, or the
    address that means any of this machine's (0.0.0.0, as clients of a server bound there
    write it); any port."""
    if host.startswith("["):  # [::1], [::1]:8765
        name = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:  # name:port
        name = host.split(":", 1)[0]
    else:  # a name alone, or an IPv6 address unbracketed
        name = host
    name = name.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


class OllamaErrors:
    """Error responses under /api/ in Ollama's shape: {"error": "message"}."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(OLLAMA_PREFIX):
            return await self.app(scope, receive, send)
        start: dict | None = None
        body = bytearray()

        async def reshaped(message):
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is whole
                return
            if start is None or message["type"] != "http.response.body":
                return await send(message)
            body.extend(message.get("body", b""))
            if message.get("more_body"):
                return
            out = _ollama_error(bytes(body))
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length",
                                                        str(len(out)).encode())]})
            await send({"type": "http.response.body", "body": out})

        return await self.app(scope, receive, reshaped)


def _ollama_error(body: bytes) -> bytes:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return body
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return json.dumps({"error": error["message"]}).encode()
    return body
