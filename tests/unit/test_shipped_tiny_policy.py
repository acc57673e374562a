"""The tiny policy shipped with the package (``model_path: tiny``, ``models.catalogue.SHIPPED_TINY_POLICY``):
found without a build, and the same policy on every machine, so the laptop demo starts from the
same place everywhere."""

import dataclasses
from pathlib import Path

import torch

import rllib_arpo.tools  # noqa: F401  (registers the tools)
from rllib_arpo.core.branching import NoBranching
from rllib_arpo.core.settings import from_config
from rllib_arpo.data.dataset_tools import tools_for_dataset
from rllib_arpo.data.prompts import encode_prompt
from rllib_arpo.data.registry import load_dataset
from rllib_arpo.experiment.checks import check_config
from rllib_arpo.experiment.file import load_experiments
from rllib_arpo.models.cache import holds_saved_model
from rllib_arpo.models.catalogue import SHIPPED_TINY_POLICY, resolve_model_path
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.hf_engine import HFEngine
from rllib_arpo.rollout.scoring import score_trees
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.rollout.tree_rollout import TreeRollout
from rllib_arpo.tools.base import ToolExecutor, build_tools

DEMO = Path(__file__).resolve().parents[2] / "tuned_examples" / "arpo_tiny.yaml"

GREEDY_ANSWERS = (
    "1950", "401625", "33336", "1834", "186017", "451", "15307", "341538", None, "2004", "72877", "457199",
)  # fmt: skip
"""The shipped policy's greedy answers to the first 12 test-split questions of the demo's dataset
(search, python, both, in turn), as its build gave them: 9 right; "15307" for 153075, no answer for
61, "457199" for 502909. Greedy over all 192: 0.792."""


MIN_GAP_FLOAT64 = 1e-9
"""Smallest gap allowed between the top two float64 logits at a greedy step. Every matrix product
of the policy sums at most 256 terms (the MLP's width) whose absolute values add up to less than 20
on these questions, so any summation order moves a sum by at most 256 * 2**-53 * 20 < 1e-12
(Higham's gamma_n bound); 1e-9 leaves a factor of 1000 for the growth of such errors through the two
layers. The gaps on these questions are 0.17 and more."""


def test_model_path_tiny_is_the_shipped_policy_and_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RLLIB_ARPO_CACHE", str(tmp_path / "cache"))
    assert resolve_model_path("tiny") == str(SHIPPED_TINY_POLICY)
    assert not (tmp_path / "cache").exists()  # nothing built or cached
    assert holds_saved_model(SHIPPED_TINY_POLICY)
    assert sum(path.stat().st_size for path in SHIPPED_TINY_POLICY.iterdir()) < 2 * 2**20  # float32, 0.4M weights


def test_the_shipped_policy_answers_the_held_out_questions_as_when_it_was_built():
    [experiment] = load_experiments(str(DEMO)).values()
    config = check_config(experiment["config"])
    spec = {**config.dataset, "split": "test"}
    examples = load_dataset(spec)[: len(GREEDY_ANSWERS)]
    engine = HFEngine.from_pretrained(resolve_model_path(config.model_path), dtype=torch.float32)
    tools = ToolExecutor(build_tools(tools_for_dataset(config.tools, spec)), timeout_s=config.tool_timeout_s)
    settings = dataclasses.replace(
        from_config(RolloutSettings, config), total_rollouts=1, initial_rollouts=1, temperature=0.0
    )
    tokenizer = engine.tokenizer
    with tools:
        trees, _ = TreeRollout(engine, tools, NoBranching(), settings).run(
            [encode_prompt(tokenizer, example) for example in examples], seed=0
        )
    scores = score_trees(trees, examples, tokenizer, from_config(RewardSettings, config), tuple(tools.tools))
    assert tuple(score.answer for [score] in scores) == GREEDY_ANSWERS

    # Machine-independent: every float32 greedy choice is the argmax of the float64 logits (the
    # exact ones, to the bound above), so every machine on which this holds follows the one exact
    # greedy path, whatever its float32 rounding.
    exact = engine.model.to(torch.float64)
    for tree in trees:
        [row] = tree.to_rows()
        ids = torch.tensor([*row.prompt_ids, *row.response_ids])
        with torch.no_grad():
            logits = exact(input_ids=ids[None]).logits[0]
        generated = [len(row.prompt_ids) + t for t, trained in enumerate(row.loss_mask) if trained]
        predicting = logits[[position - 1 for position in generated]]
        assert torch.equal(predicting.argmax(dim=-1), ids[generated])
        top_two = predicting.topk(2).values
        assert (top_two[:, 0] - top_two[:, 1]).min() > MIN_GAP_FLOAT64
