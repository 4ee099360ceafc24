"""A real P-RGE run on SST-2 with the embedded model (about 17 minutes on a 2-core CPU: PRGE_SLOW=1 runs it)."""
import pytest

from prge_lib.train import TrainConfig, Trainer


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
