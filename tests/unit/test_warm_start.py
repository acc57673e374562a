import re

import numpy as np
import pytest
import torch

import rllib_arpo.tools  # noqa: F401  (registers the tools)
from rllib_arpo.cold_start.copy_drill import COPY_DRILL_ANSWER, COPY_DRILL_PROMPT, copy_drill_sequences
from rllib_arpo.cold_start.sft import (
    LENGTH_POOL_BATCHES,
    MemoryLayout,
    length_pooled_batches,
    pad_batch,
    sft_loss,
    warm_start,
)
from rllib_arpo.cold_start.task_demonstrations import evaluate_arithmetic, fresh_demonstrations, sft_dataset
from rllib_arpo.cold_start.transcripts import encode_transcript
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.tir_questions import TIRExample
from rllib_arpo.data.tir_task import SPLIT_NAMES, TIRTask, format_prompt
from rllib_arpo.eval.evaluate import evaluate_policy
from rllib_arpo.models.tiny_policy import TAG_TOKENS, build_tiny_policy, build_tokenizer
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.engine import Generation
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.tools.base import ToolExecutor

SMALL_MODEL = dict(hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=64)
PERFECT_ONLY = {"perfect": 1.0}


@pytest.fixture(scope="module")
def task() -> TIRTask:
    return TIRTask(seed=0, num_entities=16, num_train=6, num_valid=3, num_test=3)


@pytest.fixture(scope="module")
def tokenizer(task):
    texts = task.corpus() + [format_prompt(example) for name in SPLIT_NAMES for example in task.split(name)]
    return build_tokenizer(texts, vocab_size=400)


def spans(tokenizer, ids: list[int], mask: list[int]) -> list[tuple[int, str]]:
    """The runs of equal mask value, decoded: [(mask, text), ...]."""
    runs: list[tuple[int, list[int]]] = []
    for token, value in zip(ids, mask):
        if runs and runs[-1][0] == value:
            runs[-1][1].append(token)
        else:
            runs.append((value, [token]))
    return [(value, tokenizer.decode(tokens)) for value, tokens in runs]


def test_mask_trains_only_the_model_text(tokenizer):
    prompt = "Question: What is the population of Zorvath multiplied by 7?\nAnswer: "
    page = "Page 1: Zorvath is a city. The population of Zorvath is 48213."
    transcript = (
        "<think> I need the population of Zorvath. </think> <search> population of Zorvath </search>"
        f" <result>{page}</result>"
        " <think> I compute it with Python. </think> <python> 48213 * 7 </python> <result>337491</result>"
        " <answer> \\boxed{337491} </answer>"
    )
    prompt_ids = tokenizer.encode(prompt)
    sequence = encode_transcript(tokenizer, prompt_ids, transcript)
    assert spans(tokenizer, sequence.input_ids, sequence.loss_mask) == [
        (0, prompt),
        (1, "<think> I need the population of Zorvath. </think> <search> population of Zorvath </search>"),
        (0, f" <result>{page}</result>"),
        (1, " <think> I compute it with Python. </think> <python> 48213 * 7 </python>"),
        (0, " <result>337491</result>"),
        (1, " <answer> \\boxed{337491} </answer><|endoftext|>"),
    ]
    # the tool segment is built exactly as the rollout appends it
    result_ids = tokenizer.encode(" <result>") + tokenizer.encode("337491") + tokenizer.encode("</result>")
    answer_start = len(sequence.input_ids) - len(tokenizer.encode(" <answer> \\boxed{337491} </answer>")) - 1
    assert sequence.input_ids[answer_start - len(result_ids) : answer_start] == result_ids

    # results are cut to max_tool_result_tokens like the rollout does (digits are single tokens)
    cut = encode_transcript(tokenizer, prompt_ids, transcript, max_tool_result_tokens=3)
    cut_page = tokenizer.decode(tokenizer.encode(page)[:3])
    assert spans(tokenizer, cut.input_ids, cut.loss_mask)[2] == (0, f" <result>{cut_page}</result>")
    assert spans(tokenizer, cut.input_ids, cut.loss_mask)[4] == (0, " <result>337</result>")


def test_evaluate_arithmetic_answers_like_the_python_tool():
    assert evaluate_arithmetic("3817 * 29 + 112") == "110805"  # 3817 * 29 = 110693, + 112
    assert evaluate_arithmetic(" (1000 + 100) * 11 ") == "12100"  # 1100 * 11
    assert evaluate_arithmetic("1605 - 3736") == "-2131"
    for code in ("__import__('os')", "7 / 2", "x * 3", "2 ** 8"):
        with pytest.raises(ValueError, match="not integer arithmetic"):
            evaluate_arithmetic(code)


def test_fresh_demonstrations_never_repeat_a_knowledge_base():
    # 3 questions per task (one of each kind), so 7 demonstrations come from 3 new tasks
    pairs = fresh_demonstrations(7, np.random.default_rng(0), PERFECT_ONLY, questions_per_task=3, num_entities=8)
    assert len(pairs) == 7 and len({example.plain_prompt for example, _ in pairs}) == 7
    seed_0_names = {
        entity.name for entity in TIRTask(seed=0, num_entities=8, num_train=3, num_valid=0, num_test=0).entities
    }
    searched = set()
    for example, transcript in pairs:
        answer = re.search(r"\\boxed\{(-?\d+)\}", transcript).group(1)
        arithmetic = re.fullmatch(r"Question: What is ([\d ()+*-]+)\?\nAnswer: ", example.plain_prompt)
        if arithmetic:  # a python question: the code is the question's expression, answered in process
            assert f"<python> {arithmetic.group(1)} </python> <result>{answer}</result>" in transcript
        else:  # the number first searched for is read from that task's own corpus
            name = re.search(r"<search> .+? of (\w+) </search>", transcript).group(1)
            searched.add(name)
            assert re.search(rf"The [a-z ]+ of {name} is \d+\.", transcript)
    assert len(searched) >= 3 and not searched <= seed_0_names  # names from more than one knowledge base
    with pytest.raises(ValueError, match="unknown demonstration qualities"):
        fresh_demonstrations(1, np.random.default_rng(0), {"sloppy": 1.0})


def test_fresh_demonstrations_of_the_namesakes_variant_search_again_after_a_renaming():
    pairs = fresh_demonstrations(
        24, np.random.default_rng(0), PERFECT_ONLY, questions_per_task=3, num_entities=8, variant="namesakes"
    )
    assert len(pairs) == 24
    renamed = []
    for _, transcript in pairs:
        searches = re.findall(r"<search> (.+?) of (\w+) </search>", transcript)
        renaming = searches and re.search(rf"{searches[0][1]} is a \w+\. It was renamed (\w+);", transcript)
        if renaming:  # the second search asks for the same attribute under the new name
            assert searches == [searches[0], (searches[0][0], renaming.group(1))]
            renamed.append(transcript)
    assert renamed


def test_sft_dataset_masks_results(tokenizer):
    perfect = sft_dataset(tokenizer, np.random.default_rng(0), PERFECT_ONLY, 6)
    pairs = fresh_demonstrations(6, np.random.default_rng(0), PERFECT_ONLY)  # the same draws
    assert len(perfect) == 6
    for (example, transcript), sequence in zip(pairs, perfect):
        trained = "".join(text for value, text in spans(tokenizer, sequence.input_ids, sequence.loss_mask) if value)
        answer = re.search(r"\\boxed\{-?\d+\}", transcript).group()
        assert trained.endswith(f"<answer> {answer} </answer><|endoftext|>")
        assert "<result>" not in trained and "Page 1" not in trained
        assert tokenizer.decode(sequence.input_ids).startswith(example.plain_prompt)

    stopped = sft_dataset(tokenizer, np.random.default_rng(0), {"stopped_early": 1.0}, 6)
    for sequence in stopped:  # first tool result, then EOS: nothing after the result but the EOS is trained
        assert tokenizer.decode(sequence.input_ids).endswith("</result><|endoftext|>")
        assert sequence.loss_mask[-2:] == [0, 1]


def test_length_pooled_batches_sort_within_each_pool():
    rng = np.random.default_rng(0)
    batches = length_pooled_batches([5, 1, 4, 2, 3, 6], 2, rng)
    # one pool; by length the indices are 1 (1), 3 (2), 4 (3), 2 (4), 0 (5), 5 (6)
    assert sorted(batches) == [[0, 5], [1, 3], [4, 2]]
    # batch size 1: pools of LENGTH_POOL_BATCHES = 16 consecutive sequences, each shuffled in place
    batches = length_pooled_batches(list(range(40, 0, -1)), 1, rng)
    assert LENGTH_POOL_BATCHES == 16
    assert sorted(b[0] for b in batches[:16]) == list(range(16))
    assert sorted(b[0] for b in batches[16:32]) == list(range(16, 32))
    assert sorted(b[0] for b in batches[32:]) == list(range(32, 40))


def test_pad_batch_and_loss_count_only_trained_tokens(tokenizer):
    model = build_tiny_policy(tokenizer, **SMALL_MODEL)
    short = encode_transcript(tokenizer, tokenizer.encode("Question: a\nAnswer: "), "<answer> \\boxed{1} </answer>")
    long = encode_transcript(tokenizer, tokenizer.encode("Question: bb\nAnswer: "), "<answer> \\boxed{22} </answer>")
    batch = pad_batch([short, long], tokenizer.pad_token_id)
    width = len(long.input_ids)
    assert batch["input_ids"].shape == (2, width)
    assert batch["attention_mask"][0].tolist() == [1] * len(short.input_ids) + [0] * (width - len(short.input_ids))
    assert batch["loss_mask"][0].sum() == sum(short.loss_mask)
    # the batch loss is the token-weighted mean of the two sequences' own losses
    with torch.no_grad():
        alone = [sft_loss(model, pad_batch([s], tokenizer.pad_token_id)) for s in (short, long)]
        both = sft_loss(model, batch)
    counts = [sum(short.loss_mask[1:]), sum(long.loss_mask[1:])]
    expected = (alone[0] * counts[0] + alone[1] * counts[1]) / (counts[0] + counts[1])
    assert torch.allclose(both, expected, atol=1e-5)


def test_copy_drill_trains_exactly_the_repeated_tokens(tokenizer):
    prompt = tokenizer.encode(COPY_DRILL_PROMPT)
    answer = tokenizer.encode(COPY_DRILL_ANSWER)
    tags = set(tokenizer.convert_tokens_to_ids(list(TAG_TOKENS)))
    drills = copy_drill_sequences(tokenizer, np.random.default_rng(0), 200)
    assert len(drills) == 200
    lengths = set()
    for drill in drills:
        ids, mask = drill.input_ids, drill.loss_mask
        n = (len(ids) - len(prompt) - len(answer) - 1) // 2  # prompt, s, answer, s, EOS
        lengths.add(n)
        tokens = ids[len(prompt) : len(prompt) + n]
        assert ids == prompt + tokens + answer + tokens + [tokenizer.eos_token_id]
        assert mask == [0] * (len(prompt) + n + len(answer)) + [1] * (n + 1)
        assert not (set(tokens) & (tags | {tokenizer.eos_token_id}))
    assert lengths == set(range(4, 12))
    again = copy_drill_sequences(tokenizer, np.random.default_rng(0), 200)
    assert [d.input_ids for d in again] == [d.input_ids for d in drills]


def test_warm_start_lowers_the_loss_and_is_seeded(tokenizer):
    model = build_tiny_policy(tokenizer, **SMALL_MODEL)
    dataset = sft_dataset(tokenizer, np.random.default_rng(0), PERFECT_ONLY, 12 * 3)  # what seed 0 trains on
    everything = pad_batch(dataset, tokenizer.pad_token_id)
    with torch.no_grad():
        before = sft_loss(model, everything).item()
    kwargs = dict(steps=12, batch_size=3, lr=1e-2, quality_mix=PERFECT_ONLY, num_threads=1, progress=False)
    losses = warm_start(model, tokenizer, seed=0, **kwargs)
    with torch.no_grad():
        after = sft_loss(model, everything).item()
    assert len(losses) == 12  # no copy drill by default
    assert before > 5.5  # about log(412) = 6.02 at initialisation
    assert after < before - 1.5
    assert not model.training

    again = build_tiny_policy(tokenizer, **SMALL_MODEL)
    warm_start(again, tokenizer, seed=0, **kwargs)
    other = build_tiny_policy(tokenizer, **SMALL_MODEL)
    warm_start(other, tokenizer, seed=1, **kwargs)
    weights, same, different = model.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(weights[name], same[name]) for name in weights)
    assert not torch.equal(weights["model.embed_tokens.weight"], different["model.embed_tokens.weight"])

    drilled = build_tiny_policy(tokenizer, **SMALL_MODEL)
    drill_and_sft = warm_start(drilled, tokenizer, seed=0, copy_drill_steps=5, **kwargs)
    assert len(drill_and_sft) == 5 + 12
    assert not torch.equal(drilled.state_dict()["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])


@pytest.mark.parametrize(
    "layout",
    [MemoryLayout(micro_batch_rows=1), MemoryLayout(chunk_size=5), MemoryLayout(2, 5, gradient_checkpointing=True)],
)
def test_a_memory_layout_gives_the_whole_batch_loss_and_gradient(tokenizer, layout):
    """One step at lr 0 leaves the step's gradient in the weights: micro-batches weighted by their
    trained tokens, the output layer in chunks on trained positions only, and recomputed layers
    give the whole batch's. Bound: the same float32 terms summed in another order differ by at
    most n * 2^-24 of the sum of their magnitudes, n the batch's trained tokens (each token's
    gradient term is at most the largest gradient entry times n, as the loss is their mean)."""
    kwargs = dict(steps=1, batch_size=4, lr=0.0, quality_mix=PERFECT_ONLY, num_threads=1, progress=False)
    whole = build_tiny_policy(tokenizer, **SMALL_MODEL)
    [whole_loss] = warm_start(whole, tokenizer, seed=0, **kwargs)
    laid_out = build_tiny_policy(tokenizer, **SMALL_MODEL)
    [laid_out_loss] = warm_start(laid_out, tokenizer, seed=0, memory=layout, **kwargs)
    dataset = sft_dataset(tokenizer, np.random.default_rng(0), PERFECT_ONLY, 4)
    n = sum(sum(sequence.loss_mask[1:]) for sequence in dataset)
    assert laid_out_loss == pytest.approx(whole_loss, rel=n * 2**-24)
    expected = dict(whole.named_parameters())
    for name, parameter in laid_out.named_parameters():
        bound = n * n * 2**-24 * float(expected[name].grad.abs().max())
        torch.testing.assert_close(parameter.grad, expected[name].grad, atol=bound, rtol=0, msg=name)
    assert not laid_out.is_gradient_checkpointing  # switched off again after training


class ScriptedEngine:
    """A GenerationEngine that writes a fixed response per prompt, one segment per call: the
    segment after the n-th tool result is ``script[prompt][n]``."""

    weights_version = 0
    prefers_early_children = False

    def __init__(self, tokenizer, scripts: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.scripts = scripts

    def generate(self, prefixes, params):
        generations = []
        for prefix in prefixes:
            text = self.tokenizer.decode(prefix)
            prompt = next(p for p in self.scripts if text.startswith(p))
            segment = self.scripts[prompt][text.count("</result>")]
            ids = self.tokenizer.encode(segment, add_special_tokens=False)
            if segment.endswith("</answer>"):
                generations.append(
                    Generation(
                        ids + [self.tokenizer.eos_token_id], [0.0] * (len(ids) + 1), [0.0] * (len(ids) + 1), "eos"
                    )
                )
            else:
                generations.append(Generation(ids, [0.0] * len(ids), [0.0] * len(ids), "stop", "</python>"))
        return generations

    def update_weights(self, state, version):
        raise NotImplementedError


def test_evaluate_policy_scores_each_question(tokenizer):
    examples = [
        PromptExample(format_prompt(TIRExample(q, a, "python", ("python",), (), "")), a, "math", "python")
        for q, a in (("What is 2 * 3?", "6"), ("What is 4 * 5?", "20"), ("What is 7 * 8?", "56"))
    ]
    right = ["<python> 2 * 3 </python>", " <answer> \\boxed{6} </answer>"]
    wrong = ["<answer> \\boxed{21} </answer>"]
    broken = ["<think> 56 <answer> \\boxed{56} </answer>"]  # <think> never closed
    prompts = [example.prompt for example in examples]
    engine = ScriptedEngine(tokenizer, dict(zip(prompts, [right, wrong, broken])))
    tools = ToolExecutor({"python": lambda code: str(eval(code)), "search": lambda query: "Page 1: nothing"})
    metrics = evaluate_policy(
        engine,
        examples,
        tools,
        rollout_settings=RolloutSettings(max_response_tokens=256, max_tool_result_tokens=96),
        reward_settings=RewardSettings(),
        temperature=1.0,
        seed=0,
        chunk_size=2,
    )

    def length(text: str) -> int:
        return len(tokenizer.encode(text))

    right_tokens = length(right[0]) + length(" <result>") + length("6") + length("</result>") + length(right[1]) + 1
    lengths = [right_tokens, length(wrong[0]) + 1, length(broken[0]) + 1]  # + 1: the EOS
    assert metrics == pytest.approx(
        {
            "accuracy": 2 / 3,  # the broken response still holds the right answer: S = 1, R = -1
            "format_error_rate": 1 / 3,
            "reward_mean": (1.0 + 0.0 - 1.0) / 3,  # no r_M bonus: search was not used
            "response_tokens_mean": sum(lengths) / 3,
            "accuracy/python": 2 / 3,
            "tool_calls_per_question/python": 1 / 3,
            "tool_calls_per_question/search": 0.0,
        }
    )
