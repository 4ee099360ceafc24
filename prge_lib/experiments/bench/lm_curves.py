"""Zeroth-order against backprop on WikiText-2 language modelling (Song and Tang Fig. 1, seed 004; chapter 9):
each method built as the trainer builds it, with its SST-2 defaults from the method registry (learning rate,
batch size, eps, q), trains on one stream of consecutive WikiText-2 windows (:func:`prge_lib.methods.mebp.
lm_batches`, every next token scored), in the same order, each taking as many windows per step as its batch
size (the stream starts again from its first window when a long run has read it all); a fixed set of held-out
windows, which no method trains on, gives the loss and next-token accuracy every few steps. Per step the
training loss and the step's seconds are kept, so the curves can be drawn per step and per second.

With a ``checkpoint`` file the curves cross sittings: it is written at every evaluation, when a method finishes,
and at the ``deadline`` (then :class:`~prge_lib.training.trainer.TrainingStopped` is raised), in the trainer's
checkpoint format, and ``resume`` continues from it to the curves an uninterrupted call makes. It holds the
finished methods' curves and the running method's curve so far and state (a seed checkpoint where the method can
be rebuilt from its projected gradients, MeZO (Full) and P-RGE: kilobytes instead of the weights;
``prge_lib.training.trainer.method_state``).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

from prge_lib.methods.mebp import lm_batches
from prge_lib.training import stopping
from prge_lib.training.trainer import restore_method_state

LM_METHODS = {"mebp": "MeBP", "mezo": "MeZO (Full)", "prge": "P-RGE (q = 4)"}


def _stack(items, device: str = "cpu"):
    """Windows (one row each) as one batch of their rows, on ``device``."""
    return type(items[0])(*(torch.cat([getattr(b, f) for b in items]).to(device)
                            for f in ("input_ids", "attention_mask", "targets")))


@torch.no_grad()
def held_out_loss(net, held_out) -> tuple[float, float]:
    """(mean next-token cross-entropy, next-token accuracy) of ``net`` on the held-out windows."""
    device = next(net.parameters()).device
    logits = net(input_ids=held_out.input_ids.to(device), attention_mask=held_out.attention_mask.to(device)).logits
    targets = held_out.targets.to(device)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return float(loss), float((logits.argmax(-1) == targets).float().mean())


def lm_curves(seq_len: int, steps: Mapping[str, int], eval_every: Mapping[str, int], n_held: int,
              model: str | None = None, device: str = "cpu", seed: int = 0,
              say: Callable[[str], None] = print, checkpoint: str | Path | None = None,
              deadline: float | None = None, resume: bool = False) -> dict:
    """Train each method of ``steps`` (names of :data:`LM_METHODS` -> steps) on WikiText-2 windows of ``seq_len``
    tokens from a freshly loaded ``model``, evaluating on ``n_held`` held-out windows at the start and every
    ``eval_every[name]`` steps. Returns {"runs": {name: {"rows", "losses", "seconds", "evals": [[step, training
    seconds so far, held-out loss, accuracy], …], "eval_s": seconds spent evaluating}}, "held_out": n_held,
    "stream": windows in the stream}; MeBP's run adds its phase times. ``seed``: the methods' seed (their noise
    and adapter initialisation). ``checkpoint``, ``deadline``, ``resume``: the module docstring."""
    from prge_lib.models.loading import load_model
    from prge_lib.training.config import TrainConfig
    from prge_lib.training.trainer import TrainingStopped, build_method

    unknown = sorted(set(steps) - set(LM_METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown} for the WikiText-2 curves; choose from {list(LM_METHODS)}")
    identity = {"seq_len": seq_len, "steps": dict(steps), "eval_every": dict(eval_every), "n_held": n_held,
                "model": model, "device": device, "seed": seed}
    saved = _read_curves_checkpoint(Path(checkpoint), identity) if resume else None
    _, tokenizer = load_model(model)
    configs = {name: TrainConfig("sst2", method=name, model=model, device=device, seed=seed).resolved()
               for name in steps}
    need = n_held + max(n * configs[name].batch_size for name, n in steps.items())
    try:                    # the windows the runs read, or the whole text, which a long run reads again
        windows = lm_batches(tokenizer, seq_len, 1, n_batches=need)
    except ValueError:
        windows = lm_batches(tokenizer, seq_len, 1)
    if len(windows) <= n_held:
        raise ValueError(f"the WikiText-2 text holds {len(windows)} windows of {seq_len} tokens: too few to hold "
                         f"out {n_held}")
    held_out, stream = _stack(windows[:n_held]), windows[n_held:]
    runs = dict(saved["history"]["runs"]) if saved else {}
    total = sum(steps.values())
    for name, n_steps in steps.items():
        if name in runs:                           # finished before the checkpoint
            continue
        config = configs[name]
        net, _ = load_model(model, device=device)      # MeBP quantizes its own base
        method = build_method(config, net, tokenizer)
        rows = config.batch_size
        current = saved["history"]["current"] if saved and saved["method"]["name"] == name else None
        if current is not None:
            run, grads = current["run"], current["grads"]
            earlier = run.get("phases", {})            # MeBP's phase times in the sittings before this one
            restore_method_state(method, saved["method"]["state"], grads, len(run["losses"]), Path(checkpoint),
                                 name)
            torch.set_rng_state(saved["rng"]["torch"])
        else:
            clock = time.perf_counter()
            run = {"rows": rows, "lr": config.lr, "losses": [], "seconds": [],
                   "evals": [[0, 0.0, *held_out_loss(method.model, held_out)]]}
            run["eval_s"], grads, earlier = time.perf_counter() - clock, [], {}

        def save() -> Path | None:
            if name == "mebp":
                run["phases"] = {k: earlier.get(k, 0.0) + method.times.get(k, 0.0)
                                 for k in dict.fromkeys([*earlier, *method.times])}
            if checkpoint is None:
                return None
            done = sum(len(r["losses"]) for r in runs.values()) + len(run["losses"])
            _write_curves_checkpoint(Path(checkpoint), identity, done, runs, name, run, grads, method)
            return Path(checkpoint)

        for t in range(len(run["losses"]), n_steps):
            batch = _stack([stream[(t * rows + i) % len(stream)] for i in range(rows)], device)
            start = time.perf_counter()
            record = method.step(batch, t)
            if device != "cpu":
                torch.cuda.synchronize()
            run["seconds"].append(time.perf_counter() - start)
            run["losses"].append(float(record["loss"]))
            grads.append(list(record.get("projected_grad", [])))
            if (t + 1) % eval_every[name] == 0 or t + 1 == n_steps:
                clock = time.perf_counter()
                run["evals"].append([t + 1, sum(run["seconds"]), *held_out_loss(method.model, held_out)])
                run["eval_s"] += time.perf_counter() - clock
                if t + 1 < n_steps:
                    save()
            if stopping.past(deadline) and t + 1 < n_steps:
                done = sum(len(r["losses"]) for r in runs.values()) + len(run["losses"])
                raise TrainingStopped(done, total, save())
        runs[name] = run
        save()
        start_loss, end_loss = run["evals"][0][2], run["evals"][-1][2]
        say(f"{LM_METHODS[name]}: {n_steps} steps of {rows} rows, {statistics.median(run['seconds']):.2f} s/step; "
            f"held-out loss {start_loss:.3f} -> {end_loss:.3f}")
        del net, method
    return {"runs": {name: runs[name] for name in steps}, "held_out": n_held, "stream": len(stream)}


def _write_curves_checkpoint(path: Path, identity: dict, done: int, runs: dict, name: str, run: dict,
                             grads: list, method) -> None:
    """The curves' checkpoint in the trainer's format (so ``--list`` reads its step): the finished runs, and the
    running method's run so far, projected gradients and state (a seed checkpoint where it can be rebuilt)."""
    from prge_lib.common.provenance import atomic_file
    from prge_lib.training.checkpoints import CHECKPOINT_FORMAT
    from prge_lib.training.trainer import method_state

    finished = name in runs
    payload = {"format": CHECKPOINT_FORMAT, "config": identity, "step": done,
               "method": {"name": None if finished else name,
                          "state": {} if finished else method_state(method, seed_checkpoints=True)},
               "history": {"runs": runs, "current": None if finished else {"run": run, "grads": grads}},
               "elapsed": {}, "rng": {"torch": torch.get_rng_state()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as tmp:
        torch.save(payload, tmp)


def _read_curves_checkpoint(path: Path, identity: dict) -> dict | None:
    """The checkpoint at ``path`` if there is one (None: start afresh), refused if made with other settings."""
    from prge_lib.training.checkpoints import read_checkpoint

    if not path.is_file():
        return None
    saved = read_checkpoint(path)
    if saved["config"] != identity:
        differ = sorted(k for k in identity if saved["config"].get(k) != identity[k])
        raise ValueError(f"the checkpoint {path} was made with other settings ({', '.join(differ)}); resume with "
                         f"the same settings, or move it away to start the curves again")
    return saved
