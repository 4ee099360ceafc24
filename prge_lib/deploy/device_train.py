"""Training on the device (``prge device-train``, chapter 10): pick the host that drives the exported program,
run it, and optionally the eager twin with the same seeds for the per-step parity check (Gao et al. §4.3).

The hosts: :class:`prge_lib.deploy.runtime.PythonHost` (this Python process) and
:class:`prge_lib.deploy.native_host.NativeTrainer` (the C++ trainer, native or cross-built for aarch64).
"""
from __future__ import annotations

from pathlib import Path

from prge_lib.deploy.export import read_program_meta
from prge_lib.deploy.runtime import PythonHost
from prge_lib.training.trainer import TrainConfig, Trainer, build_method
from prge_lib.zo.lora import save_adapter

HOSTS = ("python", "native", "native-aarch64")


def parity(losses, eager_losses) -> dict:
    """The paper's sanity check (§4.3): the relative difference of the per-step losses against eager P-RGE with
    the same seeds and data; within 1e-4 at every step passes."""
    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, eager_losses, strict=True)]
    return {"max_rel_loss_diff": max(rel), "per_step_rel_loss_diff": rel, "steps": len(rel),
            "within_1e-4": max(rel) <= 1e-4}


def host_trainer(config: TrainConfig, host: str, checkpoint_dir=None, progress: bool = True):
    """The trainer whose steps run in ``config.program``: :class:`PythonHost`, or the C++ trainer behind
    ``prge_lib.deploy.native_host.NativeTrainer`` ("native", "native-aarch64"). Both have ``run(resume)``, ``model``
    (holding the trained adapter) and ``host_record()``."""
    if host not in HOSTS:
        raise ValueError(f"unknown host {host!r}; choose one of {list(HOSTS)}")
    if host == "python":
        return PythonHost(config, checkpoint_dir=checkpoint_dir, progress=progress)
    from prge_lib.deploy.native_host import NativeTrainer   # builds C++ on first use: import only when asked

    return NativeTrainer(config, host, checkpoint_dir=checkpoint_dir, progress=progress)


def train_in_runtime(pte, task: str, steps: int, lr: float | None = None, eps: float | None = None,
                     eval_every: int = 0, check_eager: bool = False, checkpoint_dir=None,
                     checkpoint_every: int = 100, resume: bool = False, save_adapter_to=None,
                     host: str = "python", progress: bool = True, **sizes) -> dict:
    """Train ``task`` for ``steps`` steps with the program ``pte`` in the ExecuTorch runtime (Gao et al. §4.3).

    The run's settings (q, E, rank, targets, seed, width) come from the program's sidecar. ``host`` drives the
    program: this Python process ("python"), or the C++ trainer built for this machine ("native") or for aarch64
    and run under emulation ("native-aarch64"; chapter 10). With ``check_eager`` the eager P-RGE trainer runs the
    same steps with the same seeds and data, and the result gains ``parity``: the relative difference of the
    per-step losses (the paper's sanity check). Checkpoints go to ``checkpoint_dir`` (the eager twin's to its
    ``eager/`` subfolder); ``resume`` continues from them with a freshly loaded program. ``sizes``: n_train,
    n_val, n_test."""

    meta = read_program_meta(pte)
    s = meta["settings"]
    if resume and not checkpoint_dir:
        raise ValueError("resume needs checkpoint_dir (the folder of the run to continue)")
    common = dict(task=task, method="prge", steps=steps, lr=lr, eps=eps, q=s["q"], E=s["E"], outer=True,
                  inner=True, noise="counter", r=s["r"], alpha=s["alpha"], targets=tuple(s["targets"]),
                  seed=s["seed"], layers=s["layers"] if s["truncated"] else None, max_length=s["seq_len"],
                  model=s["model"], dtype=s.get("dtype", "fp32"), eval_every=eval_every,
                  checkpoint_every=checkpoint_every if checkpoint_dir else 0,
                  **sizes)
    runs = {"runtime": TrainConfig(program=str(pte), **common)}
    if check_eager:
        runs["eager"] = TrainConfig(**common)
    runs = {label: config.resolved() for label, config in runs.items()}   # refuse bad settings before any run
    results = {}
    for label, config in runs.items():
        folder = None if not checkpoint_dir else Path(checkpoint_dir) / ("eager" if label == "eager" else "")
        if label == "eager":
            trainer = Trainer(config, checkpoint_dir=folder, progress=progress, method_builder=build_method)
        else:
            trainer = host_trainer(config, host, folder, progress)
        results[label] = trainer.run(resume=resume)
        if label == "runtime":
            results[label]["host"] = trainer.host_record()
            if save_adapter_to:
                save_adapter(trainer.model, save_adapter_to,
                             {"task": task, "method": "prge", "program": Path(pte).name, "host": host})
    result = {"kind": "device-train", "task": task, "seed": s["seed"], "program": Path(pte).name,
              "program_settings": s, "program_commit": meta.get("provenance", {}).get("commit"),
              **results["runtime"], "status": "finished"}
    if check_eager:
        result["eager"] = results["eager"]
        result["parity"] = parity(result["losses"], results["eager"]["losses"])
    return result
