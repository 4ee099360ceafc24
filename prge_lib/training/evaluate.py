"""Zero-shot evaluation of any task on any causal LM (chapter 0; reused for every evaluation later).

  * classification: compare the label words' logits at the answer position (Gao et al. §4.1);
  * multiple choice: compare the options' mean log-likelihood per continuation token;
  * SQuAD: greedy generation after "Answer:" up to a newline, F1 / exact match against all gold answers.

Examples are sorted by length before batching so that batches carry little padding; results come back
in the input order.

Several evaluations can share each forward (:func:`zero_shot_many`): every job is batched as it would be alone,
and the k-th batches of all jobs are one forward. With ``rows`` a packed model (``prge_lib.zo.packing.Pack.
each_own``) runs each job's rows through its own adapter, so the runs of a pack are evaluated together
(chapter 5, "On a GPU"); without it the jobs share the one model.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Callable, ContextManager, Sequence

import torch
from tqdm.auto import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList

from prge_lib.data.splits import left_pad
from prge_lib.data.metrics import accuracy, exact_match, f1_score, ranking_auc
from prge_lib.models.objective import tail_logits
from prge_lib.data.tasks import Task, check_single_token

KINDS = ("cls", "mch", "qa")     # classification, multiple choice, generated answers (prge_lib.data.tasks)
# rows(parts) -> the context a merged forward runs in; parts: (job, rows of that job) in batch order
RowsContext = Callable[[list[tuple[int, int]]], ContextManager]


def _length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def _merged_batches(lengths: Sequence[list[int]], batch_sizes: Sequence[int]) -> list[list[tuple[int, list[int]]]]:
    """Each source's examples in the length-sorted batches it has alone; forward k holds the k-th batch of every
    source that has one, as (source, its indices) in source order."""
    alone = [_length_batches(own, size) for own, size in zip(lengths, batch_sizes)]
    return [[(s, batches[k]) for s, batches in enumerate(alone) if k < len(batches)]
            for k in range(max(map(len, alone), default=0))]


def _sizes(batch_size: int | Sequence[int], count: int) -> list[int]:
    sizes = [batch_size] * count if isinstance(batch_size, int) else list(batch_size)
    if len(sizes) != count or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch_size: a whole number ≥ 1, or one per source ({count}); got {batch_size!r}")
    return sizes


def _merged_forwards(sequences: Sequence[list[list[int]]], batch_size: int | Sequence[int], pad_id: int,
                     rows: RowsContext | None, device, desc: str):
    """For each merged batch (:func:`_merged_batches`): its parts, and its rows' token ids and mask, left-padded to
    one width, on ``device``; the consumer's forward runs inside ``rows(parts' row counts)``."""
    merged = _merged_batches([[len(s) for s in own] for own in sequences], _sizes(batch_size, len(sequences)))
    for parts in tqdm(merged, desc=desc, leave=False):
        ids, mask = left_pad([sequences[s][i] for s, batch in parts for i in batch], pad_id)
        with rows([(s, len(batch)) for s, batch in parts]) if rows else contextlib.nullcontext():
            yield parts, ids.to(device), mask.to(device)


def _spans(parts: list[tuple[int, list[int]]]):
    """(source, its indices, its first row in the merged batch) of each part."""
    start = 0
    for s, batch in parts:
        yield s, batch, start
        start += len(batch)


def _encode(tokenizer, text: str, special: bool = True) -> list[int]:
    return tokenizer(text, add_special_tokens=special).input_ids


@torch.no_grad()
def answer_logits_many(model, tokenizer, sources: Sequence[tuple[list[str], list[int]]],
                       batch_size: int | Sequence[int] = 16, desc: str = "answer logits",
                       rows: RowsContext | None = None) -> list[torch.Tensor]:
    """:func:`answer_logits` of several (prompts, token ids) sources, their k-th batches in one forward."""
    encoded = [[_encode(tokenizer, p) for p in prompts] for prompts, _ in sources]
    out = [torch.empty(len(prompts), len(ids)) for prompts, ids in sources]
    for parts, ids, mask in _merged_forwards(encoded, batch_size, tokenizer.pad_token_id, rows, model.device, desc):
        logits = tail_logits(model, ids, mask, 1)[:, -1, :]
        for s, batch, start in _spans(parts):
            out[s][batch] = logits[start:start + len(batch), sources[s][1]].float().cpu()
    return out


def answer_logits(model, tokenizer, prompts: list[str], token_ids: list[int], batch_size: int = 16,
                  desc: str = "answer logits") -> torch.Tensor:
    """Logits of ``token_ids`` at the position after each prompt: a (len(prompts), len(token_ids)) tensor.
    Only the last position's logits are computed (``objective.tail_logits``)."""
    return answer_logits_many(model, tokenizer, [(prompts, token_ids)], batch_size, desc)[0]


@torch.no_grad()
def continuation_logprob_many(model, tokenizer, sources: Sequence[list[tuple[str, str]]],
                              batch_size: int | Sequence[int] = 16, desc: str = "options",
                              rows: RowsContext | None = None) -> list[torch.Tensor]:
    """:func:`continuation_logprob` of several lists of (context, continuation) pairs, their k-th batches in one
    forward."""
    contexts = [[_encode(tokenizer, c) for c, _ in pairs] for pairs in sources]
    conts = [[_encode(tokenizer, x, special=False) for _, x in pairs] for pairs in sources]
    joined = [[a + b for a, b in zip(ctx, cont)] for ctx, cont in zip(contexts, conts)]
    scores = [torch.empty(len(pairs)) for pairs in sources]
    for parts, ids, mask in _merged_forwards(joined, batch_size, tokenizer.pad_token_id, rows, model.device, desc):
        keep = max(len(conts[s][i]) for s, batch in parts for i in batch) + 1
        logits = tail_logits(model, ids, mask, keep).float().log_softmax(-1).cpu()
        for s, batch, start in _spans(parts):
            for row, i in enumerate(batch, start):
                c = len(conts[s][i])
                # logits kept at positions L-keep..L-1; token L-c+j is predicted at position L-c+j-1
                predicted = logits[row, keep - c - 1:keep - 1]
                scores[s][i] = predicted.gather(1, torch.tensor(conts[s][i])[:, None]).mean()
    return scores


def continuation_logprob(model, tokenizer, pairs: list[tuple[str, str]], batch_size: int = 16,
                         desc: str = "options") -> torch.Tensor:
    """Mean log-probability of each continuation given its context (the multiple-choice score)."""
    return continuation_logprob_many(model, tokenizer, [pairs], batch_size, desc)[0]


class _FirstLineDone(StoppingCriteria):
    """Stop a row once its generated text holds a line break after some non-blank text."""

    def __init__(self, tokenizer, prompt_width: int):
        self.tokenizer, self.prompt_width = tokenizer, prompt_width

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width:], skip_special_tokens=True)
        return torch.tensor(["\n" in t.lstrip() for t in texts], device=input_ids.device)


@torch.no_grad()
def generate_answers_many(model, tokenizer, sources: Sequence[list[str]], batch_size: int | Sequence[int] = 8,
                          max_new_tokens: int = 24, desc: str = "generate",
                          rows: RowsContext | None = None) -> list[list[str]]:
    """:func:`generate_answers` of several lists of prompts, their k-th batches generated together (greedy, so a
    row's first line does not depend on the rows beside it, up to float rounding)."""
    encoded = [[_encode(tokenizer, p) for p in prompts] for prompts in sources]
    answers = [[""] * len(prompts) for prompts in sources]
    for parts, ids, mask in _merged_forwards(encoded, batch_size, tokenizer.pad_token_id, rows, model.device, desc):
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             stopping_criteria=StoppingCriteriaList([_FirstLineDone(tokenizer, ids.shape[1])]),
                             pad_token_id=tokenizer.pad_token_id)
        for s, batch, start in _spans(parts):
            for row, i in enumerate(batch, start):
                text = tokenizer.decode(out[row, ids.shape[1]:], skip_special_tokens=True)
                answers[s][i] = text.strip().split("\n")[0].strip()
    return answers


def generate_answers(model, tokenizer, prompts: list[str], batch_size: int = 8, max_new_tokens: int = 24,
                     desc: str = "generate") -> list[str]:
    """Greedy continuations: the first non-empty line (small models often open with a line break)."""
    return generate_answers_many(model, tokenizer, [prompts], batch_size, max_new_tokens, desc)[0]


def _classification(task: Task, logits: torch.Tensor, golds: list) -> tuple[dict, list[int]]:
    predictions = logits.argmax(1).tolist()
    counts = Counter(predictions)
    result = {"prediction_share": {task.label_words[k].strip(): counts.get(k, 0) / len(predictions)
                                   for k in range(logits.shape[1])}}
    if logits.shape[1] == 2:
        result["auc"] = ranking_auc((logits[:, 1] - logits[:, 0]).tolist(), golds)
    result["value"] = accuracy(predictions, golds)
    return result, predictions


def _multiple_choice(options: list[list], scores: list[float], golds: list) -> tuple[dict, list[int]]:
    predictions, start = [], 0
    for opts in options:
        chunk = scores[start:start + len(opts)]
        predictions.append(max(range(len(opts)), key=chunk.__getitem__))
        start += len(opts)
    return {"value": accuracy(predictions, golds)}, predictions


def _answers(predictions: list[str], golds: list) -> tuple[dict, list[str]]:
    return {"value": sum(f1_score(p, g) for p, g in zip(predictions, golds)) / len(golds),
            "exact_match": sum(exact_match(p, g) for p, g in zip(predictions, golds)) / len(golds)}, predictions


def zero_shot_many(jobs: Sequence[tuple[Task, list[dict]]], model, tokenizer, batch_size: int | Sequence[int] = 16,
                   rows: RowsContext | None = None) -> list[dict]:
    """:func:`zero_shot` of each (task, examples) job, the jobs of one kind sharing each forward (module
    docstring); ``batch_size``: one for all jobs or one per job; ``rows(parts)``: the context of a merged forward,
    given (job, rows) in batch order."""
    for task, examples in jobs:
        if not examples:
            raise ValueError(f"task {task.name!r}: no examples to evaluate")
        if task.kind not in KINDS:
            raise ValueError(f"task {task.name!r} is of kind {task.kind!r}; evaluation knows {list(KINDS)}")
    sizes = _sizes(batch_size, len(jobs))
    results: list[dict] = [{} for _ in jobs]
    for kind in KINDS:
        members = [j for j, (task, _) in enumerate(jobs) if task.kind == kind]
        if not members:
            continue
        of_members = (lambda parts: rows([(members[s], n) for s, n in parts])) if rows else None
        desc = ",".join(dict.fromkeys(jobs[j][0].name for j in members))
        if kind == "cls":
            sources = [([jobs[j][0].prompt(ex) for ex in jobs[j][1]], check_single_token(jobs[j][0], tokenizer))
                       for j in members]
            scored = answer_logits_many(model, tokenizer, sources, [sizes[j] for j in members], desc, of_members)
            finish = [_classification(jobs[j][0], logits, [jobs[j][0].gold(ex) for ex in jobs[j][1]])
                      for j, logits in zip(members, scored)]
        elif kind == "mch":
            options = [[jobs[j][0].options(ex) for ex in jobs[j][1]] for j in members]
            flat = [[pair for opts in own for pair in opts] for own in options]
            scored = continuation_logprob_many(model, tokenizer, flat, [sizes[j] for j in members], desc, of_members)
            finish = [_multiple_choice(own, scores.tolist(), [jobs[j][0].gold(ex) for ex in jobs[j][1]])
                      for j, own, scores in zip(members, options, scored)]
        else:
            prompts = [[jobs[j][0].prompt(ex) for ex in jobs[j][1]] for j in members]
            generated = generate_answers_many(model, tokenizer, prompts, [max(1, sizes[j] // 2) for j in members],
                                              desc=desc, rows=of_members)
            finish = [_answers(answers, [jobs[j][0].gold(ex) for ex in jobs[j][1]])
                      for j, answers in zip(members, generated)]
        for j, (result, predictions) in zip(members, finish):
            task = jobs[j][0]
            results[j] = {"task": task.name, "kind": task.kind, "metric": task.metric, "n": len(jobs[j][1]),
                          **result, "predictions": predictions}
    return results


def zero_shot(task: Task, model, tokenizer, examples: list[dict], batch_size: int = 16) -> dict:
    """Evaluate ``task`` on ``examples`` without training. Returns the metric, its value, n, and
    diagnostics: for classification the share of each predicted label word (a model that always says
    " great" scores 50% on SST-2) and, for two labels, the ranking AUC of the logit margin."""
    return zero_shot_many([(task, examples)], model, tokenizer, batch_size)[0]
