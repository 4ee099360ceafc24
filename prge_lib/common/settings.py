"""Run-wide settings read from the environment in one place: fast mode, data folder, cache, seeding.

Every chapter and command asks this module, never ``os.environ`` directly, so that one switch
(``PRGE_FAST=1``) shrinks the whole book for CI (chapter 0 explains the settings).
"""
from __future__ import annotations

import os
import random
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={value!r} is not a boolean; use one of {sorted(_TRUE | _FALSE - {''})}")


def fast_mode() -> bool:
    """True when ``PRGE_FAST`` is set: every chapter and command shrinks its work for CI."""
    return _flag("PRGE_FAST")


def pick(full, fast):
    """``fast`` in fast mode, ``full`` otherwise: the one idiom chapters use to size their work."""
    return fast if fast_mode() else full


HUB = "hub"   # PRGE_DATA_DIR=hub: read every split from the Hugging Face hub


def data_dir() -> Path | None:
    """The local data folder (``PRGE_DATA_DIR``), or None when the setting is unset or ``hub``.

    The folder holds ``<hub dataset>/<config>/<split>.jsonl`` files in the hub's schema. Unset, the book
    reads the task pools shipped in ``data/tasks`` (``prge_lib.data.splits``); ``hub`` reads the hub.
    A setting that names a missing folder is an error, not a silent fallback.
    """
    value = os.environ.get("PRGE_DATA_DIR", "").strip()
    if not value or value == HUB:
        return None
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"PRGE_DATA_DIR={value!r} is not a folder (resolved to {path}); set it to "
                                f"a data folder, to {HUB!r} for the Hugging Face hub, or unset it for the "
                                f"task pools shipped with the book")
    return path


def data_source() -> str:
    """Where task data come from: "folder" (PRGE_DATA_DIR), "hub" (PRGE_DATA_DIR=hub) or "shipped"."""
    if data_dir() is not None:
        return "folder"
    return HUB if os.environ.get("PRGE_DATA_DIR", "").strip() == HUB else "shipped"


def cache_dir() -> Path:
    """Where converted models are kept between runs (``PRGE_CACHE_DIR``, default ``~/.cache/prge``)."""
    value = os.environ.get("PRGE_CACHE_DIR", "").strip()
    path = Path(value).expanduser() if value else Path.home() / ".cache" / "prge"
    path.mkdir(parents=True, exist_ok=True)
    return path


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) for a reproducible run."""
    import numpy as np      # imported here: reading a setting must not load the numeric stack
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
