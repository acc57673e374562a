"""This project's GRPO and ARPO beside TRL's GRPOTrainer on the same model, prompts and reward.

    python scripts/bench_peer_trl.py [--model smollm2-135m] [--steps 3] [--warmup 1]
        [--contenders ours-grpo,trl-grpo,ours-arpo-tools] [--json results.json]

Every contender trains the same policy (by default SmolLM2-135M-Instruct) on the same prompts
(the embedded tool-use task's train split, drawn in the order this project's EnvRunner draws
them), with P prompts per step and M trajectories per prompt, at most ``--max-tokens`` generated
tokens per trajectory, the same sampling (temperature 1, top-p 1), learning rate, clip range
(eps_low 0.2, eps_high 0.28), token-mean loss (TRL: ``loss_type="dapo"``), no KL term, one update
per batch, gradient clipping at 1.0, micro-batches of ``--micro-batch`` rows (this project's
learner: laid out by ``--packing``, by default a tree of ``micro_batch_tokens``), and the same reward:
this project's hierarchical reward (``rewards.hierarchical.hierarchical_reward``) wrapped as a TRL reward
function. The defaults follow this project's SmolLM2 ARPO config (P = 4, M = 4, 192 tokens, lr 1e-5).

TRL's own tool calling goes through the chat template's tool format, which SmolLM2's template
does not have, so the equal-work comparison is without tools: ``ours-grpo`` (GRPO, M samples per
prompt, ``max_tool_calls: 0``, generation until EOS or the token limit) against ``trl-grpo``.
``ours-grpo-pipelined`` is ``ours-grpo`` with ``max_staleness: 1``: an EnvRunner actor samples
the next step's batch while the learner updates on this one (the correction: ``old_logprob_source:
learner``, ``tis_cap: 2``); its peak memory is the learner's process only, the actor's not counted.
``ours-arpo-tools`` is ARPO with its search and Python tools and tree rollouts (M = 4, N = 2):
more work per step (tool calls, tool results in the context), listed apart.

``--dtype bfloat16`` runs both sides in bfloat16 as each offers it: this project's ``dtype:
bfloat16`` (engines in bf16, the learner under autocast over float32 master weights) and TRL's
``bf16=True`` (accelerate's bf16 autocast over float32 weights).

Measure from the cold-started model (``--model smollm2_cold_start``, README): the base model
never writes the answer tags, so every reward is -1 on both sides and neither learns anything.

Each contender runs in its own process, one after another (so peak memory is its own), on the
transformers generation engine on both sides. Per step (the ``--warmup`` steps left out of the
means): wall time, generation (tokens generated / seconds in generation), learner (trained
tokens / seconds in forward, backward and optimizer step) and the process's peak resident
memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATASET = {"type": "tir_task", "seed": 0, "split": "train"}
CONTENDERS = ("ours-grpo", "ours-grpo-pipelined", "trl-grpo", "ours-arpo-tools")
LABELS = {
    "ours-grpo": "rllib-arpo GRPO, no tools",
    "ours-grpo-pipelined": "rllib-arpo GRPO, no tools, max_staleness 1 (1 EnvRunner actor)",
    "trl-grpo": "TRL GRPOTrainer, no tools",
    "ours-arpo-tools": "rllib-arpo ARPO with search + Python tools (more work per step)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model_path: a name or a save_pretrained directory")
    parser.add_argument("--steps", type=int, default=3, help="measured training steps per contender")
    parser.add_argument("--warmup", type=int, default=1, help="steps run first and left out of the means")
    parser.add_argument("--prompts", type=int, default=4, help="P: prompts per step")
    parser.add_argument("--rollouts", type=int, default=4, help="M: trajectories per prompt")
    parser.add_argument("--max-tokens", type=int, default=192, help="generated tokens per trajectory, at most")
    parser.add_argument("--micro-batch", type=int, default=4, help="rows per forward/backward pass")
    parser.add_argument(
        "--packing", default="tree", choices=["padded", "packed", "tree"], help="this project's learner layout"
    )
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="both sides: bfloat16 = this project's dtype: bfloat16 (float32 master weights), TRL's bf16=True",
    )
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # internal: run one contender, write its results
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.run:
        result = run_trl(args) if args.run == "trl-grpo" else run_ours(args)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        result["dtype"] = args.dtype  # as this contender's process ran it
        Path(args.out).write_text(json.dumps(result))
        return

    results = {}
    for name in args.contenders.split(","):
        if name not in CONTENDERS:
            parser.error(f"unknown contender {name!r}; known: {', '.join(CONTENDERS)}")
        results[name] = run_in_subprocess(name, args)
        print_table(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "results": results}, indent=2))


CALLER_ONLY = {"run", "out", "contenders", "json"}
"""The arguments that the calling process keeps; a contender's process gets every other one."""


def run_in_subprocess(name: str, args) -> dict:
    """Run one contender in a fresh process; its output goes to a log file named on failure."""
    with tempfile.TemporaryDirectory() as tmp:
        out, log = Path(tmp) / "result.json", Path(tempfile.gettempdir()) / f"bench_peer_trl.{name}.log"
        argv = [sys.executable, __file__, "--run", name, "--out", str(out)]
        for key, value in vars(args).items():  # every setting, so none is left at its default
            if key not in CALLER_ONLY and value is not None:
                argv += [f"--{key.replace('_', '-')}", str(value)]
        print(f"running {name} (log: {log}) ...", flush=True)
        start = time.perf_counter()
        with open(log, "w") as stream:
            code = subprocess.call(argv, stdout=stream, stderr=subprocess.STDOUT, env=single_process_env())
        if code != 0:
            tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
            sys.exit(f"{name} failed with exit code {code}; the end of {log}:\n{tail}")
        print(f"  done in {time.perf_counter() - start:.0f} s", flush=True)
        return json.loads(out.read_text())


def single_process_env() -> dict[str, str]:
    """This environment without a distributed launcher's variables: each contender is one process,
    and accelerate (under TRL) would otherwise wait for the ranks that LOCAL_RANK or WORLD_SIZE
    announce (a DeepSpeed learner in the calling process sets LOCAL_RANK, for one)."""
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    return {key: value for key, value in os.environ.items() if key not in launcher}


def prompt_batches(args) -> list[list]:
    """The prompts of every step, in the order this project's (only) EnvRunner draws them."""
    from rllib_arpo.data.prompt_stream import PromptStream
    from rllib_arpo.data.registry import load_dataset

    stream = PromptStream(load_dataset(DATASET), seed=0)
    return [stream.next_batch(args.prompts) for _ in range(args.warmup + args.steps)]


# --- this project ---------------------------------------------------------------------------------


def ours_config(args, name: str) -> dict:
    config = {
        "model_path": args.model,
        "dtype": args.dtype,
        "engine": "hf",
        "dataset": DATASET,
        "num_env_runners": 0,
        "held_out_interval": 0,
        "prompts_per_env_runner": args.prompts,
        "total_rollouts": args.rollouts,
        "max_response_tokens": args.max_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
        "policy_loss": "ppo_clip",
        "clip_eps_low": 0.2,
        "clip_eps_high": 0.28,
        "loss_agg_mode": "token-mean",
        "lr": args.lr,
        "grad_clip": 1.0,
        "micro_batch_size": args.micro_batch,
        "packing": args.packing,
        "seed": 0,
    }
    if name.startswith("ours-grpo"):
        config.update(
            initial_rollouts=args.rollouts, tools={}, max_tool_calls=0, advantage_estimator="grpo", kl_coef=0.0
        )
    if name == "ours-grpo-pipelined":  # an EnvRunner actor samples the next batch while the learner updates
        config.update(num_env_runners=1, max_staleness=1, old_logprob_source="learner", tis_cap=2.0)
    if name == "ours-arpo-tools":  # ARPO: N = M / 2 sampled first, Z = 2, the reference scripts' branching
        config.update(
            initial_rollouts=max(args.rollouts // 2, 1),
            branch_factor=2,
            entropy_window=20,
            branching="arpo",
            branching_mode="stochastic",
            beta=0.2,
            tau=0.5,
            tools={"search": {"backend": "bm25", "top_k": 2}, "python": {"timeout_s": 5}},
            max_tool_calls=3,
            max_tool_result_tokens=96,
            advantage_estimator="arpo_soft",
        )
    return config


def run_ours(args) -> dict:
    import ray

    from rllib_arpo.algorithm import ARPOConfig

    config = ARPOConfig().update_from_dict(ours_config(args, args.run))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    algo = config.build_algo()
    steps = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        result = algo.train()
        wall = time.perf_counter() - start
        runners = result["env_runners"]
        steps.append(
            {
                "wall_s": wall,
                "generation_s": runners["generation_s"],
                "generated_tokens": runners["generated_tokens"],
                "learner_s": result["learner_update_s"],
                "trained_tokens": result["trained_tokens"],
                "reward_mean": runners["reward_mean"],
            }
        )
        print(f"step {step}: {steps[-1]}", flush=True)
    algo.stop()
    ray.shutdown()
    return {"steps": steps, "warmup": args.warmup}


# --- TRL ------------------------------------------------------------------------------------------


def run_trl(args) -> dict:
    import torch
    import trl
    from transformers import AutoTokenizer

    from rllib_arpo.models.catalogue import resolve_model_path

    per_step = args.prompts * args.rollouts
    if per_step % args.micro_batch:
        raise ValueError(f"P * M = {per_step} must be a multiple of --micro-batch {args.micro_batch}")
    model_path = str(resolve_model_path(args.model))
    dataset = trl_dataset(args, AutoTokenizer.from_pretrained(model_path))
    timings = {"generation_s": 0.0, "generate_and_score_s": 0.0, "generated_tokens": 0, "trained_tokens": 0}
    timings["rewards"] = []
    steps = []
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = timed_grpo_trainer(timings)(
            model=model_path,
            reward_funcs=trl_reward_function(timings),
            args=trl_config(args, output_dir),
            train_dataset=dataset,
            callbacks=[step_timer(timings, steps)],
        )
        trainer.train()
    return {
        "steps": steps,
        "warmup": args.warmup,
        "trl_version": trl.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def trl_dataset(args, tokenizer):
    """The prompts of every step as a ``datasets.Dataset``: the prompt text exactly as this
    project's EnvRunner encodes it (chat template or not), so both sides generate from the same
    tokens and TRL hands the reward function plain strings, with each one's ground truth and task."""
    from datasets import Dataset

    from rllib_arpo.data.prompts import render_prompt

    examples = [example for batch in prompt_batches(args) for example in batch]
    return Dataset.from_list(
        [{"prompt": render_prompt(tokenizer, e), "ground_truth": str(e.ground_truth), "task": e.task} for e in examples]
    )


def trl_reward_function(timings: dict):
    """This project's hierarchical reward as a TRL reward function; the rewards it gives are added
    to ``timings["rewards"]``."""
    from rllib_arpo.rewards.hierarchical import hierarchical_reward
    from rllib_arpo.rewards.settings import RewardSettings

    settings = RewardSettings()

    def hierarchical(completions, ground_truth, task, **columns) -> list[float]:
        """This project's hierarchical reward: no tools were available, so none were called."""
        rewards = [
            hierarchical_reward(c, g, task=t, tool_calls={}, settings=settings, tool_tags=()).reward
            for c, g, t in zip(completions, ground_truth, task)
        ]
        timings["rewards"] += rewards
        return rewards

    return hierarchical


def timed_grpo_trainer(timings: dict) -> type:
    """TRL's ``GRPOTrainer`` that adds to ``timings`` its seconds in generation, its seconds in
    generation and scoring, and the tokens it generated (all of them trained)."""
    import trl

    class TimedGRPOTrainer(trl.GRPOTrainer):
        def _generate(self, prompts):
            start = time.perf_counter()
            output = super()._generate(prompts)
            timings["generation_s"] += time.perf_counter() - start
            return output

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            output = super()._generate_and_score_completions(inputs)
            timings["generate_and_score_s"] += time.perf_counter() - start
            tokens = int(output["completion_mask"].sum())
            timings["generated_tokens"] += tokens
            timings["trained_tokens"] += tokens
            return output

    return TimedGRPOTrainer


def step_timer(timings: dict, steps: list[dict]):
    """A ``TrainerCallback`` that resets ``timings`` at each step's start and at its end appends
    the step's figures to ``steps`` (the learner's time: the wall time less generation and
    scoring)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_args, **_kwargs):
            timings.update(generation_s=0.0, generate_and_score_s=0.0, generated_tokens=0, trained_tokens=0, rewards=[])
            self.start = time.perf_counter()

        def on_step_end(self, *_args, **_kwargs):
            wall = time.perf_counter() - self.start
            steps.append(
                {
                    "wall_s": wall,
                    "generation_s": timings["generation_s"],
                    "generated_tokens": timings["generated_tokens"],
                    "learner_s": wall - timings["generate_and_score_s"],
                    "trained_tokens": timings["trained_tokens"],
                    "reward_mean": sum(timings["rewards"]) / max(len(timings["rewards"]), 1),
                }
            )
            print(f"step {len(steps) - 1}: {steps[-1]}", flush=True)

    return StepTimer()


def trl_config(args, output_dir: str):
    """The ``trl.GRPOConfig`` that matches this project's settings (module docstring): P * M
    trajectories per step in micro-batches of ``--micro-batch``, the same sampling, learning
    rate, clip range and token-mean loss, no KL term, on the CPU."""
    import trl

    per_step = args.prompts * args.rollouts
    return trl.GRPOConfig(
        output_dir=output_dir,
        max_steps=args.warmup + args.steps,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=per_step // args.micro_batch,
        num_generations=args.rollouts,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        shuffle_dataset=False,
        use_cpu=True,
        bf16=args.dtype == "bfloat16",
        seed=0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
    )


# --- report ---------------------------------------------------------------------------------------


def summary(result: dict) -> dict:
    measured = result["steps"][result["warmup"] :]

    def total(key):
        return sum(step[key] for step in measured)

    return {
        "wall_s": total("wall_s") / len(measured),
        "generation_tokens_per_s": total("generated_tokens") / max(total("generation_s"), 1e-9),
        "generated_tokens": total("generated_tokens") / len(measured),
        "learner_tokens_per_s": total("trained_tokens") / max(total("learner_s"), 1e-9),
        "learner_s": total("learner_s") / len(measured),
        "generation_s": total("generation_s") / len(measured),
        "reward_mean": total("reward_mean") / len(measured),
        "peak_rss_mb": result["peak_rss_mb"],
    }


def print_table(results: dict, args) -> None:
    print(
        f"\n{args.model}, P = {args.prompts} prompts x M = {args.rollouts} trajectories per step, "
        f"<= {args.max_tokens} tokens each, {args.steps} measured steps after {args.warmup} warm-up, "
        f"{os.cpu_count()} CPU cores, {args.dtype}; this project's learner: packing {args.packing}"
    )
    header = (
        f"| {'contender':<66} | wall s/step | generation s | gen tok/s | learner s | learner tok/s "
        "| tokens/step | reward | peak RSS MB |"
    )
    print(header)
    print("|" + "|".join("-" * (len(part)) for part in header.split("|")[1:-1]) + "|")
    for name, result in results.items():
        s = summary(result)
        label = LABELS[name].replace("TRL", f"TRL {result['trl_version']}") if "trl_version" in result else LABELS[name]
        print(
            f"| {label:<66} | {s['wall_s']:11.1f} | {s['generation_s']:12.1f} | {s['generation_tokens_per_s']:9.1f} "
            f"| {s['learner_s']:9.1f} | {s['learner_tokens_per_s']:13.1f} | {s['generated_tokens']:11.0f} "
            f"| {s['reward_mean']:6.3f} | {s['peak_rss_mb']:11.0f} |"
        )


if __name__ == "__main__":
    main()
