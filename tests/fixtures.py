"""Tiny synthetic data in the hub schema of all 14 tasks, written by the tests themselves, a helper that
gives LoRA-FA layers non-zero B (so that perturbations change the loss), and a small trainer.

The rows are made up (numbered sentences), so tests that need no real data run anywhere; they exercise
the loaders, the sampling and the templates, not the models' accuracy.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from prge_lib.data.tasks import TASKS


def _row(task: str, i: int) -> dict:
    s, t = f"Sentence {i} is about a cat.", f"Sentence {i} is about a dog."
    binary = i % 2
    rows = {
        "sst2": {"sentence": f"film number {i} is fine . ", "label": binary, "idx": i},
        "rte": {"sentence1": s, "sentence2": t, "label": binary, "idx": i},
        "mrpc": {"sentence1": s, "sentence2": t, "label": binary, "idx": i},
        "qqp": {"question1": f"Why is {i} odd?", "question2": f"Is {i} odd?", "label": binary, "idx": i},
        "qnli": {"question": f"What is {i}?", "sentence": s, "label": binary, "idx": i},
        "wnli": {"sentence1": s, "sentence2": t, "label": binary, "idx": i},
        "boolq": {"question": f"is {i} a number", "passage": f"Numbers -- {i} is a number.", "idx": i,
                  "label": binary},
        "cb": {"premise": s, "hypothesis": t, "idx": i, "label": i % 3},
        "wsc": {"text": f"Ann met Bo {i} times because she liked him .", "span1_index": 0, "span2_index": 7,
                "span1_text": "Ann", "span2_text": "she", "idx": i, "label": binary},
        "wic": {"word": "bank", "sentence1": f"The bank {i} is open.", "sentence2": "The river bank is wet.",
                "start1": 4, "start2": 10, "end1": 8, "end2": 14, "idx": i, "label": binary},
        "multirc": {"paragraph": f"Tom has {i} apples. He eats one.", "question": "How many apples?",
                    "answer": str(i), "idx": {"paragraph": i, "question": 0, "answer": 0}, "label": binary},
        "copa": {"premise": f"The glass {i} fell.", "choice1": "It broke.", "choice2": "It sang.",
                 "question": "effect" if binary else "cause", "idx": i, "label": binary},
        "winogrande": {"sentence": f"Ann gave Bo {i} books because _ had too many.", "option1": "Ann",
                       "option2": "Bo", "answer": str(1 + binary)},
        "squad": {"id": f"q{i}", "title": "Some_Title", "context": f"The answer is {i} apples.",
                  "question": "What is the answer?", "answers": {"text": [f"{i} apples"], "answer_start": [14]}},
    }
    return rows[task]


def write_fixture_data(root: Path, n_train: int = 40, n_validation: int = 24) -> Path:
    """Write ``<root>/<task.path>/<split>.jsonl`` for every task (only the splits the task has)."""
    for task in TASKS.values():
        folder = Path(root) / task.path
        folder.mkdir(parents=True, exist_ok=True)
        counts = {"train": n_train, "validation": n_validation}
        offset = 0
        for split in ("train", "validation"):
            if split not in task.splits:
                continue
            with open(folder / f"{split}.jsonl", "w") as f:
                for i in range(offset, offset + counts[split]):
                    f.write(json.dumps(_row(task.name, i)) + "\n")
            offset += counts[split]
    return Path(root)


def randomize_b(layers, scale: float = 0.05, seed: int = 0) -> None:
    """Give every LoRA-FA layer a seeded random B of standard deviation ``scale`` (B starts at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in layers:
            layer.lora_B.copy_(scale * torch.randn(layer.lora_B.shape, generator=gen))


def small_trainer(tiny_factory, tokenizer, data, folder=None, **settings):
    """A 6-step SST-2 trainer on a fresh tiny model: evaluation every 3 steps, a checkpoint every 2."""
    from prge_lib.training.trainer import TrainConfig, Trainer

    settings = {"steps": 6, "eval_every": 3, "checkpoint_every": 2, **settings}
    return Trainer(TrainConfig("sst2", **settings), tiny_factory(), tokenizer, data, folder, progress=False)


def crash_during_step(trainer, n: int) -> None:
    """Run ``trainer`` until its n-th step, which is interrupted as a killed process would be."""
    real_step = trainer.method.step

    def crashing(batch, t):
        if t == n - 1:
            raise KeyboardInterrupt(f"simulated interruption during step {n}")
        return real_step(batch, t)

    trainer.method.step = crashing
    try:
        trainer.run()
    except KeyboardInterrupt:
        return
    raise AssertionError(f"the run ended without reaching step {n}")


def data_parallel_worker(rank: int, workers: int, port: int, settings: dict, model_folder: str, data_root: str,
                         checkpoint_dir: str, kill_at: int | None = None, ask_at: int | None = None) -> None:
    """One worker of a data-parallel run on a local model folder, started by a test in its own process; with
    ``kill_at`` the process of rank 1 dies (``os._exit``, no clean-up) as it begins step ``kill_at``; with
    ``ask_at`` rank 1 alone is asked to stop (as a signal would) during step ``ask_at``, and each worker that
    stops writes what it said to ``stopped-<rank>.json`` beside the checkpoint folder."""
    import json
    import os
    from pathlib import Path

    from prge_lib.distributed.launch import loopback

    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(workers),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": loopback()})
    torch.set_num_threads(1)
    from prge_lib.data.splits import sample_task
    from prge_lib.data.tasks import get_task
    from prge_lib.distributed.trainer import DistributedTrainer
    from prge_lib.distributed.wire import init_from_env
    from prge_lib.models.loading import load_model
    from prge_lib.training.config import TrainConfig

    config = TrainConfig(**settings)
    data = sample_task(get_task(config.task), config.seed, config.n_train, config.n_val, config.n_test,
                       root=data_root)
    model, tokenizer = load_model(model_folder)
    init_from_env("cpu", timeout_s=30)
    trainer = DistributedTrainer(config, model, tokenizer, data, checkpoint_dir, progress=False, ddp_steps=0)
    step = trainer.method.step

    from prge_lib.training import stopping
    from prge_lib.training.trainer import TrainingStopped

    def dying_step(batch, t):
        if rank == 1 and t == kill_at:
            os._exit(9)
        if rank == 1 and t == ask_at:
            stopping._asked.append("SIGTERM")
        return step(batch, t)

    trainer.method.step = dying_step
    try:
        trainer.run()
    except TrainingStopped as stop:
        said = {"step": stop.step, "message": str(stop), "checkpoint": str(stop.checkpoint or "")}
        Path(checkpoint_dir).with_name(f"stopped-{rank}.json").write_text(json.dumps(said))
