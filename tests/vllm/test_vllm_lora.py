"""vLLM with a LoRA adapter (``lora``): each sync brings the adapter alone, which the engine loads
under its version or merges into its weights, and it then samples as the merged model does."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from transformers import AutoModelForCausalLM  # noqa: E402

from rllib_arpo.data.tir_task import TIRTask, format_prompt  # noqa: E402
from rllib_arpo.models.lora import (  # noqa: E402
    LoraSettings,
    adapter_state,
    add_lora,
    merged_weights,
    model_weights,
    randomise_adapter,
)
from tests.vllm.test_vllm_engine import assert_same_generations, greedy  # noqa: E402

SETTINGS = LoraSettings(rank=8, alpha=16, target_modules=("q_proj", "v_proj", "up_proj", "down_proj"))


def adapter_of(policy_dir, seed: int) -> dict[str, torch.Tensor]:
    """An adapter of seeded random A and B (at init B = 0 and the adapter is the identity)."""
    model = add_lora(AutoModelForCausalLM.from_pretrained(policy_dir), SETTINGS)
    randomise_adapter(model, seed, scale=0.5)
    return {name: tensor.clone() for name, tensor in adapter_state(model).items()}


@pytest.fixture(scope="module", params=[False, True], ids=["served-as-adapter", "merged"])
def lora_engine(policy_dir, request):
    """vLLM sampling through the adapter (``merge_adapter`` false), or with it merged into its weights."""
    from rllib_arpo.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        str(policy_dir), dtype="float32", logprobs_k=20, max_model_len=1024, seed=0, lora=SETTINGS,
        merge_adapter=request.param,
    )  # fmt: skip
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts(hf_engine) -> list[list[int]]:
    examples = TIRTask(seed=0).split("test")[:3]
    return [hf_engine.tokenizer.encode(format_prompt(e), add_special_tokens=False) for e in examples]


def test_an_adapter_sync_samples_as_the_merged_model(lora_engine, hf_engine, policy_dir, prompts):
    params = greedy(24)
    base = {name: tensor.clone() for name, tensor in hf_engine.model.state_dict().items()}
    base_generations = hf_engine.generate(prompts, params)
    assert_same_generations(lora_engine.generate(prompts, params), base_generations)  # B = 0: the identity
    try:
        for version, seed in ((1, 1), (2, 2), (2, 2)):  # the last: a restore sends the same version again
            adapter = adapter_of(policy_dir, seed)
            lora_engine.update_weights(adapter, version)
            assert lora_engine.weights_version == version
            hf_engine.update_weights({**base, **merged_weights(model_weights(policy_dir), adapter, SETTINGS)}, version)
            after = lora_engine.generate(prompts, params)
            assert_same_generations(after, hf_engine.generate(prompts, params))
            assert [g.token_ids for g in after] != [g.token_ids for g in base_generations]  # the adapter acts
        if lora_engine.base_weights is None:
            assert set(lora_engine.llm.llm_engine.list_loras()) == {2}  # the older adapters are gone
        else:  # merged: plain kernels, vLLM runs without LoRA
            assert lora_engine.llm.llm_engine.vllm_config.lora_config is None
    finally:
        hf_engine.update_weights(base, version=0)


def test_the_engine_registry_states_the_largest_rank_vllm_takes():
    # the registry entry is read at config time without importing vLLM, so it repeats vLLM's value
    from rllib_arpo.rollout.engine import ENGINES
    from rllib_arpo.rollout.vllm_engine import VLLM_LORA_RANKS, vllm_lora_rank

    assert ENGINES.get("vllm").max_lora_rank == VLLM_LORA_RANKS[-1] == vllm_lora_rank(VLLM_LORA_RANKS[-1])
    with pytest.raises(ValueError, match="above vLLM's largest max_lora_rank"):
        vllm_lora_rank(VLLM_LORA_RANKS[-1] + 1)
