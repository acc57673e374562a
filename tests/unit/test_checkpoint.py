"""learner.checkpoint: safetensors with tied weights, the exported transformers directory, RNG states,
the manifest that tells a complete checkpoint from one cut short."""

import json
import random
from pathlib import Path

import numpy as np
import torch

from rllib_arpo.learner.checkpoint import (
    MANIFEST_FILE,
    checkpoint_problem,
    checkpoints_in,
    export_policy,
    latest_complete_checkpoint,
    load_weights,
    rng_states,
    save_weights,
    set_rng_states,
    write_manifest,
)


def test_tied_weights_are_saved_as_copies_and_load_back(tmp_path):
    shared = torch.arange(6.0).reshape(2, 3)
    save_weights({"embed": shared, "head": shared, "bias": torch.ones(3, dtype=torch.bfloat16)}, tmp_path / "w")
    loaded = load_weights(tmp_path / "w")
    assert torch.equal(loaded["embed"], shared) and torch.equal(loaded["head"], shared)
    assert loaded["bias"].dtype == torch.bfloat16


def test_exported_policy_is_a_transformers_directory_with_the_given_weights(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    weights = {k: (v + 1).bfloat16() for k, v in model.state_dict().items()}
    export_policy(weights, model_dir, tmp_path / "policy", "bfloat16")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert exported.config.tie_word_embeddings and exported.dtype == torch.bfloat16
    for name, value in exported.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert AutoTokenizer.from_pretrained(tmp_path / "policy").encode("<answer>") == tokenizer.encode("<answer>")


def test_rng_states_restore_every_generator():
    states = rng_states()
    first = (random.random(), np.random.rand(), torch.rand(1))
    set_rng_states(states)
    assert (random.random(), np.random.rand(), torch.rand(1)) == first


def written_checkpoint(path: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    write_manifest(path)
    return path


def test_a_checkpoint_is_complete_when_every_file_has_the_size_its_manifest_lists(tmp_path):
    checkpoint = written_checkpoint(
        tmp_path / "checkpoint_000000", {"state.pkl": b"abc", "policy/model.safetensors": b"x" * 10}
    )
    assert json.loads((checkpoint / MANIFEST_FILE).read_text()) == {"policy/model.safetensors": 10, "state.pkl": 3}
    assert checkpoint_problem(checkpoint) is None
    (checkpoint / "policy/model.safetensors").write_bytes(b"x" * 4)
    assert checkpoint_problem(checkpoint) == "policy/model.safetensors has 4 bytes, the manifest says 10"
    (checkpoint / "policy/model.safetensors").unlink()
    assert checkpoint_problem(checkpoint) == "policy/model.safetensors is missing"
    (checkpoint / MANIFEST_FILE).write_text("{")
    assert checkpoint_problem(checkpoint) == "manifest.json is not valid JSON"
    (checkpoint / MANIFEST_FILE).unlink()
    assert checkpoint_problem(checkpoint) == "no manifest.json (its writing did not finish)"


def test_the_latest_complete_checkpoint_passes_over_the_incomplete_ones_after_it(tmp_path):
    trial = tmp_path / "trial"
    for number in (0, 1, 2, 10):
        written_checkpoint(trial / f"checkpoint_{number:06d}", {"state.pkl": b"abc"})
    (trial / "checkpoint_000010" / "state.pkl").write_bytes(b"a")  # cut short
    (trial / "checkpoint_000011").mkdir()  # its manifest never written
    (trial / "checkpoint_tmp").mkdir()  # not a checkpoint Tune numbered
    (trial / "checkpoint_000003").write_text("")  # not a directory
    checkpoints = checkpoints_in(trial)
    assert list(checkpoints) == [0, 1, 2, 10, 11]
    assert latest_complete_checkpoint(checkpoints) == (
        trial / "checkpoint_000002",
        [
            (trial / "checkpoint_000010", "state.pkl has 1 bytes, the manifest says 3"),
            (trial / "checkpoint_000011", "no manifest.json (its writing did not finish)"),
        ],
    )
    assert latest_complete_checkpoint({11: trial / "checkpoint_000011"})[0] is None
