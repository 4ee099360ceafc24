"""Zero-shot scoring: batched, left-padded, length-sorted results equal one-at-a-time computations, and the
accuracy of a stand-in model whose answers the test chooses is the one counted by hand."""
from types import SimpleNamespace

import pytest
import torch

from prge_lib.data.metrics import f1_score
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
    assert result["n"] == 6 and len(result["predictions"]) == 6
    golds = [task.gold(ex) for ex in examples]          # the value is that of the predictions, in input order
    if task.kind == "qa":
        assert result["value"] == pytest.approx(sum(map(f1_score, result["predictions"], golds)) / 6)
    else:
        assert result["value"] == sum(p == g for p, g in zip(result["predictions"], golds)) / 6
    if task.kind == "cls":
        assert sum(result["prediction_share"].values()) == pytest.approx(1.0)
    if name == "squad":
        assert "exact_match" in result and all(isinstance(p, str) for p in result["predictions"])


def test_zero_shot_refuses_an_empty_set(embedded):
    with pytest.raises(ValueError, match="no examples"):
        zero_shot(get_task("sst2"), *embedded, [])


class ChosenLM(torch.nn.Module):
    """A stand-in causal LM: at every kept position, logit 4 on the tokens ``favour(row)`` names for the row's
    unpadded ids and 0 elsewhere, so the test knows every answer it gives."""

    def __init__(self, vocab: int, favour):
        super().__init__()
        self.vocab, self.favour, self.device = vocab, favour, torch.device("cpu")

    def forward(self, input_ids, attention_mask, logits_to_keep):
        logits = torch.zeros(input_ids.shape[0], len(logits_to_keep), self.vocab)
        for r, (ids, mask) in enumerate(zip(input_ids.tolist(), attention_mask.tolist())):
            logits[r, :, self.favour([t for t, m in zip(ids, mask) if m])] = 4.0
        return SimpleNamespace(logits=logits)


def single_token(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_classification_accuracy_is_that_of_the_chosen_answers(tokenizer):
    task = get_task("sst2")
    terrible, great = (single_token(tokenizer, w) for w in task.label_words)
    good = single_token(tokenizer, " good")
    model = ChosenLM(len(tokenizer), lambda ids: [great] if good in ids else [terrible])   # " great" iff " good"
    rows = [("a good film .", 1), ("a truly good film , but far too long and slow for anyone to sit through .", 0),
            ("bad .", 0), ("a quiet , patient and moving story that stays with you for days .", 1),
            ("so good .", 1)]
    result = zero_shot(task, model, tokenizer, [{"sentence": s, "label": y} for s, y in rows], batch_size=2)
    assert result["predictions"] == [1, 1, 0, 0, 1]             # in input order, though batched by length
    assert result["value"] == 3 / 5
    assert result["prediction_share"] == {"terrible": 2 / 5, "great": 3 / 5}
    # margins +4, +4, -4, -4, +4 against labels 1, 0, 0, 1, 1: positives {4, -4, 4} over negatives {4, -4}
    # win 1 + 0.5 + 0 + 0.5 + 1 + 0.5 = 3.5 of 6 pairs
    assert result["auc"] == 3.5 / 6


def test_multiple_choice_accuracy_is_that_of_the_chosen_answers(tokenizer):
    task = get_task("copa")
    broke = single_token(tokenizer, " broke")
    assert broke in tokenizer(" it broke.", add_special_tokens=False).input_ids
    model = ChosenLM(len(tokenizer), lambda ids: [broke])       # prefers the option that says " broke"
    rows = [("The glass fell.", "It broke.", "It sang.", 0),
            ("The old vase slipped off the shelf in the night.", "It sang.", "It broke.", 0),
            ("The bird sat on the window.", "It sang loudly all night.", "It broke.", 1),
            ("The plate hit the floor.", "It broke into pieces.", "It sang.", 0)]
    examples = [{"premise": p, "choice1": c1, "choice2": c2, "question": "effect", "label": y}
                for p, c1, c2, y in rows]
    result = zero_shot(task, model, tokenizer, examples, batch_size=3)
    assert result["predictions"] == [0, 1, 1, 0]
    assert result["value"] == 3 / 4


def test_jobs_of_every_kind_evaluated_together_give_their_results_alone(tiny_factory, tokenizer, fixture_data):
    """zero_shot_many: jobs of several tasks and kinds (classification, multiple choice, generation), each batched as
    alone and their k-th batches in one forward, on one model and on a pack of runs (each job its own run's
    adapter, ``Pack.each_own``): every job's predictions and metric are those of the job evaluated alone."""
    from prge_lib.training.evaluate import zero_shot_many
    from prge_lib.zo.defaults import DEFAULT_TARGETS
    from prge_lib.zo.packing import build_pack

    names = ["sst2", "copa", "squad", "rte", "copa"]
    jobs = [(get_task(name), sample_task(get_task(name), k, n_train=4, n_val=5, n_test=2, root=fixture_data).val)
            for k, name in enumerate(names)]
    model = tiny_factory(0, 1)
    together = zero_shot_many(jobs, model, tokenizer, [4, 3, 4, 2, 5])
    for (task, examples), result, size in zip(jobs, together, [4, 3, 4, 2, 5]):
        assert result == zero_shot(task, model, tokenizer, examples, size)
    settings = [{"targets": DEFAULT_TARGETS, "r": 4, "alpha": 8, "noise": "torch", "q": 1, "eps": 1e-2, "lr": 1e-2,
                 "seed": r, "keep_noise": True} for r in range(len(jobs))]
    pack = build_pack(tiny_factory(0, 1), settings, tokenizer.pad_token_id)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for run in pack.runs:
            for layer in run.layers:
                layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=generator))
    together = zero_shot_many(jobs, pack.model, tokenizer, 3, rows=pack.each_own)
    for r, ((task, examples), result) in enumerate(zip(jobs, together)):
        with pack.solo(r):
            alone = zero_shot(task, pack.model, tokenizer, examples, 3)
        assert result["predictions"] == alone["predictions"] and result["value"] == alone["value"], (task.name, r)


def test_evaluating_together_refuses_bad_batch_sizes(embedded):
    from prge_lib.training.evaluate import zero_shot_many

    job = (get_task("sst2"), [{"sentence": "fine", "label": 1}])
    for bad in (0, [4], [4, 0], True):
        with pytest.raises(ValueError, match="batch_size: a whole number ≥ 1, or one per source"):
            zero_shot_many([job, job], *embedded, bad)
