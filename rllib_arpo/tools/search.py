"""The ``search`` tool: offline retrieval, answered in the format of ARPO's web-search results.

An answer lists the ``top_k`` best snippets, one a line, as in the reference run's search cache
(``search_cache.json``)::

    Page 1: <snippet>
    Page 2: <snippet>

and is ``"No search results found."`` when nothing matches (the cache's own text for that case).
Each snippet is cut to ``max_chars_per_result`` characters (a cut one ends with ``...``). The
defaults (10 results, 500 characters) replay every cached answer unchanged: the cache holds at
most 10 pages per query and no snippet longer than 384 characters.

Backends (``SEARCH_BACKENDS``), each built once per tool instance:

- ``bm25``: Okapi BM25 (the ``bm25s`` library, Lucene variant, k1 = 1.5, b = 0.75, English
  stop words removed) over a local corpus: a JSONL file with a ``text`` and an optional
  ``title`` field per line, or a list of strings. For a query Q and document D,
  score(D, Q) = sum_{q in Q} IDF(q) * f(q, D) * (k1 + 1) / (f(q, D) + k1 * (1 - b + b * |D| / avgdl)),
  with f(q, D) the count of term q in D and avgdl the mean document length. Documents that
  share no term with the query (score 0) are not returned.
- ``cache``: exact-query replay of a JSON cache ``{query: answer text}`` (the query is only
  stripped of surrounding whitespace); on a miss, BM25 over every distinct cached snippet.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import bm25s

from rllib_arpo.tools.base import register_tool

NO_RESULTS = "No search results found."

_PAGE_PREFIX = re.compile(r"^Page \d+: ", re.MULTILINE)


class SearchBackend(Protocol):
    """Returns up to ``top_k`` snippets for a query, best first."""

    def __call__(self, query: str, top_k: int) -> list[str]: ...


def format_results(snippets: Sequence[str], max_chars_per_result: int) -> str:
    """``"Page 1: ...\\nPage 2: ..."``, each snippet cut to ``max_chars_per_result`` characters."""
    if not snippets:
        return NO_RESULTS
    pages = []
    for rank, snippet in enumerate(snippets, start=1):
        if len(snippet) > max_chars_per_result:
            snippet = snippet[:max_chars_per_result] + "..."
        pages.append(f"Page {rank}: {snippet}")
    return "\n".join(pages)


def split_pages(text: str) -> list[str]:
    """The snippets of a formatted answer (inverse of ``format_results``); [] for ``NO_RESULTS``."""
    return [page.rstrip("\n") for page in _PAGE_PREFIX.split(text)[1:]]


class BM25Backend:
    """BM25 over a fixed list of documents (whitespace inside each document collapsed to single spaces)."""

    def __init__(self, documents: Sequence[str]) -> None:
        if not documents:
            raise ValueError("the BM25 corpus is empty")
        self.documents = [" ".join(document.split()) for document in documents]
        self._retriever = bm25s.BM25()
        corpus_tokens = bm25s.tokenize(self.documents, stopwords="en", show_progress=False)
        self._retriever.index(corpus_tokens, show_progress=False)

    @classmethod
    def from_file(cls, path: str | Path) -> BM25Backend:
        """Reads a JSONL corpus: one ``{"text": ..., "title": ... (optional)}`` object a line."""
        documents = []
        with open(path, encoding="utf-8") as file:
            for line in file:
                if line.strip():
                    record = json.loads(line)
                    title = record.get("title")
                    documents.append(f"{title} - {record['text']}" if title else record["text"])
        return cls(documents)

    def __call__(self, query: str, top_k: int) -> list[str]:
        query_tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        indices, scores = self._retriever.retrieve(
            query_tokens, k=min(top_k, len(self.documents)), show_progress=False
        )
        return [self.documents[index] for index, score in zip(indices[0], scores[0]) if score > 0]


class CacheBackend:
    """Replays cached answers by exact query; a miss falls back to BM25 over the cached snippets."""

    def __init__(self, cache: Mapping[str, str]) -> None:
        self.cache = dict(cache)
        snippets = dict.fromkeys(snippet for text in self.cache.values() for snippet in split_pages(text))
        self.fallback = BM25Backend(list(snippets))

    @classmethod
    def from_file(cls, path: str | Path) -> CacheBackend:
        """Reads a JSON object ``{query: answer text}`` such as ``search_cache.json``."""
        with open(path, encoding="utf-8") as file:
            return cls(json.load(file))

    def __call__(self, query: str, top_k: int) -> list[str]:
        if query in self.cache:
            return split_pages(self.cache[query])[:top_k]
        return self.fallback(query, top_k)


SEARCH_BACKENDS: dict[str, type[BM25Backend] | type[CacheBackend]] = {
    "bm25": BM25Backend,
    "cache": CacheBackend,
}


@register_tool("search")
class SearchTool:
    """Searches an offline backend and answers with ``"Page i: snippet"`` lines.

    Args:
        backend: a key of ``SEARCH_BACKENDS``.
        corpus_path: the backend's file (``bm25``: JSONL corpus; ``cache``: JSON cache).
        documents: instead of ``corpus_path``, the data itself (``bm25``: a list of texts;
            ``cache``: a ``{query: answer text}`` mapping).
        top_k: results per query.
        max_chars_per_result: each snippet is cut to this many characters.
    """

    name: str

    def __init__(
        self,
        backend: str = "bm25",
        corpus_path: str | Path | None = None,
        documents: Sequence[str] | Mapping[str, str] | None = None,
        top_k: int = 10,
        max_chars_per_result: int = 500,
    ) -> None:
        if backend not in SEARCH_BACKENDS:
            raise ValueError(f"unknown search backend {backend!r}; available: {sorted(SEARCH_BACKENDS)}")
        if (corpus_path is None) == (documents is None):
            raise ValueError("give exactly one of corpus_path and documents")
        backend_class = SEARCH_BACKENDS[backend]
        self.backend: SearchBackend = (
            backend_class.from_file(corpus_path) if corpus_path is not None else backend_class(documents)
        )
        self.top_k = top_k
        self.max_chars_per_result = max_chars_per_result

    def __call__(self, query: str) -> str:
        return format_results(self.backend(query.strip(), self.top_k), self.max_chars_per_result)
