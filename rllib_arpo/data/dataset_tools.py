"""The tool options for a dataset's questions: a dataset that brings its own corpus is searched there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rllib_arpo.data.registry import dataset_documents
from rllib_arpo.tools.mcp import is_mcp

SEARCH_CORPUS_OPTIONS = ("backend", "corpus_path", "documents", "backend_options")
"""The search tool's options that choose what it searches (``tools.search.SearchTool``)."""


def tools_for_dataset(tools: Mapping[str, Any], dataset: Mapping[str, Any]) -> dict:
    """The tool options for questions of ``dataset``: a dataset that brings its own corpus (the
    embedded task's knowledge base) is searched there with BM25, whatever corpus the search tool
    names (its other options, ``top_k`` and the like, stay); any other dataset uses the search
    tool as configured, which must then name a corpus or a service."""
    tools = dict(tools)
    search = tools.get("search")
    if search is None or is_mcp(search):  # an MCP server named search is not the search tool
        return tools
    documents = dataset_documents(dataset)
    if documents is not None:
        kept = {k: v for k, v in (search or {}).items() if k not in SEARCH_CORPUS_OPTIONS}
        tools["search"] = {**kept, "backend": "bm25", "documents": documents}
    elif not {"corpus_path", "documents", "backend_options"} & set(search or {}):
        raise ValueError(
            f"tools.search: dataset {dataset.get('path', dataset.get('type'))!r} brings no corpus: "
            "give the search tool a corpus_path (e.g. the reference search_cache.json with backend: cache)"
        )
    return tools
