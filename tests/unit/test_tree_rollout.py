"""TreeRollout driven by a scripted engine, a character-level tokenizer and a stub search tool.

The engine's reply to a prefix depends only on how many tool results the prefix already holds
(round r of a path gets ``script[r]``), so every tree below can be traced by hand. Entropies are
binary fractions (0.25, 0.5, 0.75, 1.0) so window means and deltas are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from rllib_arpo.core.tree import BranchPoint, RolloutTree, SegmentKind
from rllib_arpo.rollout.engine import Generation, SamplingParams
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.rollout.tree_rollout import TreeRollout
from rllib_arpo.tools.base import ToolExecutor

WINDOW = 4  # k: entropy window of every test
SEARCH_CALL = "<search>q</search>"  # 18 characters = 18 tokens
TOOL_RESULT = " <result>R:q</result>"  # what the rollout appends for the stub's answer "R:q" (21 tokens)
ANSWER = "<answer>7</answer>"
LOGPROB = -0.5


class CharTokenizer:
    """One token per character: its code point."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(t) for t in token_ids)


TOKENIZER = CharTokenizer()


@dataclass(frozen=True)
class Turn:
    """What the engine writes in one round: the first ``WINDOW`` tokens get ``entropy``, later
    tokens ``tail_entropy`` (to check that only the window counts)."""

    text: str
    entropy: float
    finish_reason: str = "stop"
    tail_entropy: float = 0.0


class ScriptedEngine:
    """Replies ``script[r]`` to a prefix holding r tool results (the last turn repeats), minus
    what the prefix already holds of that turn (a continuation after a phase-1 head); honours
    ``max_new_tokens`` like a real engine and records every call."""

    prefers_early_children = False

    def __init__(self, script: list[Turn]):
        self.script = script
        self.tokenizer = TOKENIZER
        self.weights_version = 0
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    def generate(self, prefixes, params: SamplingParams) -> list[Generation]:
        self.calls.append(([list(p) for p in prefixes], params))
        generations = []
        for prefix in prefixes:
            rounds = TOKENIZER.decode(prefix).count("</result>")
            turn = self.script[min(rounds, len(self.script) - 1)]
            done = len(TOKENIZER.decode(prefix).rsplit("</result>", 1)[1]) if rounds else 0
            ids = TOKENIZER.encode(turn.text)[done:]
            entropies = [turn.entropy if t < WINDOW else turn.tail_entropy for t in range(done, done + len(ids))]
            reason = turn.finish_reason
            if len(ids) > params.max_new_tokens:
                ids, entropies, reason = ids[: params.max_new_tokens], entropies[: params.max_new_tokens], "length"
            generations.append(Generation(ids, [LOGPROB] * len(ids), entropies, reason))
        return generations

    def update_weights(self, state, version: int) -> None:
        self.weights_version = version


class StubSearch:
    name = "search"

    def __call__(self, query: str) -> str:
        return f"R:{query}"


class FixedBranching:
    """Always (or never) branches; records the dH_t values it was asked about."""

    def __init__(self, branch: bool):
        self.branch = branch
        self.deltas: list[float] = []

    def branch_probability(self, delta_entropy, consecutive_branches=0) -> float:
        return 0.5 + delta_entropy  # a score that shows which dH it was given

    def should_branch(self, delta_entropy, consecutive_branches=0, rng=None) -> bool:
        self.deltas.append(delta_entropy)
        return self.branch


# a search call in round 0 (H = 0.25), then an answer after the result (H = 0.75): dH = 0.5
SEARCH_THEN_ANSWER = [Turn(SEARCH_CALL, 0.25), Turn(ANSWER, 0.75, "eos")]


@pytest.fixture
def tools():
    with ToolExecutor({"search": StubSearch()}, max_workers=2, timeout_s=5.0) as executor:
        yield executor


def rollout(script, tools, branch: bool, **settings) -> tuple[ScriptedEngine, FixedBranching, TreeRollout]:
    engine = ScriptedEngine(script)
    policy = FixedBranching(branch)
    settings = {"entropy_window": WINDOW, "max_response_tokens": 200, **settings}
    return engine, policy, TreeRollout(engine, tools, policy, RolloutSettings(**settings))


def children(tree: RolloutTree, parent: int | None) -> list[int]:
    return [i for i, s in enumerate(tree.segments) if s.parent == parent]


@pytest.mark.parametrize("early_children", [False, True])
def test_always_branch_forks_from_the_tool_segment_within_budget(tools, early_children):
    engine, policy, runner = rollout(
        SEARCH_THEN_ANSWER,
        tools,
        branch=True,
        initial_rollouts=2,
        total_rollouts=4,
        branch_factor=2,
        early_children=early_children,
    )
    prompt = TOKENIZER.encode("Q?")
    (tree,), stats = runner.run([prompt], seed=0)

    # N = 2 paths, each forks Z - 1 = 1 child after its search result: M - N = 2 branches
    assert tree.num_trajectories == 4
    assert stats.branches == 2
    assert tree.finish_reasons == ["eos"] * 4
    # the policy is asked once per initial path, on the first k tokens after its result; the
    # children start from the result in the same round and do not decide again at that point
    assert policy.deltas == [0.5, 0.5]  # 0.75 - 0.25
    assert stats.delta_entropies == [0.5, 0.5]

    tool_segments = [i for i, s in enumerate(tree.segments) if s.kind is SegmentKind.TOOL]
    assert len(tool_segments) == 2
    for t in tool_segments:
        segment = tree.segments[t]
        assert segment.token_ids == TOKENIZER.encode(TOOL_RESULT)
        assert segment.tool_name == "search"
        assert segment.logprobs is None
        assert tree.segments[segment.parent].token_ids == TOKENIZER.encode(SEARCH_CALL)
        # the initial path's answer and the forked child's answer both hang below the result
        below = children(tree, t)
        assert len(below) == 2
        assert all(tree.segments[c].token_ids == TOKENIZER.encode(ANSWER) for c in below)
        # what the run report shows at the fork: H_initial, H_t, P_t of dH = 0.5, one child
        assert segment.branch_point == BranchPoint(0.25, 0.75, 1.0, "fork", 1)
    assert len(children(tree, None)) == 2  # only N paths start at the prompt
    assert tree.num_branch_points() == 3  # the prompt and both tool results

    rows = tree.to_rows()
    expected = TOKENIZER.encode(SEARCH_CALL + TOOL_RESULT + ANSWER)
    for row in rows:
        assert row.response_ids.tolist() == expected
        # 18 model tokens, 21 masked tool tokens, 18 model tokens
        assert row.loss_mask.tolist() == [1.0] * 18 + [0.0] * 21 + [1.0] * 18
        assert row.old_logprobs.tolist() == [LOGPROB] * 18 + [0.0] * 21 + [LOGPROB] * 18

    assert engine.calls[0][0] == [prompt, prompt]
    assert engine.calls[0][1].stop_strings == ("</search>",)
    after_result = prompt + TOKENIZER.encode(SEARCH_CALL + TOOL_RESULT)
    after_head = after_result + TOKENIZER.encode(ANSWER[:WINDOW])
    assert engine.calls[1][1].max_new_tokens == WINDOW
    if early_children:
        # round 2, phase 1: the first k = 4 tokens of the 2 paths after their results and, next
        # to them, of their 2 would-be children; phase 2: all 4 after those 4 tokens
        assert [len(prefixes) for prefixes, _ in engine.calls] == [2, 4, 4]
        assert engine.calls[1][0] == [after_result] * 4
        assert engine.calls[2][0] == [after_head] * 4
    else:
        # round 2, phase 1: the first k = 4 tokens of the 2 paths; phase 2, in the same round:
        # the 2 paths after those 4 tokens and the 2 children from the tool result
        assert [len(prefixes) for prefixes, _ in engine.calls] == [2, 2, 4]
        assert engine.calls[1][0] == [after_result] * 2
        assert engine.calls[2][0] == [after_head] * 2 + [after_result] * 2
    assert stats.rounds == 2
    assert stats.discarded_tokens == 0


class ScriptedBranching:
    """Answers the i-th branching question with ``decisions[i]``."""

    def __init__(self, decisions: list[bool]):
        self.decisions = list(decisions)

    def branch_probability(self, delta_entropy, consecutive_branches=0) -> float:
        return 0.5

    def should_branch(self, delta_entropy, consecutive_branches=0, rng=None) -> bool:
        return self.decisions.pop(0)


def test_early_children_declined_fork_drops_its_child_and_a_later_fork_starts_a_new_one(tools):
    # early_children, M = 3, N = 2, Z = 2: one branch for two candidates. Only the first candidate's would-be
    # child fits the budget; the first candidate declines (its child's k tokens are dropped),
    # the second forks and gets a new child that starts from its tool result in phase 2.
    engine = ScriptedEngine(SEARCH_THEN_ANSWER)
    settings = RolloutSettings(
        entropy_window=WINDOW, max_response_tokens=200, total_rollouts=3, initial_rollouts=2, early_children=True
    )
    runner = TreeRollout(engine, tools, ScriptedBranching([False, True]), settings)
    prompt = TOKENIZER.encode("Q")
    (tree,), stats = runner.run([prompt], seed=0)

    assert tree.num_trajectories == 3
    assert stats.branches == 1
    assert stats.discarded_tokens == WINDOW
    assert tree.finish_reasons == ["eos"] * 3
    after_result = prompt + TOKENIZER.encode(SEARCH_CALL + TOOL_RESULT)
    after_head = after_result + TOKENIZER.encode(ANSWER[:WINDOW])
    assert [len(prefixes) for prefixes, _ in engine.calls] == [2, 3, 3]
    assert engine.calls[1][0] == [after_result] * 3
    assert engine.calls[2][0] == [after_head, after_head, after_result]
    # the new child hangs below the second path's tool result; the first result has one continuation
    tool_segments = [i for i, s in enumerate(tree.segments) if s.kind is SegmentKind.TOOL]
    assert [len(children(tree, t)) for t in tool_segments] == [1, 2]
    assert all(tree.segments[c].token_ids == TOKENIZER.encode(ANSWER) for c in children(tree, tool_segments[1]))


@pytest.mark.parametrize("early_children", [False, True])
def test_never_branch_tops_up_with_fresh_trajectories_from_the_prompt(tools, early_children):
    _, policy, runner = rollout(
        SEARCH_THEN_ANSWER,
        tools,
        branch=False,
        initial_rollouts=2,
        total_rollouts=4,
        branch_factor=2,
        early_children=early_children,
    )
    trees, stats = runner.run([TOKENIZER.encode("Q1"), TOKENIZER.encode("Q2")], seed=0)

    assert stats.branches == 0
    assert policy.deltas == [0.5] * 4  # N = 2 initial paths of each of the 2 prompts
    # early: each of the 4 candidates had a would-be child (budget M - N = 2 per prompt), k tokens each, dropped
    assert stats.discarded_tokens == (4 * WINDOW if early_children else 0)
    for tree in trees:
        assert tree.num_trajectories == 4
        # 2 initial + (M - 2) = 2 fresh trajectories, every one starting at the prompt
        roots = children(tree, None)
        assert len(roots) == 4
        assert all(tree.segments[r].token_ids == TOKENIZER.encode(SEARCH_CALL) for r in roots)
        # no tool result has more than one continuation
        tool_segments = [i for i, s in enumerate(tree.segments) if s.kind is SegmentKind.TOOL]
        assert [len(children(tree, t)) for t in tool_segments] == [1, 1, 1, 1]
    assert trees[1].prompt_ids == TOKENIZER.encode("Q2")
    # search+result round, answer round, then the same two rounds for the fresh paths
    assert stats.rounds == 4


def test_tool_calls_stop_at_max_tool_calls(tools):
    forever = [Turn(SEARCH_CALL, 0.25)]
    _, _, runner = rollout(forever, tools, branch=False, initial_rollouts=1, total_rollouts=1, max_tool_calls=2)
    (tree,), stats = runner.run([TOKENIZER.encode("Q")], seed=0)

    assert tree.num_trajectories == 1
    assert tree.finish_reasons == ["max_tool_calls"]
    assert stats.finish_reasons == {"max_tool_calls": 1}
    assert tree.tool_calls(0) == {"search": 2}
    # call, result, call, result, call (the third call is not run)
    kinds = [tree.segments[s].kind for s in tree.trajectory_segments(0)]
    assert kinds == [SegmentKind.MODEL, SegmentKind.TOOL] * 2 + [SegmentKind.MODEL]


def test_response_budget_truncates_with_length(tools):
    long_answer = [Turn(SEARCH_CALL, 0.25), Turn("x" * 20, 0.5, "eos")]
    # budget 48: 18 (call) + 21 (result) = 39 used, so the answer is cut to 48 - 39 = 9 tokens
    engine, _, runner = rollout(
        long_answer, tools, branch=False, initial_rollouts=1, total_rollouts=1, max_response_tokens=48
    )
    (tree,), stats = runner.run([TOKENIZER.encode("Q")], seed=0)
    assert tree.finish_reasons == ["length"]
    assert engine.calls[1][1].max_new_tokens == 9
    assert tree.trajectory_response_ids(0) == TOKENIZER.encode(SEARCH_CALL + TOOL_RESULT + "x" * 9)

    # budget 30: the call fits (18) but its result would not (18 + 21 = 39 >= 30)
    _, _, runner = rollout(
        long_answer, tools, branch=False, initial_rollouts=1, total_rollouts=1, max_response_tokens=30
    )
    (tree,), stats = runner.run([TOKENIZER.encode("Q")], seed=0)
    assert tree.finish_reasons == ["length"]
    assert [s.kind for s in tree.segments] == [SegmentKind.MODEL]  # no tool segment appended
    assert stats.finish_reasons == {"length": 1}


def test_entropy_delta_uses_the_segment_after_the_current_tool_result(tools):
    # round 0: H_initial = mean of the first k = 4 tokens = 0.25 (the tail's 1.0 is outside the window)
    # round 1 (after result 1): H_1 = 0.5  -> dH_1 = 0.5 - 0.25 = 0.25
    # round 2 (after result 2): H_2 = 1.0  -> dH_2 = 1.0 - 0.25 = 0.75
    # A one-round lag (entropy of the segment before the result) would give [0.0, 0.25].
    script = [
        Turn(SEARCH_CALL, 0.25, tail_entropy=1.0),
        Turn(SEARCH_CALL, 0.5, tail_entropy=0.0),
        Turn(ANSWER, 1.0, "eos", tail_entropy=0.0),
    ]
    # N = 1, M = 2, never branching: the initial path, then one fresh (non-branching) path
    _, policy, runner = rollout(script, tools, branch=False, initial_rollouts=1, total_rollouts=2, max_tool_calls=3)
    (tree,), stats = runner.run([TOKENIZER.encode("Q")], seed=0)
    assert policy.deltas == [0.25, 0.75]  # asked for the initial path only
    assert stats.delta_entropies == [0.25, 0.75] * 2
    assert tree.finish_reasons == ["eos", "eos"]
    # the first segment stores every token's entropy, not just the window
    assert tree.segments[0].entropies == [0.25] * WINDOW + [1.0] * (18 - WINDOW)


def test_aepo_pre_monitoring_probes_then_samples_m_minus_one_more(tools):
    # the probe: H_root = 0.25 (first segment), mean H_tool = 0.75 (its one post-tool segment)
    # m = clamp(floor(M * sigmoid(b * (H_root - H_tool))) + 1, 1, M), M = 4, b = 1
    #   = floor(4 / (1 + e^0.5)) + 1 = floor(4 * 0.3775) + 1 = floor(1.51) + 1 = 2
    m = math.floor(4 / (1 + math.exp(0.5))) + 1
    assert m == 2
    engine, policy, runner = rollout(
        SEARCH_THEN_ANSWER,
        tools,
        branch=True,
        total_rollouts=4,
        initial_rollouts=1,
        branch_factor=2,
        aepo_pre_monitoring=True,
        aepo_sensitivity=1.0,
    )
    prompt = TOKENIZER.encode("Q")
    (tree,), stats = runner.run([prompt], seed=0)

    assert tree.num_trajectories == 4
    # the probe alone first (2 rounds), then m - 1 = 1 more global path
    assert [len(prefixes) for prefixes, _ in engine.calls[:3]] == [1, 1, 1]
    assert engine.calls[2][0] == [prompt]
    # the second global path forks Z - 1 = 1 child at its search result; the child does not
    # decide again at that point, and the stub calls no second tool, so once every path has
    # ended the prompt is topped up with 4 - 3 = 1 fresh trajectory from the prompt
    assert stats.branches == 1
    assert len(children(tree, None)) == m + 1
    (tool_of_probe, tool_of_second, _) = [i for i, s in enumerate(tree.segments) if s.kind is SegmentKind.TOOL]
    assert len(children(tree, tool_of_probe)) == 1  # the probe never branches (no budget yet)
    assert len(children(tree, tool_of_second)) == 2  # its own answer + the forked child
    # dH is measured for the probe, the second path and the fresh one; the policy is asked once
    assert stats.delta_entropies == [0.5] * 3
    assert policy.deltas == [0.5]


def test_early_children_default_follows_the_engine_unless_set(tools):
    from rllib_arpo.rollout.hf_engine import HFEngine
    from rllib_arpo.rollout.vllm_engine import VLLMEngine

    assert (HFEngine.prefers_early_children, VLLMEngine.prefers_early_children) == (True, False)
    engine = ScriptedEngine(SEARCH_THEN_ANSWER)
    for setting, expected in ((None, False), (True, True), (False, False)):
        settings = RolloutSettings(early_children=setting)
        assert TreeRollout(engine, tools, FixedBranching(True), settings).early_children is expected
    engine.prefers_early_children = True
    assert TreeRollout(engine, tools, FixedBranching(True), RolloutSettings()).early_children is True


def test_branching_none_starts_all_m_paths_at_the_prompt(tools):
    engine, policy, runner = rollout(
        SEARCH_THEN_ANSWER, tools, branch=True, branching="none", initial_rollouts=2, total_rollouts=4
    )
    (tree,), stats = runner.run([TOKENIZER.encode("Q?")], seed=0)
    # M = 4 paths from the prompt in the first round; the (forking) policy is never asked
    assert tree.num_trajectories == 4 and stats.branches == 0
    assert len(children(tree, None)) == 4 and policy.deltas == []


NO_FORK = BranchPoint(0.25, 0.75, 1.0, "no fork", 0)
NO_BUDGET = BranchPoint(0.25, 0.75, None, "no budget", 0)


@pytest.mark.parametrize(
    ("branch", "initial_rollouts", "expected"),
    [(False, 2, [NO_FORK, NO_FORK, NO_BUDGET, NO_BUDGET]), (True, 4, [NO_BUDGET] * 4)],
)
def test_a_tool_result_keeps_the_entropies_after_it_and_why_the_path_did_not_fork(
    tools, branch, initial_rollouts, expected
):
    """M = 4: two initial paths that decline their fork keep P_t, and the two top-ups that
    replace the forks (no budget to fork) are never asked; with N = M there is no budget at all.
    Every tool result keeps H_initial and H_t."""
    _, _, runner = rollout(
        SEARCH_THEN_ANSWER, tools, branch=branch, initial_rollouts=initial_rollouts, total_rollouts=4, branch_factor=2
    )
    (tree,), _ = runner.run([TOKENIZER.encode("Q?")], seed=0)
    assert [s.branch_point for s in tree.segments if s.kind is SegmentKind.TOOL] == expected
    assert all(s.branch_point is None for s in tree.segments if s.kind is SegmentKind.MODEL)
    assert NO_FORK.delta_entropy == 0.5
