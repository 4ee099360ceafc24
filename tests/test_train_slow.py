"""Real P-RGE runs on SST-2 with the embedded model (minutes on a 2-core CPU: PRGE_SLOW=1 runs them)."""
import json
from pathlib import Path

import pytest

from prge_lib.training.trainer import TrainConfig, Trainer

SEED0 = Path(__file__).resolve().parents[1] / "data/results/table1/sst2/prge-q4-E16_lr1e-3_seed0.json"


@pytest.mark.slow
@pytest.mark.needs_data
def test_prge_improves_sst2_over_zero_shot(shared_data):
    """500 steps of P-RGE with the paper's settings (q = 4, E = 16, lr 1e-3, ε 1e-2) on the MeZO protocol's
    1000 training sentences. The zero-shot model answers " great" almost always (test accuracy 51.6%);
    after training the test accuracy (872 GLUE dev sentences) must be at least 3 points higher and the
    validation accuracy higher than at step 0. The same run is data/results/train/sst2_prge_q4_E16.json."""
    config = TrainConfig("sst2", method="prge", q=4, E=16, steps=500, lr=1e-3, eps=1e-2, eval_every=500,
                         checkpoint_every=0)
    result = Trainer(config, progress=False).run()
    zero, final = result["evals"][0], result["final"]
    assert final["val"] > zero["val"], result["evals"]
    assert final["test"] >= zero["test"] + 0.03, result["evals"]


@pytest.mark.slow
@pytest.mark.needs_data
def test_prge_learns_as_fast_as_the_committed_seed(shared_data):
    """Guards the learning speed of the reproduced Table 1 row (chapter 7): 300 steps of seed 0 must reach
    the validation accuracy the committed 1000-step run had at step 300, within 3 points. A run is
    deterministic on a CPU up to the rounding of the thread count; 3 points is about 1.5 standard errors of
    an accuracy near 60% on 500 sentences, far less than what a slower learner loses (the step at lr 1e-3
    with A ~ N(0, 1/r) instead of peft's init, for one, does not learn at all)."""
    committed = json.loads(SEED0.read_text())
    at_300 = next(e["val"] for e in committed["evals"] if e["step"] == 300)
    config = TrainConfig("sst2", method="prge", q=4, E=16, steps=300, lr=1e-3, eps=1e-2, seed=0,
                         eval_every=300, checkpoint_every=0)
    result = Trainer(config, progress=False).run()
    assert result["final"]["val"] >= at_300 - 0.03, (result["final"], at_300)
    assert result["final"]["val"] > result["evals"][0]["val"] + 0.02, result["evals"]
