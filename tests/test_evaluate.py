"""Zero-shot scoring: batched, left-padded, length-sorted results equal one-at-a-time computations."""
import pytest
import torch

from prge_lib.data.splits import sample_task
from prge_lib.training.evaluate import answer_logits, continuation_logprob, zero_shot
from prge_lib.data.tasks import get_task


def test_answer_logits_match_unpadded_single_forwards(embedded):
    model, tok = embedded
    prompts = ["A short one. It was", "This is a much longer review of a film that I saw. It was", "Fine. It was"]
    ids = [tok(" great").input_ids[0], tok(" terrible").input_ids[0]]
    batched = answer_logits(model, tok, prompts, ids, batch_size=3)
    for row, p in enumerate(prompts):
        with torch.no_grad():
            single = model(**tok(p, return_tensors="pt")).logits[0, -1, ids]
        torch.testing.assert_close(batched[row], single, atol=2e-4, rtol=1e-4)


def test_continuation_logprob_matches_a_full_forward(embedded):
    model, tok = embedded
    pairs = [("The cat sat on the", " mat."), ("Paris is the capital of", " France, a country in Europe."),
             ("One two three", " four")]
    scores = continuation_logprob(model, tok, pairs, batch_size=3)
    for (context, cont), score in zip(pairs, scores):
        c_ids, x_ids = tok(context).input_ids, tok(cont, add_special_tokens=False).input_ids
        with torch.no_grad():
            logp = model(input_ids=torch.tensor([c_ids + x_ids])).logits[0].log_softmax(-1)
        expected = torch.stack([logp[len(c_ids) + j - 1, t] for j, t in enumerate(x_ids)]).mean()
        assert score.item() == pytest.approx(expected.item(), abs=1e-4)


@pytest.mark.parametrize("name", ["sst2", "cb", "copa", "winogrande", "squad"])
def test_zero_shot_runs_every_kind_on_fixture_data(name, embedded, fixture_data):
    task = get_task(name)
    examples = sample_task(task, n_train=4, n_val=2, n_test=6, root=fixture_data).test
    result = zero_shot(task, *embedded, examples, batch_size=4)
    assert result["n"] == 6 and len(result["predictions"]) == 6 and 0.0 <= result["value"] <= 1.0
    if task.kind == "cls":
        assert sum(result["prediction_share"].values()) == pytest.approx(1.0)
    if name == "squad":
        assert "exact_match" in result and all(isinstance(p, str) for p in result["predictions"])


def test_zero_shot_refuses_an_empty_set(embedded):
    with pytest.raises(ValueError, match="no examples"):
        zero_shot(get_task("sst2"), *embedded, [])
