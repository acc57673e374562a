"""The run report's tree records: spans, fork decisions, rewards and the advantage attribution of
shared spans, exact on a tree traced by hand."""

import json

import pytest

from rllib_arpo.core.advantages import compute_advantages
from rllib_arpo.core.tree import BranchPoint, RolloutTree
from rllib_arpo.eval.saved_trees import append_saved_trees, read_saved_trees, span_attribution, tree_record


def branched_tree() -> RolloutTree:
    """traj 0: m0 [10, 11] + search [20] + m2 [30]; traj 1: m0 + search + m3 [31, 32]; traj 2: m4 [40].
    The search result forked once (dH = 0.5)."""
    tree = RolloutTree(prompt_ids=[1])
    m0 = tree.add_segment(None, [10, 11], "model", entropies=[0.5, 0.25])
    t1 = tree.add_segment(m0, [20], "tool", tool_name="search")
    tree.segments[t1].branch_point = BranchPoint(0.25, 0.75, 0.625, "fork", 1)
    m2 = tree.add_segment(t1, [30], "model", entropies=[0.5])
    m3 = tree.add_segment(t1, [31, 32], "model", entropies=[0.5, 1.0])
    m4 = tree.add_segment(None, [40], "model", entropies=[0.25])
    for leaf in (m2, m3, m4):
        tree.finish(leaf, "eos")
    return tree


# rewards 1, 0, 0.5: mean 0.5, sample std 0.5, so GRPO's A_i (eps 0) are exactly 1, -1, 0
REWARDS = [1.0, 0.0, 0.5]


def record_of(estimator: str) -> dict:
    tree = branched_tree()
    attributed = compute_advantages(estimator, [tree], [REWARDS], eps=0.0)
    attribution = span_attribution(tree, attributed.rows, attributed.advantages)
    return tree_record(tree, lambda ids: " ".join(map(str, ids)), REWARDS, [1.0, 0.0, 0.0], attribution, "7")


@pytest.mark.parametrize(
    ("estimator", "shared_span"),
    [
        ("arpo_soft", [[0, 1.0], [1, -1.0]]),  # trained in both rows, each with its own A_i
        ("arpo_hard", [[0, 0.0]]),  # trained once, in the first row, with mean(A_0, A_1)
    ],
)
def test_a_shared_span_records_the_rows_that_train_it_and_its_advantage_there(estimator, shared_span):
    record = record_of(estimator)
    segments = record["segments"]
    assert [s["trained"] for s in segments if s["kind"] == "model"] == [
        shared_span,
        [[0, 1.0]],
        [[1, -1.0]],
        [[2, 0.0]],
    ]
    assert [leaf["advantage"] for leaf in record["leaves"]] == [1.0, -1.0, 0.0]


def test_a_record_holds_the_spans_the_fork_and_each_leaf():
    record = record_of("arpo_soft")
    assert record["prompt"] == "1" and record["ground_truth"] == "7"
    first, search = record["segments"][:2]
    assert {k: v for k, v in first.items() if k != "trained"} == {
        "parent": None,
        "kind": "model",
        "text": "10 11",
        "tokens": 2,
        "members": [0, 1],
        "entropy": 0.375,
    }
    assert search == {
        "parent": 0,
        "kind": "tool",
        "text": "20",
        "tokens": 1,
        "members": [0, 1],
        "tool": "search",
        "branch": {"h_initial": 0.25, "h_after": 0.75, "dh": 0.5, "p": 0.625, "decision": "fork", "children": 1},
    }
    assert record["leaves"] == [
        {"segment": 2, "reward": 1.0, "correct": 1.0, "finish": "eos", "advantage": 1.0},
        {"segment": 3, "reward": 0.0, "correct": 0.0, "finish": "eos", "advantage": -1.0},
        {"segment": 4, "reward": 0.5, "correct": 0.0, "finish": "eos", "advantage": 0.0},
    ]
    json.dumps(record)  # JSON-ready as it is


def test_a_span_below_a_fork_keeps_its_step_term_which_tree_steps_adds():
    # m2 leaves the fork t1: V(m2) - V(t1) = 1 - 1/2, over std 1/2: +1 (the record's eps 1e-6
    # moves it by 2e-6, under the 1e-4 kept); m3: 0 - 1/2: -1; m0 and m4 hang below the prompt
    record = record_of("tree_steps")
    model = [s for s in record["segments"] if s["kind"] == "model"]
    assert [s.get("step") for s in model] == [None, 1.0, -1.0, None]
    # tree_steps trains each span once with the hard advantage plus step_weight (1) times S
    assert [s["trained"] for s in model] == [[[0, 0.0]], [[0, 2.0]], [[1, -2.0]], [[2, 0.0]]]


def test_an_evaluation_record_has_no_attribution_and_mismatched_scores_are_refused():
    tree = branched_tree()
    record = tree_record(tree, str, REWARDS, [1.0, 0.0, 0.0])
    assert all("trained" not in s and "step" not in s for s in record["segments"])
    assert [leaf["advantage"] for leaf in record["leaves"]] == [None, None, None]
    with pytest.raises(ValueError, match="2 rewards, 3 scores for 3 trajectories"):
        tree_record(tree, str, REWARDS[:2], [1.0, 0.0, 0.0])


def test_the_last_line_of_an_iteration_counts_and_a_cut_off_line_is_counted(tmp_path):
    path = tmp_path / "rollout_trees.jsonl"
    append_saved_trees(path, 1, 0, [{"first": True}])
    append_saved_trees(path, 2, 1, [])
    append_saved_trees(path, 1, 0, [{"first": False}])  # iteration 1 again, after a resume
    with open(path, "a") as file:
        file.write('{"iteration": 4, "trees": null}\n{"trees": []}\n')  # lines of something else
        file.write('{"iteration": 3, "trees": [{"cut')  # a kill mid-write
    saved, unreadable = read_saved_trees(path)
    assert list(saved) == [1, 2] and saved[1]["trees"] == [{"first": False}] and unreadable == 3
    assert read_saved_trees(tmp_path / "absent.jsonl") == ({}, 0)


def test_a_lone_surrogate_is_saved_and_read_back_as_itself(tmp_path):
    """``"\\ud800"`` in a jsonl answer is a Python str but no UTF-8: saving the trees raised
    UnicodeEncodeError and stopped the run (again on resume). (Broken on purpose: without
    ``errors="backslashreplace"`` this raises.)"""
    path = tmp_path / "rollout_trees.jsonl"
    append_saved_trees(path, 1, 0, [{"prompt": "a\ud800b", "answer": "\udfff"}])
    saved, unreadable = read_saved_trees(path)
    assert saved[1]["trees"] == [{"prompt": "a\ud800b", "answer": "\udfff"}] and unreadable == 0


def test_a_line_cut_mid_character_is_counted_not_raised(tmp_path):
    """A kill in the middle of a two-byte character of the last line. (Broken on purpose: reading the
    file as strict UTF-8, as before, raises UnicodeDecodeError, and ``rllib report`` with it.)"""
    path = tmp_path / "rollout_trees.jsonl"
    append_saved_trees(path, 1, 0, [{"prompt": "café"}])
    append_saved_trees(path, 2, 1, [{"prompt": "café"}])
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex("é".encode()) + 1])  # the first of the é's two bytes
    saved, unreadable = read_saved_trees(path)
    assert list(saved) == [1] and saved[1]["trees"] == [{"prompt": "café"}] and unreadable == 1
