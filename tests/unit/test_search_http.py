"""The ``http`` search backend against a local HTTP server on 127.0.0.1 (nothing else is contacted)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from rllib_arpo.tools import search
from rllib_arpo.tools.base import build_tools
from rllib_arpo.tools.search import SearchTool

KEY_ENV = "TEST_SEARCH_API_KEY"
KEY = "s3cret-key"

GOOD_ANSWER = {
    "results": [
        {"title": "Paris", "snippet": "Paris is the capital of France."},
        {"snippet": "France is in Europe."},
        {"title": "Lyon", "snippet": "Lyon is a French city."},
    ]
}

# One route: (the handler object, how many requests this route has seen so far) -> (status, body).
Route = Callable[[BaseHTTPRequestHandler, int], tuple[int, bytes]]


class SearchServer:
    """A local server whose routes answer by path; it records every request (path, query, headers)."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                parts = urllib.parse.urlsplit(self.path)
                seen = sum(path == parts.path for path, _, _ in server.requests)
                server.requests.append((parts.path, urllib.parse.parse_qs(parts.query), dict(self.headers)))
                status, body = server.routes[parts.path](self, seen)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def count(self, path: str) -> int:
        return sum(seen_path == path for seen_path, _, _ in self.requests)


def good(handler: BaseHTTPRequestHandler, seen: int) -> tuple[int, bytes]:
    return 200, json.dumps(GOOD_ANSWER).encode()


def fail_twice(handler: BaseHTTPRequestHandler, seen: int) -> tuple[int, bytes]:
    return (500, b"{}") if seen < 2 else good(handler, seen)


def slow(handler: BaseHTTPRequestHandler, seen: int) -> tuple[int, bytes]:
    time.sleep(1.0)
    return good(handler, seen)


ROUTES: dict[str, Route] = {
    "/search": good,
    "/flaky": fail_twice,
    "/rate-limited": lambda handler, seen: (429, b"{}") if seen < 1 else good(handler, seen),
    "/broken": lambda handler, seen: (500, b"{}"),
    "/forbidden": lambda handler, seen: (403, b"{}"),
    "/slow": slow,
    "/not-json": lambda handler, seen: (200, b"<html>oops</html>"),
    "/no-results-field": lambda handler, seen: (200, b'{"items": []}'),
    "/results-not-a-list": lambda handler, seen: (200, b'{"results": 5}'),
}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[SearchServer]:
    monkeypatch.setenv(KEY_ENV, KEY)
    search_server = SearchServer(ROUTES)
    thread = threading.Thread(target=search_server.httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield search_server
    search_server.httpd.shutdown()
    search_server.httpd.server_close()


def http_tool(url: str, **options: object) -> SearchTool:
    backend_options = {"url": url, "api_key_env": KEY_ENV, "timeout_s": 0.3, "retry_base_delay_s": 0.01}
    return SearchTool(backend="http", backend_options={**backend_options, **options}, top_k=2)


def test_good_answer_sends_query_top_k_and_key(server: SearchServer) -> None:
    tool = build_tools(
        {
            "search": {
                "backend": "http",
                "backend_options": {"url": f"{server.base_url}/search", "api_key_env": KEY_ENV},
                "top_k": 2,
            }
        }
    )["search"]
    # top_k = 2 of the service's 3 results; a result with a title reads "<title> - <snippet>"
    expected = "Page 1: Paris - Paris is the capital of France.\nPage 2: France is in Europe."
    assert tool("  capital of France \n") == expected
    [(path, params, headers)] = server.requests
    assert path == "/search"
    assert params == {"q": ["capital of France"], "num": ["2"]}
    assert headers["Authorization"] == f"Bearer {KEY}"


def test_no_authorization_header_without_key(server: SearchServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV)
    assert http_tool(f"{server.base_url}/search")("q").startswith("Page 1: Paris")
    assert "Authorization" not in server.requests[0][2]


def test_per_result_and_total_budgets(server: SearchServer) -> None:
    tool = SearchTool(
        backend="http",
        backend_options={"url": f"{server.base_url}/search"},
        top_k=3,
        max_chars_per_result=10,
        max_total_chars=30,
    )
    # each snippet cut to 10 chars + "...": "Paris - Pa...", "France is ...", "Lyon - Lyo..."; the pages
    # joined are 21 + 1 + 21 + 1 + 21 = 65 chars, cut to 30 = page 1 (21) + "\n" + "Page 2: " (8), + "..."
    assert tool("q") == "Page 1: Paris - Pa...\nPage 2: ..."


@pytest.mark.parametrize(("path", "attempts"), [("/flaky", 3), ("/rate-limited", 2)])
def test_5xx_and_429_are_retried_until_success(
    server: SearchServer, path: str, attempts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    backoffs: list[float] = []
    monkeypatch.setattr(search, "time", SimpleNamespace(sleep=backoffs.append))  # record, do not wait
    answer = http_tool(f"{server.base_url}{path}")("q")
    assert answer.startswith("Page 1: Paris - ")
    assert server.count(path) == attempts  # /flaky: 500, 500, 200; /rate-limited: 429, 200
    # backoff before retry n is 0.01 * 2 ** (n - 1)
    assert backoffs == [0.01 * 2**n for n in range(attempts - 1)]


def test_always_500_gives_up_after_max_attempts(server: SearchServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        answer = http_tool(f"{server.base_url}/broken", max_attempts=3)("q")
    assert answer == "Error: search service returned HTTP 500"
    assert server.count("/broken") == 3
    assert KEY not in answer and KEY not in caplog.text


def test_other_http_errors_are_not_retried(server: SearchServer) -> None:
    assert http_tool(f"{server.base_url}/forbidden")("q") == "Error: search service returned HTTP 403"
    assert server.count("/forbidden") == 1


def test_slow_service_times_out_without_retry(server: SearchServer) -> None:
    answer = http_tool(f"{server.base_url}/slow", timeout_s=0.2)("q")  # the server answers after 1.0 s
    assert answer == "Error: search timed out after 0.2 s"
    assert server.count("/slow") == 1


def test_connection_refused() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago and has no server now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    answer = http_tool(f"http://127.0.0.1:{port}/search")("q")
    assert answer == "Error: search service unavailable (connection refused)"


@pytest.mark.parametrize("path", ["/not-json", "/no-results-field", "/results-not-a-list"])
def test_malformed_answer(server: SearchServer, path: str) -> None:
    assert http_tool(f"{server.base_url}{path}")("q") == "Error: search service returned a malformed answer"
    assert server.count(path) == 1


def test_http_backend_configuration_errors() -> None:
    with pytest.raises(ValueError, match="backend_options"):
        SearchTool(backend="http")
    with pytest.raises(ValueError, match="backend_options"):
        SearchTool(backend="http", documents=["a"], backend_options={"url": "http://127.0.0.1:1"})
    with pytest.raises(ValueError, match="no backend_options"):
        SearchTool(backend="bm25", documents=["a"], backend_options={"url": "http://127.0.0.1:1"})
    with pytest.raises(ValueError, match="max_attempts"):
        SearchTool(backend="http", backend_options={"url": "http://127.0.0.1:1", "max_attempts": 0})
