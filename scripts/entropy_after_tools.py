"""Measure the entropy change dH after tool calls, the signal ARPO and AEPO branch on.

    python scripts/entropy_after_tools.py --model-path tiny --questions 48 --samples 8
    python scripts/entropy_after_tools.py --model-path smollm2-135m --questions 24 --samples 4 --forced
    python scripts/entropy_after_tools.py --model-path tiny --questions 48 --samples 8 --variant namesakes
    python scripts/entropy_after_tools.py --model-path smollm2_cold_start --questions 48 --samples 4 \
        --training-prompt --temperature 0.7 --variant namesakes

For each question of the embedded task (train split; ``--variant namesakes``: the variant whose
search results do not always settle the next step, ``data.tir_task``), ``--samples``
trajectories are rolled out with the real tools and no branching, at temperature T (default 1).
From every trajectory: H_initial, the mean entropy (nats) of the first k = 20 tokens of its
first segment, and for every tool call t, H_t, the same mean over the first k tokens generated
after the tool result; dH_t = H_t - H_initial. AEPO's pre-monitoring gap is H_root - mean_t H_t
of a trajectory (H_root = H_initial).

A chat model (a tokenizer with a chat template, such as SmolLM2-135M-Instruct) has never seen
the tag format, so its prompt is a chat: a system message that explains the tags, one worked
example (a question of the valid split and its reference transcript, as user and assistant
turns) and the question. A cold-started model (``rllib cold-start``) learned the prompt RL
trains on (ARPO's system prompt and the question, ``data.loaders.tir_task.tir_task_example``):
``--training-prompt`` uses that prompt, and ``--temperature`` the run's sampling temperature (it
changes which tokens are drawn; the entropies are of softmax(logits), as the engines report them
in training). ``--forced`` also measures on forced transcripts: the reference solution's tool
calls and their real results are written into the response, and the model samples k tokens after
each result (and k tokens right after the prompt for H_initial), so dH is measured where the
model would have called the tools even when it does not call them itself.

Printed: counts, mean, quantiles of dH, and what the branching rules make of it at the default
settings, with entropies in nats and divided by log|V| (the scale used before): the stochastic
rule's probability clip(tau + beta * dH, 0, 1) and AEPO's m of M = 8 global samples. ``--json``
and ``--plot`` write the values and a histogram; ``--plot-from`` draws the histograms of earlier
``--json`` files side by side, without measuring:

    python scripts/entropy_after_tools.py --plot-from tiny.json smollm2.json --plot docs/entropy_dh.png
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SYSTEM_PROMPT = (
    "You solve questions with tools. Think inside <think> </think>. To look something up, write "
    "<search> query </search>; to compute, write <python> expression </python>. The result comes back "
    "as <result> ... </result>. End with <answer> \\boxed{number} </answer>."
)


@dataclass
class EntropySample:
    """Window-mean entropies (nats) of one trajectory: its first segment and after each tool call."""

    initial: float
    after_tools: list[float] = field(default_factory=list)

    @property
    def deltas(self) -> list[float]:
        return [h - self.initial for h in self.after_tools]


def trajectory_entropies(tree, window: int) -> list[EntropySample]:
    """``EntropySample`` of every trajectory of a rollout tree (model segments after a tool
    segment give H_t)."""
    from rllib_arpo.core.entropy import window_mean_entropy
    from rllib_arpo.core.tree import SegmentKind

    samples = []
    for trajectory in range(tree.num_trajectories):
        segments = [tree.segments[s] for s in tree.trajectory_segments(trajectory)]
        model = [(i, s) for i, s in enumerate(segments) if s.kind is SegmentKind.MODEL]
        if not model:
            continue
        sample = EntropySample(window_mean_entropy(model[0][1].entropies, window))
        for i, segment in model[1:]:
            if segments[i - 1].kind is SegmentKind.TOOL:
                sample.after_tools.append(window_mean_entropy(segment.entropies, window))
        samples.append(sample)
    return samples


def encode_question(tokenizer, question: str, example_question: str, example_transcript: str) -> list[int]:
    """Plain ``Question: ...\\nAnswer: `` for a tokenizer without chat template (the tiny policy,
    trained on it), else a chat with the tag instructions and one worked example."""
    from rllib_arpo.data.examples import PromptExample
    from rllib_arpo.data.prompts import encode_prompt

    if not getattr(tokenizer, "chat_template", None):
        return encode_prompt(tokenizer, PromptExample(f"Question: {question}\nAnswer: ", "", "math", "tir_task"))
    messages = (
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": example_question},
        {"role": "assistant", "content": example_transcript},
        {"role": "user", "content": question},
    )
    return encode_prompt(tokenizer, PromptExample(messages, "", "math", "tir_task"))


def forced_samples(
    engine, prompts, transcripts, samples: int, window: int, seed: int, temperature: float
) -> list[EntropySample]:
    """dH on forced transcripts: k tokens sampled after the prompt and after each tool result of
    the reference transcript (its text up to and including that result)."""
    from rllib_arpo.core.entropy import window_mean_entropy
    from rllib_arpo.rollout.engine import SamplingParams
    from rllib_arpo.tools.base import RESULT_CLOSE

    params = SamplingParams(max_new_tokens=window, temperature=temperature, seed=seed)
    out = []
    for prompt, transcript in zip(prompts, transcripts):
        cuts = [i + len(RESULT_CLOSE) for i in _find_all(transcript, RESULT_CLOSE)]
        prefixes = [prompt] + [
            prompt + engine.tokenizer.encode(transcript[:cut], add_special_tokens=False) for cut in cuts
        ]
        generations = engine.generate([p for p in prefixes for _ in range(samples)], params)
        means = [window_mean_entropy(g.entropies, window) for g in generations]
        for s in range(samples):
            initial = means[s]
            after = [means[(1 + t) * samples + s] for t in range(len(cuts))]
            out.append(EntropySample(initial, after))
    return out


def _find_all(text: str, piece: str) -> list[int]:
    found, start = [], text.find(piece)
    while start >= 0:
        found.append(start)
        start = text.find(piece, start + 1)
    return found


def summary(name: str, samples: list[EntropySample], vocab_size: int) -> dict:
    """Counts, dH statistics and what the default rules make of dH, in nats and / log|V|."""
    from rllib_arpo.core.branch_budget import aepo_global_samples
    from rllib_arpo.rollout.settings import RolloutSettings

    defaults = RolloutSettings()
    deltas = np.array([d for s in samples for d in s.deltas])
    gaps = np.array([s.initial - np.mean(s.after_tools) for s in samples if s.after_tools])
    result = {
        "name": name,
        "trajectories": len(samples),
        "tool_calls": int(deltas.size),
        "h_initial_mean": float(np.mean([s.initial for s in samples])),
        "h_after_tool_mean": float(np.mean([h for s in samples for h in s.after_tools])) if deltas.size else None,
    }
    if not deltas.size:
        return result
    log_v = math.log(vocab_size)
    for unit, scale in (("nats", 1.0), ("per_log_V", 1.0 / log_v)):
        probability = np.clip(defaults.tau + defaults.beta * deltas * scale, 0.0, 1.0)
        m = [aepo_global_samples(8, float(g * scale), 0.0, defaults.aepo_sensitivity) for g in gaps]
        result[unit] = {
            "dH_mean": float(np.mean(deltas * scale)),
            "dH_std": float(np.std(deltas * scale)),
            "dH_quantiles_5_25_50_75_95": [
                float(q) for q in np.quantile(deltas * scale, [0.05, 0.25, 0.5, 0.75, 0.95])
            ],
            "branch_probability_5_50_95": [float(q) for q in np.quantile(probability, [0.05, 0.5, 0.95])],
            "branch_probability_mean_abs_change": float(np.mean(np.abs(probability - defaults.tau))),
            "aepo_m_of_8_counts": {str(k): int(v) for k, v in zip(*np.unique(m, return_counts=True))},
        }
    result["dH"] = deltas.tolist()
    result["gap"] = gaps.tolist()
    return result


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.get("dH")]
    if not shown:
        print(f"no tool call to measure dH after: {path} not written")
        return
    columns = min(2, len(shown))
    rows = math.ceil(len(shown) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.2 * rows), squeeze=False)
    for axis, result in zip(axes.flat, shown):
        deltas = np.array(result["dH"])
        axis.hist(deltas, bins=30, color="tab:blue", alpha=0.8)
        axis.axvline(0.0, color="black", linewidth=0.8)
        axis.set_title(f"{result['name']}\n{deltas.size} tool calls, mean {deltas.mean():+.2f} nats", fontsize=9)
        axis.set_xlabel("dH = H_t - H_initial (nats, mean of k = 20 tokens)")
    for axis in axes[:, 0]:
        axis.set_ylabel("tool calls")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    from rllib_arpo.data.tir_task import TASK_VARIANTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="tiny")
    parser.add_argument("--questions", type=int, default=48)
    parser.add_argument("--samples", type=int, default=8, help="trajectories per question")
    parser.add_argument("--forced", action="store_true", help="also measure on forced reference transcripts")
    parser.add_argument("--max-response-tokens", type=int, default=256)
    parser.add_argument("--window", type=int, default=20, help="k")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", choices=TASK_VARIANTS, default="plain", help="the embedded task's variant")
    parser.add_argument("--training-prompt", action="store_true", help="the prompt RL trains on (cold-started models)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature T")
    parser.add_argument("--json", help="write the summaries here")
    parser.add_argument("--plot", help="write a histogram of dH here (PNG)")
    parser.add_argument("--plot-from", nargs="+", help="plot these --json files instead of measuring")
    args = parser.parse_args()
    if args.plot_from:
        plot([result for path in args.plot_from for result in json.loads(Path(path).read_text())], args.plot)
        return

    import rllib_arpo.tools  # noqa: F401  (registers the tools)
    from rllib_arpo.core.branching import NoBranching
    from rllib_arpo.data.loaders.tir_task import tir_task_example
    from rllib_arpo.data.prompts import encode_prompt
    from rllib_arpo.data.tir_solutions import demonstration
    from rllib_arpo.data.tir_task import TIRTask
    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.rollout.hf_engine import HFEngine
    from rllib_arpo.rollout.settings import RolloutSettings
    from rllib_arpo.rollout.tree_rollout import TreeRollout
    from rllib_arpo.tools.base import ToolCall, ToolExecutor, build_tools

    task = TIRTask(seed=0, variant=args.variant)
    tools = ToolExecutor(
        build_tools({"search": {"backend": "bm25", "documents": task.corpus(), "top_k": 2}, "python": {}})
    )

    def search(query: str) -> str:
        return tools.run([ToolCall("search", query)])[0].text

    def python(code: str) -> str:
        return tools.run([ToolCall("python", code)])[0].text

    engine = HFEngine.from_pretrained(resolve_model_path(args.model_path))
    questions = task.split("train")[: args.questions]
    if args.training_prompt:
        prompts = [encode_prompt(engine.tokenizer, tir_task_example(q)) for q in questions]
    else:
        example = task.split("valid")[2]  # a "both" question: a search, then Python
        example_transcript = demonstration(example, np.random.default_rng(0), search=search, python=python)
        prompts = [
            encode_question(engine.tokenizer, q.question, example.question, example_transcript) for q in questions
        ]

    settings = RolloutSettings(
        total_rollouts=args.samples,
        initial_rollouts=args.samples,
        entropy_window=args.window,
        max_response_tokens=args.max_response_tokens,
        max_tool_result_tokens=96,
        temperature=args.temperature,
    )
    trees, _ = TreeRollout(engine, tools, NoBranching(), settings).run(prompts, seed=args.seed)
    vocab_size = engine.model.config.vocab_size
    own = [sample for tree in trees for sample in trajectory_entropies(tree, args.window)]
    results = [summary(f"{args.model_path}, {args.variant}, own tool calls", own, vocab_size)]
    if args.forced:
        transcripts = [demonstration(q, np.random.default_rng(0), search=search, python=python) for q in questions]
        forced = forced_samples(engine, prompts, transcripts, args.samples, args.window, args.seed, args.temperature)
        results.append(summary(f"{args.model_path}, {args.variant}, forced reference calls", forced, vocab_size))
    tools.close()
    for result in results:
        print(json.dumps({k: v for k, v in result.items() if k not in ("dH", "gap")}, indent=1))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
