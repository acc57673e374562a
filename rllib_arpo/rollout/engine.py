"""The GenerationEngine protocol: what the tree rollout needs from an inference engine.

Engines work on token ids only (no re-tokenisation between turns, so the learner scores exactly
the tokens that were sampled). Each call continues a batch of token-id prefixes until a stop
string (a tool's closing tag such as ``</search>``), end of sequence, or ``max_new_tokens``.
``ENGINES`` names the implementations (``hf``: transformers, ``vllm``).
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import inspect
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from rllib_arpo.core.registry import Registry
from rllib_arpo.core.settings import check_type
from rllib_arpo.models.lora import LoraSettings

FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one ``generate`` call.

    Attributes:
        max_new_tokens: cap on tokens generated per prefix in this call.
        temperature: softmax temperature; 0 means greedy.
        top_p: nucleus sampling mass (1.0 = off).
        stop_strings: generation of a sequence stops right after its decoded text ends with one
            of these (the stop string's tokens are kept in the output).
        seed: seeds the sampler for reproducible rollouts (``None`` = engine's own stream).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class Generation:
    """The continuation of one prefix.

    Attributes:
        token_ids: generated tokens (stop string included, padding excluded).
        logprobs: log pi(token | prefix) of each generated token under the sampling
            distribution's model (temperature 1 logits), used as pi_old by the learner.
        entropies: per-token entropy of the next-token distribution in nats (exact from full
            logits, or renormalised top-k; see core.entropy).
        finish_reason: ``"stop"`` (a stop string matched), ``"eos"`` or ``"length"``.
        stop_string: the stop string that matched, if any.
    """

    token_ids: list[int]
    logprobs: list[float]
    entropies: list[float]
    finish_reason: FinishReason
    stop_string: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class EngineStats:
    """Running token counts of an engine, over all ``generate`` calls.

    Attributes:
        prefill_tokens_requested: total length of all prefixes passed in (duplicates included).
        prefill_tokens_computed: prefix tokens actually run through the model (shared spans or
            cached blocks once; pads not counted).
        generated_tokens: tokens sampled.
        calls: ``generate`` calls.
    """

    prefill_tokens_requested: int = 0
    prefill_tokens_computed: int = 0
    generated_tokens: int = 0
    calls: int = 0


@runtime_checkable
class GenerationEngine(Protocol):
    """An inference engine the tree rollout can drive (HF transformers or vLLM)."""

    tokenizer: object
    weights_version: int
    prefers_early_children: bool
    """The tree rollout's ``early_children`` when the config leaves it unset: True where time
    follows sequential decode steps (children started k steps earlier pay), False where it
    follows tokens computed (dropped would-be children cost more than they save)."""

    def generate(self, prefixes: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Continue every prefix (prompt + response so far, as token ids)."""
        ...

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Load new policy weights in place (an engine built with ``lora``: the adapter's tensors,
        ``models.lora``) and record their version."""
        ...

    # weight_sync: broadcast (weights.broadcast)
    def weight_receivers(self) -> tuple[int, str]:
        """How many ranks of the broadcast group this engine's processes take, and the device
        type their weights live on (``cpu`` or ``cuda``)."""
        ...

    def open_weight_group(self, address: str, port: int, rank: int, world_size: int, backend: str):
        """Join the broadcast group (ranks ``rank`` .. ``rank + receivers - 1``); return the
        ``WeightLayout`` the engine receives."""
        ...

    def receive_weights(self, version: int) -> None:
        """Receive one broadcast of the layout's tensors in place and record their version."""
        ...


@dataclass(frozen=True)
class EngineOption:
    """One keyword option of an engine's constructor, read from its source (no import)."""

    name: str
    type: str
    default: str
    doc: str


@dataclass(frozen=True)
class Engine:
    """A registered generation engine.

    Attributes:
        path: ``"module:Class"``, imported on use (vLLM is heavy and optional). The class builds
            with ``from_pretrained(model_path, dtype=..., **engine_options)``, and its
            classmethod ``check_options(engine_options)`` checks the values before anything is
            built (its constructor runs the same checks); a ValueError starts with the option's
            name.
        in_place_options: engine options ``build`` adds (unless set) when the weight sync
            has the engines receive weights in place (``weight_sync: broadcast``): vLLM's worker
            extension that joins the weight group.
        max_lora_rank: the largest LoRA rank it can sample with (None: any).
    """

    path: str
    in_place_options: Mapping[str, Any] = field(default_factory=dict)
    max_lora_rank: int | None = None

    def load(self) -> type:
        """The engine class (imports its module)."""
        module, name = self.path.split(":")
        return getattr(importlib.import_module(module), name)

    def build(
        self,
        model_path: str,
        dtype: torch.dtype | None,
        options: Mapping[str, Any],
        *,
        receives_in_place: bool = False,
        lora: LoraSettings | None = None,
    ) -> GenerationEngine:
        """The engine on ``model_path`` in ``dtype`` (None: the checkpoint's) with ``options``
        (the config's ``engine_options``), and with ``in_place_options`` added (unless set) when
        ``receives_in_place``; with ``lora`` it samples through a LoRA adapter (initially the
        identity) and ``update_weights`` takes the adapter's tensors."""
        if receives_in_place:
            options = {**self.in_place_options, **options}
        if lora is not None:  # an engine that has no LoRA need not know the argument
            options = {**options, "lora": lora}
        return self.load().from_pretrained(model_path, dtype=dtype, **options)

    def documented_options(self) -> tuple[list[EngineOption], bool]:
        """The constructor's own options (type, default and the class docstring's ``Args:`` line)
        and whether it passes further keyword arguments on, read from the module's source
        without importing it (for the configuration reference)."""
        module, name = self.path.split(":")
        tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
        [engine_class] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
        [init] = [node for node in engine_class.body if isinstance(node, ast.FunctionDef) and node.name == "__init__"]
        docs = _documented_arguments(ast.get_docstring(engine_class) or "")
        arguments = init.args
        positional = arguments.posonlyargs + arguments.args
        defaults = [None] * (len(positional) - len(arguments.defaults)) + arguments.defaults
        pairs = [*zip(positional, defaults), *zip(arguments.kwonlyargs, arguments.kw_defaults)]
        options = [
            EngineOption(
                argument.arg,
                ast.unparse(argument.annotation) if argument.annotation else "",
                ast.unparse(default) if default is not None else "",
                docs.get(argument.arg, ""),
            )
            for argument, default in pairs
            if argument.arg not in ENGINE_ARGUMENTS
        ]
        return options, arguments.kwarg is not None


def _documented_arguments(docstring: str) -> dict[str, str]:
    """``name -> text`` of the ``Args:`` section of a Google-style docstring."""
    docs, name, in_args = {}, None, False
    for line in docstring.splitlines():
        if line.strip() == "Args:":
            in_args = True
        elif in_args and line.startswith("    ") and not line.startswith("     ") and ":" in line:
            name, text = line.strip().split(":", 1)
            docs[name] = text.strip()
        elif in_args and line.startswith("        ") and name is not None:
            docs[name] += " " + line.strip()
        elif in_args and line.strip():
            in_args = False
    return docs


ENGINES: Registry[Engine] = Registry("generation engine")
"""Engine name (the config's ``engine``) -> ``Engine``."""
ENGINE_ARGUMENTS = {"self", "model", "model_path", "tokenizer", "dtype", "lora"}
"""Engine constructor arguments that come from other config fields, never from ``engine_options``."""


def engine_options_of(engine: str) -> tuple[dict[str, Any], frozenset[str]]:
    """The options ``engine_options`` may hold for ``engine``: the constructor's own keyword
    arguments with their types, and the names it passes on to the library underneath (vLLM's
    ``EngineArgs`` fields) when it takes ``**kwargs``."""
    engine_class = ENGINES.get(engine).load()
    parameters = inspect.signature(engine_class.__init__).parameters
    hints = typing.get_type_hints(engine_class.__init__)
    own = {name: hints.get(name, Any) for name in parameters if name not in ENGINE_ARGUMENTS}
    own = {name: hint for name, hint in own.items() if parameters[name].kind is not inspect.Parameter.VAR_KEYWORD}
    passed_on = frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        passed_on = frozenset(engine_class.passed_on_options()) - ENGINE_ARGUMENTS
    return own, passed_on


def check_engine_options(engine: str, options: Mapping[str, Any]) -> None:
    """Every key of ``engine_options`` is an option of ``engine``, of the right type, with a value
    the engine's ``check_options`` accepts; a ValueError names the key. No option, no import."""
    if not options:
        return
    own, passed_on = engine_options_of(engine)
    for key, value in options.items():
        if key in own:
            check_type(f"engine_options.{key}", value, own[key])
        elif key not in passed_on:
            close = difflib.get_close_matches(key, [*own, *passed_on], n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"engine_options.{key}: not an option of engine {engine!r} ({hint}its options: {', '.join(own)}"
                + (", and vLLM's engine arguments" if passed_on else "")
                + ")"
            )
    try:
        ENGINES.get(engine).load().check_options(options)
    except ValueError as error:
        raise ValueError(f"engine_options.{error}") from None


ENGINES.add("hf", Engine("rllib_arpo.rollout.hf_engine:HFEngine"))
ENGINES.add(
    "vllm",
    Engine(
        "rllib_arpo.rollout.vllm_engine:VLLMEngine",
        in_place_options={"worker_extension_cls": "rllib_arpo.weights.vllm_receiver.WeightReceiver"},
        max_lora_rank=512,  # vllm_engine.VLLM_LORA_RANKS
    ),
)
