"""``scripts/entropy_after_tools.py``: where its entropy windows sit and the dH figures it reports
(docs/entropy.md), on hand-made entropies.

Entropies are multiples of 1/8, so window means and their differences are exact in float64.
"""

import math

import pytest

from rllib_arpo.core.tree import RolloutTree, SegmentKind
from rllib_arpo.rollout.engine import Generation
from rllib_arpo.tools.base import RESULT_CLOSE


@pytest.fixture(scope="module")
def script(load_script):
    return load_script("entropy_after_tools")


def generated(tree: RolloutTree, parent: int | None, entropies: list[float]) -> int:
    """A model segment of one token per entropy."""
    n = len(entropies)
    return tree.add_segment(parent, [5] * n, SegmentKind.MODEL, logprobs=[0.0] * n, entropies=entropies)


def tool_result(tree: RolloutTree, parent: int) -> int:
    return tree.add_segment(parent, [7, 7, 7], SegmentKind.TOOL, tool_name="search")


def test_windows_are_the_first_k_tokens_of_the_first_segment_and_after_each_tool_result(script):
    k = 4
    tree = RolloutTree(prompt_ids=[1, 2])
    # H_initial: the first k tokens of the first segment; its 8.0s lie outside the window
    first = generated(tree, None, [1.0, 0.5, 0.25, 0.25, 8.0, 8.0])  # mean 0.5
    result_1 = tool_result(tree, first)
    # H_1: the first k tokens generated after the result
    after_1 = generated(tree, result_1, [2.0, 1.0, 1.0, 0.0, 8.0])  # mean 1.0
    result_2 = tool_result(tree, after_1)
    # H_2: fewer than k tokens left before the next call: the mean of those there are
    after_2 = generated(tree, result_2, [0.125, 0.125])  # mean 0.125
    # a tool result that ends the trajectory (length budget): nothing generated after it, no dH
    tree.finish(tool_result(tree, after_2), "length")
    # a second trajectory forks after the first result: it shares the first segment (and H_initial)
    fork = generated(tree, result_1, [0.0, 0.0, 0.0, 0.0])  # mean 0.0
    # a model segment that follows a model segment, not a tool result, gives no H_t
    tree.finish(generated(tree, fork, [8.0] * 4), "eos")

    samples = script.trajectory_entropies(tree, window=k)

    assert [(s.initial, s.after_tools) for s in samples] == [(0.5, [1.0, 0.125]), (0.5, [0.0])]
    assert [s.deltas for s in samples] == [[0.5, -0.375], [-0.5]]  # dH_t = H_t - H_initial


class CharacterTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(character) for character in text]


class PrefixEntropyEngine:
    """Generates ``max_new_tokens`` tokens whose entropies name what they were sampled after: token
    j of the r-th copy of prefix p in a call has entropy len(p) + r / 8 + j, so a window of k
    tokens has the mean len(p) + r / 8 + (k - 1) / 2."""

    tokenizer = CharacterTokenizer()

    def __init__(self):
        self.calls = []

    def generate(self, prefixes, params):
        self.calls.append((prefixes, params))
        generations = []
        for i, prefix in enumerate(prefixes):
            copy = prefixes[:i].count(prefix)
            entropies = [len(prefix) + copy / 8 + j for j in range(params.max_new_tokens)]
            n = len(entropies)
            generations.append(Generation([3] * n, [0.0] * n, entropies, "length"))
        return generations


def test_forced_windows_start_right_after_the_prompt_and_after_each_reference_result(script):
    k, samples = 3, 2
    prompts = [[1, 2, 3], [4]]
    first_call = "ab <result>x</result>"
    transcripts = [first_call + " cd <result>yz</result> e", "q <result>r</result>"]  # the second ends on a result
    engine = PrefixEntropyEngine()

    out = script.forced_samples(engine, prompts, transcripts, samples, k, seed=5, temperature=0.7)

    (first_prefixes, params), (second_prefixes, _) = engine.calls
    assert (params.max_new_tokens, params.temperature, params.seed) == (k, 0.7, 5)
    encode = CharacterTokenizer().encode
    # k tokens after the prompt, then after each result up to and including its closing tag
    cut_2 = transcripts[0].index(RESULT_CLOSE, len(first_call)) + len(RESULT_CLOSE)
    expected = [[1, 2, 3], [1, 2, 3, *encode(first_call)], [1, 2, 3, *encode(transcripts[0][:cut_2])]]
    assert first_prefixes == [prefix for prefix in expected for _ in range(samples)]
    assert second_prefixes == [prefix for prefix in [[4], [4, *encode(transcripts[1])]] for _ in range(samples)]

    # sample r pairs the r-th draw after the prompt with the r-th draw after each result
    window = (k - 1) / 2
    lengths = [[3, 3 + len(first_call), 3 + cut_2], [1, 1 + len(transcripts[1])]]
    assert [(s.initial, s.after_tools) for s in out] == [
        (n[0] + r / 8 + window, [m + r / 8 + window for m in n[1:]]) for n in lengths for r in range(samples)
    ]


def test_summary_reports_the_mean_dh_and_what_the_default_rules_make_of_it(script):
    samples = [
        script.EntropySample(0.5, [0.75, 0.0]),  # dH +0.25, -0.5
        script.EntropySample(0.5, [0.0]),  # dH -0.5
        script.EntropySample(1.0, []),  # no tool call: an H_initial, no dH
    ]
    vocab_size = 4

    result = script.summary("hand-made", samples, vocab_size)

    assert result["trajectories"] == 3 and result["tool_calls"] == 3
    assert result["h_initial_mean"] == 2 / 3 and result["h_after_tool_mean"] == 0.25
    assert result["dH"] == [0.25, -0.5, -0.5]
    assert result["gap"] == [0.125, 0.5]  # H_initial - mean_t H_t, over the trajectories with a call
    nats = result["nats"]
    assert nats["dH_mean"] == -0.25  # (0.25 - 0.5 - 0.5) / 3, the figure docs/entropy.md quotes
    assert nats["dH_quantiles_5_25_50_75_95"][2] == -0.5
    # AEPO: m = round(8 sigmoid(gap)): 8 sigmoid(0.125) = 4.25 -> 4, 8 sigmoid(0.5) = 4.98 -> 5
    assert nats["aepo_m_of_8_counts"] == {"4": 1, "5": 1}
    # The stochastic rule's p = clip(0.5 + 0.2 dH, 0, 1) is 0.55, 0.4, 0.4. Each p is rounded
    # twice in float64 (the product, the sum: under 2^-53 absolute each, p < 1), |p - 0.5| is
    # exact, and the mean adds three roundings of numbers under 0.3: under 2.5e-16 in all.
    assert nats["branch_probability_mean_abs_change"] == pytest.approx((0.05 + 0.1 + 0.1) / 3, abs=2.5e-16)
    # Divided by log|V|: log, reciprocal and product round each term (3 x 2^-53 relative), the sum
    # of |terms| 1.25 over |sum| 0.75 amplifies that 5/3 times, the two additions and the mean
    # add about 2.3 roundings, and the expected value its own 2: about 10 x 2^-53 = 1.1e-15.
    assert result["per_log_V"]["dH_mean"] == pytest.approx(-0.25 / math.log(vocab_size), rel=1.2e-15)


def test_summary_without_tool_calls_has_no_dh(script):
    result = script.summary("no calls", [script.EntropySample(0.25), script.EntropySample(0.75)], vocab_size=4)

    assert result == {
        "name": "no calls",
        "trajectories": 2,
        "tool_calls": 0,
        "h_initial_mean": 0.5,
        "h_after_tool_mean": None,
    }
