"""A response's final answer: where it is stated (``<answer>``, ``\\boxed{}``, GSM8K's ``####``),
and the gold number of a GSM8K solution.

Where we differ from the reference code: the reference prompts (``rl_datasets/*.parquet``) spell
``\\boxed`` with a backspace character where ``\\b`` was meant (``"\\x08oxed{...}"``); models
trained on them copy it. The reference extractor misses that form and scores such answers 0;
``extract_answer`` accepts it.
"""

from __future__ import annotations

import re

# ``\boxed{`` and ``\fbox{``, also with the ``\b`` / ``\f`` escape already turned into a control
# character (backspace 0x08, form feed 0x0c) as in the reference data's system prompt.
_BOXED_OPEN = re.compile(r"(?:\\boxed|\x08oxed|\\fbox|\x0cbox)\s*\{")
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM8K_ANSWER = re.compile(r"####\s*([^\n]*)")
_THOUSANDS_NUMBER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")


def _last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (outermost, braces balanced), or None."""
    last = None
    position = 0
    while (match := _BOXED_OPEN.search(text, position)) is not None:
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        if depth:  # never closed (e.g. a truncated response): look for a later, complete one
            position = match.end()
            continue
        last = text[match.end() : end - 1].strip()
        position = end
    return last


def strip_thousands(number: str) -> str:
    """``"1,450,000"`` -> ``"1450000"``; any other string is returned unchanged."""
    return number.replace(",", "") if _THOUSANDS_NUMBER.fullmatch(number) else number


def extract_answer(text: str) -> str | None:
    """The final answer stated in a response, or None when it states none.

    In order of preference:

    1. the last closed ``<answer>...</answer>`` block: the last ``\\boxed{}`` inside it, else the
       block's stripped text (None when the block is empty);
    2. the last ``\\boxed{...}`` / ``\\fbox{...}`` anywhere (nested braces balanced; the
       backspace-mangled ``\\x08oxed{...}`` of the reference prompts included);
    3. GSM8K style: the rest of the line after the last ``####``.
    """
    blocks = _ANSWER_BLOCK.findall(text)
    if blocks:
        block = blocks[-1]
        return _last_boxed(block) or block.strip() or None
    boxed = _last_boxed(text)
    if boxed:
        return boxed
    gsm8k = _GSM8K_ANSWER.findall(text)
    if gsm8k and gsm8k[-1].strip():
        return gsm8k[-1].strip()
    return None


def extract_gsm8k_reference(answer: str) -> str:
    """The gold number of a GSM8K solution ``"... #### 1,450,000"`` -> ``"1450000"``.

    Thousands separators are removed. Raises ``ValueError`` when there is no ``####`` line.
    """
    found = _GSM8K_ANSWER.findall(answer)
    if not found or not found[-1].strip():
        raise ValueError(f"no '#### <answer>' line in GSM8K solution: {answer[-80:]!r}")
    return strip_thousands(found[-1].strip())
