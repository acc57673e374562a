"""HFEngine on a tiny random Qwen2 and a character-level tokenizer (no downloads)."""

from __future__ import annotations

import math

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rllib_arpo.rollout.engine import GenerationEngine, SamplingParams
from rllib_arpo.rollout.hf_engine import HFEngine

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 <>/=.,?!\n")
MULTI_CHAR_TOKEN = "!?"  # the model can emit it; encoding never produces it
VOCAB = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}, MULTI_CHAR_TOKEN: 48}  # 49 tokens
PAD, EOS = 0, 1
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel(VOCAB, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    backend.decoder = decoders.Fuse()  # decode = concatenate
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")


def tiny_qwen2(seed: int, model_class: type[Qwen2ForCausalLM] = Qwen2ForCausalLM) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        max_position_embeddings=256,
        initializer_range=0.1,  # peakier than the default 0.02, so greedy choices are clear-cut
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=None,
    )
    return model_class(config).eval()


CHAIN = "q</search>"  # each character's successor in the cycle q < / s e a r c h > q ...


class ChainModel(Qwen2ForCausalLM):
    """Tiny Qwen2 whose logits get +30 on a fixed successor of the current token.

    Greedy decoding then follows q -> < -> / -> s -> e -> a -> r -> c -> h -> > -> q (cycle),
    z -> <eos>, j -> "!?", and every other token -> x.
    """

    def forward(self, input_ids: torch.Tensor, **kwargs):
        output = super().forward(input_ids=input_ids, **kwargs)
        successor = torch.full((len(VOCAB),), VOCAB["x"])
        for char, following in zip(CHAIN, CHAIN[1:] + CHAIN[0]):
            successor[VOCAB[char]] = VOCAB[following]
        successor[VOCAB["z"]] = EOS
        successor[VOCAB["j"]] = VOCAB[MULTI_CHAR_TOKEN]
        last_ids = input_ids[:, -output.logits.shape[1] :]
        output.logits = output.logits + 30.0 * torch.nn.functional.one_hot(successor[last_ids], len(VOCAB))
        return output


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return tiny_qwen2(seed=0)


@pytest.fixture(scope="module")
def chain_engine(tokenizer) -> HFEngine:
    return HFEngine(tiny_qwen2(seed=0, model_class=ChainModel), tokenizer)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def test_is_a_generation_engine(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    assert isinstance(engine, GenerationEngine)
    assert engine.weights_version == 0
    assert engine.eos_token_ids == {EOS}


def test_greedy_logprobs_and_entropies_match_a_full_forward_pass(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    prefixes = [encode(tokenizer, "the answer is"), encode(tokenizer, "hi"), encode(tokenizer, "<search>x")]
    generations = engine.generate(prefixes, GREEDY)
    assert engine.generate(prefixes, GREEDY) == generations  # greedy is deterministic

    for prefix, generation in zip(prefixes, generations):
        assert generation.finish_reason == "length" and generation.stop_string is None
        assert len(generation.token_ids) == len(generation.logprobs) == len(generation.entropies) == 6
        # Plain forward of the whole final sequence, no cache, no padding.
        sequence = torch.tensor([prefix + generation.token_ids])
        with torch.no_grad():
            logits = model(sequence).logits[0, len(prefix) - 1 : -1].float()  # logits that produced each token
        assert generation.token_ids == logits.argmax(-1).tolist()
        log_p = torch.log_softmax(logits, -1)
        expected_logprobs = log_p.gather(1, torch.tensor(generation.token_ids)[:, None]).squeeze(1)
        expected_entropies = -(log_p.exp() * log_p).sum(-1)  # nats
        assert torch.allclose(torch.tensor(generation.logprobs), expected_logprobs, atol=1e-4, rtol=0)
        assert torch.allclose(torch.tensor(generation.entropies), expected_entropies, atol=1e-4, rtol=0)
        assert all(lp <= 0 for lp in generation.logprobs)
        assert all(0 <= h <= math.log(49) + 1e-5 for h in generation.entropies)  # |V| = 49


def test_seeded_sampling_is_reproducible_and_duplicates_sample_independently(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    prefixes = [encode(tokenizer, "what is 2+2?")] * 4 + [encode(tokenizer, "hello")]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7)
    first = engine.generate(prefixes, params)
    assert engine.generate(prefixes, params) == first
    other_seed = engine.generate(prefixes, SamplingParams(max_new_tokens=8, temperature=1.0, seed=8))
    assert [g.token_ids for g in other_seed] != [g.token_ids for g in first]
    # The four copies of one prompt share the prefill but are separate samples.
    assert len({tuple(g.token_ids) for g in first[:4]}) > 1


def test_tiny_top_p_keeps_only_the_most_likely_token(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    prefixes = [encode(tokenizer, "abc"), encode(tokenizer, "1 2 3")]
    greedy = engine.generate(prefixes, GREEDY)
    nucleus = engine.generate(prefixes, SamplingParams(max_new_tokens=6, temperature=0.7, top_p=1e-6, seed=0))
    assert [g.token_ids for g in nucleus] == [g.token_ids for g in greedy]


def test_eos_stops_and_is_kept(chain_engine, tokenizer):
    params = SamplingParams(max_new_tokens=20, temperature=0.0, stop_strings=("</search>",))
    eos_generation, stop_generation = chain_engine.generate([encode(tokenizer, "xyz"), encode(tokenizer, "q")], params)
    assert eos_generation.token_ids == [EOS]  # z -> <eos>
    assert eos_generation.finish_reason == "eos" and eos_generation.stop_string is None
    assert tokenizer.decode(stop_generation.token_ids) == "</search>"  # the other row went on after the eos row left


def test_stop_string_is_recorded_and_its_tokens_kept(chain_engine, tokenizer):
    params = SamplingParams(max_new_tokens=20, temperature=0.0, stop_strings=("</python>", "</search>"))
    [generation] = chain_engine.generate([encode(tokenizer, "find it q")], params)
    assert generation.token_ids == encode(tokenizer, "</search>")  # q -> < / s e a r c h >: 9 tokens
    assert generation.finish_reason == "stop" and generation.stop_string == "</search>"
    assert len(generation.logprobs) == len(generation.entropies) == 9


def test_stop_string_inside_the_last_token_stops(chain_engine, tokenizer):
    # "!?" is one token: the text "!?" contains the stop string "!" without ending with it.
    params = SamplingParams(max_new_tokens=5, temperature=0.0, stop_strings=("!",))
    [generation] = chain_engine.generate([encode(tokenizer, "j")], params)
    assert generation.token_ids == [VOCAB[MULTI_CHAR_TOKEN]]
    assert generation.finish_reason == "stop" and generation.stop_string == "!"


def test_stop_string_must_be_in_the_generated_text(chain_engine, tokenizer):
    # The prefix ends in "</search"; generating ">" completes the tag only across the boundary,
    # which does not count, so generation goes on through "q" to the next full "</search>".
    params = SamplingParams(max_new_tokens=20, temperature=0.0, stop_strings=("</search>",))
    [generation] = chain_engine.generate([encode(tokenizer, "</search")], params)
    assert tokenizer.decode(generation.token_ids) == ">q</search>"  # 1 + 1 + 9 = 11 tokens
    assert generation.finish_reason == "stop"


def test_max_new_tokens_gives_length(chain_engine, tokenizer):
    params = SamplingParams(max_new_tokens=4, temperature=0.0, stop_strings=("</search>",))
    [generation] = chain_engine.generate([encode(tokenizer, "q")], params)
    assert tokenizer.decode(generation.token_ids) == "</se"
    assert generation.finish_reason == "length" and generation.stop_string is None


def test_finished_rows_leave_the_batch_without_changing_the_others(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    prefixes = [encode(tokenizer, "tell me"), encode(tokenizer, "why not"), encode(tokenizer, "0")]
    solo = [engine.generate([prefix], GREEDY)[0].token_ids for prefix in prefixes]
    stop_char = tokenizer.decode(solo[0][:1])  # row 0 stops after its first token
    params = SamplingParams(max_new_tokens=6, temperature=0.0, stop_strings=(stop_char,))
    batched = engine.generate(prefixes, params)
    assert batched[0].token_ids == solo[0][:1] and batched[0].finish_reason == "stop"
    for alone, generation in zip(solo[1:], batched[1:]):
        # Expected: the solo output, cut right after its first stop char if it has one.
        hits = [i for i, token in enumerate(alone) if tokenizer.decode([token]) == stop_char]
        assert generation.token_ids == (alone[: hits[0] + 1] if hits else alone)
        assert generation.finish_reason == ("stop" if hits else "length")


def test_shared_prefix_is_prefilled_once(model, tokenizer):
    shared = list(range(2, 12))  # 10 tokens
    prefixes = [shared + [20, 21], shared + [22, 23], shared + [24, 25], shared + [26, 27]]
    reuse = HFEngine(model, tokenizer)
    no_reuse = HFEngine(model, tokenizer, reuse_prefixes=False)
    assert _close(reuse.generate(prefixes, GREEDY), no_reuse.generate(prefixes, GREEDY))
    assert reuse.stats.prefill_tokens_requested == 4 * 12
    assert reuse.stats.prefill_tokens_computed == 10 + 4 * 2  # shared 10 once + four 2-token suffixes
    assert no_reuse.stats.prefill_tokens_computed == 4 * 12
    assert reuse.stats.generated_tokens == 4 * 6 and reuse.stats.calls == 1


def _close(generations_a, generations_b) -> bool:
    """Same tokens and finish reasons; logprobs and entropies equal within 1e-4."""
    return all(
        a.token_ids == b.token_ids
        and a.finish_reason == b.finish_reason
        and torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
        and torch.allclose(torch.tensor(a.entropies), torch.tensor(b.entropies), atol=1e-4, rtol=0)
        for a, b in zip(generations_a, generations_b, strict=True)
    )


def test_nested_tree_of_prefixes_matches_separate_prefills(model, tokenizer):
    # Radix tree: P(10) -> {A(3) -> {x(2), y(2)}, B(3)}; P itself and P+B (twice) are prefixes too,
    # so P's row rides along empty while A's children are prefilled.
    p, a, b, x, y = list(range(2, 12)), [30, 31, 32], [33, 34, 35], [40, 41], [42, 43]
    prefixes = [p + a + x, p + b, p, p + a + y, p + b]
    reuse = HFEngine(model, tokenizer)
    no_reuse = HFEngine(model, tokenizer, reuse_prefixes=False)
    assert _close(reuse.generate(prefixes, GREEDY), no_reuse.generate(prefixes, GREEDY))
    assert reuse.stats.prefill_tokens_requested == 15 + 13 + 10 + 15 + 13
    assert reuse.stats.prefill_tokens_computed == 10 + 3 + 3 + 2 + 2  # P, A, B, x, y once each
    assert no_reuse.stats.prefill_tokens_computed == 15 + 13 + 10 + 15 + 13
    small_batches = HFEngine(model, tokenizer, max_batch_size=2)
    assert _close(small_batches.generate(prefixes, GREEDY), no_reuse.generate(prefixes, GREEDY))


def test_update_weights_loads_new_weights_and_version(model, tokenizer):
    engine = HFEngine(tiny_qwen2(seed=0), tokenizer)
    new_model = tiny_qwen2(seed=1)
    prefixes = [encode(tokenizer, "the answer is")]
    before = engine.generate(prefixes, GREEDY)
    expected = HFEngine(new_model, tokenizer).generate(prefixes, GREEDY)
    assert before[0].token_ids != expected[0].token_ids

    state = {name: tensor.double() for name, tensor in new_model.state_dict().items()}
    engine.update_weights(state, version=3)
    assert engine.weights_version == 3
    assert engine.model.lm_head.weight.dtype == torch.float32  # cast to the model's dtype
    assert _close(engine.generate(prefixes, GREEDY), expected)
    with pytest.raises(RuntimeError, match="Missing key"):
        engine.update_weights({"lm_head.weight": state["lm_head.weight"]}, version=4)


def test_rejects_empty_prefix_and_zero_budget(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    with pytest.raises(ValueError):
        engine.generate([[]], GREEDY)
    with pytest.raises(ValueError):
        engine.generate([[5]], SamplingParams(max_new_tokens=0))


def test_from_pretrained_loads_model_tokenizer_and_dtype(model, tokenizer, tmp_path):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    prefixes = [encode(tokenizer, "the answer is")]
    loaded = HFEngine.from_pretrained(str(tmp_path), max_batch_size=4)
    assert loaded.max_batch_size == 4 and loaded.model.dtype == torch.float32
    assert _close(loaded.generate(prefixes, GREEDY), HFEngine(model, tokenizer).generate(prefixes, GREEDY))
    half = HFEngine.from_pretrained(str(tmp_path), dtype=torch.bfloat16)
    assert half.model.dtype == torch.bfloat16
    [generation] = half.generate(prefixes, GREEDY)
    assert len(generation.token_ids) == 6 and all(h >= 0 for h in generation.entropies)
