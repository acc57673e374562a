"""Cold-start SFT sequences: a transcript tokenised the way the tree rollout builds it.

A training sequence (``SFTSequence``) is the prompt as the model reads it
(``data.prompts.encode_prompt``: a chat model's own chat template with ARPO's system prompt, the
tiny policy's plain ``"Question: ...\nAnswer: "``), then the model's text up to each tool's
closing tag, then the tool segment
``encode(" <result>") + encode(text)[:max_tool_result_tokens] + encode("</result>")``, and so on,
then EOS (a chat model's end-of-turn token). The loss mask is 0 on the prompt and on every tool
segment (exactly the TOOL segments the RL loss masks) and 1 on the model's own tokens and the
EOS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.prompts import encode_prompt
from rllib_arpo.tools.base import RESULT_CLOSE, RESULT_OPEN, encode_tool_result

MAX_TOOL_RESULT_TOKENS = 96
"""Tool results are cut to this many tokens, as the rollout of ``tuned_examples/arpo_tiny.yaml`` does."""

_TOOL_RESULT = re.compile(f"{re.escape(RESULT_OPEN)}(.*?){re.escape(RESULT_CLOSE)}", re.DOTALL)


@dataclass(frozen=True)
class SFTSequence:
    """One training sequence: token ids and a loss mask (1 where the token is a trained target)."""

    input_ids: list[int]
    loss_mask: list[int]


Demonstration = tuple[PromptExample, str]
"""A prompt and the response a demonstrator writes for it (tool results included)."""


def encode_transcript(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[int],
    transcript: str,
    max_tool_result_tokens: int = MAX_TOOL_RESULT_TOKENS,
) -> SFTSequence:
    """Tokenise prompt + transcript + EOS as the tree rollout would, segment by segment (module
    docstring); mask 0 on the prompt and on every `` <result>...</result>`` tool segment."""

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    ids = list(prompt_ids)
    mask = [0] * len(ids)
    position = 0
    for result in _TOOL_RESULT.finditer(transcript):
        model_ids = encode(transcript[position : result.start()])
        tool_ids = encode_tool_result(tokenizer, result.group(1), max_tool_result_tokens)
        ids += model_ids + tool_ids
        mask += [1] * len(model_ids) + [0] * len(tool_ids)
        position = result.end()
    model_ids = encode(transcript[position:]) + [tokenizer.eos_token_id]
    return SFTSequence(ids + model_ids, mask + [1] * len(model_ids))


def encode_demonstration(
    tokenizer: PreTrainedTokenizerBase, demonstration: Demonstration, max_tool_result_tokens: int
) -> SFTSequence:
    """``encode_transcript`` of a demonstration, its prompt as the model reads it (``encode_prompt``)."""
    example, transcript = demonstration
    return encode_transcript(tokenizer, encode_prompt(tokenizer, example), transcript, max_tool_result_tokens)
