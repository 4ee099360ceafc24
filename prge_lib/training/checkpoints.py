"""A run's checkpoint (chapters 5 and 7): what it holds, how it is read back as data only, and when an existing
one may be continued or discarded. Written by :meth:`prge_lib.training.trainer.Trainer.save_checkpoint`."""
from __future__ import annotations

import os
import pickle
import random
import re
from pathlib import Path

import torch


# what a checkpoint holds: tensors and plain values only, read back with torch.load(weights_only=True), so a
# checkpoint from elsewhere cannot run code. Format 1 stored Python's RNG state as a tuple; it reads the same way.
CHECKPOINT_FORMAT = 2
CHECKPOINT_NAME = "checkpoint.pt"         # the file in a run's checkpoint folder
_CHECKPOINT_FIELDS = {"format": int, "config": dict, "step": int, "method": dict, "history": dict,
                      "elapsed": dict, "rng": dict}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as a checkpoint of this trainer: the message (one line) names the file,
    why, and the two ways on."""

    def __init__(self, path: str | os.PathLike, reason: str, resume: str = "--resume"):
        self.path, self.reason = Path(path), reason
        super().__init__(f"checkpoint {path} cannot be read: {reason}; restore a good copy and resume ({resume}), "
                         f"or discard it (--restart)")


def _load_failure(path: Path, err: Exception) -> str:
    """Why ``torch.load`` refused ``path``, in a few words."""
    text = str(err)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if isinstance(err, pickle.UnpicklingError) and found:
        return (f"it holds a pickled Python object ({found.group(1)}), which was not loaded: it predates the data "
                f"format of checkpoints, or is not a checkpoint")
    if path.stat().st_size == 0:
        return "the file is empty"
    generic = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(generic)]
    first = (lines[0] if lines else type(err).__name__).split(". ")[0].rstrip(".")
    return f"truncated or not a torch checkpoint ({first[:120]})"


def read_checkpoint(path: str | os.PathLike, mmap: bool = False) -> dict:
    """The payload of a checkpoint written by :meth:`Trainer.save_checkpoint`, loaded as data only
    (``weights_only``: no pickled object is ever run); :class:`CheckpointError` for anything else.
    ``mmap``: map the tensors instead of reading them (to look at the step alone)."""
    path = Path(path)
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except FileNotFoundError:
        raise
    except Exception as err:        # torch raises many kinds for a damaged file; all mean the same here
        raise CheckpointError(path, _load_failure(path, err)) from None
    if not isinstance(payload, dict):
        raise CheckpointError(path, f"it holds a {type(payload).__name__}, not a checkpoint's fields")
    for name, kind in _CHECKPOINT_FIELDS.items():
        if not isinstance(payload.get(name), kind):
            raise CheckpointError(path, f"field {name!r} is {type(payload.get(name)).__name__}, not "
                                        f"{kind.__name__}")
    if payload["format"] > CHECKPOINT_FORMAT:
        raise CheckpointError(path, f"format {payload['format']} is newer than this library's "
                                    f"{CHECKPOINT_FORMAT}")
    return payload


def check_checkpoint_folder(path: Path | None, resume: bool, restart: bool) -> None:
    """Refuse to start a run over the checkpoint ``path`` unless told what to do with it: ``resume`` continues
    it, ``restart`` discards it. Raises before any work (a checkpoint is hours of steps)."""
    if resume and restart:
        raise ValueError("--resume continues the saved run and --restart discards it: give one of them")
    if path is None or resume or restart or not path.is_file():
        return
    step = read_checkpoint(path, mmap=True)["step"]
    raise ValueError(f"{path.parent} already holds the checkpoint of a run at step {step}: continue it with "
                     f"--resume, or discard it with --restart")


def _python_rng_state() -> dict:
    """Python's RNG state as plain values (``random.getstate()`` is a tuple: version, 625 ints, gauss)."""
    version, internal, gauss = random.getstate()
    return {"version": version, "state": list(internal), "gauss": gauss}


def _set_python_rng_state(saved) -> None:
    """Restore :func:`_python_rng_state` (or format 1's tuple)."""
    if isinstance(saved, dict):
        saved = (saved["version"], saved["state"], saved["gauss"])
    version, internal, gauss = saved
    random.setstate((version, tuple(internal), gauss))
