"""The paper-budget grids (chapters 7 and 8): their shapes per profile and stage, per-task seeds, the two-stage
SensZOQ grid (the confirm stage reads its rates from the sweep's results, and waits for them), and --list's
prices on another device."""
import json

import pytest

from prge_lib.cli.common import EXIT_CELLS_LEFT
from prge_lib.cli.main import main
from prge_lib.data.tasks import TABLE2_TASKS
from prge_lib.experiments import paper
from prge_lib.experiments import reproduce as rp


def _count(grid, profile, **kw):
    return len(rp.grid_cells(grid, profile, **kw))


def test_cell_counts_per_grid_profile_and_stage():
    # Table 1, paper: zero-shot 3 seeds; FO and FO LoRA-FA 3 rates x 3 seeds; MeZO (Full) sweeps 6 rates at one
    # seed, then confirms 3 seeds at its best (2 beyond the sweep's); the three ZO LoRA-FA rows 4 rates x (5 seeds
    # on SST-2 and RTE, 3 on the other four tasks)
    assert _count("table1", "paper") == 6 * (3 + 9 + 9 + 6) + 3 * 4 * (2 * 5 + 4 * 3)
    assert len(rp.confirm_estimate_cells("table1", "paper")) == 6 * 2
    assert {c.row.key for c in rp.confirm_estimate_cells("table1", "paper")} == {"mezo-E16"}
    assert _count("table1", "cpu") == 78                      # the cpu profile as its committed results ran
    # Table 7: App. B's four rates in LoRA, LoRA-FA and DoRA, seven for VeRA, 3 seeds each
    assert _count("peft", "paper") == 3 * (4 + 4 + 4 + 7)
    vera = sorted({c.lr for c in rp.grid_cells("peft", "paper", only="mezo-vera_")})
    assert vera[0] == 5e-4 and vera[-1] == 1.0 and len(vera) == 7
    # SensZOQ: the sweep is one seed per rate, the confirm stage each row's confirm seeds beyond the sweep's
    rows = rp.GRIDS["senszoq"]["rows"]
    assert len(rows) == 9 and {r.row.key for r in rp.grid_cells("senszoq", "paper")} == {r.key for r in rows}
    assert _count("senszoq", "paper") == 2 * sum(len(r.lrs["paper"]) for r in rows) == 126
    assert {c.seed for c in rp.grid_cells("senszoq", "paper")} == {0}
    assert len(rp.confirm_estimate_cells("senszoq", "paper")) == 2 * 9 * 2
    assert {c.stage for c in rp.confirm_estimate_cells("senszoq", "paper")} == {"confirm"}


def test_table1_paper_seeds_are_per_task_and_the_grids_are_the_issues():
    zo = rp.grid_cells("table1", "paper", only="prge-q4-E16_lr1e-3")
    seeds = {task: sorted(c.seed for c in zo if c.task == task) for task in rp.GRIDS["table1"]["tasks"]}
    assert seeds["sst2"] == seeds["rte"] == [0, 1, 2, 3, 4] and seeds["mrpc"] == [0, 1, 2]
    assert sorted(c.seed for c in rp.grid_cells("table1", "cpu", only="sst2/prge-q4")) == [0, 1, 2]
    sst2_4, = rp.grid_cells("table1", "paper", only="sst2/prge-q4-E16_lr1e-3_seed4")
    assert "--seeds" not in sst2_4.command()                    # seed 4 is SST-2's own on this profile
    mrpc_4, = rp.grid_cells("table1", "paper", seeds=[4], only="mrpc/prge-q4-E16_lr1e-3")
    assert mrpc_4.command().endswith("--seeds 4")
    mezo = sorted({c.lr for c in rp.grid_cells("table1", "paper", only="sst2/mezo-E16")})
    assert mezo == [1e-7, 5e-7, 1e-6, 5e-6, 1e-5, 5e-5]
    q16, = rp.grid_cells("table1", "paper", only="sst2/prge-q16-E16_lr5e-5_seed0")
    c = q16.config()
    assert (c["q"], c["E"], c["steps"], c["eval_every"]) == (16, 16, 20000, 500)
    assert {c.steps() for c in rp.grid_cells("table1", "paper", only="fo")} == {1000}
    # the blind masks' grids reach 1000x the C4 mask's cpu rate; the NF4 baselines are on the same 4-bit base
    blind = rp.grid_cells("senszoq", "paper", only="rte/senszoq-random-s1e-3")
    assert max(c.lr for c in blind) == 1e-1 and len(blind) == 7
    lora, = rp.grid_cells("senszoq", "paper", only="rte/mezo-lora-r8-nf4_lr1e-4")
    assert {k: lora.config()[k] for k in ("adapter", "r", "alpha", "quant", "eps")} == \
        {"adapter": "lora", "r": 8, "alpha": 16, "quant": "nf4", "eps": 1e-3}


def test_every_table2_lite_cell_has_the_papers_figure_beside_it():
    cells = rp.grid_cells("table2-lite", "cpu")
    assert {c.task for c in cells} == set(rp.GRIDS["table2-lite"]["tasks"]) and len(cells) == 7 * 4
    assert all(c.task in paper.TABLE2[c.row.key] for c in cells)
    # the rows as Gao et al. print them (arXiv Table 2): P-RGE q 16 ties FO LoRA-FA on COPA, SQuAD is F1
    assert paper.TABLE2["prge-q16-E16"]["copa"] == paper.TABLE2["fo-lorafa"]["copa"] == 87.0
    assert paper.TABLE2["zeroshot"]["squad"] == 23.8
    assert paper.ZERO_SHOT["Llama2-7B (Gao et al. Table 2)"]["wic"] == 50.0
    assert all(list(values) == list(TABLE2_TASKS) for values in paper.TABLE2.values())


def _write(cell, root, val, test=0.6, device=None, start=None):
    """A synthetic result of ``cell`` (its own config; validation score ``val``; a step-0 score ``start`` where
    given) under ``root``."""
    point = {"step": 10, "val": val, "test": test}
    evals = [point] if start is None else [{"step": 0, "val": start, "test": 0.5}, point]
    config = dict(cell.config(), **({"device": device} if device else {}))
    result = {"kind": "train", "task": cell.task, "method": config["method"], "seed": cell.seed, "steps": 2,
              "config": config, "best_val": point, "final": point, "evals": evals, "losses": [1.0, 0.9],
              "step_s": {"median": 0.1, "per_step": [0.1, 0.1]}, "elapsed_s": {"train_s": 0.2, "eval_s": 0.5},
              "cell": {"grid": cell.grid, "profile": cell.profile, "name": cell.name, "row": cell.row.key,
                       "lr": cell.lr},
              "provenance": {"command": cell.command(), "commit": None, "versions": {}, "hardware": {},
                             "wall_time_s": 1.0}}
    path = cell.result_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))


def test_the_confirm_stage_runs_the_sweeps_best_validation_rate(tmp_path):
    row = "rte/senszoq-random-s1e-3"
    sweep = rp.grid_cells("senszoq", "paper", only=row)
    vals = {1e-4: 0.50, 3e-4: 0.52, 1e-3: 0.55, 3e-3: 0.61, 1e-2: 0.61, 3e-2: 0.58, 1e-1: 0.49}
    for cell in sweep:
        _write(cell, tmp_path, vals[cell.lr])
    rates, missing, beyond = rp.best_rates(sweep, tmp_path)
    assert rates == {("rte", "senszoq-random-s1e-3"): 3e-3} and missing == []      # a tie goes to the smaller
    assert beyond == {}                                                 # the whole grid ran: nothing left out
    confirm = rp.stage_cells("senszoq", "paper", "confirm", only=row, results=tmp_path)
    assert [(c.lr, c.seed, c.stage) for c in confirm] == [(3e-3, 0, "confirm"), (3e-3, 1, "confirm"),
                                                          (3e-3, 2, "confirm")]
    assert confirm[0].result_path(tmp_path).is_file()            # seed 0 at that rate is the sweep's own cell
    assert confirm[1].command() == ("prge reproduce senszoq --profile paper --only "
                                    "rte/senszoq-random-s1e-3_lr3e-3_seed1 --stage confirm")
    # the confirming seeds do not move the choice: the summary keeps the rate the sweep chose
    for cell, val in zip(confirm[1:], (0.40, 0.42)):
        _write(cell, tmp_path, val)
    record, = rp.summarize("senszoq", tmp_path, "paper")
    assert record["lr"] == 3e-3 and record["n"] == 3
    # a best rate at the edge of its grid is named: the grid did not bracket it
    edge = {("rte", "senszoq-random-s1e-3"): 1e-1}
    assert rp.sweep_edges("senszoq", "paper", edge) == ["rte/senszoq-random-s1e-3: best at the grid's largest "
                                                        "rate 1e-1"]
    assert rp.sweep_edges("senszoq", "paper", rates) == []
    # ... unless the row never trained: then its "best" rate is noise, and "did not train" says so instead
    assert rp.sweep_edges("senszoq", "paper", edge, stalled={("rte", "senszoq-random-s1e-3"): [1e-1]}) == []


def test_a_bracket_is_the_best_rate_between_two_lower_neighbours():
    grid = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
    assert rp.bracket({1e-5: 0.6, 1e-4: 0.7, 1e-3: 0.65}, grid) == rp.Bracket(1e-4, 1e-5, 1e-3)
    assert rp.bracket({1e-5: 0.6, 1e-4: 0.7}, grid) is None                # a neighbour has not run
    assert rp.bracket({1e-5: 0.6, 1e-4: 0.7, 1e-3: 0.7}, grid) is None     # a tie: the peak may lie further up
    assert rp.bracket({1e-2: 0.7, 1e-3: 0.6}, grid) is None                # the best at the grid's edge
    assert rp.bracket({1e-6: 0.7, 1e-5: 0.6}, grid) is None
    assert rp.bracket({}, grid) is None
    # the neighbours are the grid's, not the rates that happen to have run
    assert rp.bracket({1e-6: 0.6, 1e-4: 0.7, 1e-2: 0.65}, grid) is None


def test_a_sweep_stops_once_its_best_rate_is_bracketed(tmp_path, capsys):
    """Three rates of a seven-rate row ran, the middle one best, both neighbours lower, the best run off
    zero-shot: the row's rate is chosen, its other four sweep cells are left out (named by --list, refused by
    --only), its confirm seeds start. A best run that stayed at zero-shot brackets nothing (noise has no peak), and
    a late run beyond the bracket that scores higher takes the choice back to waiting."""
    row = "sst2/senszoq-c4-s1e-3"
    key = ("sst2", "senszoq-c4-s1e-3")
    sweep = rp.grid_cells("senszoq", "paper", only=row)
    ran = {1e-5: 0.60, 3e-5: 0.70, 1e-4: 0.65}
    for cell in sweep:
        if cell.lr in ran:
            _write(cell, tmp_path, ran[cell.lr], start=0.55)
    choice = rp.best_rates(sweep, tmp_path)
    assert choice.rates == {key: 3e-5} and choice.missing == []
    found, left_out = choice.beyond[key]
    assert found == rp.Bracket(3e-5, 1e-5, 1e-4)
    assert sorted(c.lr for c in left_out) == [1e-6, 3e-6, 3e-4, 1e-3]
    plan = rp.stage_plan("senszoq", "paper", only=row, results=tmp_path)
    assert sorted(c.lr for c in plan.cells) == sorted(ran) and plan.beyond == {key: choice.beyond[key]}
    confirm = rp.stage_cells("senszoq", "paper", "confirm", only=row, results=tmp_path)
    assert [(c.lr, c.seed) for c in confirm] == [(3e-5, 0), (3e-5, 1), (3e-5, 2)]
    assert len(rp.confirm_estimate_cells("senszoq", "paper", results=tmp_path)) == 36
    record, = rp.summarize("senszoq", tmp_path, "paper")
    assert record["lr"] == 3e-5 and record["lrs_bracket"] == [1e-5, 1e-4]
    assert rp.lr_note(record) == ("lr 3e-5 chosen on validation from {1e-5, 3e-5, 1e-4} ({1e-6, 3e-6, 3e-4, "
                                  "1e-3} of its grid not run: 1e-5 and 1e-4 scored lower, which brackets its best "
                                  "rate)")
    roots = ["--results-dir", str(tmp_path), "--checkpoint-root", str(tmp_path / "ck")]
    assert main(["reproduce", "senszoq", "--profile", "paper", "--only", row, "--list", *roots]) == 0
    assert ("not needed: sst2/senszoq-c4-s1e-3: lr 3e-5 is bracketed by 1e-5 and 1e-4, both lower on validation, "
            "so its sweep leaves out 1e-6, 3e-6, 3e-4, 1e-3") in capsys.readouterr().out
    assert main(["reproduce", "senszoq", "--profile", "paper", "--only", f"{row}_lr1e-3", "--list", *roots]) == 2
    assert "every sweep cell that --only 'sst2/senszoq-c4-s1e-3_lr1e-3' selects is no longer needed" in \
        capsys.readouterr().err
    # the best run stayed within a standard error of step 0: no peak, the row waits for its whole grid
    for cell in sweep:
        if cell.lr in ran:
            _write(cell, tmp_path, ran[cell.lr], start=0.69)
    choice = rp.best_rates(sweep, tmp_path)
    assert choice.rates == {} and choice.beyond == {} and len(choice.missing) == 4
    record, = rp.summarize("senszoq", tmp_path, "paper")
    assert record["lrs_bracket"] == [] and "of its grid still to run" in rp.lr_note(record)
    # trained again, and a run beyond the bracket (one that was under way) beats it: the best is at the grid's
    # edge now, bracketed by nothing, and the row waits for the rest
    for cell in sweep:
        if cell.lr in ran:
            _write(cell, tmp_path, ran[cell.lr], start=0.55)
    _write(next(c for c in sweep if c.lr == 1e-3), tmp_path, 0.8, start=0.55)
    choice = rp.best_rates(sweep, tmp_path)
    assert choice.rates == {} and sorted(c.lr for c in choice.missing) == [1e-6, 3e-6, 3e-4]
    # a one-stage grid runs its whole grid: nothing is left out of it
    assert rp.stage_plan("table1", "paper", only="sst2/prge-q4", results=tmp_path).beyond == {}


def test_the_sweep_runs_the_likeliest_rates_first_and_leaves_out_what_a_bracket_made_unneeded(tmp_path, capsys,
                                                                                               monkeypatch):
    """Nothing run yet: the sweep starts at the middle of the row's grid and works outward; once the results so far
    bracket the best rate, the runner leaves the rest out, saying why, and the command ends with nothing left to run.
    Another task's same row then starts at the rate this one chose."""
    from prge_lib.experiments import runner

    row = "sst2/senszoq-c4-s1e-3"
    vals = {1e-6: 0.56, 3e-6: 0.60, 1e-5: 0.72, 3e-5: 0.70, 1e-4: 0.62, 3e-4: 0.57, 1e-3: 0.56}
    sweep = rp.grid_cells("senszoq", "paper")
    planned = rp.sweep_order(rp.grid_cells("senszoq", "paper", only=row), rp.sweep_runs(sweep, tmp_path))
    assert [c.lr for c in planned] == [3e-5, 1e-5, 1e-4, 3e-6, 3e-4, 1e-6, 1e-3]
    ran = []

    def fake_run(cell, results, checkpoints, progress=True, **kw):
        ran.append(cell.lr)
        _write(cell, results, vals[cell.lr], start=0.55)
        return cell.result_path(results)

    monkeypatch.setattr(runner, "run_cell", fake_run)
    roots = ["--results-dir", str(tmp_path), "--checkpoint-root", str(tmp_path / "ck")]
    assert main(["reproduce", "senszoq", "--profile", "paper", "--only", row, *roots]) == 0
    # 3e-5, then its neighbours; 1e-5 best, so its other neighbour 3e-6; then 1e-5 is bracketed
    assert ran == [3e-5, 1e-5, 1e-4, 3e-6]
    err = capsys.readouterr().err
    assert err.count("not needed: sst2/senszoq-c4-s1e-3: lr 1e-5 is bracketed by 3e-6 and 3e-5") == 3
    assert rp.best_rates(sweep, tmp_path).rates[("sst2", "senszoq-c4-s1e-3")] == 1e-5
    rte = rp.sweep_order(rp.grid_cells("senszoq", "paper", only="rte/senszoq-c4-s1e-3"), rp.sweep_runs(sweep, tmp_path))
    assert [c.lr for c in rte[:3]] == [1e-5, 3e-6, 3e-5]
    # a row that stalled on SST-2 (its whole grid ran, none left zero-shot) chose noise: RTE starts at the middle
    for cell in rp.grid_cells("senszoq", "paper", only=row):
        _write(cell, tmp_path, 0.56, start=0.56)
    rte = rp.sweep_order(rp.grid_cells("senszoq", "paper", only="rte/senszoq-c4-s1e-3"), rp.sweep_runs(sweep, tmp_path))
    assert rp.best_rates(sweep, tmp_path).rates[("sst2", "senszoq-c4-s1e-3")] == 1e-6
    assert [c.lr for c in rte[:3]] == [3e-5, 1e-5, 1e-4]


def test_the_confirm_stage_is_refused_before_the_sweep_has_results(tmp_path, capsys):
    with pytest.raises(rp.SweepNotDone, match=r"waits for its sweep: 126 of 126 sweep cells have no result"):
        rp.stage_cells("senszoq", "paper", "confirm", results=tmp_path)
    sweep = rp.grid_cells("senszoq", "paper", only="sst2/senszoq-c4-s1e-3")
    for cell in sweep[:-1]:                                        # all but one rate of one row
        _write(cell, tmp_path, 0.6)
    with pytest.raises(rp.SweepNotDone, match=r": 1 of 126 sweep cells .*sst2/senszoq-c4-s1e-3_lr1e-3_seed0"):
        rp.stage_cells("senszoq", "paper", "confirm", only="sst2/senszoq-c4-s1e-3", results=tmp_path)
    roots = ["--results-dir", str(tmp_path), "--checkpoint-root", str(tmp_path / "ck")]
    assert main(["reproduce", "senszoq", "--profile", "paper", "--stage", "confirm", *roots]) == 2
    assert "the confirm stage of 'senszoq' waits for its sweep" in capsys.readouterr().err
    assert main(["reproduce", "senszoq", "--profile", "paper", "--stage", "confirm", "--list", *roots]) == 0
    out = capsys.readouterr().out
    assert "waits for its sweep" in out and "36 cells beyond the sweep's own" in out
    assert main(["reproduce", "senszoq", "--profile", "paper", "--only", "sst2/senszoq-c4-s1e-3", "--list",
                 *roots]) == 0
    out = capsys.readouterr().out
    assert "6/7 done" in out and "then --stage confirm, which waits for this sweep: 36 cells" in out
    assert "0/36 done" in out
    assert out.count("seconds per step ") == 1          # the confirm totals do not repeat the sweep's basis
    # the row's sweep complete (its best rate the last) and one confirm seed run there: the overview counts it
    _write(sweep[-1], tmp_path, 0.7)
    confirm = rp.stage_cells("senszoq", "paper", "confirm", only="sst2/senszoq-c4-s1e-3", results=tmp_path)
    assert {c.lr for c in confirm} == {sweep[-1].lr} and len(confirm) == 3
    _write(next(c for c in confirm if c.seed != sweep[-1].seed), tmp_path, 0.65)
    estimate = rp.confirm_estimate_cells("senszoq", "paper", results=tmp_path)
    assert len(estimate) == 36 and sum(c.result_path(tmp_path).is_file() for c in estimate) == 1
    assert main(["reproduce", "senszoq", "--profile", "paper", "--list", *roots]) == 0
    assert "36 cells beyond the sweep's own (each row's confirm seeds at its best rate); 1/36 done" in \
        capsys.readouterr().out
    assert main(["reproduce", "table1", "--stage", "confirm", "--list", *roots]) == 2
    assert "grid 'table1' has two-stage rows only under the profile paper, not 'cpu'" in capsys.readouterr().err
    assert main(["reproduce", "peft", "--profile", "paper", "--stage", "confirm", "--list", *roots]) == 2
    assert "grid 'peft' has one stage; the grids with two-stage rows are ['table1', 'senszoq']" in \
        capsys.readouterr().err


def test_table1s_mezo_full_sweeps_then_confirms_while_its_other_rows_run_every_cell(tmp_path, capsys):
    """Table 1 on the paper profile mixes the stages: MeZO (Full) sweeps its rates at one seed, stops once its best
    is bracketed and confirms three seeds there; the ZO LoRA-FA rows beside it run every rate at every seed,
    whatever their results, and choose their rate on the mean validation score of all of them."""
    mezo = rp.grid_cells("table1", "paper", only="sst2/mezo-E16")
    assert {c.seed for c in mezo} == {0} and len(mezo) == 6
    assert {r.key for r in rp.staged_rows("table1", "paper")} == {"mezo-E16"} and not rp.staged_rows("table1", "cpu")
    ran = {1e-6: 0.60, 5e-6: 0.70, 1e-5: 0.65}
    for cell in mezo:
        if cell.lr in ran:
            _write(cell, tmp_path, ran[cell.lr], start=0.55)
    # the ZO LoRA-FA row's seed 0 alone brackets 1e-4, but it is no two-stage row: nothing of it is left out
    q4 = rp.grid_cells("table1", "paper", only="sst2/prge-q4")
    for cell in q4:
        if cell.seed == 0 and cell.lr in (5e-5, 1e-4, 5e-4):
            _write(cell, tmp_path, {5e-5: 0.60, 1e-4: 0.70, 5e-4: 0.65}[cell.lr], start=0.55)
    plan = rp.stage_plan("table1", "paper", only="sst2/mezo-E16|sst2/prge-q4", results=tmp_path)
    assert list(plan.beyond) == [("sst2", "mezo-E16")]
    assert sorted(c.lr for c in plan.cells if c.row.key == "mezo-E16") == sorted(ran)
    assert [c.name for c in plan.cells if c.row.key == "prge-q4-E16"] == [c.name for c in q4]   # all, in order
    ordered = rp.sweep_order(plan.cells, rp.read_sweep("table1", "paper", results=tmp_path).runs)
    assert [c.name for c in ordered if c.row.key == "prge-q4-E16"] == [c.name for c in q4]
    skip = rp.sweep_skip(rp.grid_cells("table1", "paper"), tmp_path)
    assert skip(next(c for c in mezo if c.lr == 5e-5)).startswith("not needed: sst2/mezo-E16: lr 5e-6 is bracketed")
    assert all(skip(c) is None for c in q4)
    confirm = rp.stage_cells("table1", "paper", "confirm", only="sst2/", results=tmp_path)
    assert [(c.row.key, c.lr, c.seed) for c in confirm] == [("mezo-E16", 5e-6, s) for s in (0, 1, 2)]
    assert confirm[1].command() == ("prge reproduce table1 --profile paper --only sst2/mezo-E16_lr5e-6_seed1 "
                                    "--stage confirm")
    # confirming seeds that score low at the chosen rate do not move it; the ZO LoRA-FA row's choice is the mean
    # over its seeds: seed 1 at 5e-4 lifts that rate past 1e-4
    for cell, val in zip(confirm[1:], (0.50, 0.52)):
        _write(cell, tmp_path, val, start=0.55)
    _write(next(c for c in q4 if c.seed == 1 and c.lr == 5e-4), tmp_path, 0.90, start=0.55)
    records = {r["row"]: r for r in rp.summarize("table1", tmp_path, "paper")}
    assert records["mezo-E16"]["lr"] == 5e-6 and records["mezo-E16"]["n"] == 3
    assert records["mezo-E16"]["lrs_bracket"] == [1e-6, 1e-5] and records["prge-q4-E16"]["lrs_bracket"] == []
    assert records["prge-q4-E16"]["lr"] == 5e-4 and records["prge-q4-E16"]["n"] == 2
    roots = ["--results-dir", str(tmp_path), "--checkpoint-root", str(tmp_path / "ck")]
    assert main(["reproduce", "table1", "--profile", "paper", "--only", "sst2/", "--list", *roots]) == 0
    out = capsys.readouterr().out
    assert "not needed: sst2/mezo-E16: lr 5e-6 is bracketed by 1e-6 and 1e-5" in out
    assert "then --stage confirm, which waits for this sweep: 12 cells beyond the sweep's own" in out
    assert "not bracketed" not in out and "did not train" not in out


def test_the_confirm_stage_runs_the_rows_whose_sweep_is_done_and_names_the_others(tmp_path, capsys,
                                                                                  monkeypatch):
    """One row's sweep complete: the confirm stage is that row's seeds at its best rate, whatever else sweeps; the
    rows still sweeping are named with what they wait for, and a run that did all it could says they wait."""
    roots = ["--results-dir", str(tmp_path), "--checkpoint-root", str(tmp_path / "ck")]
    sweep = rp.grid_cells("senszoq", "paper", only="sst2/senszoq-c4-s1e-3")
    for cell, val in zip(sweep, (0.6, 0.7, 0.65, 0.6, 0.62, 0.61, 0.6)):
        _write(cell, tmp_path, val)
    confirm = rp.stage_cells("senszoq", "paper", "confirm", results=tmp_path)
    assert {(c.task, c.row.key, c.lr) for c in confirm} == {("sst2", "senszoq-c4-s1e-3", sweep[1].lr)}
    waiting = rp.confirm_waiting("senszoq", "paper", results=tmp_path)
    rows = len(rp.GRIDS["senszoq"]["tasks"]) * len(rp.GRIDS["senszoq"]["rows"])
    assert len(waiting) == rows - 1 and ("sst2", "senszoq-c4-s1e-3") not in waiting
    assert all(missing for missing in waiting.values())
    assert rp.confirm_waiting("senszoq", "paper", only="sst2/senszoq-c4-s1e-3", results=tmp_path) == {}
    # the plan the CLI runs from gives both at once, from one reading of each sweep result
    reads = []
    monkeypatch.setattr("prge_lib.experiments.stages.read_result", lambda path: reads.append(path) or
                        rp.read_result(path))
    plan = rp.stage_plan("senszoq", "paper", "confirm", results=tmp_path)
    assert plan.cells == confirm and plan.waiting == waiting
    assert sorted(reads) == sorted(c.result_path(tmp_path) for c in sweep)
    assert main(["reproduce", "senszoq", "--profile", "paper", "--stage", "confirm", "--list", *roots]) == 0
    out = capsys.readouterr().out
    assert f"{sum(c.result_path(tmp_path).is_file() for c in confirm)}/{len(confirm)} done" in out
    assert out.count("waits for its sweep: ") == rows - 1
    assert "waits for its sweep: sst2/senszoq-random-s1e-3 (7 sweep cells without a result, e.g. " \
           "sst2/senszoq-random-s1e-3_lr" in out
    assert "the whole confirm stage (a row still sweeping priced at a stand-in rate): 36 cells" in out
    # the ready row's confirm seeds all run: the stage did what it could, and says that the others wait
    for cell in confirm:
        if not cell.result_path(tmp_path).is_file():
            _write(cell, tmp_path, 0.66)
    assert main(["reproduce", "senszoq", "--profile", "paper", "--stage", "confirm", *roots]) == EXIT_CELLS_LEFT
    err = capsys.readouterr().err
    assert f"{rows - 1} rows wait for their sweep (exit status {EXIT_CELLS_LEFT})" in err
    assert main(["reproduce", "senszoq", "--profile", "paper", "--stage", "confirm", "--only",
                 "sst2/senszoq-c4-s1e-3", *roots]) == 0


def test_list_prices_another_device_from_its_results_or_says_it_cannot(tmp_path, capsys):
    cells = rp.grid_cells("table1", "paper", only="sst2/prge-q4-E16_lr1e-3", device="cuda")
    roots = ["--results-dir", str(tmp_path), "--checkpoint-root", str(tmp_path / "ck")]
    listing = rp.list_cells(cells, tmp_path, tmp_path / "ck")
    assert f"cells on cuda priced from {rp.DEVICE_ASSUMPTION}" in listing
    cpu_left = sum(rp.estimate_seconds(c, c.steps()) for c in cells)
    # one solo result on cuda: a step at a tenth of its CPU price
    done = rp.grid_cells("table1", "cpu", only="sst2/prge-q4-E16_lr1e-3_seed0")[0]
    _write(done, tmp_path, 0.7, device="cuda")
    result = json.loads(done.result_path(tmp_path).read_text())
    result["step_s"]["median"] = 0.1 * rp.step_seconds("sst2", done.config())
    done.result_path(tmp_path).write_text(json.dumps(result))
    shares = rp.device_shares("cuda", tmp_path)
    assert shares["steps"]["prge"] == pytest.approx(0.1) and shares["any"] == pytest.approx(0.1)
    listing = rp.list_cells(cells, tmp_path, tmp_path / "ck")
    assert "cells on cuda priced from 1 solo training results on cuda (prge)" in listing
    assert main(["reproduce", "table1", "--profile", "paper", "--device", "cuda", "--only",
                 "sst2/prge-q4-E16_lr1e-3", "--pack", "8", "--list", *roots]) == 0
    out = capsys.readouterr().out
    assert out.count("packed ×5 (pack 1)") == 5                   # SST-2's five seeds in one pack
    amount, unit = out.split("about ")[1].split()[:2]                   # "about 57 min left" or "about 1.2 h left"
    hours = float(amount) / (60 if unit == "min" else 1)
    assert unit in ("min", "h") and hours < 0.2 * cpu_left / 3600


def test_list_says_which_rows_the_time_left_goes_to(tmp_path):
    cells = rp.grid_cells("table1", "paper", only="sst2", device="cuda")
    listing = rp.list_cells(cells, tmp_path, tmp_path / "ck", pack=8, totals_only=True)
    line, = [line for line in listing.splitlines() if line.startswith("left by row: ")]
    priced = rp.price_cells(cells, tmp_path, tmp_path / "ck", 8)["seconds"]
    rows = {key: sum(s for c, s in zip(cells, priced) if c.row.key == key) for key in {c.row.key for c in cells}}
    named = [item.split(" ")[0] for item in line.removeprefix("left by row: ").split(", ")]
    assert named == sorted((k for k in rows if rows[k]), key=lambda k: -rows[k])    # largest first
    one_row = rp.grid_cells("table1", "paper", only="sst2/prge-q4", device="cuda")
    assert "left by row" not in rp.list_cells(one_row, tmp_path, tmp_path / "ck", pack=8)


def test_a_gpu_pack_is_priced_against_the_step_its_solo_gpu_runs_took(tmp_path):
    """Without a packed result, a GPU pack is priced from the engine benchmark against the configuration the
    device's solo runs stepped like: its eager per-layer step where solo per-layer fp32 LoRA-FA results exist
    (the first GPU runs), else its optimised run, times the solo results' median share."""
    # two solo results on cuda: P-RGE on the per-layer step at a tenth of its CPU price, and on the fused step at
    # a fiftieth
    for seed, engine, share in ((0, None, 0.1), (1, "fused", 0.02)):
        done = rp.grid_cells("table1", "cpu", only=f"sst2/prge-q4-E16_lr1e-3_seed{seed}")[0]
        _write(done, tmp_path / "res", 0.7, device="cuda")
        result = json.loads(done.result_path(tmp_path / "res").read_text())
        result["config"]["engine"] = engine
        result["step_s"]["median"] = share * rp.step_seconds("sst2", done.config())
        done.result_path(tmp_path / "res").write_text(json.dumps(result))
    shares = rp.device_shares("cuda", tmp_path / "res")
    assert shares["layerwise"] == pytest.approx(0.1) and shares["any"] == pytest.approx(0.06)
    # the engine benchmark: eager 5 run-steps/s, one optimised run 50, a pack of 8 100
    bench = {"kind": "engine-bench", "device": "NVIDIA H200", "provenance": {"finished_at": "2026-12-01T00:00:00+0000"},
             "tasks": {"sst2": {"configs": {name: {"runs": runs, "run_steps_per_s": rate, "width_groups": 1}
                                            for name, runs, rate in (("eager", 1, 5.0), ("optimised", 1, 50.0),
                                                                     ("packed-8", 8, 100.0))}}}}
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "engine_bench_sst2.json").write_text(json.dumps(bench))
    assert rp.bench_pack_shares("cuda", 8, tmp_path / "bench", reference="eager") == pytest.approx([0.05])
    share, how, basis = rp.pack_step_share("cuda", tmp_path / "res", runs=8, benches=tmp_path / "bench")
    assert share == pytest.approx(0.05 * 0.1) and "0.05 of the eager per-layer step's" in how and basis == "eager"
    # with no per-layer solo result the optimised run prices it, times the median share of every solo result
    share, how, basis = rp.pack_step_share("cuda", tmp_path / "res", runs=8, benches=tmp_path / "bench",
                                           solo={**shares, "layerwise": None})
    assert share == pytest.approx(0.5 * 0.06) and "0.5 of an optimised run's step" in how and basis == "optimised"


@pytest.mark.parametrize("row", ["mezo-lora-r8-nf4", "prge-q4-E16-nf4", "senszoq-random-s1e-3"])
def test_a_step_of_each_new_senszoq_row_runs_on_an_nf4_base(row, fixture_data, tiny_folder, tmp_path, monkeypatch):
    """The like-for-like baselines load their base in NF4 (bitsandbytes, on the CPU here) and train one step
    through the runner, as the grid's cell would; the SensZOQ rows quantize their own base the same way."""
    import bitsandbytes as bnb

    from prge_lib.training import trainer

    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    loaded, real_load = [], trainer.load_model

    def spy(*args, **kwargs):
        model, tokenizer = real_load(*args, **kwargs)
        loaded.append(sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules()))
        return model, tokenizer

    monkeypatch.setattr(trainer, "load_model", spy)
    cell = rp.grid_cells("senszoq", "cpu", only=f"sst2/{row}_", model=str(tiny_folder), steps=1, eval_every=1,
                         n_train=16, n_val=8, n_test=8)[0]
    path = rp.run_cell(cell, tmp_path / "res", tmp_path / "ck", progress=False)
    result = json.loads(path.read_text())
    assert result["status"] == "finished" and result["steps"] == 1 and result["config"]["quant"] == "nf4"
    assert all(map(lambda x: x == x, result["losses"]))               # a finite loss (not NaN)
    # the baselines load every projection of both layers as a bitsandbytes 4-bit layer; SensZOQ loads its base
    # unquantized and quantizes what it does not train itself (prge_lib.models.quant, the same NF4)
    assert loaded == [0 if row.startswith("senszoq") else 2 * 7]
    assert result["trainable_parameters"] > 0


def test_the_wikitext_curves_cell_stops_at_the_deadline_and_resumes_to_the_same_curves(tiny_folder, tmp_path):
    """fig1 at the paper profile outlasts a GPU command: the cell stops at the deadline with a checkpoint (after
    one step here, each time) and the same call resumes it, until its curves are those of one uninterrupted run,
    loss for loss. The running method's state is a seed checkpoint where it can be rebuilt (MeZO (Full), P-RGE:
    no weights saved), MeBP's its tensors and Adam's state; --list reads the checkpoint's step."""
    import torch

    from prge_lib.training.trainer import TrainingStopped

    steps = {"mebp": 2, "mezo": 3, "prge": 2}
    cell, = rp.grid_cells("fig1", "cpu", model=str(tiny_folder), lm_steps=steps, n_held=2, seq_len=16,
                          eval_every={"mebp": 1, "mezo": 2, "prge": 1})
    whole = rp.read_result(rp.run_cell(cell, tmp_path / "whole", tmp_path / "ck0", progress=False))
    checkpoint = cell.checkpoint_dir(tmp_path / "ck") / "checkpoint.pt"
    kinds, stops = set(), 0
    while True:
        try:
            path = rp.run_cell(cell, tmp_path / "res", tmp_path / "ck", progress=False, deadline=0.0)
            break
        except TrainingStopped as stop:
            stops += 1
            saved = torch.load(checkpoint, weights_only=True)
            kinds.add((saved["method"]["name"], next(iter(saved["method"]["state"]))))
            assert stop.step == saved["step"] and stop.steps == 7
            assert rp.cell_status(cell, tmp_path / "res", tmp_path / "ck") == {"state": "partial",
                                                                               "step": saved["step"], "steps": 7}
    assert stops == 4            # one stop after each step that is not a method's last: 1 + 2 + 1
    assert rp.estimate_seconds(cell, 7) == pytest.approx(2 * rp.estimate_seconds(cell, 3.5))   # priced by what is left
    assert kinds == {("mebp", "trainable"), ("mezo", "replay"), ("prge", "replay")}
    resumed = rp.read_result(path)
    for name, run in whole["runs"].items():
        again = resumed["runs"][name]
        assert again["losses"] == run["losses"], name
        assert [e[:1] + e[2:] for e in again["evals"]] == [e[:1] + e[2:] for e in run["evals"]], name
        assert len(again["seconds"]) == steps[name]
    assert set(resumed["runs"]["mebp"]["phases"]) == set(whole["runs"]["mebp"]["phases"])
    assert not checkpoint.exists()                         # removed with the result
    # a checkpoint of other curves is refused, naming what differs
    other, = rp.grid_cells("fig1", "cpu", model=str(tiny_folder), lm_steps=steps, n_held=3, seq_len=16)
    with pytest.raises(TrainingStopped):
        rp.run_cell(other, tmp_path / "res2", tmp_path / "ck2", progress=False, deadline=0.0)
    saved = torch.load(other.checkpoint_dir(tmp_path / "ck2") / "checkpoint.pt", weights_only=True)
    saved["config"]["n_held"] = 4
    torch.save(saved, other.checkpoint_dir(tmp_path / "ck2") / "checkpoint.pt")
    with pytest.raises(ValueError, match=r"made with other settings \(n_held\)"):
        rp.run_cell(other, tmp_path / "res2", tmp_path / "ck2", progress=False)


def test_the_wikitext_curves_cell_writes_every_methods_losses_and_step_times(tiny_folder, tmp_path, capsys):
    """The fig1 cell (chapter 9's Fig. 1) on the tiny model: one result file with each method's per-step losses
    and seconds and its held-out evaluations, schema-checked, with the command that makes it again."""
    steps = {"mebp": 2, "mezo": 3, "prge": 2}
    cell, = rp.grid_cells("fig1", "cpu", model=str(tiny_folder), lm_steps=steps, n_held=2, seq_len=16)
    assert cell.kind == "lm" and rp.grid_cells("fig1", "paper")[0].config()["lm_steps"] == \
        {"mebp": 500, "mezo": 5000, "prge": 5000}
    path = rp.run_cell(cell, tmp_path / "res", tmp_path / "ck", progress=False)
    result = rp.read_result(path)
    assert {m: len(run["losses"]) for m, run in result["runs"].items()} == steps
    assert all(len(run["seconds"]) == steps[m] and run["evals"][-1][0] == steps[m]
               for m, run in result["runs"].items())
    assert rp.cell_matches(cell, result) == [] and result["provenance"]["command"].startswith(
        "prge reproduce fig1 --profile cpu --only wikitext2/lm-curves_seed0")
    # --list prices it from a committed cpu cell, or says it has none
    assert "WikiText-2 curves priced from" in rp.list_cells([cell], tmp_path / "none", tmp_path / "ck")
    import jsonschema

    with pytest.raises(jsonschema.ValidationError):
        rp.validate_result(dict(result, runs={}))              # a curves result with no run is refused


def test_a_row_whose_sweep_never_left_zero_shot_is_named_not_confirmed_silently(tmp_path):
    """``--list`` names a (task, row) whose every sweep run stayed at zero-shot (best validation within one standard
    error of step 0): its "best" rate is noise. One run that moved takes the row off the list; a run without a
    step-0 evaluation says nothing either way; rows without results are not named."""
    def run(cell, start, best):
        _write(cell, tmp_path, best)
        path = cell.result_path(tmp_path)
        result = json.loads(path.read_text())
        result["evals"] = [{"step": 0, "val": start, "test": 0.5}, result["evals"][0]]
        result["data_sizes"] = {"val": 500}
        path.write_text(json.dumps(result))

    sweep = rp.grid_cells("senszoq", "paper", only="rte/senszoq-random-s1e-3|rte/senszoq-largest-s1e-3")
    random_cells = [c for c in sweep if c.row.key == "senszoq-random-s1e-3"]
    largest = [c for c in sweep if c.row.key == "senszoq-largest-s1e-3"]
    for cell in random_cells[:3]:
        run(cell, 0.53, 0.55)               # 2 points up; one standard error at 500 examples is 2.2 points
    run(largest[0], 0.53, 0.55)
    run(largest[1], 0.53, 0.60)             # 7 points up: this row trained
    rows = rp.untrained_rows(sweep, tmp_path)
    assert rows == ["rte/senszoq-random-s1e-3: no run so far, at 1e-4, 3e-4, 1e-3, left zero-shot (4 of its sweep "
                    "cells still to run)"]
    for cell in random_cells[3:]:           # the whole sweep ran, still at zero-shot: its confirm seeds test that
        run(cell, 0.53, 0.54)
    assert rp.untrained_rows(sweep, tmp_path) == [
        "rte/senszoq-random-s1e-3: no run at 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1 left zero-shot: its best "
        "validation score is noise, so its confirm seeds test whether the row trains at all, not its rate"]
    _write(random_cells[3], tmp_path, 0.9)  # no step-0 evaluation: whether it moved is unknown
    assert rp.untrained_rows(sweep, tmp_path) == []


def test_seeds_beyond_the_plan_are_named_as_a_second_look(tmp_path):
    """A confirm seed the grid does not plan (``--stage confirm --seeds 4``, run after a first test) is named in
    the row's ``added_seeds`` and in summary.md; the planned sweep and confirm seeds are not."""
    sweep = rp.grid_cells("senszoq", "cpu", only="sst2/senszoq-c4-s1e-3")
    for cell in sweep:
        _write(cell, tmp_path, 0.7 if cell.lr == 1e-4 else 0.6)
    planned = rp.stage_cells("senszoq", "cpu", "confirm", only="sst2/senszoq-c4-s1e-3", results=tmp_path)
    extra = rp.stage_cells("senszoq", "cpu", "confirm", seeds=[4], only="sst2/senszoq-c4-s1e-3", results=tmp_path)
    for cell in planned + extra:
        _write(cell, tmp_path, 0.7)
    record = next(r for r in rp.summarize("senszoq", tmp_path) if r["row"] == "senszoq-c4-s1e-3")
    assert record["seeds"] == sorted({0, 4, *rp.CONFIRM_SEEDS["cpu"]})
    assert record["added_seeds"] == [4]
    _, md_path = rp.write_summary("senszoq", tmp_path)
    assert "run after a first look at a comparison (the chapters' tests count the looks): SensZOQ (c4 mask, " \
           "0.1%) on sst2: seed 4." in md_path.read_text()


def _stalled(cell, root, losses, start=0.53, best=0.54):
    """A synthetic result of ``cell`` that stayed at zero-shot (best validation within one standard error of its
    step-0 score at 500 examples) with training ``losses``."""
    _write(cell, root, best, start=start)
    path = cell.result_path(root)
    result = json.loads(path.read_text())
    result.update(losses=losses, steps=len(losses), data_sizes={"val": 500})
    path.write_text(json.dumps(result))


def test_a_row_that_never_trained_adds_the_rates_where_its_training_loss_turns(tmp_path, capsys):
    """The cpu profile runs every other rate of the paper's grid. A row whose whole sweep stayed at zero-shot gets
    the paper's rates between the largest rate whose training loss fell (its last 50 steps below the first 50 of
    the smallest rate) and the smallest whose loss rose: here 3e-2, between 1e-2 (8 -> 4) and 1e-1 (8 -> 23). The
    added cell joins the sweep (its own command, --list says why), the confirm stage waits for it, the summary names
    it; once it has run nothing more lies between, and a row that trained, or one missing a result, adds nothing."""
    key = ("sst2", "senszoq-random-s1e-3")
    sweep = rp.grid_cells("senszoq", "cpu", only="sst2/senszoq-random-s1e-3")
    assert [c.lr for c in sweep] == [1e-4, 1e-3, 1e-2, 1e-1]
    ends = {1e-4: 7.9, 1e-3: 7.0, 1e-2: 4.0, 1e-1: 23.0}
    for cell in sweep[:3]:
        _stalled(cell, tmp_path, [8.0] * 50 + [ends[cell.lr]] * 50)
    assert rp.refined_cells(sweep, tmp_path) == {}                   # 1e-1 has not run: nothing to place yet
    _stalled(sweep[3], tmp_path, [8.0] * 50 + [23.0] * 50)
    (found, extra), = rp.refined_cells(sweep, tmp_path).values()
    assert found == rp.Refinement((3e-2,), 1e-2, 1e-1)
    added, = [cell for cell, record in extra]
    assert (added.lr, added.seed, added.config()["lr"], added.config()["mask"]) == (3e-2, 0, 3e-2, "random")
    assert added.command() == "prge reproduce senszoq --profile cpu --only sst2/senszoq-random-s1e-3_lr3e-2_seed0"
    plan = rp.stage_plan("senszoq", "cpu", only="sst2/senszoq-random-s1e-3", results=tmp_path)
    assert [c.name for c in plan.cells][-1] == added.name and len(plan.cells) == 5
    assert rp.sweep_cells("senszoq", "cpu", only=added.name, results=tmp_path) == [added]
    assert [c.name for c in rp.sweep_cells("senszoq", "cpu", seeds=[1], only="sst2/senszoq-random-s1e-3_lr3e-2",
                                           results=tmp_path)] == ["sst2/senszoq-random-s1e-3_lr3e-2_seed1"]
    assert rp.confirm_waiting("senszoq", "cpu", only="sst2/senszoq-random-s1e-3", results=tmp_path) == \
        {key: [added]}                                               # the confirm stage waits for the added rate
    roots = ["--results-dir", str(tmp_path), "--checkpoint-root", str(tmp_path / "ck")]
    assert main(["reproduce", "senszoq", "--only", "sst2/senszoq-random-s1e-3", "--list", *roots]) == 0
    assert ("added: sst2/senszoq-random-s1e-3: no rate trained; lr 3e-2 added where its training loss turned from "
            "falling to rising (last between 1e-2, whose loss fell, and 1e-1, whose rose)") in capsys.readouterr().out
    # it ran and rose too: no paper rate lies between 1e-2 and 3e-2, so the row's sweep is complete with it
    _stalled(added, tmp_path, [8.0] * 50 + [15.0] * 50, best=0.55)
    (found, extra), = rp.refined_cells(sweep, tmp_path).values()
    assert [cell.name for cell, _ in extra] == [added.name] and extra[0][1] is not None
    assert rp.best_rates(rp.sweep_cells("senszoq", "cpu", results=tmp_path), tmp_path).rates[key] == 3e-2
    record = next(r for r in rp.summarize("senszoq", tmp_path) if r["row"] == key[1])
    assert record["lrs_tried"] == [1e-4, 1e-3, 1e-2, 3e-2, 1e-1]
    assert rp.lr_note(record) == ("lr 3e-2 chosen on validation from {1e-4, 1e-3, 1e-2, 3e-2, 1e-1}, where no rate "
                                  "trained: the choice is the noise of a validation score ({3e-2} added to its grid "
                                  "where its training loss turned from falling to rising)")
    # the paper profile runs every rate: nothing lies between two of its rates
    paper = rp.grid_cells("senszoq", "paper", only="sst2/senszoq-random-s1e-3")
    for cell in paper:
        _stalled(cell, tmp_path, [8.0] * 50 + [4.0 if cell.lr <= 1e-2 else 23.0] * 50)
    assert rp.refined_cells(paper, tmp_path) == {}


def test_the_loss_rule_adds_a_rate_only_between_a_fall_and_a_rise():
    """:func:`stability_rates` on one row's runs: the finer rates between the largest fall below the first rise."""
    cells = {c.lr: c for c in rp.grid_cells("senszoq", "cpu", only="sst2/senszoq-largest-s1e-3")}
    finer = cells[1e-4].row.lrs["paper"]

    def run(end, start=0.53, best=0.54, head=8.0):
        return {"losses": [head] * 50 + [end] * 50, "evals": [{"step": 0, "val": start, "test": 0.5}],
                "best_val": {"step": 10, "val": best, "test": 0.5}, "data_sizes": {"val": 500}, "config": {}}

    row = [(cells[1e-4], run(7.9)), (cells[1e-3], run(6.3)), (cells[1e-2], run(26.0)), (cells[1e-1], run(28.5))]
    assert rp.stability_rates(row, finer) == rp.Refinement((3e-3,), 1e-3, 1e-2)
    # the start is the smallest rate's first 50 steps: a run that blew up at once (head 28) still rose
    row[3] = (cells[1e-1], run(20.0, head=28.0))
    assert rp.stability_rates(row, finer) == rp.Refinement((3e-3,), 1e-3, 1e-2)
    # a fall above the first rise does not move it: the first turn from the smallest rate up decides
    row[3] = (cells[1e-1], run(5.0))
    assert rp.stability_rates(row, finer) == rp.Refinement((3e-3,), 1e-3, 1e-2)
    assert rp.stability_rates([(c, run(4.0)) for c in cells.values()], finer) is None        # no rate rose
    assert rp.stability_rates([(c, run(9.0)) for c in cells.values()], finer) is None        # none fell below a rise
    assert rp.stability_rates(row[:2] + [(cells[1e-2], None)] + row[3:], finer) is None     # a run missing
    trained = [(cells[1e-4], run(7.9)), (cells[1e-3], run(6.3, best=0.60))] + row[2:]       # 7 points up: trained
    assert rp.stability_rates(trained, finer) is None
    assert rp.stability_rates(row, (1e-4, 1e-3, 1e-2, 1e-1)) is None                         # no finer rate between
