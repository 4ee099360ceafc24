"""Zero-shot evaluation of any task on any causal LM (chapter 0; reused for every evaluation later).

  * classification: compare the label words' logits at the answer position (Gao et al. §4.1);
  * multiple choice: compare the options' mean log-likelihood per continuation token;
  * SQuAD: greedy generation after "Answer:" up to a newline, F1 / exact match against all gold answers.

Examples are sorted by length before batching so that batches carry little padding; results come back
in the input order.
"""
from __future__ import annotations

from collections import Counter

import torch
from tqdm.auto import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList

from prge_lib.data.splits import left_pad
from prge_lib.data.metrics import accuracy, exact_match, f1_score, ranking_auc
from prge_lib.models.objective import tail_logits
from prge_lib.data.tasks import Task, check_single_token


def _length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def _encode(tokenizer, text: str, special: bool = True) -> list[int]:
    return tokenizer(text, add_special_tokens=special).input_ids


@torch.no_grad()
def answer_logits(model, tokenizer, prompts: list[str], token_ids: list[int], batch_size: int = 16,
                  desc: str = "answer logits") -> torch.Tensor:
    """Logits of ``token_ids`` at the position after each prompt: a (len(prompts), len(token_ids)) tensor.
    Only the last position's logits are computed (``objective.tail_logits``)."""
    encoded = [_encode(tokenizer, p) for p in prompts]
    out = torch.empty(len(prompts), len(token_ids))
    for batch in tqdm(_length_batches([len(e) for e in encoded], batch_size), desc=desc, leave=False):
        ids, mask = left_pad([encoded[i] for i in batch], tokenizer.pad_token_id)
        logits = tail_logits(model, ids.to(model.device), mask.to(model.device), 1)[:, -1, :]
        out[batch] = logits[:, token_ids].float().cpu()
    return out


@torch.no_grad()
def continuation_logprob(model, tokenizer, pairs: list[tuple[str, str]], batch_size: int = 16,
                         desc: str = "options") -> torch.Tensor:
    """Mean log-probability of each continuation given its context (the multiple-choice score)."""
    contexts = [_encode(tokenizer, c) for c, _ in pairs]
    conts = [_encode(tokenizer, x, special=False) for _, x in pairs]
    scores = torch.empty(len(pairs))
    lengths = [len(a) + len(b) for a, b in zip(contexts, conts)]
    for batch in tqdm(_length_batches(lengths, batch_size), desc=desc, leave=False):
        ids, mask = left_pad([contexts[i] + conts[i] for i in batch], tokenizer.pad_token_id)
        keep = max(len(conts[i]) for i in batch) + 1
        logits = tail_logits(model, ids.to(model.device), mask.to(model.device), keep).float().log_softmax(-1).cpu()
        for row, i in enumerate(batch):
            c = len(conts[i])
            # logits kept at positions L-keep..L-1; token L-c+j is predicted at position L-c+j-1
            predicted = logits[row, keep - c - 1:keep - 1]
            scores[i] = predicted.gather(1, torch.tensor(conts[i])[:, None]).mean()
    return scores


class _FirstLineDone(StoppingCriteria):
    """Stop a row once its generated text holds a line break after some non-blank text."""

    def __init__(self, tokenizer, prompt_width: int):
        self.tokenizer, self.prompt_width = tokenizer, prompt_width

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width:], skip_special_tokens=True)
        return torch.tensor(["\n" in t.lstrip() for t in texts], device=input_ids.device)


@torch.no_grad()
def generate_answers(model, tokenizer, prompts: list[str], batch_size: int = 8, max_new_tokens: int = 24,
                     desc: str = "generate") -> list[str]:
    """Greedy continuations: the first non-empty line (small models often open with a line break)."""
    encoded = [_encode(tokenizer, p) for p in prompts]
    answers = [""] * len(prompts)
    for batch in tqdm(_length_batches([len(e) for e in encoded], batch_size), desc=desc, leave=False):
        ids, mask = left_pad([encoded[i] for i in batch], tokenizer.pad_token_id)
        out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                             max_new_tokens=max_new_tokens, do_sample=False,
                             stopping_criteria=StoppingCriteriaList([_FirstLineDone(tokenizer, ids.shape[1])]),
                             pad_token_id=tokenizer.pad_token_id)
        for row, i in enumerate(batch):
            text = tokenizer.decode(out[row, ids.shape[1]:], skip_special_tokens=True)
            answers[i] = text.strip().split("\n")[0].strip()
    return answers


def zero_shot(task: Task, model, tokenizer, examples: list[dict], batch_size: int = 16) -> dict:
    """Evaluate ``task`` on ``examples`` without training. Returns the metric, its value, n, and
    diagnostics: for classification the share of each predicted label word (a model that always says
    " great" scores 50% on SST-2) and, for two labels, the ranking AUC of the logit margin."""
    if not examples:
        raise ValueError(f"task {task.name!r}: no examples to evaluate")
    golds = [task.gold(ex) for ex in examples]
    result = {"task": task.name, "kind": task.kind, "metric": task.metric, "n": len(examples)}
    if task.kind == "cls":
        ids = check_single_token(task, tokenizer)
        logits = answer_logits(model, tokenizer, [task.prompt(ex) for ex in examples], ids, batch_size,
                               desc=task.name)
        predictions = logits.argmax(1).tolist()
        counts = Counter(predictions)
        result["prediction_share"] = {task.label_words[k].strip(): counts.get(k, 0) / len(predictions)
                                      for k in range(len(ids))}
        if len(ids) == 2:
            margin = (logits[:, 1] - logits[:, 0]).tolist()
            result["auc"] = ranking_auc(margin, golds)
        result["value"] = accuracy(predictions, golds)
    elif task.kind == "mch":
        options = [task.options(ex) for ex in examples]
        flat = [pair for opts in options for pair in opts]
        scores = continuation_logprob(model, tokenizer, flat, batch_size, desc=task.name).tolist()
        predictions, start = [], 0
        for opts in options:
            chunk = scores[start:start + len(opts)]
            predictions.append(max(range(len(opts)), key=chunk.__getitem__))
            start += len(opts)
        result["value"] = accuracy(predictions, golds)
    else:
        predictions = generate_answers(model, tokenizer, [task.prompt(ex) for ex in examples],
                                       max(1, batch_size // 2), desc=task.name)
        result["value"] = sum(f1_score(p, g) for p, g in zip(predictions, golds)) / len(golds)
        result["exact_match"] = sum(exact_match(p, g) for p, g in zip(predictions, golds)) / len(golds)
    result["predictions"] = predictions
    return result
