"""An ExecuTorch client's round (prge_lib.deploy.client, prge_lib.distributed.upload; chapter 11): the exported step
trains in the runtime, its upload of seeds and projected gradients is replayed eagerly by another client within
the envelope of the two updates' roundings (derived) and the device's noise (measured), and eager clients
replaying the same upload agree bit for bit."""
from __future__ import annotations

import json
import re

import pytest

from prge_lib.deploy.client import (DeviceNoise, envelope_constant, eager_client, replay_config, replay_parity,
                                    replay_with_envelope, runtime_round)
from prge_lib.zo.replay import adapter_digest
from prge_lib.distributed.upload import Upload, replay_upload, upload_of_run
from prge_lib.zo.lora import adapter_state
from test_native import needs_native      # the same rule: skipped, naming the package, without cmake or g++

STEPS = 8
TRAIN = {"lr": 1e-2, "n_train": 40, "n_val": 8, "n_test": 8}


@pytest.fixture(scope="module")
def device_round(tiny_program, fixture_data):
    """The tiny model's program (portable kernels, q = 2) trained 8 steps in the runtime, with the eager twin."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRGE_DATA_DIR", str(fixture_data))
        return runtime_round(tiny_program, "sst2", STEPS, check_eager=True, **TRAIN)


@pytest.fixture(scope="module")
def device_noise(tiny_program, tmp_path_factory):
    """The device's z: the generator exported alone with the program's backend, run in the runtime."""
    return DeviceNoise(tiny_program, tmp_path_factory.mktemp("generator"))


def _client(device_round, tiny_folder):
    config = replay_config(device_round.result)
    assert config.model == str(tiny_folder) and config.program is None and config.noise == "counter"
    return eager_client(config)


def test_the_upload_is_the_steps_seed_indices_and_projected_gradients(device_round):
    upload = device_round.upload
    assert (upload.run_seed, upload.q, upload.client, upload.round) == (0, 2, 0, 0)
    assert [t for t, _ in upload.steps] == list(range(STEPS))
    assert [list(g) for _, g in upload.steps] == device_round.result["projected_grad"]
    assert upload.numbers() == STEPS * (1 + 2)
    assert Upload.from_json(upload.to_json()) == upload                   # JSON carries the fp32 g exactly
    wire = upload.to_bytes()                                              # and so do the wire's float32
    assert len(wire) == 11 + STEPS * (4 + 4 * 2) and Upload.from_bytes(wire, run_seed=0) == upload


def test_the_host_derives_the_g_the_program_applied(tiny_program, device_noise):
    """With lr = 1 and a zero adapter, the program returns -(1/q) Σ_i g_i z̃_i. Recomputed in fp32 from the host's
    g (derived from the returned losses) and the device's z̃ (the generator exported alone), it is the same bits:
    the upload's g are the ones the program applied. With the eager z most elements differ: the runtime's log and
    cos round otherwise, which is why the envelope measures that term."""
    import torch

    from prge_lib.deploy.export import read_program_meta
    from prge_lib.deploy.runtime import RuntimeStep, step_record
    from prge_lib.experiments.bench.program import program_inputs
    from prge_lib.zo.prng import counter_normal

    settings = read_program_meta(tiny_program)["settings"]
    inputs = program_inputs(settings)
    inputs[3], inputs[5] = torch.zeros(settings["adapter_size"]), torch.tensor(1.0)
    losses, adapter = RuntimeStep(tiny_program)(*inputs)
    g = torch.tensor(step_record(losses, float(inputs[6]))["projected_grad"])
    device_z = [device_noise(int(s)) for s in inputs[4]]
    assert torch.equal(-0.5 * (g[0] * device_z[0] + g[1] * device_z[1]), adapter)
    moved = torch.nextafter(g, torch.full_like(g, float("inf")))
    assert not torch.equal(-0.5 * (moved[0] * device_z[0] + moved[1] * device_z[1]), adapter)
    eager_z = [counter_normal(int(s), 0, (settings["adapter_size"],)) for s in inputs[4]]
    assert not torch.equal(torch.stack(eager_z), torch.stack(device_z))


def test_another_client_replays_the_device_round_within_the_rounding_envelope(device_round, device_noise, tiny_folder):
    """Same g, other kernels: the gap stays inside (2q + 6) u Σ_t M_t + Σ_t (η/q) Σ_i |g_i| |z̃_i − z_i|, and the
    LoRA-A are the same bits. The eager twin, which computes its own g from its own losses, leaves that envelope:
    what the envelope measures is the update's rounding, not the losses'."""
    client = _client(device_round, tiny_folder)
    envelope = replay_with_envelope(client, Upload.from_json(device_round.upload.to_json()), device_noise)
    parity = replay_parity(device_round.adapter, client, envelope)
    assert parity["a_identical"] and parity["within_envelope"] and parity["envelope_constant"] == envelope_constant(2)
    assert 0 < parity["rel_gap"] < 1e-6          # a few roundings of an adapter that moved
    assert max(float(v.abs().max()) for k, v in device_round.adapter.items() if k.endswith("lora_B")) > 1e-3

    twin = replay_upload(_client(device_round, tiny_folder), upload_of_run(device_round.result["eager"]))
    assert not replay_parity(device_round.adapter, twin, envelope)["within_envelope"]


@needs_native
def test_the_cpp_host_uploads_the_same_round(device_round, device_noise, tiny_program, fixture_data, tiny_folder,
                                             monkeypatch):
    """The C++ trainer driving the same program gives the same upload as the Python host (the same kernels on the
    same inputs), and its adapter replays within the envelope."""
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    native = runtime_round(tiny_program, "sst2", STEPS, host="native", **TRAIN)
    assert native.upload == device_round.upload
    client = _client(device_round, tiny_folder)
    parity = replay_parity(native.adapter, client, replay_with_envelope(client, native.upload, device_noise))
    assert parity["a_identical"] and parity["within_envelope"]


def test_the_envelope_catches_a_changed_projected_gradient(device_round, device_noise, tiny_folder):
    """One g of one step changed by 1e-5 relative puts the replay outside the envelope: the check can fail."""
    upload = device_round.upload
    grads = [list(g) for _, g in upload.steps]
    grads[3][1] *= 1 + 1e-5
    changed = Upload(upload.client, upload.round, tuple((t, tuple(g)) for (t, _), g in zip(upload.steps, grads)),
                     upload.run_seed)
    client = _client(device_round, tiny_folder)
    envelope = replay_with_envelope(client, changed, device_noise)
    assert not replay_parity(device_round.adapter, client, envelope)["within_envelope"]


def test_eager_clients_replaying_one_upload_agree_bit_for_bit(device_round, tiny_folder):
    """Eager to eager the replay is exact: two clients, and the twin's own upload replayed vs the twin rebuilt in
    two halves (start = 4)."""
    upload = device_round.upload
    one = replay_upload(_client(device_round, tiny_folder), upload)
    two = replay_upload(_client(device_round, tiny_folder), Upload.from_json(upload.to_json()))
    assert adapter_digest(adapter_state(one.model)) == adapter_digest(adapter_state(two.model))
    twin = upload_of_run(device_round.result["eager"])
    whole = replay_upload(_client(device_round, tiny_folder), twin)
    halves, eager = _client(device_round, tiny_folder), device_round.result["eager"]
    replay_upload(halves, upload_of_run({**eager, "projected_grad": eager["projected_grad"][:4]}))
    replay_upload(halves, upload_of_run({**eager, "projected_grad": eager["projected_grad"][4:]}, start=4))
    assert adapter_digest(adapter_state(whole.model)) == adapter_digest(adapter_state(halves.model))


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(run_seed=1), "seed 1"),
    (lambda d: d.update(q=3), "q is 3"),
    (lambda d: d["steps"][0]["g"].__setitem__(0, float("nan")), "not finite"),
    (lambda d: d["steps"][1]["g"].pop(), "step 1: 1 projected gradients, but the upload's first step has q = 2"),
    (lambda d: d.update(format="other"), "format 'other'"),
    (lambda d: d.update(format="prge-upload/1"), "written by an earlier version"),
    (lambda d: d.pop("run_seed"), "has no field 'run_seed'"),
    (lambda d: d["steps"][1].update(g="x"), "could not convert"),
])
def test_an_upload_from_another_run_is_refused(device_round, tiny_folder, change, message):
    data = json.loads(device_round.upload.to_json())
    change(data)
    with pytest.raises(ValueError, match=message):
        replay_upload(_client(device_round, tiny_folder), Upload.from_json(json.dumps(data)))


def test_cli_device_train_upload_then_replay(device_round, tiny_program, fixture_data, tmp_path, monkeypatch, capsys):
    """`prge device-train --upload` writes the round's upload (the same as the in-process round's: the runtime is
    deterministic), `prge replay` rebuilds the adapter from the result's config and the upload, bit-identical to
    an eager client's replay; bad files are refused in one line with exit status 2."""
    from prge_lib.cli.main import main
    from prge_lib.zo.lora import read_adapter

    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    run, up, adapter = tmp_path / "run.json", tmp_path / "upload.json", tmp_path / "replayed.safetensors"
    assert main(["device-train", "--pte", str(tiny_program), "--task", "sst2", "--steps", str(STEPS), "--lr", "1e-2",
                 "--n-train", "40", "--n-val", "8", "--n-test", "8", "--upload", str(up), "--out", str(run)]) == 0
    assert Upload.from_json(up.read_text()) == device_round.upload
    assert main(["replay", "--config", str(run), "--message", str(up), "--out", str(adapter)]) == 0
    expected = replay_upload(eager_client(replay_config(json.loads(run.read_text()))), device_round.upload)
    assert adapter_digest(read_adapter(adapter)) == adapter_digest(adapter_state(expected.model))
    # in the runtime: the update-only program exported on first use, then reused; close to, not equal to, eager
    program, followed = tmp_path / "replay.pte", tmp_path / "followed.safetensors"
    for _ in range(2):
        assert main(["replay", "--config", str(run), "--message", str(up), "--out", str(followed),
                     "--in-runtime", str(program), "--backend", "portable"]) == 0
    assert capsys.readouterr().err.count("exported the update-only program") == 1     # the second call reused it
    runtime_b, eager_b = read_adapter(followed), adapter_state(expected.model)
    gaps = [float((runtime_b[n] - eager_b[n]).abs().max()) for n in eager_b if n.endswith("lora_B")]
    assert 0 < max(gaps) < 1e-6 and adapter_digest(runtime_b) != adapter_digest(eager_b)

    capsys.readouterr()
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "fo.json").write_text(json.dumps({"task": "sst2", "method": "fo"}))
    (tmp_path / "odd.json").write_text(json.dumps({"task": "sst2", "colour": "red"}))
    for config, message, said in [(tmp_path / "none.json", up, "--config .*none.json: no such file"),
                                  (run, run, "format None; an upload has format 'prge-upload/2'"),
                                  (tmp_path / "list.json", up, "holds a list"),
                                  (tmp_path / "odd.json", up, r"not a training config: unknown fields \['colour'\]"),
                                  (tmp_path / "fo.json", up, "is a fo run; an upload replays the methods prge")]:
        assert main(["replay", "--config", str(config), "--message", str(message),
                     "--out", str(tmp_path / "x.safetensors")]) == 2
        err = [line for line in capsys.readouterr().err.strip().splitlines()
               if line != "prge: fast mode (PRGE_FAST) is on"]          # what every command says in fast mode
        assert len(err) == 1 and re.search(said, err[0]), err


# ----- a device that follows the run: the update-only program
@pytest.fixture(scope="module")
def replayer(tiny_program, tmp_path_factory):
    """The update-only program for the tiny program's adapter (portable kernels, q = 2), loaded in the runtime."""
    from prge_lib.deploy.client import ProgramReplayer
    from prge_lib.deploy.export import export_replay_program, read_program_meta

    settings = read_program_meta(tiny_program)["settings"]
    path = tmp_path_factory.mktemp("replay") / "replay.pte"
    export_replay_program(settings["adapter_size"], settings["q"], path, settings["backend"], seed=0)
    return ProgramReplayer(path)


def test_the_update_only_program_applies_the_step_with_the_devices_noise(replayer, device_noise):
    """One call is B + α_1 z̃_1 + α_2 z̃_2 (each product and sum rounded once, in that order) with the device's z̃,
    bit for bit; another α changes it; the eager z give other bits."""
    import torch

    from prge_lib.zo.prng import counter_normal

    size = replayer.settings["adapter_size"]
    adapter = torch.linspace(-1e-2, 1e-2, size)
    seeds, alphas = torch.tensor([11, 12]), torch.tensor([3e-3, -2e-3])
    out = replayer.program(adapter, seeds, alphas)[0]
    device_z = [device_noise(int(s)) for s in seeds]
    assert torch.equal(out, (adapter + alphas[0] * device_z[0]) + alphas[1] * device_z[1])
    assert not torch.equal(out, replayer.program(adapter, seeds, torch.tensor([3e-3, -2.0001e-3]))[0])
    eager_z = [counter_normal(int(s), 0, (size,)) for s in seeds]
    assert not torch.equal(out, (adapter + alphas[0] * eager_z[0]) + alphas[1] * eager_z[1])


def test_a_device_replays_an_upload_in_the_runtime_close_to_the_eager_client(device_round, replayer, tiny_folder):
    """The device's upload replayed by the update-only program and by an eager client: the LoRA-A are the same
    bits, the LoRA-B differ by the kernels' rounding only (relative gap below 1e-6, not zero); a program for
    another adapter is refused, naming both."""
    import dataclasses

    import torch

    from prge_lib.deploy.client import ProgramReplayer

    upload = device_round.upload
    eager = replay_upload(_client(device_round, tiny_folder), upload)
    device = _client(device_round, tiny_folder)
    replayer(device, upload.steps, device.lr)
    mine, theirs = adapter_state(device.model), adapter_state(eager.model)
    b = [name for name in mine if name.endswith("lora_B")]
    assert all(torch.equal(mine[n], theirs[n]) for n in mine if n not in b)
    gap = torch.cat([(mine[n] - theirs[n]).reshape(-1) for n in b]).norm()
    assert 0 < float(gap / torch.cat([theirs[n].reshape(-1) for n in b]).norm()) < 1e-6
    other = dataclasses.replace(replay_config(device_round.result), q=4)
    with pytest.raises(ValueError, match=r"replays adapters of \d+ numbers with q 2; this run's has \d+ with q 4"):
        replayer(eager_client(other), [(0, (1.0,) * 4)], 1e-3)
    with pytest.raises(ValueError, match="is not an update-only program"):
        ProgramReplayer(device_round.result["config"]["program"])
