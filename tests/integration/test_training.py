"""ARPO as an RLlib Algorithm: training iterations, remote EnvRunners, weight sync, Tune."""

import pytest
import torch
from ray import tune
from ray.rllib.core import DEFAULT_MODULE_ID

REQUIRED_RUNNER_METRICS = (
    "reward_mean", "reward_max", "accuracy", "format_error_rate", "branches",
    "entropy_change_after_tool", "trajectories_per_s", "generated_tokens_per_s", "discarded_tokens",
    "tool_calls_per_trajectory/search", "tool_calls_per_trajectory/python",
)  # fmt: skip
REQUIRED_LEARNER_METRICS = ("policy_loss", "clip_fraction", "approx_kl", "total_loss")


def train_two_iterations_checking_the_sync(algo, learner_weights, engine_weights, weight_sync: str) -> dict:
    """Two iterations of ``algo`` (built with AdamW's weight decay 0.5 and remote EnvRunners of
    ``small_config``): after each, the engines hold the learner's weights of that version, bit for
    bit, and they changed; the metrics, RLlib's counters and the sync's bytes and seconds are
    reported. Returns the learner's weights after the second iteration.

    AdamW's decoupled weight decay changes every weight on every step, even while the untrained
    policy's rewards are all equal (zero advantages), so the sync is observable from step one."""
    num_env_runners = algo.config.num_env_runners
    before = engine_weights(algo)
    assert [version for version, _ in before] == [0] * num_env_runners
    for iteration in (1, 2):
        result = algo.train()
        assert result["training_iteration"] == iteration
        assert result["weights_version"] == iteration
        learner = learner_weights(algo)
        after = engine_weights(algo)
        assert len(after) == num_env_runners
        for version, weights in after:
            assert version == iteration
            assert weights.keys() == learner.keys()
            for name, tensor in weights.items():
                torch.testing.assert_close(tensor, learner[name], rtol=0, atol=0)
    changed = [name for name, tensor in after[0][1].items() if not torch.equal(tensor, before[0][1][name])]
    assert changed, "the EnvRunner's weights did not change after two updates"
    runners = result["env_runners"]
    for key in REQUIRED_RUNNER_METRICS:
        assert key in runners, key
    # the runners' reported trajectories: prompts_per_env_runner * M per runner
    assert runners["trajectories"] == 2 * 4
    # RLlib's counters: a generated token is an env step, a trajectory an episode
    assert runners["num_episodes_lifetime"] == 2 * num_env_runners * 2 * 4
    assert result["num_env_steps_sampled_lifetime"] == runners["num_env_steps_sampled_lifetime"] > 0
    learners = result["learners"][DEFAULT_MODULE_ID]
    for key in (*REQUIRED_LEARNER_METRICS, "gradients_default_optimizer_global_norm"):
        assert key in learners, key
    # the object store holds one copy of the weights for all runners; a broadcast puts nothing there
    sent = sum(tensor.numel() * tensor.element_size() for tensor in learner.values())
    assert result.get("weight_sync_bytes") == (sent if weight_sync == "object_store" else None)
    assert 0 < result["weight_sync_s"] < result["time_this_iter_s"]
    return learner


def test_two_ddp_learners_broadcast_versioned_weights_to_two_remote_runners(
    ray_session, small_config, learner_weights, engine_weights
):
    """Two DDP learners whose rank 0 broadcasts to two remote EnvRunners over gloo: the engines hold
    the learner's weights, bit for bit (one local learner and the object store: the checkpoint test
    below; ``object_store_delta``: test_pipeline.py, bfloat16, and tests/unit/test_weight_delta.py)."""
    config = (
        small_config.env_runners(num_env_runners=2)
        .learners(num_learners=2, num_cpus_per_learner=1, weight_sync="broadcast")
        .training(weight_decay=0.5)
    )
    algo = config.build_algo()
    try:
        train_two_iterations_checking_the_sync(algo, learner_weights, engine_weights, "broadcast")
    finally:
        algo.stop()


def test_bfloat16_policy_syncs_to_a_remote_runner_without_numpy(
    ray_session, small_config, learner_weights, engine_weights
):
    # one remote learner: it puts the bf16 weights into the object store itself
    config = (
        small_config.policy(dtype="bfloat16")
        .env_runners(num_env_runners=1)
        .learners(num_learners=1, num_cpus_per_learner=1)
        .training(weight_decay=0.5)
    )
    algo = config.build_algo()
    try:
        algo.train()
        learner = learner_weights(algo)  # float32 master weights
        assert {t.dtype for t in learner.values()} == {torch.float32}
        [(version, weights)] = engine_weights(algo)
        assert version == 1
        assert {t.dtype for t in weights.values()} == {torch.bfloat16}
        for name, tensor in weights.items():
            assert torch.equal(tensor, learner[name].bfloat16()), name
    finally:
        algo.stop()


def test_the_driver_chooses_the_dtype_once_and_the_actors_follow(
    ray_session, small_config, engine_weights, fake_cpu, caplog
):
    """``dtype: auto`` in the driver (``ARPO.setup``), on a CPU with AMX (its /proc/cpuinfo faked),
    is bfloat16: the config says so, and the remote EnvRunner's engine and the learner compute in
    it, whatever CPU their own processes see; nothing is logged."""
    fake_cpu(frozenset({"fpu", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))
    algo = small_config.policy(dtype="auto").env_runners(num_env_runners=1).build_algo()
    try:
        assert algo.config.dtype == "bfloat16"
        [(version, weights)] = engine_weights(algo)
        assert version == 0
        assert {t.dtype for t in weights.values()} == {torch.bfloat16}
        assert algo.learner_group._learner.module[DEFAULT_MODULE_ID].compute_dtype == torch.bfloat16
    finally:
        algo.stop()
    assert [r.getMessage() for r in caplog.records if r.name == "rllib_arpo.algorithm"] == []


def test_a_slow_dtype_set_by_hand_runs_and_the_driver_logs_it_once(ray_session, small_config, fake_cpu, caplog):
    """bfloat16 set by hand on an AVX2-only CPU (faked) runs, with one warning from the driver; the
    driver's own EnvRunner and learner: which dtype remote actors take, the test above."""
    fake_cpu(frozenset({"fpu", "avx2", "fma"}))
    algo = small_config.policy(dtype="bfloat16").build_algo()
    try:
        assert algo.config.dtype == "bfloat16"
        assert algo.learner_group._learner.module[DEFAULT_MODULE_ID].compute_dtype == torch.bfloat16
    finally:
        algo.stop()
    logged = [r.getMessage() for r in caplog.records if r.name == "rllib_arpo.algorithm"]
    assert logged == ["dtype bfloat16 on a CPU without AMX or AVX512-BF16: its matrix products run 5-70x slower "
                      "than float32; set dtype: float32 (or auto)"]  # fmt: skip


def test_held_out_evaluation_before_and_after_updates(ray_session, small_config):
    config = small_config.env_runners(num_env_runners=0)
    config.held_out_interval, config.held_out_size = 2, 6
    algo = config.build_algo()
    try:
        first, second = algo.train(), algo.train()
    finally:
        algo.stop()
    # iteration 1 reports the evaluation before any update; iteration 2 the one after two updates
    assert first["evaluation_before_training"]["after_iteration"] == 0
    assert second["evaluation"]["after_iteration"] == 2
    # one sample of each of the 6 questions: every count is a whole number of questions, calls or tokens
    for evaluation in (first["evaluation_before_training"], second["evaluation"]):
        for key in ("accuracy", "format_error_rate", "tool_calls_per_question/search",
                    "tool_calls_per_question/python", "response_tokens_mean"):  # fmt: skip
            count = evaluation[key] * 6
            assert count == pytest.approx(round(count), abs=1e-9) and count >= 0, (key, evaluation[key])
        assert evaluation["accuracy"] <= 1 and evaluation["format_error_rate"] <= 1
        assert 1 <= evaluation["response_tokens_mean"] <= config.max_response_tokens
        assert -1 <= evaluation["reward_mean"] <= 1.1  # wrong or badly formed -1 ... right with the tool bonus 1.1


def test_checkpoint_restore_resyncs_runner_weights_and_version(
    ray_session, small_config, tmp_path, learner_weights, engine_weights
):
    """One local learner and one remote EnvRunner, the weights through the object store: two
    iterations whose syncs are checked as the DDP test's, a checkpoint, and a new algorithm restored
    from it, whose engine gets the saved weights and version before it trains on."""
    config = small_config.env_runners(num_env_runners=1).training(weight_decay=0.5)
    algo = config.build_algo()
    try:
        saved = train_two_iterations_checking_the_sync(algo, learner_weights, engine_weights, "object_store")
        algo.save_to_path(str(tmp_path / "checkpoint"))
    finally:
        algo.stop()
    restored = config.build_algo()
    try:
        [(version, fresh)] = engine_weights(restored)
        assert version == 0 and not all(torch.equal(fresh[name], saved[name]) for name in saved)
        restored.restore_from_path(str(tmp_path / "checkpoint"))
        assert restored.weights_version == 2
        [(version, weights)] = engine_weights(restored)
        assert version == 2
        for name, tensor in weights.items():
            torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0)
        result = restored.train()
        assert result["training_iteration"] == 3 and result["weights_version"] == 3
    finally:
        restored.stop()


@pytest.mark.parametrize("name", ["DAPO", "REINFORCE++"])
def test_family_members_train_by_name_through_tune(ray_session, small_config, tmp_path, name):
    """``import rllib_arpo`` registers the family; the member's defaults apply under ``tune.Tuner``.
    The untrained tiny policy breaks the format everywhere (equal rewards), so DAPO keeps sampling
    up to its round limit; REINFORCE++ measures the KL to the initial policy in the EnvRunner."""
    import rllib_arpo  # noqa: F401  (registers the family with Tune)
    from rllib_arpo.config.family import FAMILY

    param_space = {k: v for k, v in small_config.to_dict().items() if k not in FAMILY[name].defaults}
    param_space["dynamic_sampling_max_rounds"] = 2
    results = tune.Tuner(
        name,
        param_space=param_space,
        run_config=tune.RunConfig(stop={"training_iteration": 1}, storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert not results.errors
    [result] = results
    assert result.config["advantage_estimator"] == {"DAPO": "grpo", "REINFORCE++": "reinforce_pp"}[name]
    sampled = result.metrics["sampled"]
    if name == "DAPO":
        assert result.metrics["dynamic_sampling_rounds"] in (1, 2)
        assert sampled["prompts"] == 2 * result.metrics["dynamic_sampling_rounds"]
    else:
        assert result.config["reward_kl_coef"] == 0.01 and sampled["prompts"] == 2
    assert sampled["trajectories"] == 4 * sampled["prompts"]
