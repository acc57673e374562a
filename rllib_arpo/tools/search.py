"""The ``search`` tool: offline retrieval or a web-search service, answered in the format of ARPO's
web-search results.

An answer lists the ``top_k`` best snippets, one a line, as in the reference run's search cache
(``search_cache.json``)::

    Page 1: <snippet>
    Page 2: <snippet>

and is ``"No search results found."`` when nothing matches (the cache's own text for that case).
Each snippet is cut to ``max_chars_per_result`` characters (a cut one ends with ``...``), and the
whole answer to ``max_total_chars`` when that is set. The defaults (10 results, 500 characters,
no total budget) replay every cached answer unchanged: the cache holds at most 10 pages per query
and no snippet longer than 384 characters.

Backends (``SEARCH_BACKENDS``), each built once per tool instance:

- ``bm25``: Okapi BM25 (the ``bm25s`` library, Lucene variant, k1 = 1.5, b = 0.75, English
  stop words removed) over a local corpus: a JSONL file with a ``text`` and an optional
  ``title`` field per line, or a list of strings. For a query Q and document D,
  score(D, Q) = sum_{q in Q} IDF(q) * f(q, D) * (k1 + 1) / (f(q, D) + k1 * (1 - b + b * |D| / avgdl)),
  with f(q, D) the count of term q in D and avgdl the mean document length. Documents that
  share no term with the query (score 0) are not returned.
- ``cache``: exact-query replay of a JSON cache ``{query: answer text}`` (the query is only
  stripped of surrounding whitespace); on a miss, BM25 over every distinct cached snippet.
- ``http``: a search service over HTTP (``HttpSearchBackend``, configured by ``backend_options``).
  Request: ``GET <url>?q=<query>&num=<top_k>`` with ``Authorization: Bearer <key>``, the key read
  from the environment variable named ``api_key_env``. Response: JSON
  ``{"results": [{"title": ..., "snippet": ...}, ...]}``, each result shown as
  ``"<title> - <snippet>"``. Failures become ``"Error: ..."`` answers for the model, never
  exceptions: connection errors, HTTP 429 and 5xx are retried with exponential backoff.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from rllib_arpo.core.registry import Registry
from rllib_arpo.tools.base import TOOLS

logger = logging.getLogger(__name__)

NO_RESULTS = "No search results found."

_PAGE_PREFIX = re.compile(r"^Page \d+: ", re.MULTILINE)


class SearchBackend(Protocol):
    """Returns up to ``top_k`` snippets for a query, best first."""

    def __call__(self, query: str, top_k: int) -> list[str]: ...


def format_results(snippets: Sequence[str], max_chars_per_result: int, max_total_chars: int | None = None) -> str:
    """``"Page 1: ...\\nPage 2: ..."``, each snippet cut to ``max_chars_per_result`` characters and
    the whole text to ``max_total_chars`` (None: no total budget); a cut text ends with ``...``."""
    if not snippets:
        return NO_RESULTS
    pages = []
    for rank, snippet in enumerate(snippets, start=1):
        if len(snippet) > max_chars_per_result:
            snippet = snippet[:max_chars_per_result] + "..."
        pages.append(f"Page {rank}: {snippet}")
    text = "\n".join(pages)
    if max_total_chars is not None and len(text) > max_total_chars:
        text = text[:max_total_chars] + "..."
    return text


def split_pages(text: str) -> list[str]:
    """The snippets of a formatted answer (inverse of ``format_results``); [] for ``NO_RESULTS``."""
    return [page.rstrip("\n") for page in _PAGE_PREFIX.split(text)[1:]]


def _bm25s():
    """The bm25s module, imported on first use: it loads numba, which breaks vLLM's CPU workers
    when it is imported at the top of the script they re-import."""
    import bm25s

    return bm25s


def _index_path(index_cache_dir: str | Path, documents: Sequence[str]) -> Path:
    """``<index_cache_dir>/bm25-<hash>``: the hash covers the documents and the bm25s version."""
    digest = hashlib.sha256(_bm25s().__version__.encode())
    for document in documents:
        digest.update(document.encode("utf-8") + b"\0")
    directory = Path(index_cache_dir).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"bm25-{digest.hexdigest()[:24]}"


class BM25Backend:
    """BM25 over a fixed list of documents (whitespace inside each document collapsed to single spaces)."""

    def __init__(self, documents: Sequence[str], index_cache_dir: str | Path | None = None) -> None:
        if not documents:
            raise ValueError("the BM25 corpus is empty")
        self.documents = [" ".join(document.split()) for document in documents]
        cached = _index_path(index_cache_dir, self.documents) if index_cache_dir else None
        if cached is not None and cached.is_dir():
            self._retriever = _bm25s().BM25.load(str(cached))
            return
        bm25s = _bm25s()
        self._retriever = bm25s.BM25()
        corpus_tokens = bm25s.tokenize(self.documents, stopwords="en", show_progress=False)
        self._retriever.index(corpus_tokens, show_progress=False)
        if cached is not None:  # write beside, then rename: concurrent builders never see half an index
            staging = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".building-"))
            self._retriever.save(str(staging))
            try:
                staging.rename(cached)
            except OSError:  # another process finished first; its index is the same
                shutil.rmtree(staging, ignore_errors=True)

    @classmethod
    def from_file(cls, path: str | Path, index_cache_dir: str | Path | None = None) -> BM25Backend:
        """Reads a JSONL corpus: one ``{"text": ..., "title": ... (optional)}`` object a line."""
        documents = []
        with open(path, encoding="utf-8") as file:
            for line in file:
                if line.strip():
                    record = json.loads(line)
                    title = record.get("title")
                    documents.append(f"{title} - {record['text']}" if title else record["text"])
        return cls(documents, index_cache_dir)

    def __call__(self, query: str, top_k: int) -> list[str]:
        query_tokens = _bm25s().tokenize([query], stopwords="en", show_progress=False)
        indices, scores = self._retriever.retrieve(query_tokens, k=min(top_k, len(self.documents)), show_progress=False)
        return [self.documents[index] for index, score in zip(indices[0], scores[0]) if score > 0]


class CacheBackend:
    """Replays cached answers by exact query; a miss falls back to BM25 over the cached snippets."""

    def __init__(self, cache: Mapping[str, str], index_cache_dir: str | Path | None = None) -> None:
        self.cache = dict(cache)
        snippets = dict.fromkeys(snippet for text in self.cache.values() for snippet in split_pages(text))
        self.fallback = BM25Backend(list(snippets), index_cache_dir)

    @classmethod
    def from_file(cls, path: str | Path, index_cache_dir: str | Path | None = None) -> CacheBackend:
        """Reads a JSON object ``{query: answer text}`` such as ``search_cache.json``."""
        with open(path, encoding="utf-8") as file:
            return cls(json.load(file), index_cache_dir)

    def __call__(self, query: str, top_k: int) -> list[str]:
        if query in self.cache:
            return split_pages(self.cache[query])[:top_k]
        return self.fallback(query, top_k)


class SearchServiceError(Exception):
    """A failed search request; its message is shown to the model after ``"Error: "``."""


def network_error_reason(error: BaseException) -> str:
    """A short, secret-free reason for a failed connection: ``"connection refused"``, ``"timed out"``, ...

    Unwraps ``urllib.error.URLError`` to the socket error it carries.
    """
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(reason, TimeoutError):  # socket.timeout is TimeoutError
        return "timed out"
    if isinstance(reason, socket.gaierror):
        return "host name not found"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return type(reason).__name__ if isinstance(reason, BaseException) else str(reason)


class HttpSearchBackend:
    """A search service reached by ``GET <url>?q=<query>&num=<top_k>``.

    The request carries ``Authorization: Bearer <key>`` when the environment variable named
    ``api_key_env`` is set (none is sent otherwise); the key itself never appears in logs or
    answers. The response is JSON ``{results_field: [{title_field: ..., snippet_field: ...}]}``;
    a result becomes ``"<title> - <snippet>"`` (just the snippet when it has no title).

    Each attempt waits at most ``timeout_s`` for the service. Connection errors, HTTP 429 and
    HTTP 5xx are retried, ``max_attempts`` attempts in all, the n-th retry after
    ``retry_base_delay_s * 2 ** (n - 1)`` seconds. Timeouts are not retried (a service that is
    too slow once is likely slow again, and the rollout is waiting), nor are other HTTP errors
    or malformed answers. Every failure raises ``SearchServiceError`` with a short message.
    """

    def __init__(
        self,
        url: str,
        api_key_env: str = "SEARCH_API_KEY",
        timeout_s: float = 10.0,
        max_attempts: int = 3,
        retry_base_delay_s: float = 0.5,
        results_field: str = "results",
        title_field: str = "title",
        snippet_field: str = "snippet",
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.url = url
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.retry_base_delay_s = retry_base_delay_s
        self.results_field = results_field
        self.title_field = title_field
        self.snippet_field = snippet_field

    def __call__(self, query: str, top_k: int) -> list[str]:
        body = self._get(query, top_k)
        try:
            results = json.loads(body)[self.results_field]
            snippets = []
            for result in results:
                title, snippet = result.get(self.title_field), result.get(self.snippet_field) or ""
                snippets.append(f"{title} - {snippet}" if title else snippet)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise SearchServiceError("search service returned a malformed answer") from error
        return [snippet for snippet in snippets if snippet][:top_k]

    def _get(self, query: str, top_k: int) -> bytes:
        """The response body of a successful request, after up to ``max_attempts`` attempts."""
        separator = "&" if urllib.parse.urlsplit(self.url).query else "?"
        request_url = f"{self.url}{separator}{urllib.parse.urlencode({'q': query, 'num': top_k})}"
        headers = {"Accept": "application/json"}
        api_key = os.environ.get(self.api_key_env)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        request = urllib.request.Request(request_url, headers=headers)
        attempt = 1
        while True:
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return response.read()
            except urllib.error.HTTPError as error:
                failure = SearchServiceError(f"search service returned HTTP {error.code}")
                retryable = error.code == 429 or error.code >= 500
            except (OSError, http.client.HTTPException) as error:  # URLError is an OSError
                reason = network_error_reason(error)
                if reason == "timed out":
                    raise SearchServiceError(f"search timed out after {self.timeout_s:g} s") from error
                failure = SearchServiceError(f"search service unavailable ({reason})")
                retryable = True
            logger.warning("search request failed (attempt %d/%d): %s", attempt, self.max_attempts, failure)
            if not retryable or attempt == self.max_attempts:
                raise failure
            time.sleep(self.retry_base_delay_s * 2 ** (attempt - 1))
            attempt += 1


SEARCH_BACKENDS: Registry[type] = Registry("search backend")
SEARCH_BACKENDS.add("bm25", BM25Backend)
SEARCH_BACKENDS.add("cache", CacheBackend)
SEARCH_BACKENDS.add("http", HttpSearchBackend)


@TOOLS.register("search")
class SearchTool:
    """Searches a backend and answers with ``"Page i: snippet"`` lines, or ``"Error: ..."`` when
    the ``http`` backend fails.

    Args:
        backend: a name in ``SEARCH_BACKENDS``.
        corpus_path: the backend's file (``bm25``: JSONL corpus; ``cache``: JSON cache).
        documents: instead of ``corpus_path``, the data itself (``bm25``: a list of texts;
            ``cache``: a ``{query: answer text}`` mapping).
        backend_options: the ``http`` backend's keyword arguments (``url``, ``api_key_env``,
            ``timeout_s``, ... of ``HttpSearchBackend``); it takes no corpus.
        top_k: results per query.
        max_chars_per_result: each snippet is cut to this many characters.
        max_total_chars: the whole answer is cut to this many characters (None: no budget).
        index_cache_dir: where the ``bm25`` and ``cache`` backends keep built BM25 indexes on
            disk, keyed by a hash of the documents (None: build in memory every time).
    """

    name: str

    def __init__(
        self,
        backend: str = "bm25",
        corpus_path: str | Path | None = None,
        documents: Sequence[str] | Mapping[str, str] | None = None,
        backend_options: Mapping[str, object] | None = None,
        top_k: int = 10,
        max_chars_per_result: int = 500,
        max_total_chars: int | None = None,
        index_cache_dir: str | Path | None = None,
    ) -> None:
        backend_class = SEARCH_BACKENDS.get(backend)
        self.backend: SearchBackend
        if backend_class is HttpSearchBackend:
            if corpus_path is not None or documents is not None or backend_options is None:
                raise ValueError("the http backend takes backend_options with a url, not a corpus")
            self.backend = HttpSearchBackend(**backend_options)
        else:
            if backend_options is not None:
                raise ValueError(f"the {backend} backend takes no backend_options")
            if (corpus_path is None) == (documents is None):
                raise ValueError("give exactly one of corpus_path and documents")
            self.backend = (
                backend_class.from_file(corpus_path, index_cache_dir)
                if corpus_path is not None
                else backend_class(documents, index_cache_dir)
            )
        self.top_k = top_k
        self.max_chars_per_result = max_chars_per_result
        self.max_total_chars = max_total_chars

    def __call__(self, query: str) -> str:
        try:
            snippets = self.backend(query.strip(), self.top_k)
        except SearchServiceError as error:
            return f"Error: {error}"
        return format_results(snippets, self.max_chars_per_result, self.max_total_chars)
