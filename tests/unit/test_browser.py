"""The ``browse`` tool against a local HTTP server on 127.0.0.1 (nothing else is contacted)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rllib_arpo.tools.base import TOOLS, build_tools, find_tool_call
from rllib_arpo.tools.browser import BrowserTool, best_window, html_to_text, parse_browse_call

ARTICLE = b"""<!DOCTYPE html><html><head><title>Fish &amp; chips</title>
<style>body { color: red; }</style>
<script>var hidden = "<p>not text</p>";</script></head>
<body><h1>Fish &amp; Chips</h1><noscript>enable scripts</noscript>
<p>Price: 5&nbsp;&euro; &lt;cheap&gt;</p>
<p>Second   paragraph
spanning lines.<br>After a break.</p></body></html>"""

ARTICLE_TEXT = "Fish & chips\nFish & Chips\nPrice: 5 \u20ac <cheap>\nSecond paragraph spanning lines.\nAfter a break."

FILLER = "".join(f"<p>Filler sentence number {i:02d}.</p>" for i in range(20))  # 20 lines of 26 chars
LONG_PAGE = (
    "<p>Tungsten is mentioned once here.</p>"
    + FILLER
    + "<p>The melting point of tungsten is 3422 degrees Celsius.</p>"
    + FILLER
).encode()

PAGES: dict[str, tuple[int, str, bytes]] = {
    "/article": (200, "text/html; charset=utf-8", ARTICLE),
    "/long": (200, "text/html", LONG_PAGE),
    "/plain": (200, "text/plain", b"  line one \n\n line   two  "),
    "/huge": (200, "text/html", b"<p>" + b"a " * 5000 + b"TAIL_MARKER</p>"),
    "/image": (200, "image/png", b"\x89PNG"),
    "/missing": (404, "text/html", b"<p>Not found</p>"),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        if self.path == "/slow":
            time.sleep(1.0)
            self.path = "/article"
        status, content_type, body = PAGES[self.path]
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_registered_and_built_from_config() -> None:
    assert TOOLS.get("browse") is BrowserTool
    tool = build_tools({"browse": {"timeout_s": 1.0, "window_chars": 50}})["browse"]
    assert isinstance(tool, BrowserTool) and tool.window_chars == 50
    call = find_tool_call("Let me read it. <browse> http://a.example/x | price </browse>", ["browse"])
    assert call is not None and parse_browse_call(call.query) == ("http://a.example/x", "price")


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (" http://a.example/x | melting | tungsten ", ("http://a.example/x", "melting | tungsten")),
        ("http://a.example/x", ("http://a.example/x", "")),
        ("\nhttp://a.example/x  melting point\n", ("http://a.example/x", "melting point")),
        ("http://a.example/x |", ("http://a.example/x", "")),
        ("  ", ("", "")),
    ],
)
def test_parse_browse_call(call: str, expected: tuple[str, str]) -> None:
    assert parse_browse_call(call) == expected


def test_html_to_text_drops_scripts_and_unescapes() -> None:
    # title kept; style, script and noscript dropped; &nbsp; is whitespace and collapses to one space
    assert html_to_text(ARTICLE.decode()) == ARTICLE_TEXT


def test_fetches_html_page_as_clean_text(base_url: str) -> None:
    assert BrowserTool()(f"{base_url}/article") == ARTICLE_TEXT
    assert BrowserTool()(f"{base_url}/plain") == "line one\nline two"


def test_window_picks_the_part_that_matches_the_query(base_url: str) -> None:
    text = html_to_text(LONG_PAGE.decode())
    sentence = text.index("The melting point")
    # hits "melting" at sentence + 4, "point" at + 12, "tungsten" at + 21 ("of" is a stop word);
    # the window of 100 starting at the first hit holds all 3 (the lone "Tungsten" at 0 holds 1).
    # Centred: start = (sentence + 4) - (100 - (21 - 4)) // 2 = sentence + 4 - 41 = sentence - 37
    expected = "..." + text[sentence - 37 : sentence + 63] + "..."
    assert BrowserTool(window_chars=100)(f"{base_url}/long | melting point of tungsten") == expected
    assert "3422 degrees Celsius" in expected


def test_window_is_the_beginning_without_query_or_hits() -> None:
    text = "alpha beta gamma delta"
    assert best_window(text, "", 10) == "alpha beta..."
    assert best_window(text, "zeta", 10) == "alpha beta..."
    assert best_window(text, "delta", 100) == text  # short text: all of it, no "..."
    # one hit "delta" at 17, span 0: start = 17 - 10 // 2 = 12 = len(text) - 10 = 22 - 10; text[12:22]
    assert best_window(text, "DELTA", 10) == "...amma delta"
    # hits "alpha" at 0 and "gamma" at 11 are not in one window of 10 ([0, 10) holds only "alpha"): the
    # first wins the tie; start = 0 - (10 - 0) // 2 = -5, clamped to 0
    assert best_window(text, "gamma alpha", 10) == "alpha beta..."
    # with a window of 16 both fit: span 11, start = 0 - (16 - 11) // 2 = -2, clamped to 0
    assert best_window(text, "gamma alpha", 16) == "alpha beta gamma..."


def test_page_is_capped_at_max_bytes(base_url: str) -> None:
    answer = BrowserTool(max_bytes=1000, window_chars=5000)(f"{base_url}/huge | TAIL_MARKER")
    # bytes read: "<p>" (3) + 997 bytes of "a a a ..." = 499 "a"s and 498 spaces; the tail is never read
    assert answer == " ".join(["a"] * 499)
    assert len(answer) == 997


def test_summarize_hook_gets_whole_text_and_query(base_url: str) -> None:
    tool = BrowserTool(window_chars=10, summarize=lambda text, query: f"{len(text)} chars about {query}")
    assert tool(f"{base_url}/article | price") == f"{len(ARTICLE_TEXT)} chars about price"


def test_http_error_is_reported(base_url: str) -> None:
    assert BrowserTool()(f"{base_url}/missing") == f"Error: {base_url}/missing returned HTTP 404"


def test_non_text_content_is_rejected(base_url: str) -> None:
    assert BrowserTool()(f"{base_url}/image") == f"Error: {base_url}/image is not a text page (image/png)"


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/file", "file:///etc/passwd", "javascript:alert(1)", "127.0.0.1/x"])
def test_only_http_urls_are_fetched(url: str) -> None:
    assert BrowserTool()(url) == f"Error: only http and https URLs can be browsed, got {url!r}"


def test_missing_or_invalid_url_is_reported() -> None:
    assert BrowserTool()(" | what") == "Error: no URL given; write <browse> URL | what to look for </browse>"
    assert BrowserTool()("http://[::1 | what") == "Error: invalid URL 'http://[::1'"
    assert BrowserTool()("http:// | what") == "Error: could not fetch http:// (no host given)"


def test_timeout_is_reported(base_url: str) -> None:
    answer = BrowserTool(timeout_s=0.2)(f"{base_url}/slow")  # the server answers after 1.0 s
    assert answer == f"Error: fetching {base_url}/slow timed out after 0.2 s"


def test_connection_refused_is_reported() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago and has no server now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    assert BrowserTool(timeout_s=1.0)(url) == f"Error: could not fetch {url} (connection refused)"
