"""What a checkpoint holds beyond RLlib's own state: weights as safetensors, an HF directory of
the policy, and the random number generators' states.

A checkpoint of ``ARPO`` (``algo.save_to_path(path)``, or Tune's ``checkpoint_config``):

    path/
      learner_group/learner/rl_module/default_policy/model.safetensors   the learner's weights, exact
      learner_group/learner/state.pkl        optimizer states (AdamW m, v, step), RNG states
      deepspeed/                             learner_backend deepspeed: every learner's ZeRO partitions
      policy/                                the policy as a transformers directory (safetensors,
                                             config, tokenizer) in the engines' dtype: serve it or
                                             load it with from_pretrained (LoRA: the adapter merged)
      policy/adapter/                        LoRA: the adapter alone, a peft directory (vLLM's
                                             LoRARequest and PeftModel.from_pretrained load it)
      state.pkl                              iteration, weights version, each EnvRunner's data position
      results.jsonl                          the trial's result rows up to this checkpoint, as Tune
                                             logs them (tune_logs rebuilds the logs from them)
      manifest.json                          every other file's size, written last

Resuming from it continues exactly: the same next prompts (each EnvRunner's shard position and
sampling counter), the same weights and optimizer states, the same random streams.

A checkpoint is complete when every file its manifest lists has the listed size: one whose
writing or copying was cut short (a SIGKILL, a preempted node) lacks the manifest or a file's
full length, and ``--resume`` passes over it (``latest_complete_checkpoint``).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from rllib_arpo.core.dtypes import DTYPES
from rllib_arpo.models.lora import LoraSettings, merged_weights, model_weights, write_adapter

WEIGHTS_FILE = "model.safetensors"
POLICY_DIRECTORY = "policy"
ADAPTER_DIRECTORY = "adapter"
RESULTS_FILE = "results.jsonl"
MANIFEST_FILE = "manifest.json"
# the directories Tune writes a trial's checkpoints to: checkpoint_000000, checkpoint_000001, ...
CHECKPOINT_DIRECTORY = re.compile(r"checkpoint_(\d+)")
# what a transformers model directory holds besides its weights
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def save_weights(weights: dict[str, torch.Tensor], file: str | Path) -> None:
    """Write tensors as safetensors; tensors sharing storage (tied embeddings) are written as
    separate copies, which the format requires."""
    seen: set[int] = set()
    tensors = {}
    for name, tensor in weights.items():
        tensor = tensor.detach().to("cpu").contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    save_file(tensors, str(file))


def load_weights(file: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(file))


def export_policy(
    weights: dict[str, torch.Tensor],
    model_path: str | Path,
    directory: str | Path,
    dtype: str,
    lora: LoraSettings | None = None,
) -> Path:
    """A transformers directory of the policy: ``weights`` (transformers' names) as safetensors,
    plus the config and tokenizer files of the directory the policy started from. With ``lora``
    ``weights`` are the adapter's: it is written to ``adapter/`` as it is, and merged into the
    base weights of ``model_path`` for the directory itself."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if lora is not None:
        write_adapter(weights, lora, str(model_path), directory / ADAPTER_DIRECTORY)
        merged = merged_weights(model_weights(model_path), weights, lora)
        weights = {name: tensor.to(DTYPES[dtype]) for name, tensor in merged.items()}
    source = Path(model_path)
    for name in MODEL_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, directory / name)
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text())
    if config.get("tie_word_embeddings"):  # transformers ties lm_head to the embeddings again
        weights = {name: tensor for name, tensor in weights.items() if name != "lm_head.weight"}
    config["torch_dtype"] = config["dtype"] = dtype
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    save_weights(weights, directory / WEIGHTS_FILE)
    return directory


def rng_states() -> dict:
    """The states of Python's, NumPy's and torch's global random number generators."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


def write_manifest(path: str | Path) -> None:
    """Record the size of every file under the checkpoint ``path``; call it after the last one."""
    path = Path(path)
    sizes = {
        str(file.relative_to(path)): file.stat().st_size
        for file in sorted(path.rglob("*"))
        if file.is_file() and file.name != MANIFEST_FILE
    }
    (path / MANIFEST_FILE).write_text(json.dumps(sizes, indent=1) + "\n")


def checkpoint_problem(path: str | Path) -> str | None:
    """Why the checkpoint at ``path`` is incomplete (its manifest missing or unreadable, a file
    missing or of another size than the manifest says), or None when it is complete."""
    path = Path(path)
    try:
        sizes = json.loads((path / MANIFEST_FILE).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST_FILE} (its writing did not finish)"
    except ValueError:
        return f"{MANIFEST_FILE} is not valid JSON"
    for name, size in sizes.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {size}"
    return None


def checkpoints_in(trial_dir: str | Path) -> dict[int, Path]:
    """The checkpoint directories in a Tune trial's directory, by their number, in order."""
    found = {}
    for path in Path(trial_dir).iterdir():
        match = CHECKPOINT_DIRECTORY.fullmatch(path.name)
        if match and path.is_dir():
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def latest_complete_checkpoint(checkpoints: dict[int, Path]) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The complete checkpoint with the highest number (None if none is), and each checkpoint
    numbered after it with why it is incomplete."""
    passed_over = []
    for path in reversed(checkpoints.values()):
        problem = checkpoint_problem(path)
        if problem is None:
            return path, passed_over[::-1]
        passed_over.append((path, problem))
    return None, passed_over[::-1]


def results_up_to(trial_dir: str | Path, iteration: int) -> list[str] | None:
    """The result rows (JSON lines) of iterations 1..``iteration`` kept by the complete checkpoint
    of that iteration in a Tune trial's directory (the newest one if several), or None if none
    keeps them."""
    for path in reversed(checkpoints_in(trial_dir).values()):
        if checkpoint_problem(path) is None and (path / RESULTS_FILE).is_file():
            lines = (path / RESULTS_FILE).read_text().splitlines()
            if lines and json.loads(lines[-1])["training_iteration"] == iteration:
                return lines
    return None
