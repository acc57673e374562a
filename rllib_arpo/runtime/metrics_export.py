"""Rollout and learner metrics as Ray metrics (``ray.util.metrics``), live on the Ray dashboard.

Tune writes every result to TensorBoard, CSV and JSON; these gauges carry the ones worth watching
while a run goes to Ray's metrics agent, which serves them to Prometheus (the dashboard's Metrics
view and Grafana read them from there). Each gauge is named ``arpo_<name>`` (Prometheus shows
``ray_arpo_<name>``) and tagged ``trial`` with the name of the trial's directory (as TensorBoard
shows it), so the trials of a sweep are told apart.
"""

from __future__ import annotations

from typing import Any

# Ray metric name -> (path of the value in an iteration's result, description)
EXPORTED_METRICS: dict[str, tuple[tuple[str, ...], str]] = {
    "arpo_reward_mean": (("env_runners", "reward_mean"), "Mean trajectory reward of the iteration's rollouts"),
    "arpo_accuracy": (("env_runners", "accuracy"), "Share of correct trajectories in the rollouts"),
    "arpo_format_error_rate": (("env_runners", "format_error_rate"), "Share of trajectories breaking the format"),
    "arpo_branches": (("env_runners", "branches"), "Forks of the tree rollout per EnvRunner"),
    "arpo_entropy_change_after_tool": (("env_runners", "entropy_change_after_tool"), "Mean dH after a tool result"),
    "arpo_generated_tokens_per_s": (("env_runners", "generated_tokens_per_s"), "Rollout generation throughput"),
    "arpo_tool_seconds": (("env_runners", "tool_s"), "Seconds in tool calls per sample"),
    "arpo_env_steps_sampled_lifetime": (("num_env_steps_sampled_lifetime",), "Generated tokens so far"),
    "arpo_policy_loss": (("learners", "default_policy", "policy_loss"), "Policy loss of the update"),
    "arpo_clip_fraction": (("learners", "default_policy", "clip_fraction"), "Share of clipped tokens"),
    "arpo_approx_kl": (("learners", "default_policy", "approx_kl"), "KL(pi_old || pi_theta) estimate"),
    "arpo_logprob_mismatch_kl": (
        ("learners", "default_policy", "logprob_mismatch_kl"),
        "KL(pi_engine || pi_learner) on the sampled tokens, before the update",
    ),
    "arpo_grad_norm": (
        ("learners", "default_policy", "gradients_default_optimizer_global_norm"),
        "Global gradient norm before clipping",
    ),
    "arpo_learner_update_seconds": (("learner_update_s",), "Seconds of the learner update"),
    "arpo_weight_sync_seconds": (("weight_sync_s",), "Seconds of the weight sync to the EnvRunners"),
    "arpo_weights_version": (("weights_version",), "Version of the policy weights"),
    "arpo_held_out_accuracy": (("evaluation", "accuracy"), "Held-out accuracy (when evaluated)"),
}


def _lookup(result: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(result, dict) or key not in result:
            return None
        result = result[key]
    return result


class RayMetricsExporter:
    """Sets one gauge per ``EXPORTED_METRICS`` entry from each iteration's result."""

    def __init__(self, trial: str):
        self.tags = {"trial": trial}
        self._gauges: dict = {}

    def export(self, result: dict) -> dict[str, float]:
        """Set the gauges whose value the result has; return what was set."""
        from ray.util.metrics import Gauge

        exported = {}
        for name, (path, description) in EXPORTED_METRICS.items():
            value = _lookup(result, path)
            if not isinstance(value, (int, float)):
                continue
            if name not in self._gauges:
                self._gauges[name] = Gauge(name, description=description, tag_keys=tuple(self.tags))
            self._gauges[name].set(float(value), tags=self.tags)
            exported[name] = float(value)
        return exported
