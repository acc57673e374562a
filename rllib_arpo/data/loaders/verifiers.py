"""The ``verifiers`` dataset type and reward: the single-turn environments of the verifiers library
(its ``verifiers.v1`` API), each scored by its own reward functions.

``{"type": "verifiers", "env": "math_env", "args": {"difficulty": 2}, "split": "train"}`` asks every
task of a verifiers environment. ``env`` is either

- an installed environment id (the library's ``vf.load_environment``, as ``vf-eval`` loads it:
  the taskset package of that name), ``args`` being its taskset's config fields; or
- an import path ``module:function``, the function returning a ``vf.Env`` and called with
  ``args`` as keyword arguments: a user's own environment, from a module that ``imports:`` names.

``split`` is handed to the environment as its own ``split`` option (a taskset config field, or a
keyword argument of the function) where it declares one; the held-out split ``test`` is then the
environment's own. An environment without one has no test split: ``train`` asks all its tasks, and
``test`` is a ValueError, so the held-out set must be named (``held_out_dataset``).

Only single-turn environments are taken: a ``vf.SingleAgentEnv`` (one agent answers each prompt)
whose tasks need no tool servers and no container of their own, since ARPO's rollout and tools
replace the environment's harness. Any other environment is a one-line ValueError.

Each task's prompt (``TaskData.prompt_text``) is asked with ARPO's prompt (``data.prompts``;
``system_prompt`` replaces its system message, and the task's own system prompt is not used), so
the tools and the ``<answer>`` tags work as for every other task. An example's ``ground_truth`` is
the task's ``answer`` field where it has one (else ``""``), its ``task`` is ``math`` (for the
hierarchical reward, should a run use that), its ``source`` ``verifiers/<taskset id>``, and its
``extra["verifiers"]`` what the reward needs: ``env``, ``args``, ``split`` and the task's data
(``TaskData`` as JSON values). The reward scores a row only with an environment this process loaded
from the config (``LOADED_SPECS``): a row that names another, a jsonl's own for instance, is a
reward error, so no dataset row chooses code to import and call.

The ``verifiers`` reward (``reward: {fn: verifiers}``) scores a response with the task's own
``Task.score``: the environment's ``@vf.reward`` functions (and any judges its task config
plugs), run to completion on a fresh event loop. They read a trace whose one assistant message is
the final answer (``core.rewards.extract_answer``) boxed, ``\\boxed{...}``, as ARPO's prompt asks
for it and as the library's own scorers (``vf.verify_boxed_math_answer``) read it; a response
with no answer gives an empty message. The reward is their weighted sum (the library's
``Trace.reward``), S their weighted mean (in [0, 1] where each scores in [0, 1]), and each reward
function's score is logged as the component ``verifiers/<name>``. A response that breaks the TIR
format gets the rewards group's ``format_penalty`` instead, as under the hierarchical reward, and
keeps S for the accuracy metrics. The tool calls do not count.

The library is an optional extra: ``pip install rllib-arpo[verifiers]``, then ``pip install
--no-deps verifiers==0.4.0`` (its pins, openai<3 and mcp==2.0.0, would downgrade the ones vLLM
brings; the extra holds the dependencies it needs). It is imported when a spec is loaded or a row
is scored, so the package imports without it.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

from rllib_arpo.core.reward_functions import REWARDS, import_function
from rllib_arpo.core.rewards import RewardSettings, extract_answer, format_gated
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT, tir_messages
from rllib_arpo.data.registry import DATASET_LOADERS

SPLITS = ("train", "test")
LOADED_SPECS: set[str] = set()
"""The specs (as JSON) this process's ``load_verifiers`` loaded from the run's config: the only
environments the reward scores with. A row names its environment, and a dataset row must not choose
code to run: ``{"env": "os:system", "args": {...}}`` in a jsonl would otherwise be called."""
SINGLE_TURN = "only single-turn environments are supported (a vf.SingleAgentEnv, no tool servers, no container)"


@DATASET_LOADERS.register("verifiers", held_out_split="test")
def load_verifiers(
    env: str,
    args: Mapping[str, Any] | None = None,
    split: str = "train",
    system_prompt: str = TIR_SYSTEM_PROMPT,
) -> list[PromptExample]:
    if not isinstance(env, str) or not env:
        raise ValueError(f"env: expected an installed environment id or module:function, got {env!r}")
    if args is not None and not isinstance(args, Mapping):
        raise ValueError(f"args: expected a mapping of the environment's options, got {args!r}")
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    if "split" in (args or {}):
        raise ValueError("args.split: give split beside args, not inside them")
    spec = {"env": env, "args": dict(args or {}), "split": split}
    spec_json = _spec_json(spec)
    environment = _environment(spec_json)
    LOADED_SPECS.add(spec_json)
    return [verifiers_example(spec, environment, task, system_prompt) for task in environment.taskset]


def verifiers_example(
    spec: Mapping[str, Any], environment: Any, task: Any, system_prompt: str = TIR_SYSTEM_PROMPT
) -> PromptExample:
    """One task of the environment as a prompt (module docstring)."""
    data = task.data
    if data.prompt is None:
        raise ValueError(
            f"env: task {data.idx} of {spec['env']!r} has no prompt (the user speaks first): {SINGLE_TURN}"
        )
    answer = getattr(data, "answer", None)
    scoring = {**spec, "task": data.model_dump(mode="json", exclude_none=True)}
    return PromptExample(
        tir_messages(data.prompt_text, system_prompt),
        "" if answer is None else str(answer),
        "math",
        f"verifiers/{environment.config.env_id}",
        extra={"verifiers": scoring},
    )


def _library():
    """``verifiers.v1``; a ValueError says how to install it."""
    try:
        return importlib.import_module("verifiers.v1")
    except ImportError:
        raise ValueError(
            "the verifiers dataset type needs the verifiers package: "
            "pip install rllib-arpo[verifiers] && pip install --no-deps verifiers==0.4.0"
        ) from None


def _spec_json(spec: Mapping[str, Any]) -> str:
    """The spec's ``env``, ``args`` and ``split`` as one JSON text: the key of ``_environment``'s
    cache and of ``LOADED_SPECS``, written alike by the loader and read alike from a row."""
    return json.dumps({key: spec.get(key) for key in ("env", "args", "split")}, sort_keys=True)


@functools.cache
def _environment(spec_json: str) -> Any:
    """The single-turn ``vf.Env`` of the spec ``{"env", "args", "split"}`` (as JSON, so that each
    process builds it once); a ValueError names the key at fault."""
    spec = json.loads(spec_json)
    name, args, split = spec["env"], spec["args"], spec["split"]
    vf = _library()
    make = import_function(name, "env") if ":" in name else None
    try:
        if make is not None:
            splits = "split" in inspect.signature(make).parameters
            environment = make(**args, **({"split": split} if splits else {}))
        else:
            splits = "split" in vf.taskset_config_type(name).model_fields
            taskset = {"id": name, **args, **({"split": split} if splits else {})}
            environment = vf.load_environment(vf.resolve_env_config({"taskset": taskset}))
    except (ImportError, AttributeError, TypeError, ValueError) as error:
        raise ValueError(f"env: verifiers cannot load {name!r} with args {args!r} ({_reason(error)})") from None
    if not isinstance(environment, vf.Env):
        raise ValueError(f"env: {name!r} returned {reprlib.repr(environment)}, not a verifiers Env")
    if split == "test" and not splits:
        raise ValueError(f"split: {name!r} has no split option, so no test split; give held_out_dataset instead")
    _check_single_turn(name, environment, vf)
    return environment


def _reason(error: Exception) -> str:
    """Why loading failed, on one line: a config the library rejects as each field and its problem
    (pydantic's ``ValidationError``, less its multi-line layout and web link), else the error."""
    from pydantic import ValidationError

    if isinstance(error, ValidationError):
        return "; ".join(f"{'.'.join(map(str, problem['loc']))}: {problem['msg']}" for problem in error.errors())
    return " ".join(f"{type(error).__name__}: {error}".split())


def _check_single_turn(name: str, environment: Any, vf: Any) -> None:
    """A ValueError unless ``environment`` is single-turn (module docstring)."""
    taskset = environment.taskset
    task_type = type(taskset).task_type()
    if type(environment) is not vf.SingleAgentEnv:
        why = f"a {type(environment).__name__}"
    elif task_type.NEEDS_CONTAINER or task_type.toolsets(taskset.config.task) or type(taskset).toolsets(taskset.config):
        why = "for tasks that need a container or tool servers of their own"
    else:
        return
    raise ValueError(f"env: {name!r} is {why}: {SINGLE_TURN}")


def _scored_trace(environment: Any, task_data: Mapping[str, Any], reply: str) -> Any:
    """A trace of the task ``task_data`` whose one assistant message is ``reply``, scored by the
    task's own ``Task.score`` on an event loop of its own, closed when scoring ends."""
    vf = _library()
    task_type = type(environment.taskset).task_type()
    data = task_type.data_type().model_validate(task_data)
    task = task_type(data, environment.taskset.config.task)
    trace = vf.Trace(
        task=vf.TraceTask(type=task_type.__name__, data=data),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        nodes=[vf.MessageNode(message=vf.AssistantMessage(content=reply), sampled=True)],
    )
    asyncio.run(task.score(trace))
    return trace


@REWARDS.register("verifiers", takes_settings=True)
def verifiers_reward(
    response: str,
    row: Mapping[str, Any],
    tool_calls: Mapping[str, int],
    *,
    settings: RewardSettings,
    tool_tags: Sequence[str],
) -> dict[str, float]:
    """The ``verifiers`` reward entry: the weighted sum of the environment's own rewards of the
    boxed final answer, or the ``format_penalty`` where the response breaks the TIR format (module
    docstring)."""
    if "verifiers" not in row:
        raise ValueError("the row has no 'verifiers' column: this reward scores the verifiers dataset type")
    scoring = row["verifiers"]
    spec_json = _spec_json(scoring)
    if spec_json not in LOADED_SPECS:
        raise ValueError(
            f"the row's verifiers environment {reprlib.repr(scoring.get('env'))} is none this run loaded: the "
            "reward scores only with an environment a `type: verifiers` dataset of the config names"
        )
    answer = extract_answer(response)
    reply = "" if answer is None else f"\\boxed{{{answer}}}"
    trace = _scored_trace(_environment(spec_json), scoring["task"], reply)
    rewards = {name: value for name, value in trace.rewards.items() if value is not None}
    total_weight = sum(value.weight for value in rewards.values())
    correct = trace.reward / total_weight if total_weight else 0.0
    reward = format_gated(trace.reward, response, settings, tool_tags)
    components = {f"verifiers/{name}": value.score for name, value in sorted(rewards.items())}
    return {"reward": reward, "correct": correct, **components}
