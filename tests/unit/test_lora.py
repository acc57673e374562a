"""LoRA: the adapter's math and names, the learner that trains only it, and the HF engine that
samples through it after an adapter-only sync (``models.lora``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rllib_arpo.algorithm import ARPOConfig
from rllib_arpo.learner.checkpoint import ADAPTER_DIRECTORY, export_policy
from rllib_arpo.learner.forward import sequence_logprobs
from rllib_arpo.learner.memory import ModelShape, estimate_learner_memory
from rllib_arpo.models.lora import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    LoraSettings,
    adapter_parameters,
    adapter_state,
    add_lora,
    merged_weights,
    model_name,
    model_weights,
    randomise_adapter,
    saved_name,
)
from rllib_arpo.rollout.engine import SamplingParams
from rllib_arpo.rollout.hf_engine import HFEngine
from tests.unit.test_learner import build_learner, module_of, training_batch

LORA = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}
# float32 forward of the tiny policy (hidden 64, one layer): a sum of K = 64 products carries a
# relative error up to K * 2**-24 ~ 4e-6 of the sum of |terms|, and logits here are O(1-10): a few
# such sums in a row stay below 1e-4 on the log-probs, whichever order the CPU's kernels add in
LOGPROB_ATOL = 1e-4


def test_saved_names_are_peft_s_and_round_trip():
    name = "model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert saved_name(name) == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert model_name(saved_name(name)) == name


def test_merged_weights_equal_peft_s_own_merge(model_dir):
    settings = LoraSettings(**LORA)
    model = add_lora(AutoModelForCausalLM.from_pretrained(model_dir), settings)
    randomise_adapter(model)
    base = model_weights(model_dir)
    merged = merged_weights(base, adapter_state(model), settings)

    from peft.tuners.lora import LoraLayer

    for name, layer in model.named_modules():
        if isinstance(layer, LoraLayer):
            layer.merge()  # peft: W <- W + scaling * B A, in place
            assert torch.equal(merged[f"{name}.weight"], layer.base_layer.weight), name
    changed = [n for n in base if not torch.equal(base[n], merged[n])]
    assert sorted(changed) == sorted(
        f"model.layers.0.{m}.weight" for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
    )


def test_an_hf_engine_after_an_adapter_sync_samples_as_the_merged_model(model_dir, tmp_path):
    """The adapter's tensors alone reach an engine built with ``lora``; its tokens and log-probs
    then equal those of a fresh load of the exported merged model."""
    settings = LoraSettings(**LORA)
    trained = add_lora(AutoModelForCausalLM.from_pretrained(model_dir), settings)
    randomise_adapter(trained)
    adapter = {name: t.clone() for name, t in adapter_state(trained).items()}
    assert all(name.startswith("base_model.model.") for name in adapter)

    engine = HFEngine.from_pretrained(model_dir, lora=settings)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
    prefixes = [[5, 6, 7], [8, 9]]
    before = engine.generate(prefixes, params)
    engine.update_weights(adapter, version=1)
    after = engine.generate(prefixes, params)

    policy = export_policy(adapter, model_dir, tmp_path / "policy", "float32", settings)
    fresh = HFEngine.from_pretrained(str(policy)).generate(prefixes, params)
    for synced, merged in zip(after, fresh):
        assert synced.token_ids == merged.token_ids
        np.testing.assert_allclose(synced.logprobs, merged.logprobs, atol=LOGPROB_ATOL, rtol=0)
    assert not np.allclose(before[0].logprobs[:1], after[0].logprobs[:1], atol=0.01)  # the adapter acts

    config = json.loads((policy / ADAPTER_DIRECTORY / ADAPTER_CONFIG_FILE).read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["base_model_name_or_path"] == model_dir
    saved = load_file(str(policy / ADAPTER_DIRECTORY / ADAPTER_WEIGHTS_FILE))
    assert saved.keys() == adapter.keys() and all(torch.equal(saved[k], adapter[k]) for k in saved)


def test_an_engine_refuses_full_weights_when_it_holds_an_adapter(model_dir):
    engine = HFEngine.from_pretrained(model_dir, lora=LoraSettings(**LORA))
    with pytest.raises(ValueError, match="does not fit the model"):
        engine.update_weights(AutoModelForCausalLM.from_pretrained(model_dir).state_dict(), version=1)


@pytest.fixture(scope="module")
def lora_learner(model_dir):
    return build_learner(model_dir, learners={"lora": LORA})


def test_the_learner_trains_the_adapter_only(model_dir, lora_learner):
    module = module_of(lora_learner)
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in name for name in trainable)
    [optimizer] = [opt for _, opt in lora_learner.get_optimizers_for_module(DEFAULT_MODULE_ID)]
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in module.parameters() if p.requires_grad}

    batch = training_batch(lora_learner)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trained = batch["loss_mask"] > 0
    numpy_batch = SampleBatch({k: v.numpy() for k, v in batch.items()})
    lora_learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: numpy_batch}, env_steps=int(trained.sum())))
    after = module.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    # B starts at 0, so A gets no gradient at the first step; B moves
    assert changed == {k for k in before if ".lora_B." in k}

    # the state is the adapter's alone, and the engines get it under peft's saved names
    state = module.get_state()
    assert state.keys() == {k for k in before if ".lora_" in k}
    weights = lora_learner.policy_weights(DEFAULT_MODULE_ID)
    assert weights.keys() == {saved_name(k.removeprefix("model.")) for k in state}
    engine = HFEngine.from_pretrained(model_dir, lora=LoraSettings(**LORA))
    engine.update_weights(weights, version=1)
    assert all(torch.equal(adapter_state(engine.model)[k], weights[k]) for k in weights)


def test_the_kl_reference_is_the_base_model_with_the_adapter_off(model_dir):
    learner = build_learner(model_dir, learners={"lora": LORA}, kl_coef=0.1)
    assert learner._reference_models == {}  # no second copy of the base weights
    module = module_of(learner)
    randomise_adapter(module.model)
    batch = training_batch(learner)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    expected, _ = sequence_logprobs(base, batch, chunk_size=module.logprob_chunk_size)
    reference = learner._reference_logprobs(DEFAULT_MODULE_ID, learner.config, batch)
    real = batch["attention_mask"][:, 1:] > 0  # padding's targets are never trained
    assert torch.equal(reference[real], expected[real])
    with torch.no_grad():
        adapted = module.forward_train(batch)["logprobs"]
    assert not torch.allclose(adapted, expected)  # the adapter acts where it is on
    assert all(p.requires_grad for p in adapter_parameters(module.model).values())  # and trains again


def test_bf16_with_master_weights_keeps_the_adapter_in_float32_and_the_base_in_bf16(model_dir):
    module = module_of(build_learner(model_dir, dtype="bfloat16", learners={"lora": LORA}))
    dtypes = {name: p.dtype for name, p in module.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if ".lora_" not in n} == {torch.bfloat16}


def test_a_lora_module_loads_its_adapter_state_and_nothing_else(lora_learner):
    module = module_of(lora_learner)
    state = module.get_state()
    changed = {k: v + 1.0 for k, v in state.items()}
    module.set_state(changed)
    assert all(torch.equal(module.get_state()[k], changed[k]) for k in state)
    module.set_state(state)
    with pytest.raises(ValueError, match="must be its adapter"):
        module.set_state({**state, "model.model.norm.weight": torch.ones(64)})


def test_the_memory_estimate_counts_the_adapter_as_the_trained_parameters(model_dir):
    full = ModelShape.from_pretrained(model_dir)
    lora = ModelShape.from_pretrained(model_dir, LoraSettings(**LORA))
    hidden, intermediate, rank = 64, 64, 4  # the tiny policy: q and v are [64, 64], down [64, 64]
    adapter = rank * (2 * hidden) * 2 + rank * (intermediate + hidden)
    assert lora.trainable_parameters == adapter
    assert lora.num_parameters == full.num_parameters + adapter
    p, a = full.num_parameters, adapter
    memory = estimate_learner_memory(lora, dtype="bfloat16", master_weights=True)
    assert (memory.weights, memory.gradients, memory.optimizer) == (2 * p + 4 * a + 2 * a, 4 * a, 8 * a)
    zero2 = estimate_learner_memory(lora, dtype="bfloat16", learner_backend="deepspeed", num_learners=2)
    assert (zero2.weights, zero2.gradients, zero2.optimizer) == (2 * (p + a), 2 * a // 2, 12 * a // 2)


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"rank": 0}, "lora.rank must be an integer >= 1, got 0"),
        ({"alpha": -1}, "lora.alpha must be a number > 0"),
        ({"dropout": 1.0}, r"lora.dropout must lie in \[0, 1\)"),
        ({"target_modules": []}, "lora.target_modules must be a non-empty list"),
        ({"ranks": 8}, r"lora: unknown key\(s\) \['ranks'\]"),
        ({"target_modules": ["q_proj", "qkv_proj"]}, r"lora.target_modules \['qkv_proj'\] match no linear layer"),
    ],
)
def test_bad_lora_settings_are_named(model_dir, lora, message):
    config = ARPOConfig().policy(model_path=model_dir).learners(lora=lora)
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_lora_refuses_a_weight_sync_that_streams_full_weights(model_dir):
    config = ARPOConfig().policy(model_path=model_dir).learners(lora={}, weight_sync="broadcast")
    with pytest.raises(ValueError, match="lora sends the adapter only, which weight_sync: broadcast cannot carry"):
        config.validate()
    config = ARPOConfig().policy(model_path=model_dir, engine="vllm").learners(lora={"rank": 1024})
    with pytest.raises(ValueError, match="lora.rank 1024: engine vllm takes adapters of rank <= 512"):
        config.validate()


def test_the_adapter_starts_the_same_whatever_the_global_random_state(model_dir):
    """Every learner, run and resume starts from one adapter: A from a generator of its own, B = 0."""
    adapters = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        adapters.append(adapter_state(add_lora(AutoModelForCausalLM.from_pretrained(model_dir), LoraSettings(**LORA))))
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])
    assert all((t == 0).all() == (".lora_B." in k) for k, t in adapters[0].items())
