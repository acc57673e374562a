"""The tag structure of a tool-integrated reasoning (TIR) response: ``<think>``, tool calls each
followed by its ``<result>``, one final ``<answer>``.

Where we differ from the reference code: tool results and tool-call bodies are opaque to the
format check, so a web page or a Python string that contains ``<answer>`` does not break the
format of the model's own text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_TOOL_TAGS: tuple[str, ...] = ("search", "python", "browse")


@dataclass(frozen=True)
class FormatCheck:
    """Result of ``validate_format``: ``ok``, and ``reason`` (``"ok"`` or what is wrong, with the
    character offset)."""

    ok: bool
    reason: str


def validate_format(response: str, tool_tags: Sequence[str] = DEFAULT_TOOL_TAGS) -> FormatCheck:
    """Check the tag structure of a whole TIR response (tool results included).

    Rules, checked in one left-to-right scan over the tags ``<think>``, ``<answer>``,
    ``<result>`` and ``<t>`` for t in ``tool_tags``:

    - blocks do not nest: every opened tag is closed by its own closing tag before another tag
      opens, and no closing tag appears without its opening tag;
    - the bodies of tool calls and of ``<result>`` are opaque (code and web pages may contain
      tag-like text); ``<think>`` and ``<answer>`` bodies may not contain any of the tags;
    - every tool call ``<t>...</t>`` is followed, with only whitespace between, by a
      ``<result>...</result>``, and a ``<result>`` appears only right after a tool call;
    - there is exactly one ``<answer>...</answer>`` block and nothing but whitespace after it.

    Free text between blocks is allowed. The response must not contain chat-template special
    tokens (decode with ``skip_special_tokens=True``).
    """
    names = ("think", "answer", "result", *tool_tags)
    tag = re.compile(r"<(/?)(" + "|".join(map(re.escape, names)) + r")>")
    position = 0
    awaiting_result: str | None = None  # the tool whose call just closed
    while True:
        match = tag.search(response, position)
        if awaiting_result is not None:
            gap_end = match.start() if match else len(response)
            if match is None or match.group(0) != "<result>" or response[position:gap_end].strip():
                tool = awaiting_result
                reason = f"<{tool}> call ending at offset {position} is not followed by <result>"
                return FormatCheck(False, reason)
        if match is None:
            return FormatCheck(False, "no <answer> block")
        closing, name = match.groups()
        start = match.start()
        if closing:
            return FormatCheck(False, f"</{name}> at offset {start} has no opening <{name}>")
        if name == "result" and awaiting_result is None:
            return FormatCheck(False, f"<result> at offset {start} does not follow a tool call")
        end_tag = f"</{name}>"
        close = response.find(end_tag, match.end())
        if close < 0:
            return FormatCheck(False, f"<{name}> at offset {start} is never closed")
        if name in ("think", "answer"):
            inner = tag.search(response, match.end(), close)
            if inner is not None:
                found = f"{inner.group(0)} at offset {inner.start()}"
                reason = f"{found} inside <{name}> at offset {start}"
                return FormatCheck(False, reason)
        position = close + len(end_tag)
        awaiting_result = name if name in tool_tags else None
        if name == "answer":
            rest = response[position:]
            if "<answer>" in rest:
                return FormatCheck(False, "more than one <answer> block")
            if rest.strip():
                return FormatCheck(False, f"text after the final </answer> at offset {position}")
            return FormatCheck(True, "ok")
