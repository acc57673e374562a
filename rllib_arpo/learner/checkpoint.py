"""What a checkpoint holds beyond RLlib's own state: weights as safetensors, an HF directory of
the policy, and the random number generators' states.

A checkpoint of ``ARPO`` (``algo.save_to_path(path)``, or Tune's ``checkpoint_config``):

    path/
      learner_group/learner/rl_module/default_policy/model.safetensors   the learner's weights, exact
      learner_group/learner/state.pkl        optimizer states (AdamW m, v, step), RNG states
      deepspeed/                             learner_backend deepspeed: every learner's ZeRO partitions
      policy/                                the policy as a transformers directory (safetensors,
                                             config, tokenizer) in the engines' dtype: serve it or
                                             load it with from_pretrained
      state.pkl                              iteration, weights version, each EnvRunner's data position

Resuming from it continues exactly: the same next prompts (each EnvRunner's shard position and
sampling counter), the same weights and optimizer states, the same random streams.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

WEIGHTS_FILE = "model.safetensors"
POLICY_DIRECTORY = "policy"
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


def export_policy(weights: dict[str, torch.Tensor], model_path: str | Path, directory: str | Path, dtype: str) -> Path:
    """A transformers directory of the policy: ``weights`` (transformers' names) as safetensors,
    plus the config and tokenizer files of the directory the policy started from."""
    import json

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
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
