"""``scripts/compare_algorithms.py``'s power calculation and its configs from variants."""

import argparse

import numpy as np
import pytest


@pytest.mark.parametrize(("effect", "seeds"), [(0.5, 34), (0.8, 15), (1.0, 10)])
def test_seeds_for_power_match_the_paired_t_test_tables(load_script, effect, seeds):
    """Differences of mean d and standard deviation 1: the seeds of a one-sample (paired) t-test,
    two-sided at 5%, with 80% power at effect size d (Cohen 1988; G*Power: 34, 15 and 10)."""
    compare = load_script("compare_algorithms")
    half = 1 / np.sqrt(2)  # two values d +- 1/sqrt(2): standard deviation 1
    assert compare.seeds_for_power([effect + half, effect - half]) == seeds
    assert compare.seeds_for_power([-effect + half, -effect - half]) == seeds  # the sign does not matter
    assert compare.seeds_for_power([half, -half]) is None  # no difference to detect


def test_a_variant_is_the_first_file_with_its_fields_on_top(load_script):
    compare = load_script("compare_algorithms")
    args = argparse.Namespace(
        config_files=["tuned_examples/arpo_smollm2.yaml"],
        config={"model_path": "m", "seed": 3},
        variant=[["grpo", '{"branching": "none", "advantage_estimator": "grpo"}']],
    )
    assert compare.configs(args) == [
        ("arpo_smollm2", "tuned_examples/arpo_smollm2.yaml", {"model_path": "m", "seed": 3}),
        (
            "grpo",
            "tuned_examples/arpo_smollm2.yaml",
            {"model_path": "m", "seed": 3, "branching": "none", "advantage_estimator": "grpo"},
        ),
    ]
    args.variant.append(["arpo_smollm2", "{}"])
    with pytest.raises(SystemExit, match="names must differ"):
        compare.configs(args)


def test_after_is_never_the_evaluation_before_training(load_script):
    """The SmolLM2 recipe evaluates before the first update and at the end only: with the default
    two final evaluations, 'after' is the end's accuracy, not its mean with the start's."""
    compare = load_script("compare_algorithms")
    curve = [(0, {"accuracy": 0.6}), (20, {"accuracy": 0.9})]
    assert compare.before_and_last(curve, 2) == ({"accuracy": 0.6}, [{"accuracy": 0.9}])
    curve += [(40, {"accuracy": 0.8})]
    assert compare.before_and_last(curve, 2) == ({"accuracy": 0.6}, [{"accuracy": 0.9}, {"accuracy": 0.8}])
    assert compare.before_and_last(curve, 1) == ({"accuracy": 0.6}, [{"accuracy": 0.8}])


def test_a_results_file_resumes_only_with_the_recipe_its_runs_had(load_script, tmp_path):
    """Each run records its recipe; resuming with another file content, other overrides or other stop
    criteria stops before running anything, naming the runs that differ. A comment or another layout
    of the same content is the same recipe."""
    compare = load_script("compare_algorithms")
    config_file = tmp_path / "recipe.yaml"
    config_file.write_text("arpo: {run: ARPO, config: {lr: 1.0e-6}}\n")
    args = argparse.Namespace(
        config_files=[str(config_file)],
        config={"model_path": "m"},
        variant=[["grpo", '{"branching": "none"}']],
        stop=None,
    )
    ran = compare.recipe(str(config_file), {"model_path": "m", "branching": "none"}, None)
    # sha256sum of the content as sorted JSON: {"arpo": {"config": {"lr": 1e-06}, "run": "ARPO"}}
    assert ran["config_sha256"] == "bf5e3f4aa5baad1cfb5b7c2fba7506798d66e681ac1a9334ebe1387384081a3f"
    runs = [{"config": "grpo", "seed": 3, "recipe": ran}, {"config": "recipe", "seed": 3}]  # an older row: no recipe
    compare.check_recipes(args, runs)  # the same recipe: resumes
    for changed in ({"stop": {"training_iteration": 2}}, {"config": {"model_path": "other"}}):
        with pytest.raises(SystemExit, match=r"1 runs .* another recipe .*\(grpo seed 3\)"):
            compare.check_recipes(argparse.Namespace(**{**vars(args), **changed}), runs)
    config_file.write_text("# the recipe\narpo:\n  config:\n    lr: 0.000001  # a comment\n  run: ARPO\n")
    compare.check_recipes(args, runs)  # the same content, written otherwise: resumes
    config_file.write_text("arpo: {run: ARPO, config: {lr: 2.0e-6}}\n")
    with pytest.raises(SystemExit, match=r"grpo seed 3"):
        compare.check_recipes(args, runs)


def test_a_run_cut_off_midway_starts_again_in_an_empty_folder(load_script, tmp_path):
    """A comparison killed during a run leaves that run's trial behind, and no line in the results
    file: resumed, the run starts again, and its folder holds the new trial's result.json only."""
    compare = load_script("compare_algorithms")
    interrupted = tmp_path / "grpo_seed4" / "arpo-smollm2" / "ARPO_old_trial"
    interrupted.mkdir(parents=True)
    (interrupted / "result.json").write_text('{"training_iteration": 3}\n')
    finished = tmp_path / "grpo_seed3" / "arpo-smollm2" / "ARPO_trial"
    finished.mkdir(parents=True)
    (finished / "result.json").write_text("{}\n")

    assert compare.fresh_run_storage(tmp_path, "grpo", 4) == tmp_path / "grpo_seed4"
    assert not (tmp_path / "grpo_seed4").exists()
    assert (finished / "result.json").exists()  # another run's folder is left alone
    assert compare.fresh_run_storage(tmp_path, "grpo", 5) == tmp_path / "grpo_seed5"  # nothing there: fine
