"""The learner pieces: ``learner_update`` and ``deepspeed_update`` (one update of one learner on the
devices against the same update on the CPU in float64) and ``learners`` (DDP, ZeRO-2 and ZeRO-3
with 2 learners against one), with the tolerances derived from the dtype's rounding."""

from __future__ import annotations

from rllib_arpo.gpu_check.devices import GPU, REFERENCE, Devices, require_package
from rllib_arpo.gpu_check.learner_runs import learner_config, learner_group, training_batch, update_gap
from rllib_arpo.gpu_check.outcomes import CheckFailed

# 2 learners against 1: a micro-batch is half the rows, so each of 2 learners runs one of the 2
# micro-batches that one learner runs, and both add the same two micro-batch gradients (one rounding,
# and a + b == b + a). A backend may add a few roundings of the dtype's unit roundoff u (a reduce in
# bf16, DeepSpeed's averaging, a GPU's nondeterministic backward): ``learner_tolerances``.
GRADIENT_ROUNDINGS = 4


def _train_twice(model_path: str, batch, num_learners: int, devices: Devices, **learners) -> tuple[dict, list[float]]:
    """Weights after two updates on ``batch`` and the global gradient norm of each."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_arpo.learner.group import update_learners
    from rllib_arpo.weights.object_store import policy_weights

    config = learner_config(model_path, num_learners, devices, **learners)
    group = learner_group(config)
    try:
        norms = []
        for _ in range(2):
            [results, *_] = update_learners(group, batch, config)
            norms.append(results[DEFAULT_MODULE_ID]["gradients_default_optimizer_global_norm"].peek())
        return policy_weights(group), norms
    finally:
        group.shutdown()


def learner_tolerances(dtype: str) -> tuple[float, float]:
    """The largest gradient-norm relative gap and ``update_gap`` of 2 learners against one in
    ``dtype``, from e = ``GRADIENT_ROUNDINGS`` u (u: the unit roundoff, 2^-24 in float32, 2^-8 in
    bf16): the gradients differ by at most e relative, so the norms do. Adam steps a weight by about
    lr whatever its gradient's size, so a weight whose gradient lies within e of zero may step the
    other way: its two flipped steps add (4 lr)^2 to ||w - e||^2, where every weight adds about
    (2 lr)^2 to ||e - w0||^2, so flips of a fraction f of the weights make a gap of 2 sqrt(f); f is at
    most e where a gradient element's density near zero is at most 1 / its RMS (a Gaussian's: 0.4).
    float32: 2.4e-7 and 9.8e-4; bf16: 1.6e-2 and 0.25. A learner that loses a shard: about 0.7 and 0.8."""
    import torch

    error = GRADIENT_ROUNDINGS * torch.finfo(getattr(torch, dtype)).eps / 2
    return error, 2 * error**0.5


LEARNER_LAYOUTS = {
    "ddp": {},
    "zero2": {"learner_backend": "deepspeed", "zero_stage": 2},
    "zero3": {"learner_backend": "deepspeed", "zero_stage": 3},
}


def check_learners(model: str, devices: Devices = GPU, layouts: dict = LEARNER_LAYOUTS) -> dict:
    """Each of ``layouts`` (learner options) with 2 learners against one learner, two updates on
    the same batch: gradient norms and the weights' update (``update_gap``) as close to one
    learner's as ``learner_tolerances`` of ``devices.dtype`` allows."""
    from rllib_arpo.learner.backends import LEARNER_BACKENDS

    devices.require(2, " (2 learners)")
    for options in layouts.values():
        package = LEARNER_BACKENDS.get(options.get("learner_backend", "torch")).package
        if package:
            require_package(package)
    import torch
    from transformers import AutoModelForCausalLM

    from rllib_arpo.models.catalogue import resolve_model_path

    path = resolve_model_path(model)
    batch = training_batch(path)
    initial = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, devices.dtype)).state_dict()
    expected, expected_norms = _train_twice(path, batch, 1, devices)
    norm_rtol, gap_max = learner_tolerances(devices.dtype)
    figures, wrong = {}, []
    for name, learners in layouts.items():
        weights, norms = _train_twice(path, batch, 2, devices, **learners)
        gap = update_gap(weights, expected, initial)
        norm_gap = max(abs(n - e) / e for n, e in zip(norms, expected_norms))
        figures[f"{name}_update_gap"], figures[f"{name}_grad_norm_rel_gap"] = gap, norm_gap
        if gap > gap_max or norm_gap > norm_rtol:
            wrong.append(name)
    if wrong:
        raise CheckFailed(f"2 learners differ from one ({', '.join(wrong)}): {figures}")
    return figures


# A product under autocast rounds its two inputs to the dtype (up to u each, u its unit roundoff)
# and sums K terms in float32 (about sqrt(K) float32 roundoffs); a gradient is the end of a chain
# of such products, forward and backward through every layer, whose independent errors add in
# quadrature
PRODUCTS_PER_LAYER = 9  # q, k, v, o, gate, up, down, and attention's two (Q K^T and A V)


def learner_precision_tolerances(dtype: str, num_layers: int, inner_size: int) -> tuple[float, float]:
    """The largest gradient-norm relative gap and ``update_gap`` of one learner's update in
    ``dtype`` against the same update in float64.

    A gradient passes forward and backward through P = 2 (``PRODUCTS_PER_LAYER`` L + 1) products
    (L layers and the head), each erring by about p = 2 u + sqrt(K) u_32 relative (u: the dtype's
    unit roundoff, 2^-8 in bf16; u_32 = 2^-24; K: the widest inner dimension), so the gradient
    errs by e = p sqrt(P), and so does its norm. AdamW's first step moves a weight by about lr
    sign(g) (its moments are g and g^2), so only weights whose gradient lies within e (relative to
    its RMS) of zero may step the other way: a fraction of at most e, since a gradient element's
    density near zero is at most 1 / its RMS (a Gaussian's: 0.4), and their flipped steps make a
    gap of at most 2 sqrt(e) (as in ``learner_tolerances``). On the 2-layer tiny policy (K = 256):
    bf16 4.8e-2 and 0.44 (measured on a CPU: 6.0e-3 and 0.20); float32 6.6e-6 and 5.1e-3 (9.1e-7
    and 4.0e-4). A learner that trains on half the batch: about 0.7."""
    import torch

    unit_roundoff = torch.finfo(getattr(torch, dtype)).eps / 2
    float32_roundoff = torch.finfo(torch.float32).eps / 2
    per_product = 2 * unit_roundoff + inner_size**0.5 * float32_roundoff
    error = per_product * (2 * (PRODUCTS_PER_LAYER * num_layers + 1)) ** 0.5
    return error, 2 * error**0.5


UPDATE_LAYOUTS = {"torch": {}, "zero2": {"learner_backend": "deepspeed", "zero_stage": 2}}
"""The learners ``learner_update`` (``torch``) and ``deepspeed_update`` (``zero2``) check."""


def _trained_weights(learner) -> dict:
    """The learner's trained weights as CPU tensors in their master precision: DeepSpeed's float32
    copies (its module holds the bf16 ones), else the module's own."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    parameters = dict(learner.module[DEFAULT_MODULE_ID].named_parameters())
    if getattr(learner, "engines", None):
        from deepspeed.utils import safe_get_full_fp32_param

        return {name: safe_get_full_fp32_param(p).detach().cpu().clone() for name, p in parameters.items()}
    return {name: p.detach().cpu().clone() for name, p in parameters.items()}


def _in_float64(learner) -> None:
    """The learner's module in float64, computed in float64 (no autocast); its AdamW holds the same
    parameters, so its moments are float64 too."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID

    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    module.double()
    module.compute_dtype = torch.float64


def _one_update(
    model_path: str, batch, devices: Devices, float64: bool = False, **learners
) -> tuple[dict, dict, float]:
    """(weights before, weights after, global gradient norm) of one update of a local learner
    (``num_learners: 0``, in this process) on ``devices``, or in float64 on the CPU."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_arpo.learner.group import update_learners

    config = learner_config(model_path, 0, REFERENCE if float64 else devices, **learners)
    group = learner_group(config)
    try:
        if float64:
            group.foreach_learner(_in_float64)
        [before] = [result.get() for result in group.foreach_learner(_trained_weights)]
        [results, *_] = update_learners(group, batch, config)
        [after] = [result.get() for result in group.foreach_learner(_trained_weights)]
        return before, after, float(results[DEFAULT_MODULE_ID]["gradients_default_optimizer_global_norm"].peek())
    finally:
        group.shutdown()


def check_learner_update(model: str, devices: Devices = GPU, layout: str = "torch") -> dict:
    """One update of one learner of ``layout`` (``UPDATE_LAYOUTS``) on ``devices`` in their dtype
    against the same update of one torch learner on the CPU in float64: the gradient norm and the
    weights' update (``update_gap`` of each one's move from where it started) within
    ``learner_precision_tolerances``, and the learner's trained weights before the update exactly
    those loaded (``start_gap`` 0: how far they were, in units of the update; DeepSpeed's bf16
    optimizer made its float32 master weights from the bf16-rounded ones, 1.1 updates away on an
    H200 at lr 1e-4, until ``deepspeed_learner`` set them)."""
    devices.require()
    options = UPDATE_LAYOUTS[layout]
    if options.get("learner_backend") == "deepspeed":
        require_package("deepspeed")
    from transformers import AutoConfig

    from rllib_arpo.models.catalogue import resolve_model_path

    path = resolve_model_path(model)
    batch = training_batch(path)
    initial, expected, expected_norm = _one_update(path, batch, devices, float64=True)
    start, weights, norm = _one_update(path, batch, devices, **options)
    # each learner's own move: DeepSpeed's bf16 master weights start from the weights rounded to bf16
    moved = {name: weights[name].double() - start[name].double() + initial[name].double() for name in expected}
    shape = AutoConfig.from_pretrained(path)
    norm_rtol, gap_max = learner_precision_tolerances(devices.dtype, shape.num_hidden_layers, shape.intermediate_size)
    figures = {
        "dtype": devices.dtype,
        "grad_norm_rel_gap": abs(norm - expected_norm) / expected_norm,
        "update_gap": update_gap(moved, expected, initial),
        "grad_norm_rtol": norm_rtol,
        "update_gap_max": gap_max,
        "start_gap": update_gap(start, initial, expected),
    }
    if figures["grad_norm_rel_gap"] > norm_rtol or figures["update_gap"] > gap_max or figures["start_gap"] > 0:
        raise CheckFailed(f"the {layout} learner's update in {devices.dtype} differs from float64's: {figures}")
    return figures
