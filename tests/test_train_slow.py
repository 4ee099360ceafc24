"""A real P-RGE run on SST-2 with the embedded model (minutes on a CPU: PRGE_SLOW=1 runs it)."""
import pytest

from prge_lib.data import sample_task
from prge_lib.tasks import get_task
from prge_lib.train import TrainConfig, Trainer


@pytest.mark.slow
@pytest.mark.needs_data
def test_prge_improves_sst2_validation_accuracy_over_zero_shot(shared_data):
    """300 steps of P-RGE (q = 4, E = 16, lr 1e-3, ε 1e-2) on 1000 training sentences: validation accuracy
    on 300 held-out sentences must rise by at least 5 points over the zero-shot score (about 50%: the model
    answers " great" almost always). The full run and its curve are in data/results/train/."""
    data = sample_task(get_task("sst2"), seed=0, n_train=1000, n_val=300, n_test=300, root=shared_data)
    config = TrainConfig("sst2", method="prge", q=4, E=16, steps=300, lr=1e-3, eps=1e-2, eval_every=300,
                         checkpoint_every=0)
    result = Trainer(config, data=data, progress=False).run()
    assert result["final"]["val"] >= result["zero_shot_val"] + 0.05, result["evals"]
