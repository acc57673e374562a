"""The ``browse`` tool: fetches a web page and answers with the part of its text that matches a query.

The model writes::

    <browse> https://example.org/page | what to look for </browse>

The URL comes first; everything after the first ``|`` is the query. Without a ``|``, the first
whitespace-separated word is the URL and the rest the query; the query may be empty.

The page is fetched with a timeout and read up to ``max_bytes`` bytes (a larger page is cut
there, not refused). HTML becomes text with the standard library's ``html.parser``: script,
style and similar elements are dropped, entities unescaped, and each block element (paragraph,
heading, list item, ...) becomes a line of its own. The answer is the window of
``window_chars`` characters with the most occurrences of the query's words (stop words
excluded, case-insensitive, whole words), centred on those occurrences; the beginning of the
page when there is no query or no occurrence. A cut end is marked with ``...``.

An optional ``summarize(text, query) -> str`` replaces the window: it gets the page's whole text.

Failures (bad URL, unknown host, refused connection, HTTP errors, timeout, content that is not
text) are answered with a short ``"Error: ..."`` text, never raised.
"""

from __future__ import annotations

import bisect
import http.client
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from html.parser import HTMLParser

from rllib_arpo.tools.base import TOOLS
from rllib_arpo.tools.search import network_error_reason

SKIPPED_ELEMENTS = frozenset({"script", "style", "noscript", "template", "svg"})
"""Elements whose content is not page text."""

BLOCK_ELEMENTS = frozenset(
    {
        "address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt", "figcaption",
        "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li",
        "main", "nav", "ol", "p", "pre", "section", "table", "td", "th", "title", "tr", "ul",
    }
)  # fmt: skip
"""Elements that start a new line of text."""

USAGE = "write <browse> URL | what to look for </browse>"


class _UnsupportedContent(Exception):
    """The page's content type is not text; the message is the content type."""


class _TextExtractor(HTMLParser):
    """Collects the visible text of an HTML document (entities unescaped by ``convert_charrefs``)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in SKIPPED_ELEMENTS:
            self._skip_depth += 1
        elif tag in BLOCK_ELEMENTS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIPPED_ELEMENTS:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag in BLOCK_ELEMENTS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self.parts.append(re.sub(r"\s+", " ", data))  # a line break in the source is a space


def html_to_text(html: str) -> str:
    """The visible text of ``html``: one line per block element, whitespace collapsed, no empty lines."""
    extractor = _TextExtractor()
    extractor.feed(html)
    extractor.close()
    lines = (" ".join(line.split()) for line in "".join(extractor.parts).split("\n"))
    return "\n".join(line for line in lines if line)


def best_window(text: str, query: str, window_chars: int) -> str:
    """The ``window_chars``-character part of ``text`` with the most query-word occurrences.

    Among windows that start at an occurrence, the one holding the most occurrences wins (the
    first on ties); it is then shifted so that its occurrences sit in the middle. Without query
    words or occurrences, the window is the beginning of ``text``. Cut ends get ``...``.
    """
    from bm25s.stopwords import STOPWORDS_EN  # on first use: bm25s loads numba (see tools.search._bm25s)

    words = {word for word in re.findall(r"\w+", query.lower()) if word not in STOPWORDS_EN}
    start = 0
    if words and len(text) > window_chars:
        pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(words))) + r")\b", re.IGNORECASE)
        hits = [match.start() for match in pattern.finditer(text)]
        if hits:
            best_first, best_count = 0, 0
            for first, position in enumerate(hits):
                count = bisect.bisect_left(hits, position + window_chars) - first
                if count > best_count:
                    best_first, best_count = first, count
            span_start, span_end = hits[best_first], hits[best_first + best_count - 1]
            start = span_start - (window_chars - (span_end - span_start)) // 2
            start = max(0, min(start, len(text) - window_chars))
    window = text[start : start + window_chars]
    prefix = "..." if start > 0 else ""
    suffix = "..." if start + window_chars < len(text) else ""
    return f"{prefix}{window}{suffix}"


def parse_browse_call(call: str) -> tuple[str, str]:
    """``"URL | query"`` (or ``"URL query words"``) -> (URL, query), both stripped."""
    call = call.strip()
    if "|" in call:
        url, query = call.split("|", 1)
    else:
        url, _, query = call.partition(" ")
    return url.strip(), query.strip()


@TOOLS.register("browse")
class BrowserTool:
    """Fetches an http(s) page and answers with its text around the query (see the module docstring).

    Args:
        timeout_s: seconds to wait for the server, per connection and per read.
        max_bytes: at most this many bytes of the page are read.
        window_chars: characters of page text in an answer.
        summarize: optional ``summarize(page_text, query) -> answer`` used instead of the window.
        user_agent: the ``User-Agent`` header sent.
    """

    name: str

    def __init__(
        self,
        timeout_s: float = 10.0,
        max_bytes: int = 2_000_000,
        window_chars: int = 3000,
        summarize: Callable[[str, str], str] | None = None,
        user_agent: str = "Mozilla/5.0 (compatible; rllib-arpo-browser)",
    ) -> None:
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.window_chars = window_chars
        self.summarize = summarize
        self.user_agent = user_agent

    def __call__(self, call: str) -> str:
        url, query = parse_browse_call(call)
        if not url:
            return f"Error: no URL given; {USAGE}"
        if not url.lower().startswith(("http://", "https://")):
            return f"Error: only http and https URLs can be browsed, got {url[:200]!r}"
        try:
            text = self._fetch_text(url)
        except urllib.error.HTTPError as error:
            return f"Error: {url[:200]} returned HTTP {error.code}"
        except ValueError:
            return f"Error: invalid URL {url[:200]!r}"
        except (OSError, http.client.HTTPException) as error:  # URLError is an OSError
            reason = network_error_reason(error)
            if reason == "timed out":
                return f"Error: fetching {url[:200]} timed out after {self.timeout_s:g} s"
            return f"Error: could not fetch {url[:200]} ({reason})"
        except _UnsupportedContent as error:
            return f"Error: {url[:200]} is not a text page ({error})"
        if not text:
            return f"Error: {url[:200]} has no readable text"
        if self.summarize is not None:
            return self.summarize(text, query)
        return best_window(text, query, self.window_chars)

    def _fetch_text(self, url: str) -> str:
        """The page's text (HTML converted), from its first ``max_bytes`` bytes."""
        request = urllib.request.Request(url, headers={"User-Agent": self.user_agent})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            content_type = response.headers.get_content_type()
            if not (content_type.startswith("text/") or content_type.endswith(("+xml", "/xml", "/json"))):
                raise _UnsupportedContent(content_type)
            charset = response.headers.get_content_charset() or "utf-8"
            body = response.read(self.max_bytes)
        try:
            page = body.decode(charset, errors="replace")
        except LookupError:  # an unknown charset name
            page = body.decode("utf-8", errors="replace")
        if "html" in content_type:
            return html_to_text(page)
        return "\n".join(" ".join(line.split()) for line in page.splitlines() if line.strip())
