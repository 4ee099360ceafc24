"""What every subcommand shares: notes, exit statuses, and the options built from TrainConfig's fields."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from prge_lib.data.tasks import TASKS


def note(line: str) -> None:
    print(f"prge: note: {line}", file=sys.stderr)


# `prge reproduce` stopped with cells left to run (a --time-limit): distinct from success (0) and bad input (2)
EXIT_CELLS_LEFT = 3


# a setting, file or data row refused (argparse exits with 2 for its own errors too)
EXIT_BAD_INPUT = 2


MODEL_OPTIONS = ("model", "dtype", "quant", "device")


def add_model_options(p) -> None:
    add_config_options(p, MODEL_OPTIONS)


def add_config_options(p, names=None, defaults=None, choices=None) -> None:
    """Options built from TrainConfig's fields (all of them, or ``names``): each setting is declared once,
    with its default, help and choices, in ``prge_lib.training.trainer.TrainConfig``. ``defaults``: the value an
    option takes where TrainConfig leaves it to the method (None), for a command that fixes the method (``prge
    export``: P-RGE's q and E); ``choices``: narrower choices than TrainConfig's."""
    from prge_lib.training.config import TrainConfig

    for f in dataclasses.fields(TrainConfig):
        if "help" not in f.metadata or (names is not None and f.name not in names):
            continue
        settings = {k: v() if callable(v) else v     # a function: what is registered now (method names)
                    for k, v in f.metadata.items() if k in ("help", "choices", "required")}
        if choices and f.name in choices:
            settings["choices"] = tuple(choices[f.name])
        default = (defaults or {}).get(f.name, f.default)
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type)
        if f.name == "task":
            settings["help"] = f"one of: {', '.join(TASKS)}"
        elif kind.startswith("bool"):
            settings["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
            settings["default"] = default
        elif kind.startswith("tuple"):
            settings.update(type=lambda text: tuple(text.split(",")), default=default)
        else:
            settings.update(type=int if kind.startswith("int") else float if kind.startswith("float") else str,
                            default=default)
        if default is not None and default is not False and f.name != "task" and "default" not in settings["help"]:
            shown = ",".join(default) if isinstance(default, tuple) else default
            settings["help"] += f" (default {shown})".replace("%", "%%")
        p.add_argument(flag, **settings)
