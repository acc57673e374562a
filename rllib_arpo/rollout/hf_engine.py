"""HFEngine: the transformers generation engine (the embedded default, CPU or GPU).

It samples with its own decoding loop over a KV cache (not ``model.generate``) because the tree
rollout needs, for every generated token y_t with logits z_t:

    logprob_t = log softmax(z_t)[y_t]                       (temperature-1 logits: pi_old)
    entropy_t = H(softmax(z_t)) = -sum_j p_j log p_j   (nats; exact, full vocabulary)

Prefix reuse. In an ARPO tree the prefixes of one call share long token spans: the prompt is
repeated for all trajectories of a question, and branches forked at a tool call share everything
before it. The engine builds a radix tree (compressed trie, ``rollout.prefix_tree``) of the
call's prefixes and prefills it level by level, so every shared span is encoded once and its KV
cache is copied to the rows that continue it:

    level 0: the distinct first spans           (e.g. the prompt, once)
    level d: the spans after each level d-1 fork, with the parent's cache rows selected

The cache of one row is laid out block by block, each block left-padded:

    [pad pad | prompt ...] [pad | branch span ...] [generated tokens ...]

Pads are masked out of attention and every real token gets its true position id, so each row
computes exactly what a separate forward pass of its own sequence would (up to float rounding).
``engine.stats`` counts prefill tokens requested and actually computed, so a benchmark can report
the saving. KV caches are not kept between calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from rllib_arpo.core.entropy import entropy_from_logits
from rllib_arpo.models.lora import LoraSettings, add_lora, load_adapter_state
from rllib_arpo.rollout.engine import EngineStats, Generation, SamplingParams
from rllib_arpo.rollout.prefix_tree import PrefixNode, insert_prefix


class HFEngine:
    """Batched sampling from a transformers causal LM with exact logprobs and entropies.

    Args:
        model: a causal LM (e.g. ``Qwen2ForCausalLM``); put in eval mode on ``device``.
        tokenizer: its tokenizer (used to decode for stop strings and for the EOS id).
        device: where the model runs.
        max_batch_size: most sequences decoded in one forward pass; larger calls are split.
        dtype: cast the model to this dtype (``None`` keeps the model's dtype).
        reuse_prefixes: encode shared prefix spans once (the default); ``False`` prefills every
            prefix in full, which is only useful to measure the saving.
        lora: sample through a LoRA adapter of these settings (the identity until the first
            ``update_weights``, which then takes the adapter's tensors and swaps them in place).
    """

    prefers_early_children = True  # one forward pass decodes the whole batch: time follows decode steps

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer,
        *,
        device: str | torch.device = "cpu",
        max_batch_size: int = 64,
        dtype: torch.dtype | None = None,
        reuse_prefixes: bool = True,
        lora: LoraSettings | None = None,
    ) -> None:
        self.check_options({"device": device, "max_batch_size": max_batch_size})
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=dtype).eval()
        self.lora = lora
        if lora is not None:
            add_lora(self.model, lora)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.reuse_prefixes = reuse_prefixes
        self.weights_version = 0
        self.stats = EngineStats()
        self.eos_token_ids = self._eos_token_ids(model, tokenizer)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = pad_id if pad_id is not None else 0

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """The values of the keyword arguments in ``options`` (``rollout.engine.ENGINES``)."""
        max_batch_size = options.get("max_batch_size", 1)
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if "device" in options:
            try:
                device = torch.device(options["device"])
            except RuntimeError as error:
                raise ValueError(f"device: {error}") from None
            if device.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"device: {str(device)!r}, but torch finds no CUDA device on this machine")

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: torch.dtype | None = None, **kwargs) -> HFEngine:
        """Load model and tokenizer from a local directory or hub name; ``kwargs`` go to ``__init__``."""
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype if dtype is not None else "auto")
        return cls(model, AutoTokenizer.from_pretrained(path), **kwargs)

    @staticmethod
    def _eos_token_ids(model: PreTrainedModel, tokenizer) -> frozenset[int]:
        """The tokenizer's EOS plus the generation config's (chat models often list several)."""
        ids = {tokenizer.eos_token_id}
        config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
        return frozenset(i for i in ids if i is not None)

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copy new weights into the model in place (strict key match) and record their version.

        ``load_state_dict`` copies each tensor into the existing parameter, which casts it to the
        model's dtype and device. With ``lora`` the state is the adapter's, copied into it alike.
        """
        if self.lora is not None:
            load_adapter_state(self.model, state)
        else:
            self.model.load_state_dict(state, strict=True)
        self.weights_version = version

    def weight_receivers(self) -> tuple[int, str]:
        return 1, self.device.type

    def open_weight_group(self, address: str, port: int, rank: int, world_size: int, backend: str):
        """Join the broadcast group as ``rank``; the tensors of each sync land in the model's own."""
        from rllib_arpo.weights.broadcast import ParameterReceiver

        self._weight_receiver = ParameterReceiver(self.model, address, port, rank, world_size, backend)
        return self._weight_receiver.layout

    def receive_weights(self, version: int) -> None:
        self._weight_receiver.receive()
        self.weights_version = version

    @torch.inference_mode()
    def generate(self, prefixes: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Continue every prefix until EOS, a stop string or ``params.max_new_tokens``.

        Prefixes are sorted so that ones sharing spans land in the same chunk of
        ``max_batch_size`` rows. Identical prefixes are prefilled once but sampled independently.
        The EOS token and the tokens of a stop string are kept in ``token_ids``.
        """
        if params.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {params.max_new_tokens}")
        if any(len(prefix) == 0 for prefix in prefixes):
            raise ValueError("every prefix needs at least one token")
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        order = sorted(range(len(prefixes)), key=lambda i: list(prefixes[i]))
        results: list[Generation | None] = [None] * len(prefixes)
        for begin in range(0, len(order), self.max_batch_size):
            chunk = order[begin : begin + self.max_batch_size]
            for i, generation in zip(chunk, self._generate_chunk([prefixes[i] for i in chunk], params, generator)):
                results[i] = generation
        self.stats.calls += 1
        self.stats.prefill_tokens_requested += sum(len(prefix) for prefix in prefixes)
        self.stats.generated_tokens += sum(len(g.token_ids) for g in results)
        return results

    # --- prefill -------------------------------------------------------------------------------

    def _prefill(self, prefixes: list[Sequence[int]]) -> tuple[DynamicCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Encode the prefixes, sharing common spans; one output row per prefix.

        Returns the KV cache, the attention mask over its columns ``[B, C]``, the position id of
        each row's next token ``[B]``, and the logits of each row's next token ``[B, V]``.
        """
        root = PrefixNode([], parent=None)
        if self.reuse_prefixes:
            ends = [insert_prefix(root, prefix) for prefix in prefixes]
        else:  # every prefix is its own span
            ends = [PrefixNode(list(prefix), parent=root) for prefix in prefixes]
        for node in ends:
            node.is_prefix_end = True

        cache = DynamicCache(config=self.model.config)
        mask = torch.zeros(1, 0, dtype=torch.long, device=self.device)
        rows: list[PrefixNode] = [root]  # rows[r]: the node whose path cache row r holds
        logits_of: dict[PrefixNode, torch.Tensor] = {}
        level = list(root.children.values()) if self.reuse_prefixes else ends
        while level:
            # Rows of the next cache: prefix ends reached earlier ride along with an empty span,
            # then the new spans, each after a copy of its parent's row.
            carried = [node for node in rows if node.is_prefix_end]
            parent_rows = [rows.index(node) for node in carried] + [rows.index(node.parent) for node in level]
            spans = [[]] * len(carried) + [node.tokens for node in level]
            starts = [0] * len(carried) + [node.start for node in level]
            width = max(len(span) for span in spans)

            parent_index = torch.tensor(parent_rows, device=self.device)
            cache.batch_select_indices(parent_index)
            input_ids = torch.full((len(spans), width), self.pad_token_id, dtype=torch.long)
            span_mask = torch.zeros(len(spans), width, dtype=torch.long)
            position_ids = torch.zeros(len(spans), width, dtype=torch.long)
            for r, (span, start) in enumerate(zip(spans, starts)):
                if span:  # left-pad: the span's last token sits in the last column
                    input_ids[r, width - len(span) :] = torch.tensor(span)
                    span_mask[r, width - len(span) :] = 1
                    position_ids[r, width - len(span) :] = torch.arange(start, start + len(span))
            mask = torch.cat([mask[parent_index], span_mask.to(self.device)], dim=1)
            logits = self._forward(input_ids.to(self.device), mask, position_ids.to(self.device), cache)
            for r, node in enumerate(level, start=len(carried)):
                if node.is_prefix_end:
                    logits_of[node] = logits[r]
            self.stats.prefill_tokens_computed += sum(len(node.tokens) for node in level)
            rows = carried + level
            level = [child for node in level for child in node.children.values()]

        # Every row is now a prefix end; expand to one row per prefix (duplicates included).
        end_rows = torch.tensor([rows.index(node) for node in ends], device=self.device)
        cache.batch_select_indices(end_rows)
        next_positions = torch.tensor([len(prefix) for prefix in prefixes], device=self.device)
        next_logits = torch.stack([logits_of[node] for node in ends])
        return cache, mask[end_rows], next_positions, next_logits

    def _forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """One cached forward pass; returns the float32 logits after the last column ``[B, V]``."""
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1].float()

    # --- decoding ------------------------------------------------------------------------------

    def _generate_chunk(
        self, prefixes: list[Sequence[int]], params: SamplingParams, generator: torch.Generator | None
    ) -> list[Generation]:
        cache, mask, positions, logits = self._prefill(prefixes)
        tokens: list[list[int]] = [[] for _ in prefixes]
        logprobs: list[list[float]] = [[] for _ in prefixes]
        entropies: list[list[float]] = [[] for _ in prefixes]
        finished: list[Generation | None] = [None] * len(prefixes)
        active = list(range(len(prefixes)))  # the sequence each cache row belongs to
        stop_window = 2 * max((len(s) for s in params.stop_strings), default=0) + 4
        for step in range(params.max_new_tokens):
            sampled = self._sample(logits, params, generator)
            log_probs = torch.log_softmax(logits, dim=-1)
            sampled_logprobs = log_probs.gather(1, sampled[:, None]).squeeze(1)
            sampled_entropies = entropy_from_logits(logits)
            keep = []
            for row, (seq, token, logprob, entropy) in enumerate(
                zip(active, sampled.tolist(), sampled_logprobs.tolist(), sampled_entropies.tolist())
            ):
                tokens[seq].append(token)
                logprobs[seq].append(logprob)
                entropies[seq].append(entropy)
                stop_string = self._matched_stop_string(tokens[seq][-stop_window:], params.stop_strings)
                if token in self.eos_token_ids:
                    finished[seq] = Generation(tokens[seq], logprobs[seq], entropies[seq], "eos")
                elif stop_string is not None:
                    finished[seq] = Generation(tokens[seq], logprobs[seq], entropies[seq], "stop", stop_string)
                elif step == params.max_new_tokens - 1:
                    finished[seq] = Generation(tokens[seq], logprobs[seq], entropies[seq], "length")
                else:
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(active):  # drop finished rows from the batch
                keep_index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(keep_index)
                mask, positions, sampled = mask[keep_index], positions[keep_index], sampled[keep_index]
                active = [active[row] for row in keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            logits = self._forward(sampled[:, None], mask, positions[:, None], cache)
            positions = positions + 1
        return finished

    @staticmethod
    def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
        """Greedy when temperature is 0, else sample softmax(z / T) restricted to the top-p nucleus.

        The nucleus is the smallest set of most likely tokens whose mass reaches ``top_p`` (the
        most likely token is always in it).
        """
        if params.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter(1, sorted_ids, sorted_probs)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    def _matched_stop_string(self, recent_tokens: list[int], stop_strings: Sequence[str]) -> str | None:
        """The first stop string found in the text of the most recent generated tokens, if any.

        Called after every token, so a match is always one the newest token completed. A match
        counts even when the newest token carries characters past the stop string (e.g. a
        ``">\\n"`` token closing ``</search>``); that token is kept whole. Only the last few
        generated tokens are decoded (2 * the longest stop string's length in characters + 4,
        enough even where single characters take two tokens).
        """
        if not stop_strings:
            return None
        text = self.tokenizer.decode(recent_tokens)
        return next((s for s in stop_strings if s in text), None)
