"""How a prompt reaches the model: ARPO's system prompt and the tokenizer's chat template.

ARPO's prompt (arXiv 2507.19849, and the reference RL data) is a system message that names the
tool tags and asks for the final answer as ``\\boxed{...}`` inside ``<answer>``, then the question
as the user message. A chat model reads both through its own chat template, with the generation
prompt (the assistant header) at the end, and its response starts right after that. The tool
results stay inside that same assistant turn, appended after each call's closing tag as
`` <result>...</result>`` (``tools.base.wrap_result``), as in the reference rollout; the
response ends with the template's end-of-turn token (the tokenizer's EOS, e.g. ChatML's
``<|im_end|>``).

A tokenizer without a chat template (the embedded tiny policy) gets the example's
``plain_prompt`` where its loader sets one, else the embedded task's plain form of its question
(its last user message): ``"Question: ...\\nAnswer: "`` (``question_prompt``), the form the
tiny policy was trained to read, whatever the dataset type. Only a prompt without a user message
falls back to the contents of its messages joined by blank lines. A tokenizer with a chat
template never reads ``plain_prompt``.

Tags are single tokens only in the tiny policy's tokenizer. In a real model's vocabulary
``</search>`` is several tokens (SmolLM2: ``" </"``, ``"search"``, ``">"``); the engines stop on
the decoded text, so a stop string is found whichever tokens spell it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rllib_arpo.data.examples import PromptExample
from rllib_arpo.tools.mcp import MCPTool

TIR_SYSTEM_PROMPT = (
    "Answer the question step by step. Think inside <think> </think>. To look facts up, write a "
    "query inside <search> </search>; to compute, write Python code inside <python> </python>. "
    "Each tool's output comes back inside <result> </result>. Give the final answer as "
    "<answer> \\boxed{...} </answer>."
)
"""The project's ARPO system prompt: the tool tags, the result tag and the boxed final answer."""


def tir_messages(question: str, system_prompt: str = TIR_SYSTEM_PROMPT) -> tuple[dict[str, str], ...]:
    """The chat messages of a question: ARPO's system prompt, then the question from the user."""
    return ({"role": "system", "content": system_prompt}, {"role": "user", "content": question})


MCP_TOOLS_HEADER = (
    "More tools: call one by writing its arguments as a JSON object inside its tags, e.g. "
    '<name>{"argument": value}</name>; its output comes back inside <result> </result>.'
)
"""The first line of the MCP tools' description (``with_mcp_tools``); a line per tool follows."""


def with_mcp_tools(example: PromptExample, tools: Mapping[str, object]) -> PromptExample:
    """``example`` with the MCP tools among ``tools`` (``tools.mcp.MCPTool``) described after its
    system message: ``MCP_TOOLS_HEADER``, then ``- <tag>: description Arguments: {JSON schema}``
    a tool, in the order of ``tools``; a prompt without a system message gets one, a plain-text
    prompt gets the description before it. ``example`` itself where none is an MCP tool. A
    tokenizer without a chat template reads no system message (``plain_text``)."""
    lines = [f"- <{tag}>: {tool.description}" for tag, tool in tools.items() if isinstance(tool, MCPTool)]
    if not lines:
        return example
    description = "\n".join([MCP_TOOLS_HEADER, *lines])
    if isinstance(example.prompt, str):
        return dataclasses.replace(example, prompt=f"{description}\n\n{example.prompt}")
    messages = [dict(message) for message in example.prompt]
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{description}"
    else:
        messages.insert(0, {"role": "system", "content": description})
    return dataclasses.replace(example, prompt=tuple(messages))


def question_prompt(question: str) -> str:
    """The embedded task's plain prompt of ``question``: what a tokenizer without a chat template
    reads, and the form the tiny policy was trained on; its response starts right after it."""
    return f"Question: {question}\nAnswer: "


def plain_text(example: PromptExample) -> str:
    """The text a tokenizer without a chat template reads for chat messages (module docstring):
    the example's ``plain_prompt``, else ``question_prompt`` of its last user message, else (no
    user message) the messages' contents joined by blank lines."""
    if example.plain_prompt:
        return example.plain_prompt
    questions = [m["content"] for m in example.prompt if m.get("role") == "user"]
    if questions:
        return question_prompt(questions[-1])
    return "\n\n".join(m["content"] for m in example.prompt) + "\n"


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer, example: PromptExample) -> list[int]:
    """Token ids of the prompt (see the module docstring): plain text as is; chat messages
    through the chat template with the generation prompt; without a chat template, the
    example's ``plain_text``."""
    if isinstance(example.prompt, str):
        return tokenizer.encode(example.prompt, add_special_tokens=False)
    messages = [dict(m) for m in example.prompt]
    if has_chat_template(tokenizer):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
    return tokenizer.encode(plain_text(example), add_special_tokens=False)


def render_prompt(tokenizer, example: PromptExample) -> str:
    """The prompt exactly as the model sees it: its token ids decoded, special tokens included."""
    return tokenizer.decode(encode_prompt(tokenizer, example), skip_special_tokens=False)
