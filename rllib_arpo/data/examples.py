"""``PromptExample``: one question as every dataset gives it, whatever its source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PromptExample:
    """One prompt: plain text (used as is) or chat messages (rendered with the chat template).

    Attributes:
        prompt: the text, or the chat messages.
        ground_truth: the gold answer, or a tuple of accepted answers.
        task: ``"qa"`` or ``"math"``: picks the correctness score of the hierarchical reward.
        source: where the example comes from (the benchmark, or ``tir_task/<kind>``).
        plain_prompt: the text a tokenizer without a chat template reads instead of the messages.
    """

    prompt: str | tuple[Mapping[str, str], ...]
    ground_truth: str | tuple[str, ...]
    task: str
    source: str
    plain_prompt: str | None = None
