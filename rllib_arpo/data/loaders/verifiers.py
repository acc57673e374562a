"""The ``verifiers`` dataset type: the single-turn environments of the verifiers library (its
``verifiers.v1`` API), each scored by its own reward functions (the ``verifiers`` reward,
``rewards.verifiers``).

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
from the config (``LOADED_SPECS``), so no dataset row chooses code to import and call.

The library is an optional extra: ``pip install rllib-arpo[verifiers]``, then ``pip install
--no-deps verifiers==0.4.0`` (its pins, openai<3 and mcp==2.0.0, would downgrade the ones vLLM
brings; the extra holds the dependencies it needs). It is imported when a spec is loaded or a row
is scored, so the package imports without it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import reprlib
from collections.abc import Mapping
from typing import Any

from rllib_arpo.core.user_imports import import_function
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
    spec_json = spec_json_of(spec)
    environment = environment_of(spec_json)
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


def library():
    """``verifiers.v1``; a ValueError says how to install it."""
    try:
        return importlib.import_module("verifiers.v1")
    except ImportError:
        raise ValueError(
            "the verifiers dataset type needs the verifiers package: "
            "pip install rllib-arpo[verifiers] && pip install --no-deps verifiers==0.4.0"
        ) from None


def spec_json_of(spec: Mapping[str, Any]) -> str:
    """The spec's ``env``, ``args`` and ``split`` as one JSON text: the key of ``environment_of``'s
    cache and of ``LOADED_SPECS``, written alike by the loader and read alike from a row."""
    return json.dumps({key: spec.get(key) for key in ("env", "args", "split")}, sort_keys=True)


@functools.cache
def environment_of(spec_json: str) -> Any:
    """The single-turn ``vf.Env`` of the spec ``{"env", "args", "split"}`` (as JSON, so that each
    process builds it once); a ValueError names the key at fault."""
    spec = json.loads(spec_json)
    name, args, split = spec["env"], spec["args"], spec["split"]
    vf = library()
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
