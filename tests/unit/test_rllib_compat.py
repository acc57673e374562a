"""rllib_arpo.learner.rllib_compat against the installed (pinned) Ray, without starting Ray.

Each fact the compat module's docstring states about an RLlib private name is checked here, so a
Ray upgrade that changes one of them fails in this file rather than silently in training.
"""

from __future__ import annotations

import inspect

import pytest
import ray
import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from transformers import AutoConfig

from rllib_arpo.algorithm import ARPOConfig
from rllib_arpo.learner import rllib_compat
from rllib_arpo.learner.rllib_compat import (
    DATA_PARALLEL_HOOK,
    PINNED_RAY_VERSION,
    UPDATE_HOOK,
    parameter_gradients,
    thawed,
    update_result,
    zero_gradients,
)
from rllib_arpo.learner.torch_learner import ARPOTorchLearner
from rllib_arpo.models.spaces import placeholder_spaces

ROWS, LENGTH = 3, 7


def build_learner(model_dir: str, learner_class: type | None = None) -> ARPOTorchLearner:
    config = ARPOConfig().policy(model_path=model_dir).training(lr=1e-3)
    if learner_class is not None:
        config.learners(learner_class=learner_class)
    vocab_size = AutoConfig.from_pretrained(model_dir).vocab_size
    return config.build_learner(spaces={DEFAULT_MODULE_ID: placeholder_spaces(vocab_size)})


def module_of(learner: Learner):
    return learner.module[DEFAULT_MODULE_ID]


def tensor_batch(learner: Learner) -> dict[str, torch.Tensor]:
    """A training batch of ROWS full rows; old log-probs are the current ones minus 0.1."""
    generator = torch.Generator().manual_seed(0)
    vocab_size = module_of(learner).model.config.vocab_size
    batch = {
        "input_ids": torch.randint(1, vocab_size, (ROWS, LENGTH), generator=generator),
        "attention_mask": torch.ones(ROWS, LENGTH, dtype=torch.int64),
        "loss_mask": torch.ones(ROWS, LENGTH - 1),
        "advantages": torch.tensor([[1.0], [-0.5], [2.0]]).expand(ROWS, LENGTH - 1).contiguous(),
    }
    with torch.no_grad():
        batch["old_logprobs"] = module_of(learner).forward_train(batch)["logprobs"] - 0.1
    return batch


def update(learner: Learner, batch: dict[str, torch.Tensor]) -> dict:
    numpy_batch = SampleBatch({k: v.numpy() for k, v in batch.items()})
    return learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: numpy_batch}, env_steps=ROWS))


def backward_on(learner: Learner) -> None:
    """One plain backward pass through the module, outside any RLlib update."""
    logprobs = module_of(learner).forward_train(tensor_batch(learner))["logprobs"]
    logprobs.sum().backward()


@pytest.fixture(scope="module")
def learner(model_dir) -> ARPOTorchLearner:
    return build_learner(model_dir)


# --- the pin ------------------------------------------------------------------------------


def test_installed_ray_is_the_pinned_version():
    assert ray.__version__ == PINNED_RAY_VERSION, (
        f"Ray {ray.__version__} is installed, but rllib_arpo/learner/rllib_compat.py was checked "
        f"against Ray {PINNED_RAY_VERSION}: re-check each private RLlib name its docstring lists "
        "against the new Ray, then update PINNED_RAY_VERSION"
    )


def parameters_of(function) -> list[inspect.Parameter]:
    """``function``'s parameters as RLlib wrote them. Once a subclass becomes a Ray actor (a remote
    learner), Ray's tracing helper writes a ``_ray_trace_ctx`` keyword into the ``__signature__``
    of every method the subclass inherits; that parameter is Ray's, not RLlib's."""
    return [p for p in inspect.signature(function).parameters.values() if p.name != "_ray_trace_ctx"]


# --- _uncompiled_update: the update hook -------------------------------------------------


def test_update_hook_has_the_signature_we_override():
    def shape(function) -> list[tuple[str, inspect._ParameterKind]]:
        return [(p.name, p.kind) for p in parameters_of(function)]

    positional, var_keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_KEYWORD
    expected = [("self", positional), ("batch", positional), ("kwargs", var_keyword)]
    assert shape(getattr(TorchLearner, UPDATE_HOOK)) == expected
    assert shape(TorchLearner._update) == [("self", positional), ("batch", positional)]
    # ARPOTorchLearner overrides the hook itself, with the same signature
    assert UPDATE_HOOK in vars(ARPOTorchLearner)
    assert shape(getattr(ARPOTorchLearner, UPDATE_HOOK)) == expected


def spy_on(base: type, calls: list, hook) -> type:
    """A subclass of ``base`` whose UPDATE_HOOK records (batch, result) of ``hook(self, batch)``."""

    def spy(self, batch, **kwargs):
        result = hook(self, batch)
        calls.append((batch, result))
        return result

    return type(f"Spy{base.__name__}", (base,), {UPDATE_HOOK: spy})


def assert_update_result_shape(result, loss_module_ids) -> None:
    assert isinstance(result, tuple) and len(result) == len(update_result({})) == 3
    fwd_out, loss_per_module, tensor_metrics = result
    assert isinstance(fwd_out, dict) and isinstance(tensor_metrics, dict)
    assert set(loss_per_module) == set(loss_module_ids)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in loss_per_module.values())


@pytest.mark.parametrize("hook", ["ours", "rllib"])
def test_learner_update_dispatches_to_the_hook_and_logs_its_losses(model_dir, hook):
    """``Learner.update`` -> ``TorchLearner._update`` -> UPDATE_HOOK, once, with ModuleID -> tensor
    dict; the hook's (fwd_out, loss_per_module, tensor_metrics), ours as RLlib's own, becomes
    ``total_loss`` in the results."""
    calls: list = []
    implementation = getattr(ARPOTorchLearner if hook == "ours" else TorchLearner, UPDATE_HOOK)
    learner = build_learner(model_dir, spy_on(ARPOTorchLearner, calls, implementation))
    batch = tensor_batch(learner)
    results = update(learner, batch)

    assert len(calls) == 1
    seen_batch, result = calls[0]
    assert set(seen_batch) == {DEFAULT_MODULE_ID}
    assert all(torch.equal(seen_batch[DEFAULT_MODULE_ID][k], v) for k, v in batch.items())
    assert_update_result_shape(result, [DEFAULT_MODULE_ID])
    assert results[DEFAULT_MODULE_ID]["total_loss"].peek() == pytest.approx(
        float(result[1][DEFAULT_MODULE_ID].detach())
    )


# --- _make_modules_ddp_if_necessary: the data-parallel wrapping hook ------------------------


def test_data_parallel_hook_runs_once_at_the_end_of_build_with_optimizers_registered(model_dir):
    """``TorchLearner.build`` calls DATA_PARALLEL_HOOK once, with no arguments, after the module
    exists and its optimizer is registered; the DeepSpeed learner overrides the same name."""
    from rllib_arpo.learner.deepspeed_learner import ARPODeepSpeedLearner

    seen = []

    def hook(self):
        seen.append(([name for name, _ in self.get_optimizers_for_module(DEFAULT_MODULE_ID)], self.module))

    spy = type("SpyLearner", (ARPOTorchLearner,), {DATA_PARALLEL_HOOK: hook})
    learner = build_learner(model_dir, spy)
    assert [p.name for p in parameters_of(getattr(TorchLearner, DATA_PARALLEL_HOOK))] == ["self"]
    [(optimizer_names, module)] = seen
    assert optimizer_names == ["default_optimizer"] and module is learner.module
    assert DATA_PARALLEL_HOOK in vars(ARPODeepSpeedLearner)
    # RLlib's own hook wraps for DDP only with several learners: one local learner stays unwrapped
    from ray.rllib.core.rl_module.torch.torch_rl_module import TorchDDPRLModule

    assert not isinstance(module_of(build_learner(model_dir)), TorchDDPRLModule)


# --- _optimizer_parameters / _params ---------------------------------------------------------


def test_learner_holds_optimizers_and_params_as_compat_reads_them(learner):
    module_params = list(module_of(learner).parameters())
    optimizers = [optimizer for _, optimizer in learner.get_optimizers_for_module(DEFAULT_MODULE_ID)]
    assert isinstance(learner._optimizer_parameters, dict)
    assert list(learner._optimizer_parameters) == optimizers
    assert all(isinstance(o, torch.optim.Optimizer) for o in learner._optimizer_parameters)
    assert isinstance(learner._params, dict)
    assert all(learner.get_param_ref(p) is p for p in module_params)  # a param ref is the param
    assert all(ref is param for ref, param in learner._params.items())
    assert {id(p) for p in learner._params.values()} == {id(p) for p in module_params}
    refs = [ref for refs in learner._optimizer_parameters.values() for ref in refs]
    assert {id(r) for r in refs} == {id(p) for p in module_params}


def test_parameter_gradients_are_the_module_gradients_keyed_as_rllib_expects(learner):
    zero_gradients(learner)
    backward_on(learner)
    module_params = list(module_of(learner).parameters())
    skipped = module_params[0]
    skipped.grad = None  # a parameter without a gradient is left out

    gradients = parameter_gradients(learner)
    assert {id(p) for p in gradients} == {id(p) for p in module_params[1:]}
    assert all(grad is param.grad for param, grad in gradients.items())
    # the keys are the refs RLlib's optimizer bookkeeping uses
    (optimizer,) = learner._optimizer_parameters
    assert learner.filter_param_dict_for_optimizer(gradients, optimizer).keys() == gradients.keys()


def test_zero_gradients_sets_every_gradient_to_none(learner):
    backward_on(learner)
    assert all(p.grad is not None for p in module_of(learner).parameters())
    zero_gradients(learner)
    assert all(p.grad is None for p in module_of(learner).parameters())
    assert parameter_gradients(learner) == {}


# --- AlgorithmConfig._is_frozen ---------------------------------------------------------------


def test_algorithm_config_freezes_through_is_frozen():
    config = AlgorithmConfig()
    assert config._is_frozen is False
    config.freeze()
    assert config._is_frozen is True
    with pytest.raises(AttributeError, match="frozen"):
        config.lr = 0.5


def test_thawed_lets_a_frozen_config_change_and_freezes_it_again():
    config = ARPOConfig()
    config.freeze()
    with thawed(config) as same:
        assert same is config
        config.model_path = "somewhere"
    assert config.model_path == "somewhere"
    with pytest.raises(AttributeError, match="frozen"):
        config.model_path = "elsewhere"

    with pytest.raises(RuntimeError, match="inside"), thawed(config):
        config.model_path = "elsewhere"
        raise RuntimeError("inside")
    assert config.model_path == "elsewhere"
    with pytest.raises(AttributeError, match="frozen"):
        config.model_path = "third"


def test_thawed_leaves_an_unfrozen_config_unfrozen():
    config = ARPOConfig()
    with thawed(config):
        config.model_path = "somewhere"
    config.model_path = "elsewhere"  # no AttributeError
    assert config.model_path == "elsewhere"


def test_compat_is_the_only_module_naming_rllib_privates():
    """Our learner code reaches RLlib's private attributes only through rllib_compat."""
    import rllib_arpo.learner.deepspeed_learner as deepspeed_learner
    import rllib_arpo.learner.forward as forward
    import rllib_arpo.learner.group as group
    import rllib_arpo.learner.rl_module as rl_module
    import rllib_arpo.learner.torch_learner as torch_learner

    privates = ("_optimizer_parameters", "._params", "_is_frozen", "._device", "._worker_manager", "._learner")
    for module in (torch_learner, rl_module, forward, deepspeed_learner, group):
        source = inspect.getsource(module)
        assert not [name for name in privates if name in source], module.__name__
    compat_source = inspect.getsource(rllib_compat)
    assert all(name in compat_source for name in privates[:3])
