"""LoRA adapters on a causal LM (peft underneath): the learner trains them, the engines sample
with them, and only they travel from one to the other.

LoRA (Hu et al. 2021) freezes a linear layer's weight W [out, in] and learns a low-rank update:

    W' = W + (alpha / r) * B A,     A [r, in] (random init),  B [out, r] (zeros at init)

so the adapted model starts as the base model. One module's adapter is r * (in + out) values
instead of in * out. The adapter's tensors are named as peft saves them
(``base_model.model.<module>.lora_A.weight``, ``...lora_B.weight``), the names vLLM loads an
adapter directory by and ``set_peft_model_state_dict`` takes: these names are what the learner
sends, the engines receive and the checkpoint's ``policy/adapter/`` holds.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of attention and MLP of a Llama/Qwen-style decoder (not the LM head)."""
ADAPTER_NAME = "default"
SAVED_PREFIX = "base_model.model."
"""What peft puts before a module's name in a saved adapter (``PeftModel`` wraps ``LoraModel``
wraps the causal LM)."""
INIT_SEED = 0
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoraSettings:
    """The config's ``lora`` entry: ``rank`` r, ``alpha`` (the update is scaled by alpha / r),
    ``dropout`` on the adapter's input while training, ``target_modules`` (module names, matched
    as peft matches them: the whole name or its last parts)."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = field(default=DEFAULT_TARGET_MODULES)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"lora.rank must be an integer >= 1, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float) or not self.alpha > 0:
            raise ValueError(f"lora.alpha must be a number > 0, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float) or not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must lie in [0, 1), got {self.dropout!r}")
        targets = self.target_modules
        if isinstance(targets, str) or not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(f"lora.target_modules must be a non-empty list of module names, got {targets!r}")
        object.__setattr__(self, "target_modules", tuple(targets))

    @classmethod
    def from_config(cls, entry: dict | None) -> LoraSettings | None:
        """The settings of the config's ``lora`` entry (None: no LoRA); unknown keys are named."""
        if entry is None:
            return None
        if not isinstance(entry, dict):
            raise ValueError(f"lora must be a mapping of rank, alpha, dropout, target_modules or null, got {entry!r}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ValueError(f"lora: unknown key(s) {unknown}; its keys: {sorted(known)}")
        return cls(**entry)

    @property
    def scaling(self) -> float:
        """alpha / r, the factor of B A."""
        return self.alpha / self.rank

    def peft_config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=list(self.target_modules)
        )

    def adapter_config(self, base_model: str) -> dict:
        """``adapter_config.json`` of a saved adapter on ``base_model``."""
        config = self.peft_config().to_dict()
        config.update(base_model_name_or_path=str(base_model), target_modules=list(self.target_modules))
        return {key: (sorted(value) if isinstance(value, set) else value) for key, value in config.items()}


def matches(module_name: str, target: str) -> bool:
    """peft's rule: a target names a module by its whole name or by its last dotted parts."""
    return module_name == target or module_name.endswith("." + target)


def unmatched_targets(model: torch.nn.Module, targets: tuple[str, ...]) -> list[str]:
    """The entries of ``targets`` that name no linear layer of ``model``."""
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    return [target for target in targets if not any(matches(name, target) for name in linear)]


def add_lora(model: torch.nn.Module, settings: LoraSettings, *, adapter_dtype: torch.dtype | None = None):
    """Put a LoRA adapter into ``model``'s target layers in place (peft's ``inject_adapter_in_model``),
    freeze everything else, and return ``model``. ``adapter_dtype``: the adapter's own dtype (None:
    the base layer's). A target that matches no linear layer raises ValueError.

    A is drawn as peft draws it (Kaiming uniform, a = sqrt 5) but from a generator seeded with
    ``INIT_SEED``, not from the process's global one: every learner, every run and every resume
    starts from the same adapter, as they start from the same base weights; B = 0."""
    from peft import inject_adapter_in_model

    missing = unmatched_targets(model, settings.target_modules)
    if missing:
        raise ValueError(f"lora.target_modules {missing} match no linear layer of the model")
    model = inject_adapter_in_model(settings.peft_config(), model, adapter_name=ADAPTER_NAME)
    generator = torch.Generator().manual_seed(INIT_SEED)
    for name, parameter in adapter_parameters(model).items():
        if ".lora_A." in name:  # peft's init, drawn from a generator of its own
            with torch.no_grad():
                initial = torch.empty(parameter.shape, dtype=torch.float32)
                torch.nn.init.kaiming_uniform_(initial, a=math.sqrt(5), generator=generator)
                parameter.copy_(initial)
        if adapter_dtype is not None:
            parameter.data = parameter.data.to(adapter_dtype)
    return model


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The adapter's parameters under ``model``'s own names."""
    return {name: parameter for name, parameter in model.named_parameters() if ".lora_" in name}


def randomise_adapter(model: torch.nn.Module, seed: int = 0, scale: float = 0.3) -> None:
    """Give A and B seeded N(0, ``scale``^2) values, so that the adapter acts (at init B = 0 and
    it is the identity): for checks and benchmarks of the adapter's path."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in adapter_parameters(model).values():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(scale * noise)


def saved_name(name: str) -> str:
    """A parameter's name in the model (``model.layers.0.self_attn.q_proj.lora_A.default.weight``)
    -> its name in a saved adapter (``base_model.model.model.layers.0...q_proj.lora_A.weight``)."""
    return SAVED_PREFIX + name.replace(f".{ADAPTER_NAME}.", ".")


def model_name(saved: str) -> str:
    """The inverse of ``saved_name``."""
    head, _, tail = saved.removeprefix(SAVED_PREFIX).rpartition(".")
    return f"{head}.{ADAPTER_NAME}.{tail}"


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors (detached, no copy) under their saved names."""
    return {saved_name(name): parameter.detach() for name, parameter in adapter_parameters(model).items()}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy a saved adapter's tensors into ``model``'s adapter in place (cast to its dtype); every
    adapter tensor must be given, and nothing else."""
    parameters = adapter_parameters(model)
    given = {model_name(name): tensor for name, tensor in state.items()}
    if set(given) != set(parameters):
        missing, unknown = sorted(set(parameters) - set(given)), sorted(set(given) - set(parameters))
        raise ValueError(f"an adapter state that does not fit the model: missing {missing[:3]}, unknown {unknown[:3]}")
    with torch.no_grad():
        for name, tensor in given.items():
            parameters[name].copy_(tensor)


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """Within the block ``model`` computes as its base model (every LoRA layer passes its base
    layer's output through); the adapters' trainability is restored after."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    trainable = {name: p.requires_grad for name, p in adapter_parameters(model).items()}
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for name, parameter in adapter_parameters(model).items():
            parameter.requires_grad_(trainable[name])


def model_weights(model_path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a transformers directory's safetensors files (one, or the shards)."""
    weights = {}
    for file in sorted(Path(model_path).glob("*.safetensors")):
        weights.update(load_file(str(file)))
    if not weights:
        raise FileNotFoundError(f"{model_path} holds no .safetensors weights (merging needs a local model directory)")
    return weights


def merged_weights(
    base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], settings: LoraSettings
) -> dict[str, torch.Tensor]:
    """The base model's weights (transformers' names) with the adapter merged in, in float32:
    W' = W + (alpha / r) B A for every adapted layer, the others as they are."""
    merged = {name: tensor.float() for name, tensor in base.items()}
    for name, lora_a in adapter.items():
        if ".lora_A." not in name:
            continue
        layer = name.removeprefix(SAVED_PREFIX).rpartition(".lora_A.")[0]
        lora_b = adapter[name.replace(".lora_A.", ".lora_B.")]
        merged[f"{layer}.weight"] = merged[f"{layer}.weight"] + settings.scaling * (lora_b.float() @ lora_a.float())
    return merged


def write_adapter(
    state: dict[str, torch.Tensor], settings: LoraSettings, base_model: str, directory: str | Path
) -> Path:
    """A peft adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``): what
    ``PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` load."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ADAPTER_CONFIG_FILE).write_text(json.dumps(settings.adapter_config(base_model), indent=2) + "\n")
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    save_file(tensors, str(directory / ADAPTER_WEIGHTS_FILE))
    return directory


def adapter_parameter_count(model: torch.nn.Module, settings: LoraSettings) -> int:
    """r * (in + out) summed over the linear layers the settings target (a model on the meta
    device will do: nothing is allocated)."""
    return sum(
        settings.rank * (module.in_features + module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and any(matches(name, t) for t in settings.target_modules)
    )
