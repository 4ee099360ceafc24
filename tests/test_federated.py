"""Federated P-RGE (prge_lib.distributed.federated, chapter 11) on the tiny model: the shards, the server and a
client that replays the broadcasts holding the same adapter bit for bit, federated rounds with one client and one
local step equal to centralised P-RGE bit for bit, a resumed run equal to the uninterrupted one, the upload's
measured size, and bad input refused.

Why C = 1, S = 1 is centralised P-RGE exactly. Round r has one client, which starts from the global adapter B_r
and takes one step with seed index t = (r·1 + 0)·1 + 0 = r on its batch: the same B, seeds step_seeds(seed, r, q)
and rows as centralised step r over the same batches, hence the same forward and the same float32 g. The upload
carries g as float32 (exact), the server restores B_r (a copy, exact) and replays B_r − (η/C / q) Σ_i g_i z_i with
C = 1: η/1 = η, and apply_update draws z_i from the same seed and adds in the same order as the step's own update.
Every operation is the same on the same operands, so every bit is.
"""
import dataclasses
import json

import jsonschema
import pytest
import torch

from prge_lib.cli.main import main
from prge_lib.data.splits import sample_task
from prge_lib.data.tasks import get_task
from prge_lib.distributed.federated import FederatedConfig, FederatedRun, apply_broadcast, plan, seed_index
from prge_lib.distributed.upload import Upload, decode_broadcast
from prge_lib.zo.replay import adapter_digest
from prge_lib.distributed.shards import iid_shards, label_counts, label_skew_shards, make_shards
from prge_lib.training.config import TrainConfig
from prge_lib.training.records import FederatedRecord
from prge_lib.common.schema import json_schema
from prge_lib.training.trainer import Trainer, build_method

SETTINGS = {"task": "sst2", "method": "prge", "q": 2, "E": 4, "lr": 1e-2, "eps": 1e-2, "steps": 1, "eval_every": 0,
            "n_train": 24, "n_val": 4, "n_test": 8, "max_length": 32, "seed": 0}


def setup(tiny_factory, tokenizer, fixture_data, tiny_folder, **changes) -> Trainer:
    c = TrainConfig(**{**SETTINGS, "model": str(tiny_folder), **changes})
    data = sample_task(get_task(c.task), c.seed, c.n_train, c.n_val, c.n_test, root=fixture_data)
    return Trainer(c, tiny_factory(), tokenizer, data, progress=False)


# ----- shards
def test_shards_are_disjoint_cover_the_sample_and_keep_the_skew_rule():
    labels = [i % 2 for i in range(103)]
    for shards in (iid_shards(103, 10, 0), label_skew_shards(labels, 10, 0.9, 0)):
        flat = [i for s in shards for i in s]
        assert sorted(flat) == list(range(103)) and len(set(flat)) == 103
        assert [len(s) for s in shards] == [11, 11, 11] + [10] * 7
    skewed = label_skew_shards(labels, 10, 0.9, 0)
    for k, counts in enumerate(label_counts(skewed, labels)):
        home = str(k % 2)
        assert counts[home] >= int(0.9 * len(skewed[k])), (k, counts)
    iid = label_counts(iid_shards(103, 10, 0), labels)
    assert min(c.get("0", 0) for c in iid) < 9        # a random split is not skewed like that
    assert make_shards("iid", labels, 10, 1) != make_shards("iid", labels, 10, 0)


def test_the_plan_gives_every_step_its_own_seed_index_and_batches_from_the_clients_shard():
    fed = FederatedConfig(clients=4, per_round=2, local_steps=3, rounds=5)
    shards = iid_shards(40, 4, 0)
    rounds = plan(0, fed, shards, batch_size=2)
    indices = [t for work in rounds for _, steps in work for t, _ in steps]
    assert indices == list(range(fed.steps))
    for work in rounds:
        for k, steps in work:
            assert all(set(rows) <= set(shards[k]) and len(rows) == 2 for _, rows in steps)
    assert seed_index(fed, 1, 1, 2) == (1 * 2 + 1) * 3 + 2


# ----- messages and their sizes
def test_the_upload_is_its_measured_bytes_and_grows_with_s_times_q_not_the_adapter():
    g = torch.randn(4, dtype=torch.float32)
    upload = Upload(3, 7, tuple((t, tuple(g.tolist())) for t in range(5)))
    data = upload.to_bytes()
    assert Upload.from_bytes(data) == upload               # float32 values survive exactly
    assert len(data) == 11 + 5 * (4 + 4 * 4)
    wider = Upload(3, 7, tuple((t, tuple(float(x) for x in range(8))) for t in range(10))).to_bytes()
    assert len(wider) == 11 + 10 * (4 + 4 * 8)           # S·q four times larger: the steps' part nearly four times


def test_server_and_a_replaying_client_hold_the_same_adapter(tiny_factory, tokenizer, fixture_data, tiny_folder):
    s = setup(tiny_factory, tokenizer, fixture_data, tiny_folder)
    fed = FederatedConfig(clients=3, per_round=2, local_steps=2, rounds=3)
    run = FederatedRun(s, fed, progress=False)
    result = run.run()
    client = build_method(s.config, tiny_factory())        # a device that joins: the run's config, fresh B₀ = 0
    for broadcast in run.broadcasts:
        apply_broadcast(client, broadcast)
    assert adapter_digest(client.trainable()) == adapter_digest(s.method.trainable()) == result["adapter_sha256"]
    comm = result["communication"]
    assert comm["upload_bytes_per_client_round"] == 11 + 2 * (4 + 4 * 2)
    assert comm["download_bytes_per_client_round"] == 6 + 2 * (4 + comm["upload_bytes_per_client_round"])
    assert comm["total"]["all"] == 3 * 2 * comm["upload_bytes_per_client_round"] + 3 * 3 * \
        comm["download_bytes_per_client_round"]
    assert result["final"]["test"] >= 0 and len(result["round_losses"]) == 3
    assert any(b.abs().max() > 0 for b in s.method.trainable().values())
    # an adapter four times larger (rank 64 instead of 16): the same upload, a first-order delta four times larger
    wide = FederatedRun(setup(tiny_factory, tokenizer, fixture_data, tiny_folder, r=64), fed, progress=False).run(
        zero_shot=0.5)["communication"]
    assert wide["upload_bytes_per_client_round"] == comm["upload_bytes_per_client_round"]
    assert wide["first_order_fedavg_upload_bytes_per_client_round"] == \
        4 * comm["first_order_fedavg_upload_bytes_per_client_round"] == 4 * 4 * result["trainable_parameters"]


def test_a_round_closes_on_the_uploads_that_arrived(tiny_factory, tokenizer, fixture_data, tiny_folder):
    """With --drop, a chosen client's upload is lost by a seeded draw; the round is replayed at lr/(uploads that
    arrived), a lost slot's seed indices are never applied, a client that joins later still rebuilds the adapter
    from the broadcasts, and drop 0 is the run without losses, bit for bit."""
    fed = FederatedConfig(clients=4, per_round=3, local_steps=2, rounds=4, drop=0.4)
    s = setup(tiny_factory, tokenizer, fixture_data, tiny_folder)
    run = FederatedRun(s, fed, progress=False)
    result = run.run(zero_shot=0.5)
    lost = result["federation"]["lost_uploads"]
    per_round = [u.get("lost", []) for u in result["uploads"]]
    assert lost["lost"] == sum(map(len, per_round)) and 0 < lost["lost"] < lost["of"] == 12    # some, not all
    for r, (broadcast, gone) in enumerate(zip(run.broadcasts, per_round)):
        _, uploads = decode_broadcast(broadcast)
        arrived = [u.client for u in uploads]
        assert sorted(arrived + gone) == result["federation"]["clients_by_round"][r]
        slots = {k: slot for slot, k in enumerate(result["federation"]["clients_by_round"][r])}
        applied = {t for u in uploads for t, _ in u.steps}
        assert all(seed_index(fed, r, slots[k], j) not in applied for k in gone for j in range(2))
    client = build_method(s.config, tiny_factory())
    for broadcast in run.broadcasts:
        apply_broadcast(client, broadcast)
    assert adapter_digest(client.trainable()) == result["adapter_sha256"]
    none = FederatedRun(setup(tiny_factory, tokenizer, fixture_data, tiny_folder), dataclasses.replace(fed, drop=0.0),
                        progress=False).run(zero_shot=0.5)
    plain = FederatedRun(setup(tiny_factory, tokenizer, fixture_data, tiny_folder),
                         FederatedConfig(clients=4, per_round=3, local_steps=2, rounds=4), progress=False).run(zero_shot=0.5)
    assert none["adapter_sha256"] == plain["adapter_sha256"] != result["adapter_sha256"]
    assert "lost_uploads" not in plain["federation"]
    with pytest.raises(ValueError, match="--drop 1.0: the chance that an upload is lost"):
        dataclasses.replace(fed, drop=1.0).check(24, 2)


def test_a_late_upload_is_broadcast_with_the_next_round_and_survives_a_resume(tiny_factory, tokenizer, fixture_data,
                                                                               tiny_folder, tmp_path):
    """With --late, an upload that is not lost comes a round late by a seeded draw: round r's broadcast holds it
    beside round r + 1's on-time uploads (its own round number kept), its steps are applied exactly once (the last
    round's late ones never), a late client still rebuilds the adapter from the broadcasts, a run killed while an
    upload is pending resumes to the same adapter, and late 0 is the plain run bit for bit."""
    fed = FederatedConfig(clients=4, per_round=3, local_steps=2, rounds=4, late=0.5)
    s = setup(tiny_factory, tokenizer, fixture_data, tiny_folder)
    run = FederatedRun(s, fed, progress=False)
    result = run.run(zero_shot=0.5)
    late = [u.get("late", []) for u in result["uploads"]]
    info = result["federation"]["late_uploads"]
    assert info["delayed"] == sum(map(len, late)) and 0 < info["delayed"] < info["of"] == 12
    assert info["never_arrived"] == len(late[-1])
    applied = []
    for r, broadcast in enumerate(run.broadcasts):
        round_, uploads = decode_broadcast(broadcast)
        chosen = result["federation"]["clients_by_round"][r]
        assert round_ == r and [u.client for u in uploads if u.round == r] == [k for k in chosen if k not in late[r]]
        assert [u.client for u in uploads if u.round != r] == (late[r - 1] if r else [])
        assert all(u.round == r - 1 for u in uploads if u.round != r)
        applied += [t for u in uploads for t, _ in u.steps]
    slots = [{k: slot for slot, k in enumerate(c)} for c in result["federation"]["clients_by_round"]]
    expected = [seed_index(fed, r, slots[r][k], j) for r in range(4) for k in slots[r] if r == 3 and k in late[3]
                for j in range(2)]
    assert len(applied) == len(set(applied)) == 4 * 3 * 2 - len(expected) and not set(expected) & set(applied)
    client = build_method(s.config, tiny_factory())
    for broadcast in run.broadcasts:
        apply_broadcast(client, broadcast)
    assert adapter_digest(client.trainable()) == result["adapter_sha256"]
    pending_at = next(r for r in range(3) if late[r])               # a round after which an upload is pending
    cut = FederatedRun(s, fed, checkpoint_dir=tmp_path, progress=False)
    cut.plan = cut.plan[:pending_at + 1]
    with pytest.raises(IndexError):
        cut.run(zero_shot=0.5)
    assert cut.pending
    resumed = FederatedRun(s, fed, checkpoint_dir=tmp_path, progress=False).run(resume=True)
    assert resumed["adapter_sha256"] == result["adapter_sha256"] and resumed["losses"] == result["losses"]
    plain = FederatedRun(s, dataclasses.replace(fed, late=0.0), progress=False).run(zero_shot=0.5)
    assert "late_uploads" not in plain["federation"] and plain["adapter_sha256"] != result["adapter_sha256"]
    assert plain["adapter_sha256"] == FederatedRun(s, FederatedConfig(clients=4, per_round=3, local_steps=2, rounds=4),
                                                   progress=False).run(zero_shot=0.5)["adapter_sha256"]
    with pytest.raises(ValueError, match="--late 1.0: the chance that an upload comes a round late"):
        dataclasses.replace(fed, late=1.0).check(24, 2)


def test_one_client_one_step_a_round_is_centralised_p_rge_bit_for_bit(tiny_factory, tokenizer, fixture_data,
                                                                        tiny_folder):
    fed = FederatedConfig(clients=3, per_round=1, local_steps=1, rounds=4)
    s = setup(tiny_factory, tokenizer, fixture_data, tiny_folder)
    central = FederatedRun(s, fed, "centralised", progress=False).run(zero_shot=0.5)
    federated = FederatedRun(s, fed, "federated", progress=False).run(zero_shot=0.5)
    assert federated["losses"] == central["losses"]
    assert federated["adapter_sha256"] == central["adapter_sha256"]
    # with two local steps the client moves before its second step: no longer the centralised computation
    two = FederatedConfig(clients=3, per_round=2, local_steps=1, rounds=2)
    assert FederatedRun(s, two, "federated", progress=False).run(zero_shot=0.5)["adapter_sha256"] != \
        FederatedRun(s, two, "centralised", progress=False).run(zero_shot=0.5)["adapter_sha256"]


def test_a_resumed_run_equals_the_uninterrupted_one(tiny_factory, tokenizer, fixture_data, tiny_folder, tmp_path):
    fed = FederatedConfig(clients=3, per_round=2, local_steps=2, rounds=3, split="label-skew", skew=0.9)
    s = setup(tiny_factory, tokenizer, fixture_data, tiny_folder)
    whole = FederatedRun(s, fed, progress=False).run(zero_shot=0.5)
    cut = FederatedRun(s, fed, checkpoint_dir=tmp_path, progress=False)
    cut.plan = cut.plan[:2]                  # "killed" after round 2: the checkpoint holds two rounds
    with pytest.raises(IndexError):
        cut.run(zero_shot=0.5)
    resumed = FederatedRun(s, fed, checkpoint_dir=tmp_path, progress=False).run(resume=True)
    assert resumed["resumed_at_rounds"] == [2]
    assert resumed["losses"] == whole["losses"] and resumed["adapter_sha256"] == whole["adapter_sha256"]
    assert resumed["federation"]["label_counts"] == whole["federation"]["label_counts"]


# ----- the command
def options(**settings) -> list[str]:
    return [x for k, v in settings.items() for x in ("--" + k.replace("_", "-"), str(v))]


BASE = {"task": "sst2", "q": 2, "E": 4, "lr": 1e-2, "n_train": 24, "n_val": 4, "n_test": 8, "max_length": 32,
        "clients": 3, "per_round": 2, "local_steps": 1, "rounds": 2}


def test_the_command_writes_both_results(fixture_data, tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    out, base = tmp_path / "f.json", tmp_path / "c.json"
    assert main(["federate", *options(**BASE, model=tiny_folder, split="label-skew", skew=0.9), "--out", str(out),
                 "--baseline", str(base)]) == 0
    fed, central = json.loads(out.read_text()), json.loads(base.read_text())
    for record in (fed, central):
        jsonschema.validate(record, json_schema(FederatedRecord))
        assert record["provenance"]["command"].startswith("prge federate")
    assert fed["zero_shot"]["test"] == central["zero_shot"]["test"]
    assert fed["mode"] == "federated" and central["mode"] == "centralised" and central["communication"] is None
    assert fed["zero_shot"]["taken_from"].startswith("the centralised baseline")


def test_the_command_says_what_was_lost_and_late(fixture_data, tiny_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    out = tmp_path / "f.json"
    assert main(["federate", *options(**{**BASE, "rounds": 4}, model=tiny_folder, drop=0.3, late=0.5),
                 "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    jsonschema.validate(record, json_schema(FederatedRecord))
    lost, late = record["federation"]["lost_uploads"], record["federation"]["late_uploads"]
    assert (lost["drop"], lost["of"], late["late"], late["of"]) == (0.3, 8, 0.5, 8)
    said = capsys.readouterr().out
    assert f"; {lost['lost']} of 8 uploads lost; {late['delayed']} of 8 a round late " \
           f"({late['never_arrived']} never arrived) -> {out}" in said


def test_the_command_takes_device_clients(fixture_data, tiny_folder, tiny_program, tmp_path, monkeypatch, capsys):
    """`prge federate --device-clients 0,1 --program step.pte`: the result records the device clients' parity and
    validates; a program without clients, clients without a program, or a bad number are refused in one line."""
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    run = {**BASE, "max_length": 24, "layers": 1, "model": tiny_folder}
    out = tmp_path / "f.json"
    assert main(["federate", *options(**run), "--device-clients", "0,1", "--program", str(tiny_program),
                 "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    jsonschema.validate(record, json_schema(FederatedRecord))
    assert record["config"]["noise"] == "counter" and record["federation"]["device_clients"]["clients"] == [0, 1]
    assert record["federation"]["device_clients"]["max_rel_loss_diff"] <= 1e-4
    for extra, message in ((["--program", str(tiny_program)], "name them with --device-clients"),
                           (["--device-clients", "0"], "--device-clients needs --program"),
                           (["--device-clients", "a", "--program", str(tiny_program)], "client numbers separated"),
                           (["--device-clients", "7", "--program", str(tiny_program)], "numbered 0 to 2")):
        capsys.readouterr()
        assert main(["federate", *options(**run), *extra, "--out", str(tmp_path / "x.json")]) == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("changes, message", [
    ({"split": "label-skew"}, "--skew None: the label-skew split needs a share p"),
    ({"split": "label-skew", "skew": 1.5}, "--skew 1.5"),
    ({"skew": 0.9}, "--skew 0.9 applies to --split label-skew only"),
    ({"per_round": 4}, "--per-round 4: at most --clients (3)"),
    ({"clients": 13}, "--clients 13: shards of 1 of the 24 training examples cannot fill a batch of 2"),
    ({"rounds": 0}, "--rounds 0: must be at least 1"),
    ({"drop": 1.5}, "--drop 1.5: the chance that an upload is lost, at least 0 and below 1"),
    ({"late": -0.1}, "--late -0.1: the chance that an upload comes a round late, at least 0 and below 1"),
])
def test_bad_input_is_refused_in_one_line(changes, message, fixture_data, tiny_folder, tmp_path, monkeypatch,
                                          capsys):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    code = main(["federate", *options(**{**BASE, **changes}, model=tiny_folder), "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1], err


def test_the_summary_command_names_a_missing_folder(tmp_path, capsys):
    from prge_lib.experiments.federated_summary import main as summary_main

    with pytest.raises(SystemExit) as stop:
        summary_main([str(tmp_path / "absent")])
    assert stop.value.code == 2 and "absent' does not exist" in capsys.readouterr().err
    assert not (tmp_path / "absent").exists()


def test_the_summary_tests_over_seeds_in_chapter_7s_words(tmp_path):
    from prge_lib.experiments import stats
    from prge_lib.experiments.federated_summary import read_runs, seed_test, write_summary

    finals = {"centralised": (0.60, 0.62, 0.64), "iid": (0.61, 0.62, 0.66), "label-skew": (0.50, 0.51, 0.53)}
    for config, values in finals.items():
        for seed, final in enumerate(values):
            record = {"seed": seed, "final": {"test": final}, "zero_shot": {"test": 0.5}, "round_losses": [7.0, 6.0],
                      "communication": None if config == "centralised" else {
                          "upload_bytes_per_client_round": 111, "download_bytes_per_client_round": 236,
                          "first_order_fedavg_upload_bytes_per_client_round": 9953280},
                      "federation": {"clients": 10, "per_round": 2, "local_steps": 5, "rounds": 10},
                      "config": {"q": 4, "E": 16, "eps": 0.01, "lr": 0.001}, "n_test": 500, "steps": 100}
            (tmp_path / f"{config}_seed{seed}.json").write_text(json.dumps(record))
    summary = write_summary(tmp_path)
    tests = {(t["a"], t["b"]): t for t in summary["tests"]}
    assert tests[("iid", "centralised")]["verdict"] == stats.NO_DIFFERENCE            # +1, +0, +2 points
    assert tests[("iid", "centralised")]["test"] == "paired t"
    assert abs(tests[("iid", "centralised")]["difference"] - 1.0) < 1e-9
    assert tests[("label-skew", "centralised")]["verdict"] == "difference"             # −10, −11, −11 points
    assert summary["rows"]["iid"]["final"]["n"] == 3
    assert f"- iid − centralised: {stats.describe(tests[('iid', 'centralised')])}" in (tmp_path / "summary.md").read_text()
    # two seeds: the label-skew gap still has p < 0.05, but two seeds a side are not called a difference
    runs = read_runs(tmp_path)
    two = seed_test({s: runs["label-skew"][s] for s in (0, 1)}, {s: runs["centralised"][s] for s in (0, 1)},
                    "label-skew", "centralised")
    assert two["p"] < stats.ALPHA and two["verdict"] == stats.FEW_SEEDS
    # other seeds on one side: Welch's test, as in chapter 7; no runs on one side: untested, and said so
    other = seed_test(runs["label-skew"], {s + 3: r for s, r in runs["centralised"].items()}, "label-skew", "centralised")
    assert other["test"] == "Welch t" and other["verdict"] == stats.DIFFERENCE
    assert seed_test(runs["iid"], {}, "drop 0.5", "all on time")["verdict"] == "untested: no runs of all on time"
    # accuracy against the clients a round: C 2 is the iid run, the others come from clients/, paired C max − C min
    assert list(summary["clients"]["rows"]) == ["2"] and summary["clients"]["test"] is None
    (tmp_path / "clients").mkdir()
    for c, s, values in ((1, 10, (0.70, 0.72, 0.71)), (10, 1, (0.55, 0.56, 0.58))):
        for seed, final in enumerate(values):
            record = json.loads((tmp_path / f"iid_seed{seed}.json").read_text())
            record.update(final={"test": final}, federation={"clients": 10, "per_round": c, "local_steps": s,
                                                             "rounds": 10})
            (tmp_path / "clients" / f"iid_C{c}_seed{seed}.json").write_text(json.dumps(record))
    clients = write_summary(tmp_path)["clients"]
    assert [(r["per_round"], r["local_steps"]) for r in clients["rows"].values()] == [(1, 10), (2, 5), (10, 1)]
    assert clients["test"]["a"] == "C 10" and clients["test"]["verdict"] == "difference"     # −15, −16, −13 points
    assert abs(clients["test"]["difference"] + 14.67) < 0.01
    assert "| 10 | 1 | 56.3 ± 1.5 (3) |" in (tmp_path / "summary.md").read_text()
    # lost and late uploads: "all on time" is the clients/ run of their C, tested paired against each condition
    assert write_summary(tmp_path)["uploads"] == {"rows": {}, "tests": []}
    (tmp_path / "uploads").mkdir()
    for name, info, values in (("drop50", {"lost_uploads": {"drop": 0.5, "lost": 5, "of": 10, "rounds_with_none_arrived": 5}},
                                (0.69, 0.70, 0.71)),
                               ("drop80", {"lost_uploads": {"drop": 0.8, "lost": 8, "of": 10, "rounds_with_none_arrived": 8}},
                                (0.60, 0.62, 0.61)),
                               ("late50", {"late_uploads": {"late": 0.5, "delayed": 4, "of": 10, "never_arrived": 1}},
                                (0.71, 0.71, 0.72))):
        for seed, final in enumerate(values):
            record = json.loads((tmp_path / "clients" / f"iid_C1_seed{seed}.json").read_text())
            record["final"] = {"test": final}
            record["federation"].update(info)
            (tmp_path / "uploads" / f"iid_C1_{name}_seed{seed}.json").write_text(json.dumps(record))
    uploads = write_summary(tmp_path)["uploads"]
    assert list(uploads["rows"]) == ["all on time", "drop 0.5", "drop 0.8", "late 0.5"]
    on_time = uploads["rows"]["all on time"]
    assert on_time["seeds"] == [0, 1, 2] and on_time["lost_share"]["mean"] == 0 == on_time["late_share"]["mean"]
    assert abs(uploads["rows"]["drop 0.8"]["lost_share"]["mean"] - 0.8) < 1e-12
    assert abs(uploads["rows"]["late 0.5"]["late_share"]["mean"] - 0.4) < 1e-12
    tests = {t["a"]: t for t in uploads["tests"]}
    assert tests["drop 0.5"]["verdict"] == stats.NO_DIFFERENCE                        # −1, −2, 0 points
    assert tests["drop 0.8"]["verdict"] == "difference" and abs(tests["drop 0.8"]["difference"] + 10) < 1e-9
    assert abs(tests["late 0.5"]["difference"] - 1 / 3) < 1e-9                             # +1, −1, +1 points
    assert "| drop 0.8 | 80 % | 0 % | 8.0 | 61.0 ± 1.0 (3) |" in (tmp_path / "summary.md").read_text()


# ----- an ExecuTorch client in the rounds
def device_setup(tokenizer, fixture_data, tiny_folder, **changes) -> Trainer:
    """The run the tests' exported step (tiny model cut to one layer, q 2, E 4, 24 tokens, seed 0) was made for."""
    c = TrainConfig(**{**SETTINGS, "model": str(tiny_folder), "layers": 1, "max_length": 24, "noise": "counter",
                       **changes})
    data = sample_task(get_task(c.task), c.seed, c.n_train, c.n_val, c.n_test, root=fixture_data)
    return Trainer(c, None, None, data, progress=False)


def test_an_executorch_client_takes_part_in_the_rounds(tokenizer, fixture_data, tiny_folder, tiny_program):
    """Client 1 trains its local steps in the runtime (the portable kernels): the server replays its uploads like
    any client's, a client that joins later rebuilds the same adapter bit for bit from the broadcasts, and each
    device step agrees with its eager twin's from the same adapter within the paper's 1e-4 (relative loss)."""
    from prge_lib.deploy.client import program_client

    s = device_setup(tokenizer, fixture_data, tiny_folder)
    fed = FederatedConfig(clients=3, per_round=2, local_steps=2, rounds=3)
    run = FederatedRun(s, fed, progress=False, device_method=program_client(s, tiny_program), device_clients=(1,))
    result = run.run()
    info = result["federation"]["device_clients"]
    chosen = [r for r, clients in enumerate(result["federation"]["clients_by_round"]) if 1 in clients]
    assert info["clients"] == [1] and info["program"] == tiny_program.name and chosen
    assert [r["round"] for r in info["rounds"]] == chosen and all(r["steps"] == 2 for r in info["rounds"])
    assert info["max_rel_loss_diff"] <= 1e-4 and all(r["within_1e-4"] for r in info["rounds"])
    joining = device_setup(tokenizer, fixture_data, tiny_folder).method       # B₀ = 0, the run's config
    for broadcast in run.broadcasts:
        apply_broadcast(joining, broadcast)
    assert adapter_digest(joining.trainable()) == result["adapter_sha256"]
    assert any(b.abs().max() > 0 for b in joining.trainable().values())


def test_a_device_client_is_refused_where_it_cannot_stand_in(tokenizer, fixture_data, tiny_folder, tiny_program):
    from prge_lib.deploy.client import program_client

    fed = FederatedConfig(clients=3, per_round=2, local_steps=2, rounds=1)
    s = device_setup(tokenizer, fixture_data, tiny_folder)
    with pytest.raises(ValueError, match=r"exported for other settings .*'seed': \(0, 5\)"):
        program_client(device_setup(tokenizer, fixture_data, tiny_folder, seed=5), tiny_program)
    with pytest.raises(ValueError, match="--noise counter"):
        program_client(device_setup(tokenizer, fixture_data, tiny_folder, noise="torch"), tiny_program)
    with pytest.raises(ValueError, match="clients are numbered 0 to 2"):
        FederatedRun(s, fed, progress=False, device_method=program_client(s, tiny_program), device_clients=(3,))
    with pytest.raises(ValueError, match="centralised baseline has none"):
        FederatedRun(s, fed, "centralised", progress=False, device_method=program_client(s, tiny_program),
                     device_clients=(0,))
