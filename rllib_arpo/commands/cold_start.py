"""``rllib cold-start MODEL OUTPUT``: the supervised cold start of a real chat model on tool-use
demonstrations (``cold_start.sft.cold_start``), with demonstrations from a reference set if asked
for; its record in ``OUTPUT/cold_start.json``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rllib_arpo.experiment.checks import ConfigError


def cold_start(args: argparse.Namespace) -> int:
    """``rllib cold-start``: reference-set demonstrations (if asked for), then the SFT."""
    from rllib_arpo.cold_start.sft import cold_start as run_cold_start
    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.models.optimizers import missing_package

    if (missing := missing_package(args.optimizer_states)) is not None:
        raise ConfigError(missing)
    try:
        model_path = resolve_model_path(args.model)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    demonstrations = _reference_set_demonstrations(args, model_path) if args.reference_set else []
    start = time.perf_counter()
    losses = run_cold_start(
        model_path,
        args.output,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        demonstrations=demonstrations,
        max_tool_result_tokens=args.max_tool_result_tokens,
        variant=args.task_variant,
        seed=args.seed,
        optimizer_states=args.optimizer_states,
    )
    minutes = (time.perf_counter() - start) / 60
    record = {
        "model": args.model,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "reference_demonstrations": len(demonstrations),
        "embedded_task_demonstrations": args.steps * args.batch_size - len(demonstrations),
        "task_variant": args.task_variant,
        "seed": args.seed,
        "optimizer_states": args.optimizer_states,
        "minutes": minutes,
        "losses": losses,
    }
    (Path(args.output) / "cold_start.json").write_text(json.dumps(record, indent=2) + "\n")
    loss = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    print(f"cold start: {args.steps} steps in {minutes:.1f} min, {loss}; saved {args.output}")
    return 0


def _reference_set_demonstrations(args: argparse.Namespace, model_path: str) -> list:
    """``--reference-set``'s demonstrations: its rows the search cache answers correctly, at most
    ``--reference-limit`` of them (``data.demonstrations.reference_set_demonstrations``)."""
    from transformers import AutoTokenizer

    from rllib_arpo.data.demonstrations import reference_set_demonstrations
    from rllib_arpo.data.registry import load_dataset
    from rllib_arpo.tools.search import SearchTool

    if not args.search_cache:
        raise ConfigError("--reference-set needs --search-cache (the reference search_cache.json)")
    examples = load_dataset({"type": "parquet", "path": args.reference_set})
    search = SearchTool(backend="cache", corpus_path=args.search_cache, top_k=args.search_top_k)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    built = reference_set_demonstrations(examples, search, tokenizer, args.max_tool_result_tokens)
    demonstrations = built[: args.reference_limit]
    print(
        f"{args.reference_set}: {len(built)} of {len(examples)} rows give a correct search demonstration; "
        f"using {len(demonstrations)}",
        flush=True,
    )
    return demonstrations
