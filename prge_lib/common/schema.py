"""A JSON schema read off a typed declaration, so a record's type and the schema its files are checked against
are one declaration (chapter 7's result files: ``prge_lib.training.records``).

:func:`json_schema` translates a ``TypedDict`` (required and ``NotRequired`` keys), ``Literal``, ``list[...]``,
``dict[...]``, unions with ``None`` and the plain scalars; ``Annotated[T, {...}]`` adds JSON-schema keywords
(bounds, ``minItems``) to ``T``'s schema. Keys the type does not declare are allowed, as result files carry
method-specific extras.
"""
from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal, NotRequired, Required, Union, get_args, get_origin

_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}


def _is_typeddict(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _union(options: list[dict]) -> dict:
    """One schema for several: a list of plain types merged into one ``type`` where possible."""
    if all(set(o) == {"type"} for o in options):
        names = []
        for o in options:
            names += o["type"] if isinstance(o["type"], list) else [o["type"]]
        return {"type": sorted(set(names), key=names.index)}
    return {"anyOf": options}


def json_schema(tp: Any) -> dict:
    """The JSON schema of the type ``tp`` (see the module docstring for what is translated); any other type is
    refused with a ValueError naming it."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extras = get_args(tp)
        schema = json_schema(base)
        for extra in extras:
            if isinstance(extra, dict):
                schema.update(extra)
        return schema
    if origin in (Required, NotRequired):
        return json_schema(get_args(tp)[0])
    if tp is Any:
        return {}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if origin is Literal:
        values = get_args(tp)
        return {"const": values[0]} if len(values) == 1 else {"enum": list(values)}
    if origin in (Union, types.UnionType):
        return _union([json_schema(a) for a in get_args(tp)])
    if origin in (list, tuple) or tp in (list, tuple):
        args = get_args(tp)
        return {"type": "array", **({"items": json_schema(args[0])} if args and args[0] is not Ellipsis else {})}
    if origin is dict or tp is dict:
        args = get_args(tp)
        return {"type": "object", **({"additionalProperties": json_schema(args[1])} if args else {})}
    if _is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        return {"type": "object",
                "required": [k for k in hints if k in tp.__required_keys__],
                "properties": {k: json_schema(v) for k, v in hints.items()}}
    raise ValueError(f"no JSON schema for type {tp!r}; use a TypedDict, Literal, list, dict, a union or a scalar")
