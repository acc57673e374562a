"""``PromptExample``: one question as every dataset gives it, whatever its source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PromptExample:
    """One prompt: plain text (used as is) or chat messages (rendered with the chat template).

    Attributes:
        prompt: the text, or the chat messages.
        ground_truth: the gold answer, or a tuple of accepted answers.
        task: ``"qa"`` or ``"math"``: picks the correctness score of the hierarchical reward.
        source: where the example comes from (the benchmark, or the embedded task's question
            kind), as the per-source metrics name it (``accuracy/<source>``).
        plain_prompt: the text a tokenizer without a chat template reads instead of the messages.
        extra: every column of the dataset's row that its loader does not read itself (a code
            task's test cases, a row id), for the reward (``row``).
    """

    prompt: str | tuple[Mapping[str, str], ...]
    ground_truth: str | tuple[str, ...]
    task: str
    source: str
    plain_prompt: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The whole dataset row, as a reward sees it (``rewards.registry``): ``prompt``,
        ``ground_truth``, ``task``, ``source`` and the ``extra`` columns (an extra column of one
        of those four names is shadowed by the example's own)."""
        own = {"prompt": self.prompt, "ground_truth": self.ground_truth, "task": self.task, "source": self.source}
        return {**self.extra, **own}

    def ground_truth_text(self) -> str:
        """The ground truth as the run report shows it: accepted answers joined by `` | ``."""
        truth = self.ground_truth
        return " | ".join(truth) if isinstance(truth, tuple) else str(truth)
