"""ARPOTorchLearner + CausalLMModule built from ARPOConfig without Ray, on a tiny Qwen2 policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from transformers import AutoConfig

from rllib_arpo.algorithm import ARPOConfig
from rllib_arpo.core.loss_aggregation import LOSS_AGGREGATIONS, LossAggregation
from rllib_arpo.core.tree import TrajectoryRow
from rllib_arpo.learner import torch_learner
from rllib_arpo.learner.forward import sequence_logprobs
from rllib_arpo.learner.packed_forward import packed_logprobs
from rllib_arpo.learner.packing import pad_rows
from rllib_arpo.learner.rl_module import hf_state_dict
from rllib_arpo.learner.sampler_mismatch import SAMPLER_LOGPROBS
from rllib_arpo.learner.torch_learner import ARPOTorchLearner
from rllib_arpo.models.spaces import placeholder_spaces
from rllib_arpo.rollout.hf_engine import HFEngine

LR = 1e-3
EPS = 0.2  # clip_eps_low = clip_eps_high
# (prompt length, loss mask of the response, advantage of the row); trained tokens per row:
# 5, 3, 0 (a fully shared row of the de-duplicated view), 5, 1 -- unequal on purpose, so a
# micro-batch split only matches the whole batch if each micro-loss is weighted by its share
ROWS = [
    (3, [1, 1, 1, 0, 0, 0, 1, 1], 1.0),  # a 3-token tool result in the middle
    (5, [1, 1, 1], -0.5),
    (2, [0, 0, 0, 0], 0.25),
    (4, [1, 0, 0, 1, 1, 1, 1], -1.5),
    (2, [1], 2.0),
]


def build_learner(model_dir: str, dtype: str = "float32", learners: dict | None = None, **training) -> ARPOTorchLearner:
    config = (
        ARPOConfig()
        .policy(model_path=model_dir, dtype=dtype)
        .training(**{"lr": LR, "clip_eps_low": EPS, "clip_eps_high": EPS, **training})
        .learners(**(learners or {}))
    )
    vocab_size = AutoConfig.from_pretrained(model_dir).vocab_size
    return config.build_learner(spaces={DEFAULT_MODULE_ID: placeholder_spaces(vocab_size)})


def module_of(learner: ARPOTorchLearner):
    return learner.module[DEFAULT_MODULE_ID]


def padded_batch_with_noisy_old_logprobs(
    learner: ARPOTorchLearner, rows: list[TrajectoryRow], advantages: list[np.ndarray], rng: np.random.Generator
) -> dict[str, torch.Tensor]:
    """``rows`` padded by ``pad_rows``; old log-probs = current log-probs + N(0, 0.3^2) noise on
    trained tokens, so ratios r = exp(-noise) are near 1 and some get clipped."""
    batch = {k: torch.from_numpy(v) for k, v in pad_rows(rows, advantages, pad_token_id=0).items()}
    with torch.no_grad():
        logprobs = module_of(learner).forward_train(batch)["logprobs"]
    noise = torch.from_numpy(rng.normal(0.0, 0.3, logprobs.shape).astype(np.float32))
    batch["old_logprobs"] = torch.where(batch["loss_mask"] > 0, logprobs + noise, torch.zeros_like(logprobs))
    return batch


def training_batch(learner: ARPOTorchLearner, seed: int = 0) -> dict[str, torch.Tensor]:
    """ROWS with random token ids, as ``padded_batch_with_noisy_old_logprobs`` makes batches."""
    rng = np.random.default_rng(seed)
    vocab_size = module_of(learner).model.config.vocab_size
    rows, advantages = [], []
    for prompt_length, mask, advantage in ROWS:
        n = len(mask)
        rows.append(
            TrajectoryRow(
                prompt_ids=rng.integers(1, vocab_size, prompt_length),
                response_ids=rng.integers(1, vocab_size, n),
                loss_mask=np.asarray(mask, dtype=np.float32),
                old_logprobs=np.zeros(n, dtype=np.float32),
                entropies=np.zeros(n, dtype=np.float32),
                segment_ids=np.zeros(n, dtype=np.int64),
            )
        )
        advantages.append(np.full(n, advantage, dtype=np.float32))
    return padded_batch_with_noisy_old_logprobs(learner, rows, advantages, rng)


def gradients(
    learner: ARPOTorchLearner, batch: dict[str, torch.Tensor], learners: dict | None = None, **training
) -> dict[str, torch.Tensor]:
    """Parameter gradients of the learner's (micro-batched) loss on ``batch``; no optimizer step."""
    config = learner.config.copy(copy_frozen=False).training(**training).learners(**(learners or {}))
    module = module_of(learner)
    module.zero_grad(set_to_none=True)
    learner._accumulate_gradients(DEFAULT_MODULE_ID, config, batch)
    return {name: p.grad.clone() for name, p in module.named_parameters()}


@pytest.fixture(scope="module")
def learner(model_dir) -> ARPOTorchLearner:
    return build_learner(model_dir)


@pytest.mark.parametrize("policy_loss", ["ppo_clip", "sg_clip", "cispo"])
def test_loss_ignores_tokens_outside_the_loss_mask(learner, policy_loss):
    batch = training_batch(learner)
    untrained = batch["loss_mask"] == 0  # tool results, prompt targets, padding
    perturbed = dict(batch)
    perturbed["advantages"] = torch.where(untrained, batch["advantages"] + 100.0, batch["advantages"])
    perturbed["old_logprobs"] = torch.where(untrained, batch["old_logprobs"] - 3.0, batch["old_logprobs"])

    reference = gradients(learner, batch, policy_loss=policy_loss)
    assert all(torch.equal(reference[k], g) for k, g in gradients(learner, perturbed, policy_loss=policy_loss).items())

    # the comparison is sensitive: the same change on the *trained* tokens changes the gradient
    trained_change = dict(batch)
    trained_change["advantages"] = torch.where(untrained, batch["advantages"], batch["advantages"] + 100.0)
    changed = gradients(learner, trained_change, policy_loss=policy_loss)
    assert not all(torch.equal(reference[k], g) for k, g in changed.items())


def _token_mean_halved(loss: torch.Tensor, tokens: torch.Tensor, _norm) -> torch.Tensor:
    return 0.5 * loss.sum() / tokens.sum().clamp_min(1)


CUSTOM_AGGREGATION = LossAggregation(_token_mean_halved, weighs="tokens")
"""A registered aggregation the learner knows nothing of: a token mean under another name."""


@pytest.mark.parametrize("loss_agg_mode", [*LOSS_AGGREGATIONS, "custom-token-mean"])
def test_micro_batches_give_the_whole_batch_gradient(learner, loss_agg_mode, monkeypatch):
    monkeypatch.setattr(LOSS_AGGREGATIONS, "_entries", dict(LOSS_AGGREGATIONS._entries))
    LOSS_AGGREGATIONS.add("custom-token-mean", CUSTOM_AGGREGATION)
    batch = training_batch(learner)
    whole = gradients(learner, batch, {"packing": "padded"}, loss_agg_mode=loss_agg_mode, micro_batch_size=8)
    assert any(bool(grad.abs().max() > 0) for grad in whole.values())  # 5 rows: one micro-batch
    for learners, micro_batch_size in (
        ({"packing": "padded"}, 1),  # 5 micro-batches of 1 row
        ({"packing": "padded"}, 2),  # micro-batches of 2, 2, 1 rows
        ({"packing": "packed", "micro_batch_tokens": 14}, 8),  # packed: rows of 11, 8 + 6, 11, 3 tokens
    ):
        split = gradients(learner, batch, learners, loss_agg_mode=loss_agg_mode, micro_batch_size=micro_batch_size)
        for name, grad in whole.items():
            torch.testing.assert_close(split[name], grad, atol=1e-5, rtol=0, msg=name)


def test_bf16_state_moves_as_torch_tensors_into_an_engine(model_dir):
    learner = build_learner(model_dir, dtype="bfloat16")
    with torch.no_grad():  # move the module away from the saved weights the engine will load
        for param in module_of(learner).parameters():
            param.add_(0.5)

    # the learner's own state: float32 master weights; the engines get bf16 copies of them
    state = learner.get_state(components="rl_module/default_policy")["rl_module"][DEFAULT_MODULE_ID]
    assert state and all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in state.values())
    weights = learner.policy_weights(DEFAULT_MODULE_ID)
    assert weights.keys() == hf_state_dict(state).keys()
    assert all(v.dtype == torch.bfloat16 and torch.equal(v, state["model." + k].bfloat16()) for k, v in weights.items())

    engine = HFEngine.from_pretrained(model_dir)  # as the EnvRunner builds it: the saved float32 weights
    engine_weights = engine.model.state_dict()
    assert weights.keys() == engine_weights.keys()
    assert not torch.equal(engine_weights["model.norm.weight"], weights["model.norm.weight"].float())

    engine.update_weights(weights, version=3)
    assert engine.weights_version == 3
    for name, value in engine.model.state_dict().items():
        assert value.dtype == torch.float32
        assert torch.equal(value, weights[name].float()), name  # bf16 -> float32 is exact


@pytest.mark.parametrize(
    ("learners", "thresholds_set"),
    [({}, [4 << 20]), ({"malloc_mmap_threshold": 1 << 20}, [1 << 20]), ({"malloc_mmap_threshold": None}, [])],
)
def test_a_cpu_learner_sets_the_mmap_threshold_it_is_given(model_dir, monkeypatch, learners, thresholds_set):
    """``malloc_mmap_threshold`` (4 MiB by default) reaches glibc at the learner's build, and
    nothing does with null (the call is recorded, not made)."""
    calls = []
    monkeypatch.setattr(torch_learner, "serve_large_allocations_by_mmap", lambda value: calls.append(value) or True)
    build_learner(model_dir, learners=learners)
    assert calls == thresholds_set


def test_update_changes_weights_and_reports_metrics(model_dir):
    learner = build_learner(model_dir)
    batch = training_batch(learner)
    expected_grad_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in gradients(learner, batch).values()]))
    trained = batch["loss_mask"] > 0
    module = module_of(learner)
    with torch.no_grad():
        logprobs = module.forward_train(batch)["logprobs"]
    ratio = torch.exp(logprobs - batch["old_logprobs"])
    advantages = batch["advantages"]
    clipped = ((advantages > 0) & (ratio > 1 + EPS)) | ((advantages < 0) & (ratio < 1 - EPS))
    expected_clip_fraction = clipped[trained].float().mean().item()
    assert 0 < expected_clip_fraction < 1  # the noise clips some tokens, not all

    before = {k: v.clone() for k, v in module.state_dict().items()}
    numpy_batch = SampleBatch({k: v.numpy() for k, v in batch.items()})
    results = learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: numpy_batch}, env_steps=int(trained.sum())))

    after = module.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)
    # AdamW's first step moves each weight by lr * g / (|g| + eps_adam) <= lr, ~lr where |g| >> 1e-8
    largest_step = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert largest_step == pytest.approx(LR, rel=1e-3)

    module_metrics = results[DEFAULT_MODULE_ID]
    assert module_metrics["gradients_default_optimizer_global_norm"].peek() == pytest.approx(
        float(expected_grad_norm), rel=1e-5
    )
    assert module_metrics["clip_fraction"].peek() == pytest.approx(expected_clip_fraction, abs=1e-6)


@pytest.mark.parametrize("grad_clip", [1e-3, None])
def test_rllib_grad_clip_scales_the_global_norm(model_dir, grad_clip):
    learner = build_learner(model_dir, grad_clip=grad_clip)
    batch = training_batch(learner)
    unclipped = torch.linalg.vector_norm(torch.stack([g.norm() for g in gradients(learner, batch).values()]))
    assert unclipped > 1e-2
    numpy_batch = SampleBatch({k: v.numpy() for k, v in batch.items()})
    trained = int((batch["loss_mask"] > 0).sum())
    applied = []  # the global norm of the gradients the optimizer steps with
    apply_gradients = learner.apply_gradients

    def recording(grads: dict) -> None:
        applied.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])))
        apply_gradients(grads)

    learner.apply_gradients = recording
    learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: numpy_batch}, env_steps=trained))
    expected = grad_clip if grad_clip is not None else unclipped
    assert float(applied[0]) == pytest.approx(float(expected), rel=1e-4)
    # once applied the gradients are freed: they do not stay resident through the next rollout
    assert all(p.grad is None for p in module_of(learner).parameters())


def test_nonfinite_updates_are_skipped_counted_and_stop_the_run_in_a_row(model_dir):
    learner = build_learner(model_dir, max_consecutive_nonfinite_steps=2)
    batch = training_batch(learner)
    poisoned = dict(batch, advantages=torch.where(batch["loss_mask"] > 0, torch.nan, batch["advantages"]))

    def update(rows: dict[str, torch.Tensor]) -> dict:
        numpy_batch = SampleBatch({k: v.numpy() for k, v in rows.items()})
        return learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: numpy_batch}, env_steps=1))

    module = module_of(learner)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    assert update(poisoned)["nonfinite_steps_skipped"].peek() == 1
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())  # no step taken
    assert update(batch)["nonfinite_steps_skipped"].peek() == 0  # a finite update resets the count
    assert not all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    update(poisoned)
    with pytest.raises(FloatingPointError, match="2 updates in a row had a NaN or inf loss or gradient"):
        update(poisoned)


def update(learner: ARPOTorchLearner, batch: dict[str, torch.Tensor]) -> dict:
    numpy_batch = SampleBatch({k: v.numpy() for k, v in batch.items()})
    trained = int((batch["loss_mask"] > 0).sum())
    return learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: numpy_batch}, env_steps=trained))


def changed_fraction(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    changed = sum(int((after[k] != before[k]).sum()) for k in before)
    return changed / sum(v.numel() for v in before.values())


@pytest.mark.parametrize("master_weights", [True, False])
def test_bf16_with_master_weights_learns_at_lr_1e_6(model_dir, master_weights):
    """AdamW's step is about lr = 1e-6 per weight: below half a bf16 ulp of most weights (2^-9
    relative, ~4e-5 at |w| = 0.02), so pure bf16 weights do not move, while float32 master weights
    all do; the bf16 copies the engines get follow once the steps add up to half an ulp."""
    learner = build_learner(model_dir, dtype="bfloat16", learners={"master_weights": master_weights}, lr=1e-6)
    module = module_of(learner)
    assert {p.dtype for p in module.parameters()} == {torch.float32 if master_weights else torch.bfloat16}
    batch = training_batch(learner)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    before_sent = learner.policy_weights(DEFAULT_MODULE_ID)
    for _ in range(10):
        update(learner, batch)
    after = module.state_dict()
    if master_weights:
        assert changed_fraction(before, after) > 0.999
        # ten steps of ~1e-6 move the master weights by ~1e-5 each, still rounding to the same
        # bf16 value for most weights; the engines see the sum of the steps, not lost steps
        drift = max(float((after[k] - before[k]).abs().max()) for k in before)
        assert 5e-6 < drift < 2e-5
        sent = learner.policy_weights(DEFAULT_MODULE_ID)
        assert all(sent[k].dtype == torch.bfloat16 for k in sent)
        assert changed_fraction(before_sent, sent) > 0
    else:
        assert changed_fraction(before, after) < 0.1


def layer_forwards(learner: ARPOTorchLearner) -> list[int]:
    """Counts the runs of the policy's first decoder layer's MLP, as they happen (its ``forward``
    wrapped: module hooks do not fire when a checkpoint recomputes it)."""
    calls = []
    mlp = module_of(learner).model.get_decoder().layers[0].mlp
    forward = mlp.forward

    def counting_forward(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    mlp.forward = counting_forward
    return calls


def test_gradient_checkpointing_recomputes_the_layers_and_gives_the_same_gradients(model_dir, learner):
    """Each decoder layer runs again in the backward pass (transformers checkpoints a layer only in
    training mode, which RLlib's ``forward_train`` sets)."""
    checkpointed = build_learner(model_dir, learners={"gradient_checkpointing": True})
    assert module_of(checkpointed).model.is_gradient_checkpointing
    assert not module_of(learner).model.is_gradient_checkpointing
    batch = training_batch(learner)
    plain_calls, checkpointed_calls = layer_forwards(learner), layer_forwards(checkpointed)
    expected = gradients(learner, batch)
    for name, grad in gradients(checkpointed, batch).items():
        torch.testing.assert_close(grad, expected[name], atol=1e-6, rtol=0, msg=name)
    assert len(checkpointed_calls) == 2 * len(plain_calls) > 0  # forward, then again in the backward


def test_chunked_logprobs_give_the_same_loss_gradients_and_entropies(model_dir, learner):
    chunked = build_learner(model_dir, learners={"logprob_chunk_size": 7})
    assert module_of(chunked).logprob_chunk_size == 7
    batch = training_batch(learner)
    with torch.no_grad():
        expected, got = (module_of(x).forward_train(batch, with_entropy=True) for x in (learner, chunked))
    torch.testing.assert_close(got["logprobs"], expected["logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["entropy"], expected["entropy"], atol=1e-5, rtol=0)
    expected_gradients = gradients(learner, batch)
    for name, grad in gradients(chunked, batch).items():
        torch.testing.assert_close(grad, expected_gradients[name], atol=1e-6, rtol=0, msg=name)


def test_out_of_memory_names_the_settings_to_change(model_dir, monkeypatch):
    from rllib_arpo.learner.memory import LearnerOutOfMemoryError

    learner = build_learner(model_dir, micro_batch_size=4, learners={"packing": "padded", "logprob_chunk_size": None})
    batch = training_batch(learner)

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(module_of(learner), "forward_train", out_of_memory)
    with pytest.raises(LearnerOutOfMemoryError) as caught:
        update(learner, batch)
    message = str(caught.value)
    assert "out of memory on a micro-batch of 4 rows x 11 tokens" in message  # ROWS' longest: 3 + 8
    for knob in ("micro_batch_size: 4 -> 2", "logprob_chunk_size: null -> 1024",
                 "gradient_checkpointing: false -> true", "dtype: float32 -> bfloat16",
                 "optimizer_states: full -> 8bit (AdamW's moments: 2.03 bytes a parameter instead of 8)",
                 "lora: null -> {rank: 16}",
                 "learner_backend: deepspeed", "max_response_tokens: 512"):  # fmt: skip
        assert knob in message, knob
    assert "GiB per GPU" in message  # the estimate of the current layout
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)

    tree = build_learner(model_dir, learners={"packing": "tree", "micro_batch_tokens": 64})
    monkeypatch.setattr(module_of(tree), "forward_train", out_of_memory)
    with pytest.raises(LearnerOutOfMemoryError, match="tree-packed micro-batch of <= 64 tokens") as caught:
        update(tree, batch)
    assert "micro_batch_tokens: 64 -> 32" in str(caught.value)

    # any other error passes through as it is
    monkeypatch.setattr(module_of(learner), "forward_train", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        update(learner, batch)


def shared_prefix_batch(learner: ARPOTorchLearner) -> dict[str, torch.Tensor]:
    """Two prompts, each with 3 rows; on the first prompt two rows branch after a common 6-token
    response span holding a 2-token tool result, so about half the tokens are shared."""
    rng = np.random.default_rng(3)
    vocab_size = module_of(learner).model.config.vocab_size

    def tokens(n: int) -> list[int]:
        return rng.integers(1, vocab_size, n).tolist()

    rows, advantages = [], []
    for prompt in (tokens(7), tokens(5)):
        span = tokens(6)
        for response, mask in (
            (span + tokens(4), [1, 1, 0, 0, 1, 1, 1, 1, 1, 1]),
            (span + tokens(2), [1, 1, 0, 0, 1, 1, 1, 1]),
            (tokens(5), [1] * 5),
        ):
            n = len(response)
            rows.append(
                TrajectoryRow(
                    prompt_ids=np.asarray(prompt),
                    response_ids=np.asarray(response),
                    loss_mask=np.asarray(mask, dtype=np.float32),
                    old_logprobs=np.zeros(n, dtype=np.float32),
                    entropies=np.zeros(n, dtype=np.float32),
                    segment_ids=np.zeros(n, dtype=np.int64),
                )
            )
            advantages.append(np.full(n, rng.normal(), dtype=np.float32))
    return padded_batch_with_noisy_old_logprobs(learner, rows, advantages, rng)


@pytest.mark.parametrize("packing", ["packed", "tree"])
@pytest.mark.parametrize("micro_batch_tokens", [4096, 20], ids=["one-micro-batch", "several"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.5], ids=["no-kl", "kl"])
def test_a_packed_update_gives_the_padded_update(model_dir, packing, micro_batch_tokens, kl_coef, monkeypatch):
    """The gradients agree to 1e-6 (float rounding: a shared token's gradient is summed in another
    order); the parameters after one AdamW step (lr 1e-3) to 1e-5, a hundredth of a step: Adam
    divides by |g| + 1e-8, so on weights whose gradient is ~1e-8 the rounding becomes ~1e-6."""
    padded = build_learner(model_dir, micro_batch_size=2, kl_coef=kl_coef)
    learners = {"packing": packing, "micro_batch_tokens": micro_batch_tokens}
    packed = build_learner(model_dir, learners=learners, kl_coef=kl_coef)
    batch = shared_prefix_batch(padded)
    expected = gradients(padded, batch)
    laid_out = []  # tokens of each packed forward pass (policy and reference model)
    monkeypatch.setattr(
        "rllib_arpo.learner.forward.packed_logprobs",
        lambda model, micro, **kwargs: laid_out.append(micro.num_tokens) or packed_logprobs(model, micro, **kwargs),
    )
    packed_gradients = gradients(packed, batch)
    # rows of 7 + (10, 8, 5) and 5 + (10, 8, 5) tokens; the tree holds each prompt and span once
    passes = 2 if kl_coef else 1
    if micro_batch_tokens == 4096:
        assert laid_out == [82 if packing == "packed" else 7 + 5 + 2 * (6 + 4 + 2 + 5)] * passes
    else:
        assert len(laid_out) >= 3 * passes and max(laid_out) <= micro_batch_tokens
    for name, grad in packed_gradients.items():
        torch.testing.assert_close(grad, expected[name], atol=1e-6, rtol=0, msg=name)
    for learner in (padded, packed):
        update(learner, batch)
    after = module_of(padded).state_dict()
    assert any(not torch.equal(after[k], v) for k, v in module_of(build_learner(model_dir)).state_dict().items())
    for name, value in module_of(packed).state_dict().items():
        torch.testing.assert_close(value, after[name], atol=1e-5, rtol=0, msg=name)


def test_the_tree_attends_in_blocks_of_attention_block_tokens_queries(model_dir, monkeypatch):
    padded = build_learner(model_dir, micro_batch_size=2)
    tree = build_learner(model_dir, learners={"packing": "tree", "attention_block_tokens": 5})
    batch = shared_prefix_batch(padded)
    blocks = []  # (start, stop) of each query block of each packed forward pass
    monkeypatch.setattr(
        "rllib_arpo.learner.forward.packed_logprobs",
        lambda model, micro, **kwargs: (
            blocks.append([(b.start, b.stop) for b in micro.query_blocks]) or packed_logprobs(model, micro, **kwargs)
        ),
    )
    tree_gradients = gradients(tree, batch)
    # one micro-batch: the tree of 7 + 5 + 2 * (6 + 4 + 2 + 5) = 46 tokens, in blocks of 5 queries
    assert blocks == [[(start, min(start + 5, 46)) for start in range(0, 46, 5)]]
    for name, grad in gradients(padded, batch).items():
        torch.testing.assert_close(tree_gradients[name], grad, atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("packing", ["packed", "tree"])
def test_a_micro_batch_that_trains_no_token_adds_nothing(model_dir, packing):
    """ROWS' third row (2 + 4 tokens) trains no token, as arpo_hard's fully shared rows do; with 6
    tokens a micro-batch it is packed alone and its pass adds a zero gradient."""
    padded = build_learner(model_dir, micro_batch_size=2)
    packed = build_learner(model_dir, learners={"packing": packing, "micro_batch_tokens": 6})
    batch = training_batch(padded)
    expected = gradients(padded, batch)
    for name, grad in gradients(packed, batch).items():
        torch.testing.assert_close(grad, expected[name], atol=1e-6, rtol=0, msg=name)


def batch_sampled_in_bfloat16(model_dir: str, learner: ARPOTorchLearner) -> dict[str, torch.Tensor]:
    """``training_batch`` rows whose old log-probs are those of the same weights in bfloat16 (an
    engine in bf16), where the learner computes in float32."""
    from transformers import AutoModelForCausalLM

    batch = training_batch(learner)
    engine_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        engine_logprobs, _ = sequence_logprobs(engine_model, batch)
    batch["old_logprobs"] = torch.where(batch["loss_mask"] > 0, engine_logprobs, torch.zeros_like(engine_logprobs))
    return batch


def record_update_forwards(learner: ARPOTorchLearner) -> list[tuple[dict, torch.Tensor]]:
    """The ``(chunk, log-probs)`` of every forward the learner's update makes with gradients on,
    recorded as it runs: the very log-probs its metrics are computed from. A forward of the test's
    own would differ from them by float32 rounding (other shapes, other kernels) and give the
    metrics a tolerance that depends on the CPU."""
    recorded = []
    forward = learner._forward_train

    def recording_forward(mid, chunk):
        out = forward(mid, chunk)
        if torch.is_grad_enabled():  # not the no-grad recomputation of old_logprob_source: learner
            recorded.append((chunk, out["logprobs"].detach()))
        return out

    learner._forward_train = recording_forward
    return recorded


@pytest.mark.parametrize("old_logprob_source", ["engine", "learner"])
def test_sampler_learner_mismatch_is_measured_and_learner_old_logprobs_start_at_ratio_1(model_dir, old_logprob_source):
    learner = build_learner(model_dir, old_logprob_source=old_logprob_source)
    batch = batch_sampled_in_bfloat16(model_dir, learner)
    forwards = record_update_forwards(learner)
    metrics = update(learner, batch)[DEFAULT_MODULE_ID]
    [(chunk, learner_logprobs)] = forwards  # one minibatch of one micro-batch: the first pass is all of it
    trained = chunk["loss_mask"] > 0
    engine_logprobs = chunk.get(SAMPLER_LOGPROBS, chunk["old_logprobs"])  # the batch's, where learner replaced them
    difference = (learner_logprobs.double() - engine_logprobs.double())[trained]
    assert float(difference.abs().max()) > 1e-3  # bf16 and float32 disagree

    # the same float32 log-probs summed in float64 in another order: |error| <= n * 2^-53 * sum
    log_rho = -difference  # log pi_engine - log pi_learner on the engine's tokens: k3 of KL(engine || learner)
    expected_kl = float((torch.exp(-log_rho) + log_rho - 1).mean())
    assert metrics["logprob_mismatch_kl"].peek() == pytest.approx(expected_kl, rel=1e-9)
    assert metrics["logprob_mismatch_max_abs"].peek() == float(difference.abs().max())
    if old_logprob_source == "learner":
        assert metrics["first_ratio_max_deviation"].peek() == 0.0
        assert metrics["first_ratio_std"].peek() == 0.0
    else:
        assert metrics["first_ratio_max_deviation"].peek() == pytest.approx(
            float((torch.exp(difference) - 1).abs().max()), rel=1e-9
        )


def count_forwards(learner: ARPOTorchLearner) -> dict[bool, int]:
    """The learner's forwards as they run, counted by whether gradients were on."""
    counts = {True: 0, False: 0}
    forward = learner._forward_train

    def counting_forward(mid, chunk):
        counts[torch.is_grad_enabled()] += 1
        return forward(mid, chunk)

    learner._forward_train = counting_forward
    return counts


@pytest.mark.parametrize("num_epochs", [1, 2])
def test_learner_old_logprobs_of_a_one_pass_update_come_from_its_training_forward(model_dir, num_epochs):
    """One epoch of one minibatch: pi_old is the training forward's own log-probs, no forward
    without gradients is made, and the first ratio is exactly 1; two epochs: the old log-probs are
    recomputed (one forward without gradients) before the first step changes the weights."""
    learner = build_learner(model_dir, old_logprob_source="learner")
    batch = batch_sampled_in_bfloat16(model_dir, learner)
    counts = count_forwards(learner)
    numpy_batch = SampleBatch({k: v.numpy() for k, v in batch.items()})
    trained = int((batch["loss_mask"] > 0).sum())
    metrics = learner.update(
        batch=MultiAgentBatch({DEFAULT_MODULE_ID: numpy_batch}, env_steps=trained),
        num_epochs=num_epochs,
        minibatch_size=len(batch["loss_mask"]),
    )[DEFAULT_MODULE_ID]
    assert counts == ({True: 1, False: 0} if num_epochs == 1 else {True: 2, False: 1})
    assert metrics["first_ratio_max_deviation"].peek() == 0.0
    assert metrics["logprob_mismatch_kl"].peek() > 0  # measured against the engine's, kept aside


@pytest.mark.parametrize("packing", ["padded", "tree"])
def test_a_temperature_trains_the_tempered_policy_from_a_first_ratio_of_1(model_dir, packing):
    config = (
        ARPOConfig()
        .policy(model_path=model_dir)
        .rollouts(temperature=0.5)
        .training(lr=LR, old_logprob_source="learner")
        .learners(packing=packing)
    )
    vocab_size = AutoConfig.from_pretrained(model_dir).vocab_size
    learner = config.build_learner(spaces={DEFAULT_MODULE_ID: placeholder_spaces(vocab_size)})
    batch = training_batch(learner)
    trained = batch["loss_mask"] > 0
    with torch.no_grad():
        tempered = module_of(learner).forward_train(batch)["logprobs"]
        model = module_of(learner).model
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1] / 0.5
        expected = torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(tempered[trained], expected[trained], atol=1e-5, rtol=0)

    metrics = update(learner, batch)[DEFAULT_MODULE_ID]
    assert metrics["first_ratio_max_deviation"].peek() == 0.0
    assert "logprob_mismatch_kl" not in metrics  # the engine's log-probs are of the temperature-1 policy


def test_tis_weights_the_engine_tokens_by_the_learner_over_engine_ratio(model_dir):
    learner = build_learner(model_dir, old_logprob_source="learner", tis_cap=1.0)
    batch = batch_sampled_in_bfloat16(model_dir, learner)
    forwards = record_update_forwards(learner)
    metrics = update(learner, batch)[DEFAULT_MODULE_ID]
    [(chunk, learner_logprobs)] = forwards
    trained = chunk["loss_mask"] > 0
    weights = torch.exp(learner_logprobs - chunk[SAMPLER_LOGPROBS]).clamp(max=1.0)[trained]  # float32, as trained
    assert 0 < float((weights < 1.0).float().mean()) < 1  # some tokens truncated, some not

    # the metric's float32 mean of n weights in [0, 1]: |error| <= n * 2^-24 relative
    assert metrics["tis_weight_mean"].peek() == pytest.approx(float(weights.double().mean()), rel=len(weights) * 2**-24)
    assert metrics["tis_truncated_fraction"].peek() == pytest.approx(float((weights >= 1.0).double().mean()))


def test_with_8bit_moments_the_first_update_is_adamws(model_dir):
    """``optimizer_states: 8bit``: the learner steps with bitsandbytes' AdamW8bit, and its first update
    (zero states) moves every weight as float32 AdamW's does, the same float32 operations on the same
    gradients: equal to 8 float32 ulps of lr plus 2 of the weight (models.optimizers)."""
    weights = {}
    for states in ("full", "8bit"):
        learner = build_learner(model_dir, learners={"optimizer_states": states})
        update(learner, training_batch(learner))
        weights[states] = {name: p.detach().clone() for name, p in module_of(learner).named_parameters()}
        [optimizer] = learner._optimizer_parameters
        assert type(optimizer).__name__ == {"full": "AdamW", "8bit": "AdamW8bit"}[states]
    ulp = 2.0**-23
    for name, exact in weights["full"].items():
        torch.testing.assert_close(weights["8bit"][name], exact, rtol=2 * ulp, atol=8 * ulp * LR, msg=name)
    initial = {name: p.detach() for name, p in module_of(build_learner(model_dir)).named_parameters()}
    assert changed_fraction(initial, weights["8bit"]) > 0.5
