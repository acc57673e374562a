"""LoRA against full fine-tuning, side by side in one run: the learner's peak memory and trained
tokens/s, and the bytes and seconds of one weight sync into an engine, with their ratios.

    python scripts/bench_lora.py --model-path smollm2-135m --engine vllm --merge-adapter false
    python scripts/bench_lora.py --model-path tiny --engine hf --rows 4 --prompt-tokens 16 \
        --response-tokens 16 --repeats 1                    # the smallest size (CI)

Learner: ``bench_learner.measure`` (a fresh learner process per mode with 2 CPUs, one warm-up
update, the median of ``--repeats`` updates) on ``bench_learner.make_batch``'s random batch of
``--rows`` rows (``bench_learner.tree_groups_shape``), with the SmolLM2 recipe's learner settings
(``RECIPE_FIELDS``: bfloat16 with float32 master weights, the k3 KL to the initial policy at 0.2,
gradient checkpointing, micro-batches of 4 rows). Full fine-tuning keeps a second copy of the
model as the KL reference; LoRA (``--rank``, ``--alpha``, every attention and MLP projection)
computes the reference with the adapter off. Peak memory: the learner process's peak resident
set (``ru_maxrss``: the model load included).

Sync: what the learner sends after an update (``policy_weights``, in the engines' bfloat16: the
whole model, or the adapter) and the seconds from asking the learner for it to the engine having
loaded it (``update_weights``: an in-place ``load_state_dict`` for hf; for vLLM a safetensors
reload of the whole model, and for LoRA the adapter loaded by version, or with ``--merge-adapter
true`` merged into the base weights and reloaded as a whole: the engine's ``merge_adapter``,
``auto`` its default), median of ``--repeats`` syncs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).parent))
from bench_learner import Layout, make_batch, measure, tree_groups_shape  # noqa: E402

RECIPE_FIELDS = {"kl_coef": 0.2, "gradient_checkpointing": True}
"""``tuned_examples/arpo_smollm2.yaml``'s learner settings besides dtype and micro-batches."""
MODES = ("full", "lora")
MERGE_CHOICES = {"auto": None, "true": True, "false": False}


def sync_seconds(engine_name: str, path: str, lora: dict | None, repeats: int, merge_adapter: bool | None = None):
    """A probe for ``measure``: the bytes of the weights the learner sends and the median seconds
    of ``repeats`` syncs into a fresh engine (``policy_weights`` then ``update_weights``)."""
    from rllib_arpo.core.dtypes import DTYPES
    from rllib_arpo.models.lora import LoraSettings
    from rllib_arpo.rollout.engine import ENGINES
    from rllib_arpo.weights.object_store import policy_weights

    def probe(group) -> tuple[int, float]:
        options = {}
        if engine_name == "vllm":
            options = {"max_model_len": 2048, "enable_chunked_prefill": False, "merge_adapter": merge_adapter}
        engine = ENGINES.get(engine_name).build(path, DTYPES["bfloat16"], options, lora=LoraSettings.from_config(lora))
        try:
            seconds = []
            for version in range(1, repeats + 1):
                start = time.perf_counter()
                weights = policy_weights(group)
                engine.update_weights(weights, version)
                seconds.append(time.perf_counter() - start)
        finally:
            if hasattr(engine, "close"):
                engine.close()
        return sum(t.numel() * t.element_size() for t in weights.values()), statistics.median(seconds)

    return probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="smollm2-135m")
    parser.add_argument("--engine", default="vllm", choices=["hf", "vllm"])
    parser.add_argument(
        "--merge-adapter", default="auto", choices=MERGE_CHOICES, help="vLLM with LoRA: the engine's merge_adapter"
    )
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--response-tokens", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()

    from transformers import AutoConfig

    from rllib_arpo.models.catalogue import resolve_model_path

    path = resolve_model_path(args.model_path)
    shape = tree_groups_shape(args.rows, args.prompt_tokens, args.response_tokens)
    batch = make_batch(shape, AutoConfig.from_pretrained(path).vocab_size)
    lora = {"rank": args.rank, "alpha": args.alpha}
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    figures = {}
    for mode in MODES:
        adapter = lora if mode == "lora" else None
        result = measure(
            path,
            Layout(mode, 1, lora=adapter),
            shape,
            batch,
            args.repeats,
            dtype="bfloat16",
            cpus_per_learner=2,
            fields=RECIPE_FIELDS,
            probe=sync_seconds(args.engine, path, adapter, args.repeats, MERGE_CHOICES[args.merge_adapter]),
        )
        sync_bytes, sync_s = result.probed
        figures[mode] = {
            "peak_rss_gib": result.peak_rss_gib[0],
            "estimate_gib": result.estimate_gib,
            "trained_tokens_per_s": result.tokens_per_s,
            "sync_mb": sync_bytes / 1e6,
            "sync_s": sync_s,
        }
    ray.shutdown()

    rows, length = batch["input_ids"].shape
    print(
        f"{args.model_path}: {rows} rows <= {length} tokens, bfloat16 (float32 master weights), KL to the initial "
        f"policy, gradient checkpointing; LoRA rank {args.rank}, alpha {args.alpha:g} on every attention and MLP "
        f"projection; sync into {args.engine} (merge_adapter: {args.merge_adapter}); median of {args.repeats}"
    )
    print("| measure | full | LoRA | LoRA / full |")
    print("|---|---|---|---|")
    for key, label, digits in (
        ("peak_rss_gib", "learner peak RSS (GiB)", 2),
        ("estimate_gib", "learner memory estimate (GiB)", 2),
        ("trained_tokens_per_s", "learner trained tokens/s", 0),
        ("sync_mb", f"bytes per sync (MB, into {args.engine})", 2),
        ("sync_s", f"seconds per sync (into {args.engine})", 3),
    ):
        full, adapter = figures["full"][key], figures["lora"][key]
        print(f"| {label} | {full:.{digits}f} | {adapter:.{digits}f} | {adapter / full:.3f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
