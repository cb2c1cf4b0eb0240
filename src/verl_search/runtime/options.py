"""Command-line flags generated from the option classes, so each option is declared once.

An options class (a dataclass, or a pydantic model such as `ServerSettings`) declares each option:
its name, type, default and help (dataclass: `field(metadata={"help": ...})`; pydantic:
`Field(description=...)`). `add_arguments` turns the fields into argparse flags and `build` turns
the parsed namespace back into the class, so the CLI never repeats a default or copies fields by
hand. Standard library only: the flags of every sub-command can be built without its heavy side.

Flag rules (field `max_topk` -> flag `--max-topk`):

| field type | flag |
| --- | --- |
| `int`, `float`, `str` (or `X \\| None`) | `--name VALUE` |
| `Literal[...]` | `--name {choices}` |
| `bool`, default False | `--name` (sets True) |
| `bool`, default True | `--no-name` (sets False) |
| `list[str]` | `--name VALUE`, repeatable |
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Literal, get_args, get_origin, get_type_hints


@dataclasses.dataclass
class FieldSpec:
    """One option of an options class: `name`, resolved `type`, `default` (`MISSING` if required), `help`."""

    name: str
    type: Any
    default: Any
    help: str


MISSING = dataclasses.MISSING


def option_fields(cls: type) -> list[FieldSpec]:
    """The options of a dataclass or a pydantic model, in declaration order.

    Raises:
        TypeError: `cls` is neither a dataclass nor a pydantic model.
    """
    hints = get_type_hints(cls)
    if dataclasses.is_dataclass(cls):
        specs = []
        for f in dataclasses.fields(cls):
            if f.default is not MISSING:
                default = f.default
            elif f.default_factory is not MISSING:
                default = f.default_factory()
            else:
                default = MISSING
            specs.append(FieldSpec(f.name, hints[f.name], default, f.metadata.get("help", "")))
        return specs
    model_fields = getattr(cls, "model_fields", None)
    if model_fields is None:
        raise TypeError(f"{cls.__name__} is neither a dataclass nor a pydantic model")
    return [FieldSpec(name, hints[name], MISSING if info.is_required() else info.default, info.description or "")
            for name, info in model_fields.items()]


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def flag_name(spec: FieldSpec) -> str:
    """The flag of a field: `--max-topk`, or `--no-micro-batching` for a bool that defaults to True."""
    name = spec.name.replace("_", "-")
    if _unwrap_optional(spec.type) is bool and spec.default is True:
        return f"--no-{name}"
    return f"--{name}"


def add_arguments(parser, cls: type, skip: tuple[str, ...] = (), defaults_in_class: bool = False,
                  only: tuple[str, ...] = ()) -> None:
    """Add one flag per field of `cls` (except `skip`; only `only` if given) to `parser` (a parser,
    an argument group or a mutually exclusive group).

    Args:
        defaults_in_class: leave the flag's default at `None` ("the class's default", resolved by
            `build`), for parsers that must not hold a copy of the defaults; the help still names
            the default.

    Raises:
        TypeError: a field of a type the rules above do not cover.
    """
    for spec in option_fields(cls):
        if spec.name in skip or (only and spec.name not in only):
            continue
        kind = _unwrap_optional(spec.type)
        shown = "" if spec.default is MISSING or spec.default is None else f" (default: {spec.default})"
        keywords: dict[str, Any] = {"dest": spec.name, "help": spec.help + shown}
        if kind is bool:
            keywords["action"] = "store_false" if spec.default is True else "store_true"
            keywords["help"] = spec.help
            if defaults_in_class:
                keywords["default"] = None
        elif get_origin(kind) is Literal:
            keywords["choices"] = list(get_args(kind))
        elif get_origin(kind) is list:
            keywords["action"] = "append"
            keywords["type"] = get_args(kind)[0]
        elif kind in (int, float, str):
            keywords["type"] = kind
        else:
            raise TypeError(f"{cls.__name__}.{spec.name}: no flag rule for type {spec.type!r}")
        if kind is not bool:
            if spec.default is MISSING:
                keywords["required"] = True
            else:
                keywords["default"] = None if defaults_in_class else spec.default
        parser.add_argument(flag_name(spec), **keywords)


def build(cls: type, args: argparse.Namespace | dict, **extra: Any):
    """An instance of `cls` from parsed flags: its fields found in `args` (values of `None` are
    left to the class's default), then `extra`.

    Raises:
        whatever `cls` raises for a bad value (pydantic `ValidationError` is a `ValueError`).
    """
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    names = {spec.name for spec in option_fields(cls)}
    given = {k: v for k, v in values.items() if k in names and v is not None}
    return cls(**{**given, **extra})
