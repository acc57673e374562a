"""Several learners give the update of one: DDP (gloo; padded and tree-packed micro-batches),
DeepSpeed ZeRO-2 and ZeRO-3 against one padded learner, with full weights and with a LoRA adapter.

The batch has 5 rows with 5, 3, 0, 5 and 1 trained tokens: 2 learners get shards of 3 rows (one
row added with no trained token), and the shards' token counts (8 and 6) differ, so only the
global token mean makes 2 learners equal to 1 (a mean of per-shard means weighs the second
shard's tokens 8/6 times more). Two updates on the batch, so that Adam's second step depends on
the gradients' magnitudes and not only on their signs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

LR = 1e-4
# stated tolerance: float32 all-reduce sums in another order than one learner's backward
# measured: 1.4e-7 (DDP, ZeRO-2) and 1.5e-6 (ZeRO-3); a mean of per-shard token means: 4e-4
WEIGHTS_ATOL = 1e-5  # a tenth of one step (lr)
NORM_RTOL = 1e-5
ROWS = [(3, [1, 1, 1, 0, 0, 0, 1, 1], 1.0), (5, [1, 1, 1], -0.5), (2, [0, 0, 0, 0], 0.25),
        (4, [1, 0, 0, 1, 1, 1, 1], -1.5), (2, [1], 2.0)]  # fmt: skip


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory) -> str:
    from rllib_arpo.models.tiny_policy import build_tiny_policy, build_tokenizer

    tokenizer = build_tokenizer(["Where is the tower? <search>tower</search> <answer>Paris</answer>"], vocab_size=300)
    model = build_tiny_policy(tokenizer, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                              intermediate_size=96, max_position_embeddings=64)  # fmt: skip
    directory = tmp_path_factory.mktemp("small_policy")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def learner_config(model_dir: str, num_learners: int, **learners):
    from rllib_arpo.algorithm import ARPOConfig

    return (
        ARPOConfig()
        .policy(model_path=model_dir)
        .training(lr=LR, micro_batch_size=2, grad_clip=100.0)  # large: logs the norm, never clips
        .learners(num_learners=num_learners, num_cpus_per_learner=1, **{"packing": "padded", **learners})
    )


def training_batch(model_dir: str) -> dict[str, np.ndarray]:
    """ROWS with random token ids; old log-probs = the initial policy's + N(0, 0.3^2) noise."""
    from transformers import AutoModelForCausalLM

    from rllib_arpo.core.logprobs import next_token_logprobs
    from rllib_arpo.core.tree import TrajectoryRow
    from rllib_arpo.learner.packing import pad_rows

    rng = np.random.default_rng(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rows, advantages = [], []
    for prompt_length, mask, advantage in ROWS:
        n = len(mask)
        rows.append(TrajectoryRow(
            prompt_ids=rng.integers(1, model.config.vocab_size, prompt_length),
            response_ids=rng.integers(1, model.config.vocab_size, n),
            loss_mask=np.asarray(mask, dtype=np.float32), old_logprobs=np.zeros(n, dtype=np.float32),
            entropies=np.zeros(n, dtype=np.float32), segment_ids=np.zeros(n, dtype=np.int64),
        ))  # fmt: skip
        advantages.append(np.full(n, advantage, dtype=np.float32))
    batch = pad_rows(rows, advantages, pad_token_id=0)
    ids = torch.from_numpy(batch["input_ids"])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.from_numpy(batch["attention_mask"])).logits
        logprobs = next_token_logprobs(logits, ids).numpy()
    noise = rng.normal(0.0, 0.3, logprobs.shape).astype(np.float32)
    batch["old_logprobs"] = np.where(batch["loss_mask"] > 0, logprobs + noise, 0.0).astype(np.float32)
    return batch


def train_twice(config, batch) -> tuple[dict[str, torch.Tensor], list[float], dict]:
    """Weights after two updates on ``batch``, the global gradient norm of each, last metrics."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from transformers import AutoConfig

    from rllib_arpo.learner.group import update_learners
    from rllib_arpo.models.spaces import placeholder_spaces
    from rllib_arpo.weights.object_store import policy_weights

    vocab_size = AutoConfig.from_pretrained(config.model_path).vocab_size
    group = config.build_learner_group(spaces={DEFAULT_MODULE_ID: placeholder_spaces(vocab_size)})
    try:
        norms, metrics = [], {}
        for _ in range(2):
            [results, *others] = update_learners(group, batch, config)
            assert len(others) == max(config.num_learners, 1) - 1
            module_results = results[DEFAULT_MODULE_ID]
            norms.append(module_results["gradients_default_optimizer_global_norm"].peek())
            metrics = {k: [r[DEFAULT_MODULE_ID][k].peek() for r in (results, *others)] for k in ("policy_loss",)}
        return policy_weights(group), norms, metrics
    finally:
        group.shutdown()


@pytest.fixture(scope="module")
def one_learner(small_model_dir):
    batch = training_batch(small_model_dir)
    return batch, train_twice(learner_config(small_model_dir, num_learners=0), batch)


@pytest.mark.parametrize(
    "learners",
    [
        {},
        # tree-packed micro-batches of <= 16 tokens: the learners run different numbers of them
        {"packing": "tree", "micro_batch_tokens": 16},
        {"learner_backend": "deepspeed", "zero_stage": 2},
        {"learner_backend": "deepspeed", "zero_stage": 3},
    ],
    ids=["ddp", "ddp-tree-packed", "deepspeed-zero2", "deepspeed-zero3"],
)
def test_two_learners_update_as_one(ray_session, small_model_dir, one_learner, learners):
    batch, (expected, expected_norms, expected_metrics) = one_learner
    weights, norms, metrics = train_twice(learner_config(small_model_dir, num_learners=2, **learners), batch)
    assert norms == pytest.approx(expected_norms, rel=NORM_RTOL)
    # each learner's policy_loss is its shard's part of the global one, times 2: their mean is the global loss
    assert np.mean(metrics["policy_loss"]) == pytest.approx(expected_metrics["policy_loss"][0], rel=1e-5)
    assert weights.keys() == expected.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=WEIGHTS_ATOL, msg=name)


LORA = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}


@pytest.fixture(scope="module")
def one_lora_learner(small_model_dir):
    batch = training_batch(small_model_dir)
    return batch, train_twice(learner_config(small_model_dir, num_learners=0, lora=LORA), batch)


@pytest.mark.parametrize(
    "learners",
    [{}, {"learner_backend": "deepspeed", "zero_stage": 2}, {"learner_backend": "deepspeed", "zero_stage": 3}],
    ids=["ddp", "deepspeed-zero2", "deepspeed-zero3"],
)
def test_two_lora_learners_update_as_one_and_train_the_adapter_only(
    ray_session, small_model_dir, one_lora_learner, learners
):
    """The adapter's two updates match one learner's; every learner's frozen base weights got no
    gradient, so DDP and DeepSpeed reduced the adapter's gradients alone."""

    batch, (expected, expected_norms, _) = one_lora_learner
    assert expected and all(".lora_" in name for name in expected)  # the adapter's tensors only
    config = learner_config(small_model_dir, num_learners=2, lora=LORA, **learners)
    weights, norms, _ = train_twice(config, batch)
    assert norms == pytest.approx(expected_norms, rel=NORM_RTOL)
    assert weights.keys() == expected.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=WEIGHTS_ATOL, msg=name)


def test_deepspeed_bf16_optimizer_keeps_float32_master_weights(ray_session, small_model_dir):
    """One local DeepSpeed learner (its own one-process group) in bf16 at lr 1e-6: the engine's
    weights are bf16, its optimizer steps float32 master weights, so ten steps of ~1e-6 move a
    quarter of the bf16 weights (pure bf16 AdamW moves 2%: tests/unit/test_learner.py)."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from transformers import AutoConfig

    from rllib_arpo.learner.group import update_learners
    from rllib_arpo.models.spaces import placeholder_spaces
    from rllib_arpo.weights.object_store import policy_weights

    config = learner_config(small_model_dir, num_learners=0, learner_backend="deepspeed").training(lr=1e-6)
    config.dtype = "bfloat16"
    vocab_size = AutoConfig.from_pretrained(small_model_dir).vocab_size
    group = config.build_learner_group(spaces={DEFAULT_MODULE_ID: placeholder_spaces(vocab_size)})
    batch = training_batch(small_model_dir)
    try:
        before = {name: tensor.clone() for name, tensor in policy_weights(group).items()}  # not views
        assert {t.dtype for t in before.values()} == {torch.bfloat16}
        assert {p.dtype for p in group._learner.module[DEFAULT_MODULE_ID].parameters()} == {torch.bfloat16}
        for _ in range(10):
            update_learners(group, batch, config)
        after = policy_weights(group)
    finally:
        group.shutdown()
    changed = sum(int((after[k] != before[k]).sum()) for k in before) / sum(t.numel() for t in before.values())
    assert changed > 0.1
