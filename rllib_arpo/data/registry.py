"""The dataset types: ``DATASET_LOADERS`` and what a dataset spec gives (its examples, its corpus).

The dataset is chosen by a dict in the config (``ARPOConfig.dataset``): its ``type`` names a
registered ``DatasetLoader``, its other keys are the loader's keyword arguments. The built-in
types (``tir_task``, ``parquet``, ``jsonl``: ``data.loaders``) register when ``rllib_arpo.data``
is imported; this module imports none of them, so a loader defined elsewhere imports only it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rllib_arpo.core.registry import Registry
from rllib_arpo.data.examples import PromptExample

ToolFunction = Callable[[str], str]
"""A tool as a reference solution calls it: its query -> its result text."""


@dataclass(frozen=True)
class ReferenceResponse:
    """A question answered the reference way: its ``kind`` (the group the dry run reports it in),
    its prompt, and the response that answers it (tool calls and their results included)."""

    kind: str
    example: PromptExample
    response: str


ReferenceSolutions = Callable[[Mapping[str, Any], int | None, Mapping[str, ToolFunction]], list[ReferenceResponse]]
"""``reference_solutions(spec, limit, tools)`` of a ``DatasetLoader``."""


@dataclass(frozen=True)
class DatasetLoader:
    """A registered dataset type.

    Attributes:
        load: ``load(**options) -> list[PromptExample]``, the options being the other keys of
            the config's ``dataset``.
        held_out_split: the split that holds its held-out questions (the default held-out set,
            the same spec with this ``split``); None: ``held_out_dataset`` must name one.
        documents: ``documents(spec) -> list[str]``: the retrieval corpus the dataset brings with
            it (searched instead of the search tool's own); None: it brings none.
        reference_solutions: ``reference_solutions(spec, limit, tools) -> list[ReferenceResponse]``:
            how its first ``limit`` questions are solved, ``tools`` being the tool functions a
            solution calls (``{"search": ..., "python": ...}``, each ``query -> result``), so the
            dry run can measure them against ``max_response_tokens``; None: no solutions are known.

    A loader's examples carry their ``PromptExample.source`` in the form the per-source metrics
    name it (``accuracy/<source>``): the metrics take it as it is.
    """

    load: Callable[..., list[PromptExample]]
    held_out_split: str | None = None
    documents: Callable[[Mapping[str, Any]], list[str]] | None = None
    reference_solutions: ReferenceSolutions | None = None


class DatasetLoaderRegistry(Registry[DatasetLoader]):
    """``Registry`` whose ``register`` decorates a plain loader function; every declaration
    beside ``load`` is a keyword with a default (``DatasetLoader``)."""

    def register(self, *names: str, held_out_split: str | None = None, documents=None, reference_solutions=None):
        def decorator(load: Callable[..., list[PromptExample]]) -> Callable[..., list[PromptExample]]:
            Registry.register(self, *names)(DatasetLoader(load, held_out_split, documents, reference_solutions))
            return load

        return decorator


DATASET_LOADERS = DatasetLoaderRegistry("dataset type")
"""Dataset type (the ``type`` of the config's ``dataset``) -> ``DatasetLoader``; the other keys
of the spec are the loader's keyword arguments."""


def load_dataset(spec: Mapping[str, Any]) -> list[PromptExample]:
    spec = dict(spec)
    kind = spec.pop("type", None)
    loader = DATASET_LOADERS.get(kind).load
    try:
        examples = loader(**spec)
    except TypeError as error:
        raise ValueError(f"bad options for dataset type {kind!r}: {error}") from None
    if not examples:
        raise ValueError(f"dataset {kind!r} with {spec} has no examples")
    return examples


def dataset_documents(spec: Mapping[str, Any]) -> list[str] | None:
    """The retrieval corpus a dataset brings with it (the TIR task's knowledge base), else None
    (``DatasetLoader.documents``)."""
    documents = DATASET_LOADERS.get(spec.get("type")).documents
    return None if documents is None else documents(spec)
