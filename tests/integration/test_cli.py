"""The ``rllib train file`` console script on the tiny tuned example."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_arpo.experiment.checks import RESULT_GROUPS, RESULT_VALUES, ConfigError
from rllib_arpo.experiment.file import load_experiments

REPO = Path(__file__).resolve().parents[2]


def test_rllib_train_file_tiny_yaml_in_a_ray_started_again_writes_tensorboard_and_metrics(
    ray_session, start_ray, tiny_policy_cache, tmp_path, capsys, browser
):
    """``rllib train file`` (its ``main``, in this process: the console script's own start is
    test_cli_exits_with_a_clear_message_on_a_bad_file's) on the tiny tuned example, two iterations.

    It runs in a Ray started again: Tune's registry of trainables lives in the Ray session, so
    after ``ray.shutdown()`` and a new ``ray.init()`` (a notebook, or this pytest process between
    test files) ``run: ARPO`` must still be known. The algorithm module is imported before the
    restart, as in a notebook: its import registers the trainables in the Ray of that moment, so
    imported only by ``main`` after the restart it would register them itself. (Broken on purpose:
    without train_file's ``register_trainables()``, "Unknown trainable: ARPO".)"""
    import ray

    import rllib_arpo.algorithm  # noqa: F401  (registers the trainables in the Ray before the restart)
    from rllib_arpo.cli import main

    ray.shutdown()
    start_ray()  # after tiny_policy_cache: its workers find RLLIB_ARPO_CACHE
    command = [
        "train", "file", str(REPO / "tuned_examples" / "arpo_tiny.yaml"),
        "--stop", '{"training_iteration": 2}', "--config", '{"held_out_size": 4}', "--storage-path", str(tmp_path),
    ]  # fmt: skip
    assert main(command) == 0
    stdout = capsys.readouterr().out
    result_files = list(tmp_path.glob("arpo-tiny/*/result.json"))
    assert len(result_files) == 1
    results = [json.loads(line) for line in result_files[0].read_text().splitlines()]
    assert [r["training_iteration"] for r in results] == [1, 2]
    last = results[-1]
    for key in ("reward_mean", "reward_max", "accuracy", "format_error_rate", "branches",
                "entropy_change_after_tool", "trajectories_per_s", "generated_tokens_per_s",
                "tool_calls_per_trajectory/search", "tool_calls_per_trajectory/python",
                "trained_reward_mean", "response_tokens_mean"):  # fmt: skip
        assert key in last["env_runners"], key
    for key in ("policy_loss", "clip_fraction", "approx_kl", "gradients_default_optimizer_global_norm",
                "logprob_mismatch_kl", "logprob_mismatch_max_abs", "first_ratio_std",
                "first_ratio_max_deviation"):  # fmt: skip
        assert key in last["learners"]["default_policy"], key
    # the HF engine samples with the learner's own float32 forward: they agree on every token
    assert last["learners"]["default_policy"]["logprob_mismatch_max_abs"] < 1e-4
    assert last["weights_version"] == 2 and "weight_sync_s" in last
    # every number and group of a result can be named by a stop key (experiment/checks.py: check_stop)
    numbers = {key for key, value in last.items() if isinstance(value, int | float) and not isinstance(value, bool)}
    assert numbers - {"pid"} <= set(RESULT_VALUES)
    assert {key for key, value in last.items() if isinstance(value, dict)} - {"config"} <= set(RESULT_GROUPS)
    assert list(result_files[0].parent.glob("events.out.tfevents.*")), "no TensorBoard event file"
    # the held-out split ran before the first update; the report table and plot were written
    assert results[0]["evaluation_before_training"]["after_iteration"] == 0
    assert "held-out split" in stdout
    # and where the two iterations' time went, their parts summed (eval.report.time_split)
    assert "where the time went" in stdout
    assert f"{'all iterations':<26}{sum(r['time_this_iter_s'] for r in results):>14.1f}" in stdout
    assert (result_files[0].parent / "training.png").is_file()
    # the run report: two trees saved per iteration, and the page that draws them
    trial = result_files[0].parent
    saved = [json.loads(line) for line in (trial / "rollout_trees.jsonl").read_text().splitlines()]
    assert [(entry["iteration"], len(entry["trees"])) for entry in saved] == [(1, 2), (2, 2)]
    for tree in (tree for entry in saved for tree in entry["trees"]):
        assert len(tree["leaves"]) == 8  # M trajectories, each ending at a model span
        assert all(tree["segments"][leaf["segment"]]["kind"] == "model" for leaf in tree["leaves"])
        # every trajectory starts at the prompt or is a child forked at a tool result
        roots = sum(s["parent"] is None for s in tree["segments"])
        assert roots + sum(s.get("branch", {}).get("children", 0) for s in tree["segments"]) == 8
    assert f"report: {trial / 'report.html'}" in stdout
    forked = [
        (entry["iteration"], index, tree)
        for entry in saved
        for index, tree in enumerate(entry["trees"])
        if any(s.get("branch", {}).get("children") for s in tree["segments"])
    ]
    assert forked, "no saved tree forked: nothing to draw as a tree"
    check_report_in_browser(browser, trial / "report.html", saved[-1]["trees"][0], forked[0])


def check_report_in_browser(browser, page_path: Path, first_shown: dict, forked: tuple[int, int, dict]) -> None:
    """The page opens with the last iteration's first tree and draws it span for span, and so it
    does a tree that forked, chosen in its menus; a click on a span's summary expands it; a
    leaf's transcript shows its path."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(page_path.as_uri())
    spans = page.locator("#tree .span")
    assert spans.count() == len(first_shown["segments"])
    iteration, index, shown_tree = forked
    page.select_option("#tree-group", label=f"iteration {iteration}")
    page.select_option("#tree-choice", label=f"prompt {index + 1}")
    assert spans.count() == len(shown_tree["segments"])
    check_shape(drawn_shape(page), shown_tree["segments"])
    assert page.locator("#tree .note").count() == 0
    first = spans.first
    assert first.get_attribute("open") is None
    first.locator("summary").first.click()
    assert first.get_attribute("open") is not None
    assert shown_tree["segments"][0]["text"].strip()[:20] in first.inner_text()
    page.locator("#tree .show-transcript").first.click()
    assert shown_tree["prompt"].strip()[:20] in page.locator("#transcript").inner_text()
    assert errors == []
    page.close()


BLOCKS_OF_SPANS = """() => {
  const blocks = [document.getElementById("tree"), ...document.querySelectorAll("#tree .branch")];
  return [...document.querySelectorAll("#tree .span")].map((span) => {
    const block = span.closest(".branch, #tree");
    const outer = block.parentElement.closest(".branch, #tree");
    return [+span.dataset.segment, blocks.indexOf(block), blocks.indexOf(outer)];
  });
}"""
"""For each drawn span: its segment, the block it is drawn in (0: the tree, k: the k-th branch
block) and the block that block hangs in."""


def drawn_shape(page) -> dict[int, tuple[int, int]]:
    return {segment: (block, outer) for segment, block, outer in page.evaluate(BLOCKS_OF_SPANS)}


def check_shape(drawn: dict[int, tuple[int, int]], segments: list[dict]) -> None:
    """The tree as the page must draw it, in the blocks of ``drawn_shape``: an only child stays in
    its parent's block (a chain reads down one column), each child of a fork gets a branch block
    of its own, directly inside its parent's block."""
    children = {None: []} | {i: [] for i in range(len(segments))}
    for i, segment in enumerate(segments):
        children[segment["parent"]].append(i)
    assert sorted(drawn) == list(range(len(segments)))
    for parent, below in children.items():
        block_of_parent = 0 if parent is None else drawn[parent][0]
        for child in below:
            block, outer = drawn[child]
            if len(below) == 1:
                assert block == block_of_parent, f"segment {child}, the only child of {parent}, left its block"
            else:
                assert block != block_of_parent and outer == block_of_parent, (
                    f"segment {child} is no branch of {parent}"
                )
    forks = [below for below in children.values() if len(below) > 1]
    assert len({drawn[child][0] for below in forks for child in below}) == sum(map(len, forks))  # a block each


def write(tmp_path, text: str) -> str:
    path = tmp_path / "experiment.yaml"
    path.write_text(text)
    return str(path)


def test_unknown_run_and_config_keys_are_reported(tmp_path):
    with pytest.raises(ConfigError, match="unknown run: 'PPO2'"):
        load_experiments(write(tmp_path, "x:\n  run: PPO2\n  config: {}\n"))
    with pytest.raises(ConfigError, match="unknown config key 'totl_rollouts'.*total_rollouts"):
        load_experiments(write(tmp_path, "x:\n  run: ARPO\n  config: {totl_rollouts: 4}\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_experiments(str(tmp_path / "missing.yaml"))


def test_stop_and_config_overrides_and_grid_search_are_read(tmp_path):
    path = write(
        tmp_path,
        "x:\n  run: ARPO\n  stop: {training_iteration: 50}\n"
        "  config: {model_path: tiny, tau: {grid_search: [0.3, 0.5]}, lr: 0.1}\n",
    )
    experiments = load_experiments(path, stop_override={"training_iteration": 2}, config_override={"lr": 0.5})
    assert experiments["x"]["stop"] == {"training_iteration": 2}
    assert experiments["x"]["config"] == {"model_path": "tiny", "tau": {"grid_search": [0.3, 0.5]}, "lr": 0.5}
    with pytest.raises(ConfigError, match="unknown config key 'lrr'"):
        load_experiments(path, config_override={"lrr": 0.5})


MODELS_TO_BRING = {
    "arpo_qwen.yaml",
    "arpo_qwen_1gpu.yaml",
    "arpo_qwen_lora_1gpu.yaml",
    "arpo_qwen_8gpu.yaml",
    "arpo_qwen_nodes.yaml",
    "arpo_smollm2.yaml",
    "arpo_smollm2_arithmetic.yaml",
    "arpo_smollm2_session.yaml",
}
"""Tuned examples whose model_path is the user's own directory (a Qwen2.5 checkpoint, the cold start)."""


@pytest.mark.parametrize("example", sorted((REPO / "tuned_examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_tuned_example_loads_and_validates(example, tiny_policy_cache, arpo_data):
    override = {"model_path": "tiny"} if example.name in MODELS_TO_BRING else None
    for experiment in load_experiments(str(example), config_override=override).values():
        assert experiment["config"]
    if override:
        with pytest.raises(ConfigError, match="model_path: '.*' (holds no config.json|not found)"):
            load_experiments(str(example))


def test_dry_run_of_the_paper_config_checks_all_and_prints_resources_and_prompts(smollm2_path, arpo_data):
    """The paper setting as shipped, its data found beside the repository; SmolLM2 stands in for
    Qwen2.5-7B-Instruct (the same ChatML template), which is not available offline."""
    env = {**os.environ, "RLLIB_ARPO_CACHE": str(Path(smollm2_path).parent)}
    command = [
        sys.executable, "-m", "rllib_arpo.cli", "train", "file", str(REPO / "tuned_examples" / "arpo_qwen.yaml"),
        "--dry-run", "--config", '{"model_path": "smollm2-135m"}',
    ]  # fmt: skip
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd="/")
    assert completed.returncode == 0, completed.stderr[-3000:]
    out = completed.stdout
    sections = [line for line in out.splitlines() if line.startswith("== ")]
    assert sections == [
        "== experiment ==", "== resources ==", "== learner memory ==", "== response budget ==", "== prompts ==",
        "== environment ==",
    ]  # fmt: skip
    assert "== response budget ==\ndataset type 'parquet' declares no reference solutions" in out
    assert "== environment ==\nnone (stateful_env: null): the tools answer each call afresh" in out
    # 1 CPU for the algorithm, 2 EnvRunners with 1 CPU and 1 GPU each, 2 learners with 1 GPU each
    assert "one trial asks Ray for 3 CPU, 4 GPU (placement group, strategy PACK)" in out
    layout = "2 x torch learner, dtype bfloat16, packing tree, micro_batch_tokens 4096"
    assert f"one learner, per GPU: {layout}, rows of " in out
    assert "GiB per GPU" in out
    data = arpo_data.resolve()
    assert f'dataset: {{"type": "parquet", "path": "{data}/rl_datasets/train_10k.parquet"}}' in out
    # the first training prompt, exactly as the model reads it: the reference system prompt in ChatML
    assert "--- prompt 1 (training, DR_grpo_mix," in out
    assert "<|im_start|>system\nYou are a helpful assistant that can solve the given question" in out
    assert out.count("<|im_start|>assistant\n") == 3  # two training prompts and one held-out
    assert out.count("\\x08oxed{answer here}") == 3  # the data's mangled \boxed, shown, not hidden
    assert "Started a local Ray instance" not in out + completed.stderr


def test_cli_exits_with_a_clear_message_on_a_bad_file(tmp_path):
    path = write(tmp_path, "x:\n  run: NOPE\n")
    completed = subprocess.run(
        [sys.executable, "-m", "rllib_arpo.cli", "train", "file", path], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 2
    known = "['AEPO', 'ARPO', 'CISPO', 'DAPO', 'DrGRPO', 'GPPO', 'GRPO', 'LOOP', 'REINFORCE++']"
    assert completed.stderr == f"rllib: error: {path}: experiment 'x': unknown run: 'NOPE'; known: {known}\n"


def test_search_spaces_and_the_asha_scheduler_are_read(tmp_path):
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.sample import Categorical, Float, Integer

    from rllib_arpo.commands.train import _scheduler, _search_space_to_tune

    space = _search_space_to_tune(
        {"alpha": {"uniform": [0.3, 0.7]}, "beta": {"choice": [0.1, 0.2]}, "lr": {"loguniform": [1e-6, 1e-4]},
         "initial_rollouts": {"randint": [2, 5]}, "tools": {"search": {"top_k": 2}}, "tau": 0.5}
    )  # fmt: skip
    assert isinstance(space["alpha"], Float) and (space["alpha"].lower, space["alpha"].upper) == (0.3, 0.7)
    assert isinstance(space["beta"], Categorical) and space["beta"].categories == [0.1, 0.2]
    assert isinstance(space["lr"], Float) and isinstance(space["initial_rollouts"], Integer)
    assert space["tools"] == {"search": {"top_k": 2}} and space["tau"] == 0.5
    scheduler = _scheduler({"type": "asha", "metric": "env_runners/reward_mean", "mode": "max", "max_t": 4}, "x")
    assert isinstance(scheduler, ASHAScheduler) and scheduler.metric == "env_runners/reward_mean"
    assert _scheduler(None, "x") is None
    with pytest.raises(ConfigError, match="unknown scheduler type 'pbt'"):
        _scheduler({"type": "pbt", "metric": "m", "mode": "max"}, "x")
    with pytest.raises(ConfigError, match=r"scheduler needs \['mode'\]"):
        _scheduler({"type": "asha", "metric": "m"}, "x")
    with pytest.raises(ConfigError, match="experiment 'x': bad scheduler option: .*'grace'"):
        _scheduler({"type": "asha", "metric": "m", "mode": "max", "grace": 1}, "x")
