"""Save a bigger Qwen2 model that samples exactly like a small policy (``models.expand``).

    python scripts/expand_policy.py OUT_DIR [--model-path tiny] [--hidden-size 896 --layers 24 ...]

The defaults are Qwen2.5-0.5B's shape (hidden 896, 24 layers, MLP 4864, 14 query heads, 2
key/value heads), with the small policy's vocabulary and tokenizer. The script checks that the
two models' logits agree on a few prompts of the task before it saves.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllib_arpo.data.tir_task import TIRTask, format_prompt
from rllib_arpo.models.catalogue import resolve_model_path
from rllib_arpo.models.expand import expand_qwen2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--model-path", default="tiny", help="save_pretrained directory, or 'tiny'")
    parser.add_argument("--hidden-size", type=int, default=896)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--intermediate-size", type=int, default=4864)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model_path = resolve_model_path(args.model_path)
    small = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    big = expand_qwen2(
        small,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        intermediate_size=args.intermediate_size,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        seed=args.seed,
    )
    prompts = [format_prompt(example) for example in TIRTask(seed=0).split("test")[:4]]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        gap = (small(**batch).logits - big(**batch).logits).abs().max().item()
    if gap > 1e-3:
        raise SystemExit(f"the expanded model's logits differ by {gap:.2e}; not saving")
    big.save_pretrained(args.out_dir)
    tokenizer.save_pretrained(args.out_dir)
    params = sum(p.numel() for p in big.parameters())
    print(f"saved {params / 1e6:.1f}M parameters to {args.out_dir} (largest logit gap {gap:.1e})")


if __name__ == "__main__":
    main()
