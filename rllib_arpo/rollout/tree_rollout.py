"""The ARPO tree rollout: generate, call tools, measure entropy, branch, until M trajectories.

For a batch of prompts, every round:

1. every active path is continued by the engine until a tool's closing tag, EOS or the length
   budget (all paths of all prompts in one ``generate`` call, so shared prefixes are batched);
2. the new tokens become a MODEL segment of the prompt's tree. A path's first segment sets its
   H_initial (window-mean entropy of its first k tokens, in nats, fresh every training step).
   A segment that follows a tool result gives H_t, and dH_t = H_t - H_initial drives the
   branching policy: a fork adds Z - 1 children that resample from the end of that tool result
   (with ``early_children`` they start next to the deciding tokens and are dropped if the fork is
   declined, so they do not lag k tokens behind their parent; unset, the engine's
   ``prefers_early_children`` decides);
3. paths that closed a tool tag have their calls run in parallel; each result is appended as a
   TOOL segment ``" <result>...</result>"`` (loss-masked; ``rollout.tool_round``);
4. a prompt whose paths have all ended is topped up with fresh trajectories until it has M.

With an ``environment`` (``environments.base``), each prompt's row is reset first (its first
observation ends the prompt), its action tag stops generation like a tool's, and an action is
stepped in the trajectory's own instance (``rollout.episodes``): the observation is appended
like a tool result, with the step's reward on its segment, and the environment's ``done`` ends
the trajectory (``env_done``). A fork copies the parent's instance for each child.

AEPO's entropy pre-monitoring (``aepo_pre_monitoring``) first samples one probe trajectory per
prompt; its root entropy and mean post-tool entropy set the number m of global samples
(``aepo_global_samples``), the remaining M - m go to branching.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from rllib_arpo.core.branch_budget import BranchBudget, aepo_global_samples
from rllib_arpo.core.branching import BranchingPolicy
from rllib_arpo.core.entropy import window_mean_entropy
from rllib_arpo.core.tree import BranchPoint, RolloutTree, SegmentKind
from rllib_arpo.rollout.engine import Generation, GenerationEngine, SamplingParams
from rllib_arpo.rollout.episodes import Episode, Episodes
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.rollout.tool_round import ToolRound
from rllib_arpo.rollout.tree_paths import RolloutPath, RolloutStats, finish_path
from rllib_arpo.tools.base import ToolCall, ToolExecutor, encode_tool_result, find_tool_call


def _can_branch(budget: BranchBudget | None) -> bool:
    return budget is not None and budget.can_branch()


def _ended(generation: Generation, room: int) -> bool:
    """True when a phase-1 head already ended its segment (tool tag, EOS, or no room left)."""
    return generation.finish_reason != "length" or len(generation.token_ids) >= room


def _joined(head: Generation | None, tail: Generation | None) -> Generation:
    """One segment from a phase-1 head and its phase-2 continuation (either may be absent)."""
    if head is None or tail is None:
        return head or tail
    return Generation(
        token_ids=head.token_ids + tail.token_ids,
        logprobs=head.logprobs + tail.logprobs,
        entropies=head.entropies + tail.entropies,
        finish_reason=tail.finish_reason,
        stop_string=tail.stop_string,
    )


class TreeRollout:
    def __init__(
        self,
        engine: GenerationEngine,
        tools: ToolExecutor,
        branching: BranchingPolicy,
        settings: RolloutSettings,
        episodes: Episodes | None = None,
    ):
        self.engine = engine
        self.tools = tools
        self.branching = branching
        self.settings = settings
        self.early_children = (
            engine.prefers_early_children if settings.early_children is None else settings.early_children
        )
        self.episodes = episodes
        self.action_tag = episodes.spec.action_tag if episodes is not None else None
        if self.action_tag in tools.tools:
            raise ValueError(f"the environment acts with <{self.action_tag}>, which a tool names as well")
        self.tool_names = tuple(tools.tools) + ((self.action_tag,) if self.action_tag else ())
        """Every tag a call or an action may close: the tools' and the environment's."""
        self.stop_strings = tuple(f"</{name}>" for name in self.tool_names)
        self.tool_round = ToolRound(engine, tools, episodes, self.action_tag, settings)

    def run(
        self, prompts: list[list[int]], seed: int, rows: list[dict] | None = None
    ) -> tuple[list[RolloutTree], RolloutStats]:
        """The trees of ``prompts`` (token ids); with an environment, ``rows`` are the prompts'
        dataset rows it is reset with."""
        s = self.settings
        rng = np.random.default_rng(seed)
        trees = [RolloutTree(prompt_ids=list(p)) for p in prompts]
        stats = RolloutStats()
        roots = [None] * len(trees)
        if self.episodes is not None:
            if rows is None or len(rows) != len(prompts):
                raise ValueError("a rollout over an environment needs one dataset row per prompt")
            roots = self.episodes.start(rows)
            for tree, root in zip(trees, roots):
                first = root.observation if root.error is None else f"Error: reset failed: {root.error}"
                if first:
                    tree.prompt_ids += encode_tool_result(self.engine.tokenizer, first, s.max_tool_result_tokens)

        def new_path(i: int, **kwargs) -> RolloutPath:
            return RolloutPath(tree=i, episode=Episode(roots[i]) if roots[i] is not None else None, **kwargs)

        if s.aepo_pre_monitoring:
            budgets: list[BranchBudget | None] = [None] * len(trees)
            active = [new_path(i) for i in range(len(trees))]
            probes = {path.tree: path for path in active}
        else:
            budgets = [BranchBudget(s.total_rollouts, s.global_samples, s.branch_factor) for _ in trees]
            active = [new_path(i) for i in range(len(trees)) for _ in range(s.global_samples)]

        while active:
            stats.rounds += 1
            pending = self._generate_round(trees, budgets, active, rng, seed, stats)
            next_active = self.tool_round.run(trees, pending, stats)
            # prompts whose paths all ended: finish AEPO's probe, or top up to M
            running = {p.tree for p in next_active}
            for i, tree in enumerate(trees):
                if i in running or tree.num_trajectories >= s.total_rollouts:
                    continue
                if budgets[i] is None:
                    budgets[i] = self._budget_from_probe(probes[i])
                    next_active += [new_path(i) for _ in range(budgets[i].initial - 1)]
                else:
                    fill = budgets[i].fill_count(tree.num_trajectories)
                    next_active += [new_path(i, may_branch=False) for _ in range(fill)]
            active = next_active
        if self.episodes is not None:
            stats.environment = self.episodes.pop_stats()
        return trees, stats

    # --- one generation round ---------------------------------------------------------------
    def _generate_round(self, trees, budgets, active, rng, seed, stats) -> list[tuple[RolloutPath, ToolCall]]:
        """Phase 1, in rounds where some path may fork right after its tool result (a candidate):
        each candidate generates its first k tokens, whose entropy decides the fork. Phase 2:
        every path, and the granted children from the end of the tool result, continues until a
        tool tag closes, EOS or the length budget. Children so start in the round of their fork,
        k tokens after their parent.

        With ``early_children``, phase 1 runs every path, and next to each candidate its
        would-be children (Z - 1, as far as the prompt's remaining budget goes). Granted
        children keep their k tokens, the others are dropped (``stats.discarded_tokens``), and a
        forking round costs no more sequential decode steps than any other. A child is sampled
        from the same prefix whether it starts before or after the decision, and the decision
        reads only its parent's tokens, so no distribution changes. It pays where decoding is
        bound by sequential steps (the HF engine); where cost follows tokens computed (vLLM on
        CPU), the dropped children and the split segments cost more than it saves."""
        deciding = [p for p in active if p.after_tool and p.may_branch and _can_branch(budgets[p.tree])]
        heads: dict[int, Generation] = {}
        if deciding:
            heads, forked = self._decide_forks(trees, budgets, active, deciding, rng, seed, stats)
            active = active + forked
        deciding_ids = {id(p) for p in deciding}
        unfinished = [p for p in active if id(p) not in heads or not _ended(heads[id(p)], self._room(trees, p))]
        tails = self._generate(trees, unfinished, heads, None, seed * 2, stats)

        pending = []
        for path in active:
            generation = _joined(heads.get(id(path)), tails.get(id(path)))
            call = self._add_generation(trees[path.tree], path, generation, id(path) in deciding_ids, stats)
            if call is not None:
                pending.append((path, call))
        return pending

    def _decide_forks(
        self, trees, budgets, active, deciding, rng, seed, stats
    ) -> tuple[dict[int, Generation], list[RolloutPath]]:
        """Phase 1 of ``_generate_round``: the first k tokens of the ``deciding`` paths (with
        ``early_children``, of every active path and of the candidates' would-be children), and
        the fork each candidate's tokens decide. Returns (the k-token heads by path id, the
        children forked)."""
        s = self.settings
        tentative = {id(path): [] for path in deciding}
        if self.early_children:
            reserved = Counter()
            for path in deciding:
                budget = budgets[path.tree]
                n = min(budget.children_per_branch(), budget.branches_remaining - reserved[path.tree])
                reserved[path.tree] += n
                tentative[id(path)] = [self._child(path) for _ in range(n)]
        phase_one = (active if self.early_children else deciding) + [c for cs in tentative.values() for c in cs]
        heads = self._generate(trees, phase_one, {}, s.entropy_window, seed * 2 + 1, stats)
        forked = []
        for path in deciding:
            window = window_mean_entropy(heads[id(path)].entropies, s.entropy_window)
            tree, budget = trees[path.tree], budgets[path.tree]
            kept, dropped = self._decide_branch(tree, path, window, budget, tentative[id(path)], rng, stats)
            forked += kept
            stats.discarded_tokens += sum(len(heads[id(child)].token_ids) for child in dropped)
        return heads, forked

    def _add_generation(
        self, tree: RolloutTree, path: RolloutPath, generation: Generation, decided_fork: bool, stats: RolloutStats
    ) -> ToolCall | None:
        """Append ``generation`` to ``path`` as a model segment and record its window entropy:
        H_initial on the path's first segment, after a tool result a tool entropy (and dH where the
        path was no fork candidate, ``decided_fork`` False: a candidate's dH is recorded by its
        decision). Returns the tool call the generation ends with, or None where the path ends."""
        segment = tree.add_segment(
            path.node,
            generation.token_ids,
            SegmentKind.MODEL,
            logprobs=generation.logprobs,
            entropies=generation.entropies,
        )
        window = window_mean_entropy(generation.entropies, self.settings.entropy_window)
        if path.h_initial is None:
            path.h_initial = window
        elif path.after_tool:
            path.tool_entropies.append(window)
            if not decided_fork:
                stats.delta_entropies.append(window - path.h_initial)
                tree.segments[path.node].branch_point = BranchPoint(path.h_initial, window, None, "no budget")
        path.node, path.after_tool = segment, False
        if generation.finish_reason != "stop":
            reason = generation.finish_reason
        elif (call := find_tool_call(self.engine.tokenizer.decode(generation.token_ids), self.tool_names)) is None:
            reason = "bad_tool_call"
        elif path.tool_calls >= self.settings.max_tool_calls:
            reason = "max_tool_calls"
        else:
            return call
        finish_path(tree, path, reason, stats)
        return None

    def _room(self, trees, path: RolloutPath) -> int:
        """Tokens the path may still generate: max_response_tokens minus its response so far."""
        return self.settings.max_response_tokens - len(trees[path.tree].response_ids(path.node))

    def _generate(self, trees, paths, heads, max_new_tokens, seed, stats) -> dict[int, Generation]:
        """Continue ``paths`` (after their phase-1 head, if any) in one engine call; generations
        are cut to each path's room, and a cut one is marked ``length``."""
        if not paths:
            return {}
        s = self.settings
        prefixes, limits = [], []
        for path in paths:
            tree = trees[path.tree]
            head = heads[id(path)].token_ids if id(path) in heads else []
            response = tree.response_ids(path.node)
            prefixes.append(tree.prompt_ids + response + head)
            limits.append(s.max_response_tokens - len(response) - len(head))
        cap = max(limits) if max_new_tokens is None else min(max_new_tokens, max(limits))
        params = SamplingParams(
            max_new_tokens=cap,
            temperature=s.temperature,
            top_p=s.top_p,
            stop_strings=self.stop_strings,
            seed=seed * 1_000_003 + stats.rounds,
        )
        start = time.perf_counter()
        generations = self.engine.generate(prefixes, params)
        stats.generation_s += time.perf_counter() - start
        out = {}
        for path, generation, limit in zip(paths, generations, limits):
            n = min(len(generation.token_ids), limit)
            cut = n < len(generation.token_ids) or (generation.finish_reason == "length" and n >= limit)
            out[id(path)] = Generation(
                token_ids=list(generation.token_ids[:n]),
                logprobs=list(generation.logprobs[:n]),
                entropies=list(generation.entropies[:n]),
                finish_reason="length" if cut else generation.finish_reason,
                stop_string=None if cut else generation.stop_string,
            )
        return out

    def _decide_branch(
        self, tree, path, window_entropy, budget, tentative, rng, stats
    ) -> tuple[list[RolloutPath], list[RolloutPath]]:
        """Ask the branching policy with dH = H_t - H_initial, and keep what it decided on the
        tool segment the path stands after (``BranchPoint``). On a fork the budget grants up to
        Z - 1 children: the tentative (early) ones first, then new ones starting in phase 2.
        Returns (children, dropped tentative ones)."""
        delta = window_entropy - path.h_initial
        stats.delta_entropies.append(delta)
        probability = self.branching.branch_probability(delta, path.consecutive_branches)
        if not self.branching.should_branch(delta, path.consecutive_branches, rng):
            path.consecutive_branches = 0
            tree.segments[path.node].branch_point = BranchPoint(path.h_initial, window_entropy, probability, "no fork")
            return [], tentative
        path.consecutive_branches += 1
        granted = budget.record_branch(budget.children_per_branch())
        tree.segments[path.node].branch_point = BranchPoint(
            path.h_initial, window_entropy, probability, "fork", granted
        )
        stats.branches += granted
        children = tentative[:granted] + [self._child(path) for _ in range(granted - len(tentative))]
        for child in children:
            child.consecutive_branches = path.consecutive_branches
        return children, tentative[granted:]

    @staticmethod
    def _child(path: RolloutPath) -> RolloutPath:
        """A new path that resamples from the end of ``path``'s tool result (the fork point)."""
        return RolloutPath(
            tree=path.tree,
            node=path.node,
            h_initial=path.h_initial,
            tool_calls=path.tool_calls,
            tool_entropies=list(path.tool_entropies),
            episode=path.episode.fork() if path.episode is not None else None,
        )

    # --- AEPO pre-monitoring ---------------------------------------------------------------
    def _budget_from_probe(self, probe: RolloutPath) -> BranchBudget:
        """m = aepo_global_samples(M, H_root, mean H_tool) from the probe trajectory; a probe that
        called no tool gives H_tool = H_root (no evidence either way: m = M / 2 rounded half up)."""
        s = self.settings
        root = probe.h_initial
        tool = float(np.mean(probe.tool_entropies)) if probe.tool_entropies else root
        m = aepo_global_samples(s.total_rollouts, root, tool, s.aepo_sensitivity)
        return BranchBudget(s.total_rollouts, m, s.branch_factor)
