"""learner.checkpoint: safetensors with tied weights, the exported transformers directory, RNG states."""

import random

import numpy as np
import torch

from rllib_arpo.learner.checkpoint import export_policy, load_weights, rng_states, save_weights, set_rng_states


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
