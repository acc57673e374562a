"""The tool half of a tree rollout's round (``rollout.tree_rollout``): the paths that closed a
tool's tag have their calls run in parallel (``tools.base.ToolExecutor``), and those that closed
the environment's action tag step their own instance (``rollout.episodes``); each answer is
appended to its path as a TOOL segment ``" <result>...</result>"`` (loss-masked), with an action's
reward on the segment it ends, and the environment's ``done`` or error ends the trajectory.
"""

from __future__ import annotations

import time

from rllib_arpo.core.tree import SegmentKind
from rllib_arpo.rollout.engine import GenerationEngine
from rllib_arpo.rollout.episodes import ENV_ERROR, Episodes
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.rollout.tree_paths import RolloutPath, finish_path
from rllib_arpo.tools.base import ToolCall, ToolExecutor, encode_tool_result


class ToolRound:
    """Runs a round's tool calls and environment actions (``action_tag``: the environment's tag,
    None without one); ``engine``'s tokenizer encodes their answers."""

    def __init__(
        self,
        engine: GenerationEngine,
        tools: ToolExecutor,
        episodes: Episodes | None,
        action_tag: str | None,
        settings: RolloutSettings,
    ):
        self.engine = engine
        self.tools = tools
        self.episodes = episodes
        self.action_tag = action_tag
        self.settings = settings

    def run(self, trees, pending: list[tuple[RolloutPath, ToolCall]], stats) -> list[RolloutPath]:
        """Run the round's tool calls and environment actions and append what they answered;
        returns the paths that go on."""
        if not pending:
            return []
        calls = [(path, call) for path, call in pending if call.name != self.action_tag]
        actions = [(path, call) for path, call in pending if call.name == self.action_tag]
        start = time.perf_counter()
        results = self.tools.run([call for _, call in calls])
        stats.tool_s += time.perf_counter() - start
        continuing = []
        for (path, call), result in zip(calls, results):
            if self._append_answer(trees[path.tree], path, call.name, result.text, stats):
                continuing.append(path)
        outcomes = self.episodes.step([(path.episode, call.query) for path, call in actions]) if actions else []
        for (path, call), outcome in zip(actions, outcomes):
            tree = trees[path.tree]
            tree.segments[path.node].reward = outcome.reward  # r_t of the action that ends this segment
            failed = outcome.error is not None
            overflow = ENV_ERROR if failed else "length"
            if not self._append_answer(tree, path, call.name, outcome.observation, stats, overflow):
                continue
            if failed or outcome.done:
                finish_path(tree, path, ENV_ERROR if failed else "env_done", stats)
            else:
                continuing.append(path)
        order = {id(path): k for k, (path, _) in enumerate(pending)}
        return sorted(continuing, key=lambda path: order[id(path)])

    def _append_answer(self, tree, path: RolloutPath, name: str, text: str, stats, overflow: str = "length") -> bool:
        """Append a tool's result or an environment's observation to the path as a TOOL segment;
        False where it does not fit the response budget and the path ended (finish reason
        ``overflow``: ``env_error`` for an environment's error, which ends the path either way)."""
        s = self.settings
        result_ids = encode_tool_result(self.engine.tokenizer, text, s.max_tool_result_tokens)
        if len(tree.response_ids(path.node)) + len(result_ids) >= s.max_response_tokens:
            finish_path(tree, path, overflow, stats)
            return False
        path.node = tree.add_segment(path.node, result_ids, SegmentKind.TOOL, tool_name=name)
        path.tool_calls += 1
        path.after_tool = True
        return True
