import pytest

from rllib_arpo.core.advantages import ADVANTAGE_ESTIMATORS
from rllib_arpo.core.loss_aggregation import LOSS_AGGREGATIONS
from rllib_arpo.core.losses import POLICY_LOSSES
from rllib_arpo.core.registry import Registry
from rllib_arpo.data.registry import DATASET_LOADERS
from rllib_arpo.environments import ENVIRONMENTS
from rllib_arpo.rollout.engine import ENGINES
from rllib_arpo.tools.base import TOOLS
from rllib_arpo.tools.search import SEARCH_BACKENDS


def test_register_get_and_list_names():
    colours = Registry("colour")

    @colours.register("red", "rouge")
    def red():
        return "#f00"

    colours.add("blue", "#00f")
    assert colours.get("rouge") is red and colours.get("blue") == "#00f"
    assert colours.names() == ["blue", "red", "rouge"] == list(colours)
    assert "red" in colours and "green" not in colours and len(colours) == 3


def test_a_taken_name_is_refused_and_the_same_object_may_register_again():
    colours = Registry("colour")
    colours.add("red", "#f00")
    colours.add("red", "#f00")  # a module imported twice registers the same object again
    with pytest.raises(ValueError, match="a colour named 'red' is already registered: '#f00'"):
        colours.add("red", "#e00")
    with pytest.raises(ValueError, match="at least one name"):
        colours.register()


def test_an_unknown_name_lists_the_known_ones_with_the_closest_as_a_hint():
    colours = Registry("colour")
    colours.add("green", 1)
    colours.add("grey", 2)
    with pytest.raises(ValueError, match=r"unknown colour 'gren' \(did you mean 'green'\?\); known: green, grey"):
        colours.get("gren")
    with pytest.raises(ValueError, match=r"unknown colour 'purple'; known: green, grey"):
        colours.get("purple")
    with pytest.raises(ValueError, match=r"unknown colour \['red'\]"):
        colours.get(["red"])  # an unhashable name from a YAML typo


@pytest.mark.parametrize(
    "registry, names",
    [
        (
            ADVANTAGE_ESTIMATORS,
            ["aepo", "arpo_hard", "arpo_soft", "dr_grpo", "grpo", "loop", "reinforce_pp", "rloo", "tree_steps"],
        ),
        (POLICY_LOSSES, ["aepo_clip", "cispo", "gppo", "ppo_clip", "sg_clip"]),
        (LOSS_AGGREGATIONS, ["seq-mean-token-mean", "seq-mean-token-sum", "token-mean"]),
        (TOOLS, ["browse", "python", "search"]),
        (SEARCH_BACKENDS, ["bm25", "cache", "http"]),
        (DATASET_LOADERS, ["jsonl", "parquet", "reasoning_gym", "session_lookup", "tir_task", "verifiers"]),
        (ENGINES, ["hf", "vllm"]),
        (ENVIRONMENTS, ["gymnasium", "mcp", "openenv", "python_session"]),
    ],
)
def test_every_concept_uses_the_one_registry_shape(registry, names):
    assert isinstance(registry, Registry)
    assert registry.names() == names
