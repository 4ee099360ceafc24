"""Data-parallel P-RGE (prge_lib.distributed, chapter 11): 2 gloo workers started by `prge train --workers 2` train
the tiny model as one process would, up to a float-rounding bound derived below; their replicas stay identical;
the result records the bytes measured on the wire beside first-order DDP's; an adapter replays from its seed and
projected gradients bit for bit; a run whose worker is killed resumes from its checkpoint on the same trajectory.

The bound. Worker k forwards the copies (s_i, ±ε) of its queries i ≡ k (mod N) on the same b rows as the single
process, which forwards all 2q copies at once: the weights, z (same seeds, same per-layer draw) and rows are the
same, and rows never share a reduction, but the products have 2q/N instead of 2q groups of rows, which may block
their reductions differently. That is case (i) of tests/test_packing.py (the padded length is the same here, so
its case (ii) does not arise), whose derivation bounds each copy's loss by β_ℓ = 4 S √K u Z + 8u|ℓ|. The
all-reduce adds to each g_i (computed on one worker) only zeros, which is exact, so β_g = β_ℓ / ε, and every
worker applies the update from the same g with the same z in the same order, so β_B is the packed runs' β_B. The
loss the result records is the all-reduced sum of the workers' partial sums of the 2q losses, divided by 2q: the
sum's order changes, which adds at most 2q·u·|ℓ| to β_ℓ. Observed: g agree bit for bit, a loss record by one ulp.
"""
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from fixtures import data_parallel_worker
from test_packing import U, bounds, max_logit

from prge_lib.cli.main import main
from prge_lib.data.splits import sample_task
from prge_lib.data.tasks import get_task
from prge_lib.zo.replay import adapter_digest, replay
from prge_lib.distributed.wire import free_port
from prge_lib.experiments.results import validate_result
from prge_lib.training.config import TrainConfig
from prge_lib.training.trainer import Trainer, build_method

SETTINGS = {"task": "sst2", "method": "prge", "q": 4, "E": 8, "lr": 1e-2, "steps": 4, "eval_every": 2,
            "checkpoint_every": 2, "n_train": 16, "n_val": 8, "n_test": 8, "max_length": 32, "seed": 0}


def options(settings: dict) -> list[str]:
    return [x for k, v in settings.items() for x in ("--" + k.replace("_", "-"), str(v))]


@pytest.fixture(scope="module")
def dp_run(fixture_data, tiny_folder, tmp_path_factory):
    """`prge train --workers 2` on the tiny model: its result and its checkpoint folder."""
    folder = tmp_path_factory.mktemp("dp")
    out, checkpoints = folder / "r.json", folder / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRGE_DATA_DIR", str(fixture_data))
        code = main(["train", *options(SETTINGS), "--model", str(tiny_folder), "--workers", "2",
                     "--checkpoint-dir", str(checkpoints), "--out", str(out)])
    assert code == 0
    # the launcher ran in this process and put back its signal handlers: Ctrl-C is KeyboardInterrupt again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    return {"result": json.loads(out.read_text()), "checkpoints": checkpoints, "folder": folder}


def config(tiny_folder, **changes) -> TrainConfig:
    return TrainConfig(**{**SETTINGS, "model": str(tiny_folder), **changes})


def solo(tiny_factory, tokenizer, fixture_data, tiny_folder, **changes) -> Trainer:
    c = config(tiny_folder, **changes)
    data = sample_task(get_task(c.task), c.seed, c.n_train, c.n_val, c.n_test, root=fixture_data)
    return Trainer(c, tiny_factory(), tokenizer, data, progress=False)


def final_adapter(checkpoints) -> dict:
    payload = torch.load(checkpoints / "checkpoint.pt", weights_only=True)
    assert payload["step"] == SETTINGS["steps"]
    return payload["method"]["trainable"]


def gaps(result: dict, adapter: dict, reference: dict, reference_trainer: Trainer) -> dict:
    theirs = reference_trainer.method.trainable()
    return {"loss": max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])),
            "grad": max(abs(a - b) for ga, gb in zip(result["projected_grad"], reference["projected_grad"])
                        for a, b in zip(ga, gb)),
            "B": max(float((adapter[k] - theirs[k].detach()).abs().max()) for k in adapter)}


def test_two_workers_train_as_one_process(dp_run, tiny_factory, tokenizer, fixture_data, tiny_folder):
    result = dp_run["result"]
    validate_result(result)                       # a training result, accepted wherever one is
    assert result["status"] == "finished" and result["steps"] == 4
    assert result["replicas_identical"] is True
    checks = result["distributed"]["replica_checks"]
    assert [c["step"] for c in checks] == [0, 2, 4] and all(c["identical"] for c in checks)
    assert result["distributed"]["workers"] == 2 and result["distributed"]["backend"] == "gloo"
    assert result["method_settings"]["queries_by_rank"] == [[0, 2], [1, 3]]

    one = solo(tiny_factory, tokenizer, fixture_data, tiny_folder)
    z_logits = max_logit(one)
    reference = one.run()
    bound = bounds(one, max(z_logits, max_logit(one)), reference["losses"])
    bound["loss"] += 2 * SETTINGS["q"] * U * max(map(abs, reference["losses"]))    # the partial sums' order
    adapter = final_adapter(dp_run["checkpoints"])
    found = gaps(result, adapter, reference, one)
    print("gaps", found, "bounds", bound)
    assert all(found[w] <= bound[w] for w in bound), (found, bound)
    assert [e["step"] for e in result["evals"]] == [e["step"] for e in reference["evals"]]

    # not vacuous: the same batches with other noise seeds land far outside the bound
    other = solo(tiny_factory, tokenizer, fixture_data, tiny_folder, seed=7)
    other.epoch_order = one.epoch_order
    wrong = gaps(result, adapter, other.run(), other)
    assert all(100 * bound[w] < wrong[w] for w in bound), (wrong, bound)


def test_the_wire_carries_q_plus_one_floats_a_step(dp_run, tiny_factory):
    result, q = dp_run["result"], SETTINGS["q"]
    wire = result["communication"]
    # measured by the counting wrapper around each all-reduce: q projected gradients and the losses' sum, fp32
    assert wire["bytes_per_step"] == 4 * (q + 1) and wire["calls"]["step"] == SETTINGS["steps"]
    assert wire["bytes"]["check"] == 3 * 32       # one SHA-256 per worker at each of the three evaluations
    # DDP's gradient buckets, counted by its communication hook: every trainable float once per step
    model = tiny_factory()
    full = sum(p.numel() for p in model.parameters())
    ddp = wire["first_order_ddp"]
    assert ddp["lora-fa"]["trainable_parameters"] == result["trainable_parameters"]
    assert ddp["lora-fa"]["bytes_per_step"] == 4 * result["trainable_parameters"]
    assert ddp["full"]["trainable_parameters"] == full and ddp["full"]["bytes_per_step"] == 4 * full


def test_an_adapter_replays_from_its_seed_and_projected_gradients(dp_run, tiny_factory, tiny_folder):
    result = dp_run["result"]
    adapter = final_adapter(dp_run["checkpoints"])
    # a worker joining late: the run's config and the list of g, nothing else
    joined = replay(build_method(config(tiny_folder).resolved(), tiny_factory()), result["projected_grad"])
    rebuilt = joined.trainable()
    assert all(torch.equal(rebuilt[k], adapter[k]) for k in adapter)
    assert adapter_digest(rebuilt) == result["distributed"]["replica_checks"][-1]["sha256"]
    # in two sittings: the first two steps, then the last two from there
    half = build_method(config(tiny_folder).resolved(), tiny_factory())
    replay(half, result["projected_grad"][:2])
    replay(half, result["projected_grad"][2:], start=2)
    assert adapter_digest(half.trainable()) == adapter_digest(rebuilt)
    # not vacuous: one projected gradient off by one ulp gives another adapter
    history = [list(g) for g in result["projected_grad"]]
    history[1][0] = float(torch.nextafter(torch.tensor(history[1][0]), torch.tensor(float("inf"))))
    off = replay(build_method(config(tiny_folder).resolved(), tiny_factory()), history)
    assert adapter_digest(off.trainable()) != adapter_digest(rebuilt)
    with pytest.raises(ValueError, match="3 projected gradients for a run with q = 4"):
        replay(off, [[0.0, 0.0, 0.0]])


def run_workers(settings: dict, tiny_folder, fixture_data, checkpoints, kill_at=None, ask_at=None) -> list[int]:
    """Two workers of a run (tests/fixtures.py's data_parallel_worker), each in its own process: their exit codes."""
    port, spawn = free_port(), multiprocessing.get_context("spawn")
    workers = [spawn.Process(target=data_parallel_worker, args=(rank, 2, port, settings, str(tiny_folder),
                                                                str(fixture_data), str(checkpoints), kill_at, ask_at))
               for rank in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
        if w.is_alive():
            w.kill()
    return [w.exitcode for w in workers]


def resume_workers(fixture_data, tiny_folder, checkpoints, out) -> dict:
    """`prge train --workers 2 --resume` of the stopped run in ``checkpoints``: its result."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRGE_DATA_DIR", str(fixture_data))
        code = main(["train", *options(SETTINGS), "--model", str(tiny_folder), "--workers", "2", "--ddp-steps", "0",
                     "--checkpoint-dir", str(checkpoints), "--resume", "--out", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_a_killed_run_resumes_on_the_same_trajectory(dp_run, fixture_data, tiny_folder, tmp_path):
    checkpoints = tmp_path / "run"
    codes = run_workers({**SETTINGS, "model": str(tiny_folder)}, tiny_folder, fixture_data, checkpoints, kill_at=2)
    assert codes[1] == 9            # killed as it began step 3
    assert codes[0] != 0            # its peer gone, rank 0's all-reduce failed
    assert torch.load(checkpoints / "checkpoint.pt", weights_only=True)["step"] == 2

    resumed, whole = resume_workers(fixture_data, tiny_folder, checkpoints, tmp_path / "resumed.json"), dp_run["result"]
    assert resumed["losses"] == whole["losses"] and resumed["projected_grad"] == whole["projected_grad"]
    assert resumed["evals"] == whole["evals"] and resumed["resumed_at_steps"] == [2]
    assert resumed["replicas_identical"] is True
    assert resumed["communication"]["bytes_per_step"] == 4 * (SETTINGS["q"] + 1)
    assert "first_order_ddp" not in resumed["communication"]


def test_a_signal_to_one_worker_stops_every_worker_after_the_same_step(dp_run, fixture_data, tiny_folder, tmp_path):
    checkpoints = tmp_path / "run"
    settings = {**SETTINGS, "model": str(tiny_folder), "checkpoint_every": 100}     # no periodic checkpoint
    codes = run_workers(settings, tiny_folder, fixture_data, checkpoints, ask_at=1)
    assert codes == [0, 0]          # both stopped, neither left waiting for the other
    said = [json.loads((tmp_path / f"stopped-{rank}.json").read_text()) for rank in range(2)]
    # rank 1 was asked during step 2 (t = 1); rank 0 never was, and stops after the same step with the checkpoint
    assert [s["step"] for s in said] == [2, 2]
    assert said[0]["message"].startswith("stopped by a signal to another worker after step 2 of 4; its checkpoint")
    assert said[1]["message"].startswith("stopped by SIGTERM after step 2 of 4; no checkpoint folder")
    assert torch.load(checkpoints / "checkpoint.pt", weights_only=True)["step"] == 2

    resumed, whole = resume_workers(fixture_data, tiny_folder, checkpoints, tmp_path / "resumed.json"), dp_run["result"]
    assert resumed["losses"] == whole["losses"] and resumed["projected_grad"] == whole["projected_grad"]
    assert resumed["resumed_at_steps"] == [2] and resumed["replicas_identical"] is True


def test_a_signal_to_the_launcher_stops_the_workers_with_a_checkpoint(fixture_data, tiny_folder, tmp_path):
    checkpoints = tmp_path / "run"
    argv = [sys.executable, "-m", "prge_lib.cli.main", "train", *options({**SETTINGS, "steps": 100_000}),
            "--model", str(tiny_folder), "--workers", "2", "--checkpoint-dir", str(checkpoints),
            "--out", str(tmp_path / "r.json")]
    env = {**os.environ, "PRGE_DATA_DIR": str(fixture_data), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60"}
    launcher = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (checkpoints / "checkpoint.pt").is_file() and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)                                 # the first checkpoint (step 2): the workers are training
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, err
    stopped = re.findall(r"prge: stopped by (SIGTERM|a signal to another worker) after step (\d+) of 100000; "
                         r"its checkpoint is (\S+)", err)
    assert len(stopped) == 1, err                       # rank 0 alone speaks
    step = int(stopped[0][1])
    assert torch.load(checkpoints / "checkpoint.pt", weights_only=True)["step"] == step >= 2
    assert "Traceback" not in err and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--method", "fo", "--workers", "2"], "--workers trains prge or mezo-lorafa, not fo"),
    (["--q", "2", "--E", "4", "--workers", "3"], "--workers 3 with q = 2"),
    (["--workers", "0"], "--workers must be a whole number at least 1, got 0"),
    (["--method", "mezo-lorafa", "--workers", "2"], "mezo-lorafa has one query a step"),
    (["--engine", "fused", "--noise", "counter", "--workers", "2"], "engine 'fused' and --buckets are single-process"),
])
def test_runs_that_cannot_be_data_parallel_are_refused(argv, message, tmp_path, capsys):
    assert main(["train", "--task", "sst2", *argv, "--out", str(tmp_path / "r.json")]) == 2
    assert message in capsys.readouterr().err
    assert not os.listdir(tmp_path)


def test_a_diverging_run_exits_3_with_rank_0s_partial_result(fixture_data, tiny_folder, tmp_path):
    out = tmp_path / "r.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRGE_DATA_DIR", str(fixture_data))
        code = main(["train", *options({**SETTINGS, "lr": 1e33}), "--model", str(tiny_folder), "--workers", "2",
                     "--out", str(out)])
    assert code == 3                  # the worker's own status, through the launcher
    result = json.loads(out.read_text())
    assert result["status"] == "diverged" and result["steps"] == 1 and "not finite" in result["diverged"]


def test_the_gpu_path_picks_nccl_and_the_local_ranks_gpu(monkeypatch):
    """The logic of the GPU path, on the CPU: NCCL for CUDA devices, gloo for the CPU, another device refused by
    name; each worker on a GPU takes the GPU of its local rank, on the CPU the CPU."""
    from prge_lib.distributed.wire import backend_for, worker_device

    assert (backend_for("cpu"), backend_for("cuda"), backend_for("cuda:1")) == ("gloo", "nccl", "nccl")
    with pytest.raises(ValueError, match="device 'mps' has no collective backend here"):
        backend_for("mps")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert (worker_device("cuda"), worker_device("cuda:0"), worker_device("cpu")) == ("cuda:3", "cuda:3", "cpu")
