import numpy as np
import pytest

from rllib_arpo.core.tree import RolloutTree, SegmentKind


def small_tree() -> RolloutTree:
    """prompt -> m0 [10, 11] -> search result [20] -> m2 [30]      (trajectory 0)
                                                 -> m3 [31, 32]  (trajectory 1)
    prompt -> m4 [40]                                            (trajectory 2)"""
    tree = RolloutTree(prompt_ids=[1, 2])
    m0 = tree.add_segment(None, [10, 11], "model", logprobs=[-0.1, -0.2], entropies=[0.5, 0.4])
    t1 = tree.add_segment(m0, [20], "tool", tool_name="search")
    m2 = tree.add_segment(t1, [30], "model", logprobs=[-0.3], entropies=[0.9])
    m3 = tree.add_segment(t1, [31, 32], "model", logprobs=[-0.4, -0.5], entropies=[0.1, 0.2])
    m4 = tree.add_segment(None, [40], "model", logprobs=[-0.6], entropies=[0.3])
    for leaf in (m2, m3, m4):
        tree.finish(leaf)
    return tree


def test_paths_members_and_counts():
    tree = small_tree()
    assert tree.num_trajectories == 3
    assert tree.trajectory_segments(1) == [0, 1, 3]
    assert tree.trajectory_response_ids(1) == [10, 11, 20, 31, 32]
    assert tree.segment_members() == [[0, 1], [0, 1], [0], [1], [2]]
    assert tree.tool_calls(0) == {"search": 1}
    assert tree.tool_calls(2) == {}
    # generated once each: 2 (m0) + 1 + 2 + 1 = 6 model tokens; tool token not counted
    assert tree.num_generated_tokens() == 6
    # the prompt has two children (m0, m4) and the search result has two (m2, m3)
    assert tree.num_branch_points() == 2


def test_rows_full_and_deduplicated():
    tree = small_tree()
    full = tree.to_rows()
    np.testing.assert_array_equal(full[1].response_ids, [10, 11, 20, 31, 32])
    np.testing.assert_array_equal(full[1].loss_mask, [1, 1, 0, 1, 1])  # tool token masked
    np.testing.assert_allclose(full[1].old_logprobs, [-0.1, -0.2, 0.0, -0.4, -0.5])
    np.testing.assert_array_equal(full[1].segment_ids, [0, 0, 1, 3, 3])
    np.testing.assert_array_equal(full[0].prompt_ids, [1, 2])

    dedup = tree.to_rows(dedupe=True)
    # m0 is owned by trajectory 0, so trajectory 1 keeps its tokens but does not train them
    np.testing.assert_array_equal(dedup[0].loss_mask, [1, 1, 0, 1])
    np.testing.assert_array_equal(dedup[1].loss_mask, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(dedup[2].loss_mask, [1])
    # every model token trained exactly once: 6 trained tokens in total
    assert sum(r.loss_mask.sum() for r in dedup) == tree.num_generated_tokens()
    # the full view trains the shared m0 twice: 6 + 2 = 8
    assert sum(r.loss_mask.sum() for r in full) == 8


def test_invalid_building_is_rejected():
    tree = RolloutTree(prompt_ids=[1])
    with pytest.raises(ValueError, match="tool_name"):
        tree.add_segment(None, [5], SegmentKind.TOOL)
    with pytest.raises(ValueError, match="logprobs"):
        tree.add_segment(None, [5, 6], "model", logprobs=[-1.0])
    with pytest.raises(IndexError):
        tree.add_segment(3, [5], "model")
    m = tree.add_segment(None, [5], "model")
    child = tree.add_segment(m, [6], "model")
    with pytest.raises(ValueError, match="children"):
        tree.finish(m)
    tree.finish(child)
    with pytest.raises(ValueError, match="already"):
        tree.finish(child)
    with pytest.raises(ValueError, match="cannot get children"):
        tree.add_segment(child, [7], "model")
