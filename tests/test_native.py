"""The native host (prge_lib/deploy/native/trainer.cpp, prge_lib.deploy.native_host; chapter 10): the C++ trainer builds against
the executorch wheel's C++ SDK, follows eager P-RGE, continues from a saved adapter, refuses bad inputs in one line,
and, cross-built for aarch64, trains under qemu."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from prge_lib.deploy.native_host import (TOOLS, NativeHostError, build_trainer, check_tools, read_adapter, read_step_log,
                                  source_part, trainer_command, write_adapter, write_batches)

TRAIN = ["--task", "sst2", "--lr", "1e-2", "--n-train", "40", "--n-val", "8", "--n-test", "8"]


def _missing(target: str) -> list[str]:
    return [f"{program} (Debian package {package})" for program, package in TOOLS[target].items()
            if shutil.which(program) is None]


needs_native = pytest.mark.skipif(bool(_missing("native")), reason=f"no native toolchain: {_missing('native')}")
needs_aarch64 = pytest.mark.skipif(bool(_missing("native-aarch64")),
                                   reason=f"no aarch64 cross compiler or emulator: {_missing('native-aarch64')}")


@pytest.fixture(scope="module")
def trainer_binary():
    return build_trainer("native")


def _program_steps(pte, n: int, first: int = 0, eps=None) -> list[tuple]:
    """``n`` steps of random inputs of the program's shapes (prge_lib.experiments.bench.program.program_inputs)."""
    from prge_lib.deploy.export import read_program_meta
    from prge_lib.experiments.bench.program import program_inputs

    settings = read_program_meta(pte)["settings"]
    steps = [tuple(program_inputs(settings, seed=t)) for t in range(first, first + n)]
    if eps is not None:                                  # (step, value): one step's ε replaced
        t, value = eps
        steps[t - first] = steps[t - first][:6] + (torch.tensor(value),)
    return steps


def _run(binary, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True)


@needs_native
def test_native_host_matches_eager_and_continues_from_a_saved_adapter(fixture_data, tiny_folder, tiny_xnnpack_program,
                                                                        tmp_path, monkeypatch):
    """`prge device-train --host native --check-eager`: 5 steps of the C++ trainer within 1e-4 of eager P-RGE;
    stopped after 3 steps and continued from the saved adapter and step, the trajectory is the same."""
    from prge_lib.cli.main import main

    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    pte, out = tiny_xnnpack_program, tmp_path / "native.json"
    assert main(["device-train", "--pte", str(pte), "--host", "native", "--steps", "5", "--check-eager",
                 "--out", str(out), *TRAIN]) == 0
    result = json.loads(out.read_text())
    assert result["parity"]["steps"] == 5 and result["parity"]["max_rel_loss_diff"] <= 1e-4
    assert len(set(result["losses"])) > 1 and len(result["step_s"]["per_step"]) == 5
    host = result["host"]
    assert host["name"] == "native" and not host["emulated"] and host["peak_resident_mib"] > 0
    assert host["resident_after_first_step_mib"] > 0 and "provenance" in result

    ckpt, adapter = tmp_path / "ckpt", tmp_path / "adapter.safetensors"
    common = ["device-train", "--pte", str(pte), "--host", "native", "--checkpoint-dir", str(ckpt), *TRAIN]
    assert main(common + ["--steps", "3", "--out", str(tmp_path / "first.json")]) == 0
    assert read_adapter(ckpt / "adapter.bin")[0] == 3
    assert main(common + ["--steps", "5", "--resume", "--save-adapter", str(adapter),
                          "--out", str(tmp_path / "resumed.json")]) == 0
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["losses"] == result["losses"] and resumed["host"]["runs"] == 1
    assert sorted(read_step_log(ckpt / "steps.tsv", 2)) == list(range(5))

    from prge_lib.zo.lora import inject_lorafa, load_adapter, read_adapter as read_safetensors
    from prge_lib.models.loading import load_model, truncate_layers
    from prge_lib.deploy.program import TrainStep

    model, _ = load_model(str(tiny_folder))
    truncate_layers(model, 1)
    inject_lorafa(model, noise="counter")
    load_adapter(model, read_safetensors(adapter))
    assert torch.equal(TrainStep(model, 2).adapter(), read_adapter(ckpt / "adapter.bin")[1])


@needs_native
def test_trainer_continues_a_batch_file_from_a_saved_adapter(trainer_binary, tiny_xnnpack_program, tmp_path):
    """The binary alone: 4 steps in one run = 2 steps, then a new process continuing from the adapter file."""
    pte, steps = tiny_xnnpack_program, _program_steps(tiny_xnnpack_program, 4)
    write_batches(tmp_path / "b.bin", 0, steps)
    assert _run(trainer_binary, pte, tmp_path / "b.bin", tmp_path / "a.bin", tmp_path / "log.tsv").returncode == 0
    write_batches(tmp_path / "first.bin", 0, steps[:2])
    for batches in ("first.bin", "b.bin"):
        proc = _run(trainer_binary, pte, tmp_path / batches, tmp_path / "a2.bin", tmp_path / "log2.tsv")
        assert proc.returncode == 0, proc.stderr
    whole, parts = read_step_log(tmp_path / "log.tsv", 2), read_step_log(tmp_path / "log2.tsv", 2)
    assert sorted(parts) == [0, 1, 2, 3]
    assert all(torch.equal(whole[t]["losses"], parts[t]["losses"]) for t in range(4))
    assert torch.equal(read_adapter(tmp_path / "a.bin")[1], read_adapter(tmp_path / "a2.bin")[1])
    assert json.loads(proc.stdout.splitlines()[-1])["first_step"] == 2


@needs_native
def test_refused_step_keeps_the_last_good_adapter(trainer_binary, tiny_xnnpack_program, tmp_path):
    """A step whose losses are not finite (here ε = NaN) is refused: exit status 3, one line, and the adapter
    file holds the adapter from before that step."""
    write_batches(tmp_path / "b.bin", 0, _program_steps(tiny_xnnpack_program, 3, eps=(1, math.nan)))
    write_batches(tmp_path / "one.bin", 0, _program_steps(tiny_xnnpack_program, 1))
    proc = _run(trainer_binary, tiny_xnnpack_program, tmp_path / "b.bin", tmp_path / "a.bin", tmp_path / "log.tsv")
    assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1 and "refused" in proc.stderr
    assert _run(trainer_binary, tiny_xnnpack_program, tmp_path / "one.bin", tmp_path / "good.bin",
                tmp_path / "good.tsv").returncode == 0
    step, adapter = read_adapter(tmp_path / "a.bin")
    assert step == 1 and torch.equal(adapter, read_adapter(tmp_path / "good.bin")[1]) and adapter.abs().max() > 0
    log = read_step_log(tmp_path / "log.tsv", 2)
    assert [log[t]["kept"] for t in sorted(log)] == [True, False]


@needs_native
def test_bad_inputs_get_one_line_errors(trainer_binary, tiny_xnnpack_program, tiny_program, tmp_path):
    """A missing, corrupt or mismatched program, a corrupt batch file and a foreign adapter file are refused with
    one line that names the file and the fix, and exit status 1 (no crash)."""
    pte = tiny_xnnpack_program
    good = write_batches(tmp_path / "b.bin", 0, _program_steps(pte, 2))
    raw = pte.read_bytes()
    (tmp_path / "truncated.pte").write_bytes(raw[:len(raw) // 2])
    (tmp_path / "noise.pte").write_bytes(bytes(range(256)) * 64)
    flipped = bytearray(raw)
    flipped[64:4096] = bytes(4032)                                   # the flatbuffer's tables zeroed
    (tmp_path / "flipped.pte").write_bytes(bytes(flipped))
    (tmp_path / "short.bin").write_bytes(good.read_bytes()[:-100])
    (tmp_path / "foreign.bin").write_bytes(b"PRGEBAT2" + good.read_bytes()[8:])
    write_adapter(tmp_path / "small.adapter", torch.zeros(7), 0)
    cases = {  # (program, batches, adapter): words the message must hold
        ("missing.pte", good, "a.bin"): ["missing.pte", "prge export"],
        ("truncated.pte", good, "a.bin"): ["truncated.pte", "export it again"],
        ("noise.pte", good, "a.bin"): ["noise.pte", "export it again"],
        ("flipped.pte", good, "a.bin"): ["flipped.pte", "export it again"],
        (tiny_program, good, "a.bin"): ["input_ids of shape (2, 24)", "holds (2, 16)", "another program"],
        (pte, "short.bin", "a.bin"): ["short.bin", "truncated or corrupt", "write it again"],
        (pte, "foreign.bin", "a.bin"): ["foreign.bin", "not a P-RGE batch file"],
        (pte, good, "small.adapter"): ["small.adapter", "7 floats", "delete it"],
    }
    for (program, batches, adapter), words in cases.items():
        proc = _run(trainer_binary, tmp_path / program, tmp_path / batches, tmp_path / adapter, tmp_path / "log.tsv")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, (program, batches, proc.returncode, proc.stderr)
        assert lines[0].startswith("prge-trainer: ") and all(w in lines[0] for w in words), lines[0]


def test_missing_tools_name_their_debian_package(monkeypatch):
    """Where the cross compiler or qemu is missing, the error is one line naming the package to install."""
    import prge_lib.deploy.native_host as native_host

    monkeypatch.setattr(native_host.shutil, "which", lambda program: None if "qemu" in program else "/bin/true")
    with pytest.raises(NativeHostError, match="install the Debian package qemu-user-static"):
        check_tools("native-aarch64")
    check_tools("native")
    with pytest.raises(ValueError, match="native-aarch64"):
        check_tools("arm")
    assert trainer_command("native-aarch64", Path("prge-trainer"))[0] == "qemu-aarch64-static"
    assert "one training step is one call" in source_part("step").lower()


@needs_aarch64
def test_aarch64_host_under_emulation_matches_eager(fixture_data, tiny_xnnpack_program, tmp_path, monkeypatch):
    """Cross-built for aarch64 (the aarch64 wheel's SDK, XNNPACK's Arm kernels) and run under qemu: 3 steps within
    1e-4 of eager P-RGE."""
    from prge_lib.cli.main import main

    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    out = tmp_path / "aarch64.json"
    assert main(["device-train", "--pte", str(tiny_xnnpack_program), "--host", "native-aarch64", "--steps", "3",
                 "--check-eager", "--out", str(out), *TRAIN]) == 0
    result = json.loads(out.read_text())
    assert result["parity"]["steps"] == 3 and result["parity"]["max_rel_loss_diff"] <= 1e-4
    assert result["host"]["machine"] == "aarch64" and result["host"]["emulated"]
    assert build_trainer("native-aarch64").read_bytes()[18] == 183          # ELF e_machine: EM_AARCH64
