"""Build the tiny Qwen2 policy and its tokenizer from the embedded TIR task, warm-start it by SFT, and save them.

    python scripts/build_tiny_policy.py --out checkpoints/tiny_policy

The directory is a standard ``save_pretrained`` directory (``AutoModelForCausalLM``,
``AutoTokenizer``, vLLM). ``--sft-steps 0`` saves the random initialisation.

The package ships this build, with the default arguments, as ``model_path: tiny``
(``rllib_arpo/models/shipped_tiny_policy``): the warm start is sensitive to float rounding, so
another CPU builds a slightly different policy. To ship a new build, write it there (``--out
rllib_arpo/models/shipped_tiny_policy``), then update ``GREEDY_ANSWERS`` in
``tests/unit/test_shipped_tiny_policy.py`` and the laptop demo's figures (README,
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse

from rllib_arpo.cold_start.saved_tiny_policy import COPY_DRILL_STEPS, SFT_STEPS, VOCAB_SIZE, save_tiny_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write the model and tokenizer into")
    parser.add_argument("--task-seed", type=int, default=0, help="seed of the TIR task the tokenizer learns from")
    parser.add_argument(
        "--vocab-size", type=int, default=VOCAB_SIZE, help="BPE vocabulary size (the 12 tag tokens come on top)"
    )
    parser.add_argument("--hidden-size", type=int, default=128, help="must be 64 * --num-heads")
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=2)
    parser.add_argument("--num-kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=256)
    parser.add_argument("--max-position-embeddings", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random initial weights")
    parser.add_argument("--sft-steps", type=int, default=SFT_STEPS, help="warm-start SFT steps (0: no SFT)")
    parser.add_argument(
        "--copy-drill-steps", type=int, default=COPY_DRILL_STEPS, help="copy-drill steps before the SFT"
    )
    args = parser.parse_args()
    directory = save_tiny_policy(
        args.out,
        task_seed=args.task_seed,
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings,
        seed=args.seed,
        sft_steps=args.sft_steps,
        copy_drill_steps=args.copy_drill_steps,
    )
    print(f"saved the tiny policy to {directory}")


if __name__ == "__main__":
    main()
