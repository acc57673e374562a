"""A real chat tokenizer end to end: ARPO's prompt through SmolLM2's ChatML template, tags that
are several tokens long, the tool results inside the assistant turn, and the reward."""

import dataclasses

import pytest
import torch

from rllib_arpo.core.branching import NoBranching
from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT, encode_prompt, render_prompt
from rllib_arpo.data.registry import load_dataset
from rllib_arpo.rewards.hierarchical import hierarchical_reward
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.engine import Generation
from rllib_arpo.rollout.hf_engine import HFEngine
from rllib_arpo.rollout.scoring import score_trees
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.rollout.tree_rollout import TreeRollout
from rllib_arpo.tools.base import ToolExecutor, find_tool_call

PAGE = "Page 1: Zorvath is a city. The population of Zorvath is 48213."
SEGMENTS = [
    "<think> I need the population of Zorvath. </think> <search> population of Zorvath </search>",
    " <think> I compute it with Python. </think> <python> 48213 * 7 </python>",
    " <answer> \\boxed{337491} </answer>",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def test_the_prompt_is_arpo_system_prompt_and_question_in_chatml(tokenizer):
    example = load_dataset({"type": "tir_task", "seed": 0, "split": "test"})[0]
    question = example.prompt[1]["content"]
    assert render_prompt(tokenizer, example) == (
        f"<|im_start|>system\n{TIR_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert encode_prompt(tokenizer, example) == tokenizer.encode(render_prompt(tokenizer, example))


def test_tags_are_several_tokens_and_the_stop_check_fires_on_the_closing_one(tokenizer):
    """The HF engine stops on decoded text: at the token that completes ``</search>``, never
    before, although ``</``, ``search`` and ``>`` are separate tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1
    )
    engine = HFEngine(LlamaForCausalLM(config), tokenizer)
    ids = tokenizer.encode(SEGMENTS[0], add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in ids[-3:]] == [" </", "search", ">"]
    stops = ("</search>", "</python>")
    fired = [engine._matched_stop_string(ids[: n + 1][-40:], stops) for n in range(len(ids))]
    assert fired == [None] * (len(ids) - 1) + ["</search>"]
    # a token that carries more than the tag's ">" (here ">.") still stops generation, but the call
    # is not read (the text does not end with the tag): the path ends, its format fails
    merged = tokenizer.encode(" <search> x </search>.", add_special_tokens=False)
    assert tokenizer.decode(merged[-1:]) == ">." and engine._matched_stop_string(merged, stops) == "</search>"
    assert find_tool_call(tokenizer.decode(merged), ("search", "python")) is None


class ScriptedEngine:
    """Writes ``SEGMENTS``, one per call, as SmolLM2 token ids: the tool segments end with their
    closing tag (finish "stop"), the answer with ``<|im_end|>`` (finish "eos")."""

    weights_version = 0
    prefers_early_children = False

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prefixes, params):
        out = []
        for prefix in prefixes:
            response = self.tokenizer.decode(prefix).split("<|im_start|>assistant\n")[-1]
            segment = SEGMENTS[response.count("</result>")]
            ids = self.tokenizer.encode(segment, add_special_tokens=False)
            stop = next((s for s in params.stop_strings if segment.endswith(s)), None)
            if stop is None:
                ids.append(self.tokenizer.eos_token_id)
            out.append(Generation(ids, [0.0] * len(ids), [0.0] * len(ids), "stop" if stop else "eos", stop))
        return out

    def update_weights(self, state, version):
        raise NotImplementedError


def test_a_rollout_with_multi_token_tags_calls_both_tools_and_scores_right(tokenizer):
    example = load_dataset({"type": "tir_task", "seed": 0, "split": "test"})[0]
    tools = ToolExecutor({"search": lambda query: PAGE, "python": lambda code: str(eval(code))})
    settings = RolloutSettings(total_rollouts=1, initial_rollouts=1, max_response_tokens=400)
    rollout = TreeRollout(ScriptedEngine(tokenizer), tools, NoBranching(), settings)
    [tree], stats = rollout.run([encode_prompt(tokenizer, example)], seed=0)
    response = tokenizer.decode(tree.trajectory_response_ids(0), skip_special_tokens=True)
    assert response == (f"{SEGMENTS[0]} <result>{PAGE}</result>{SEGMENTS[1]} <result>337491</result>{SEGMENTS[2]}")
    assert dict(tree.tool_calls(0)) == {"search": 1, "python": 1}
    assert stats.finish_reasons == {"eos": 1}
    # scored as in training: format ok, S = 1 against "337491", r_M = 0.1 for using both tools
    example = dataclasses.replace(example, ground_truth="337491")
    [[score]] = score_trees([tree], [example], tokenizer, RewardSettings(), ("search", "python"))
    assert (score.format_ok, score.correctness, score.reward) == (True, 1.0, pytest.approx(1.1))
    # the end-of-turn token is a special token: it never reaches the format check
    merged = hierarchical_reward(response + ".", "337491", task="math", tool_calls={"search": 1, "python": 1})
    assert not merged.format_ok and "text after the final </answer>" in merged.format_reason
    assert torch.tensor(tree.trajectory_response_ids(0))[-1].item() == tokenizer.eos_token_id


class Counter:
    """A stateful environment for the prefix test: a count that each action adds to."""

    action_tag = "add"
    deterministic = True

    def reset(self, row):
        self.count = 0
        return "count: 0 (add with <add> n </add>)"

    def step(self, action):
        self.count += int(action)
        return f"count: {self.count}\n", 0.0, False, {}


class RecordingEngine:
    """Adds 2 twice, then answers; records every prefix it is asked to continue."""

    weights_version = 0
    prefers_early_children = False

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prefixes = []

    def generate(self, prefixes, params):
        out = []
        for prefix in prefixes:
            self.prefixes.append(list(prefix))
            response = self.tokenizer.decode(prefix).split("<|im_start|>assistant\n")[-1]
            turn = response.count("</result>") - 1  # the first observation is a result too
            text = " <add> 2 </add>" if turn < 2 else " <answer> \\boxed{4} </answer>"
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            stop = "</add>" if turn < 2 else None
            ids += [] if stop else [self.tokenizer.eos_token_id]
            out.append(Generation(ids, [0.0] * len(ids), [0.0] * len(ids), "stop" if stop else "eos", stop))
        return out


def test_each_turns_prompt_ids_are_a_prefix_of_the_next_turns(tokenizer):
    """Across the turns of an episode in an environment, the engine continues the very ids it
    generated and the observations appended to them: the chat history is never re-rendered."""
    from rllib_arpo.environments.base import resolve_environment
    from rllib_arpo.rollout.episodes import Episodes

    example = load_dataset({"type": "tir_task", "seed": 0, "split": "test"})[0]
    engine = RecordingEngine(tokenizer)
    episodes = Episodes(
        resolve_environment({"name": f"{__name__}:Counter", "isolate": False}, 5.0), max_workers=1, timeout_s=5.0
    )
    settings = RolloutSettings(total_rollouts=1, initial_rollouts=1, max_response_tokens=400)
    rollout = TreeRollout(engine, ToolExecutor({}), NoBranching(), settings, episodes)
    [tree], _ = rollout.run([encode_prompt(tokenizer, example)], seed=0, rows=[example.row()])
    first, second, third = engine.prefixes
    assert first == encode_prompt(tokenizer, example) + tokenizer.encode(
        " <result>count: 0 (add with <add> n </add>)</result>", add_special_tokens=False
    )
    assert second[: len(first)] == first and third[: len(second)] == second
    assert tree.prompt_ids + tree.trajectory_response_ids(0) == third + tokenizer.encode(
        " <answer> \\boxed{4} </answer>", add_special_tokens=False
    ) + [tokenizer.eos_token_id]
    assert tokenizer.decode(third[len(first) :]) == (
        " <add> 2 </add> <result>count: 2\n</result> <add> 2 </add> <result>count: 4\n</result>"
    )
