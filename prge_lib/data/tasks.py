"""The 14 tasks of the P-RGE paper: prompt templates (Gao et al. Table 11; CB from Guo et al. Table 11),
label words or candidates, task type and where the data live. Chapter 0 prints one prompt of each.

Three kinds of task:
  * ``cls`` — classification: the prompt is followed by one label word; the answer-token logits of the
    label words decide (zero-shot) and the cross-entropy at that token is the training loss (Gao et al. §4.1).
  * ``mch`` — multiple choice: each option is a (context, continuation) pair; the option whose
    continuation has the highest mean log-likelihood wins.
  * ``qa`` — extractive QA (SQuAD): greedy generation after "Answer:", scored by F1 / exact match.

Templates are written with single spaces and ASCII quotes. Where Gao et al.'s table and the MeZO templates it
says it applied differ (BoolQ's stray "<answer>", WSC's missing "Yes or No?", WiC's order), we follow MeZO,
as Guo et al.'s table does. SQuAD keeps MeZO's line breaks between its fields (a table row cannot show them):
on one line the embedded model answers "A:" (F1 0.7 on 32 test examples), with them it answers (F1 17.5).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

YES_NO = (" Yes", " No")
NO_YES = (" No", " Yes")


@dataclass(frozen=True)
class Task:
    name: str                   # short id used on the command line, e.g. "sst2"
    title: str                  # as printed in the paper's tables, e.g. "SST-2"
    kind: str                   # "cls", "mch" or "qa"
    path: str                   # local layout <hub dataset>/<config>, e.g. "glue/sst2"
    hub: tuple[str, str | None]  # (hub dataset id, config) for ``datasets.load_dataset``
    render: Callable[[dict], str] | None = None          # cls / qa: the prompt before the answer
    label_words: tuple[str, ...] = ()                    # cls: label id -> answer word (with its space)
    options: Callable[[dict], list[tuple[str, str]]] | None = None  # mch: (context, continuation) pairs
    splits: tuple[str, ...] = ("train", "validation")   # splits that exist in the local copy
    metric: str = "accuracy"
    notes: str = field(default="", compare=False)

    def prompt(self, example: dict) -> str:
        if self.render is None:
            raise TypeError(f"task {self.name!r} is multiple choice: use task.options(example)")
        return self.render(example)

    def gold(self, example: dict):
        """The label id (cls), the index of the right option (mch), or the list of gold answers (qa)."""
        if self.kind == "qa":
            return list(example["answers"]["text"])
        field, first = self.label_field()
        return int(example[field]) - first

    def label_field(self) -> tuple[str, int]:
        """The field that holds an example's answer (cls, mch) and the value that stands for the first class."""
        return ("answer", 1) if self.name == "winogrande" else ("label", 0)

    def check_label(self, example: dict) -> None:
        """Raise ValueError when the example's answer is not one of the task's classes (its label words or
        options; for qa: no gold answer), naming the field, its value and the values allowed."""
        if self.kind == "qa":
            if not self.gold(example):
                raise ValueError("answers.text is empty: the example has no gold answer")
            return
        count = len(self.label_words) if self.kind == "cls" else len(self.options(example))
        if not 0 <= self.gold(example) < count:
            field, first = self.label_field()
            words = f" ({', '.join(map(repr, self.label_words))})" if self.kind == "cls" else ""
            raise ValueError(f"{field} {example[field]!r} is not one of the {count} classes of task {self.name!r}; "
                             f"allowed: {', '.join(str(first + i) for i in range(count))}{words}")

    def training_pair(self, example: dict) -> tuple[str, str]:
        """(context, continuation) a training step reads: the prompt and its answer, or the right option."""
        if self.kind == "mch":
            return self.options(example)[self.gold(example)]
        return self.prompt(example), self.target_text(example)

    def target_text(self, example: dict) -> str:
        """The text the model should produce after the prompt (training target; chapter 7)."""
        if self.kind == "cls":
            return self.label_words[self.gold(example)]
        if self.kind == "mch":
            return self.options(example)[self.gold(example)][1]
        return " " + self.gold(example)[0]


def _clean(text: str) -> str:
    return " ".join(text.split())


def _copa_options(ex: dict) -> list[tuple[str, str]]:
    connective = "so" if ex["question"] == "effect" else "because"
    context = f"{_clean(ex['premise']).rstrip('.')} {connective}"
    choices = [_clean(ex["choice1"]), _clean(ex["choice2"])]
    return [(context, " " + c[0].lower() + c[1:]) for c in choices]


def _winogrande_options(ex: dict) -> list[tuple[str, str]]:
    before, after = ex["sentence"].split("_", 1)
    return [(before + ex[f"option{i}"], after) for i in (1, 2)]


TASKS: dict[str, Task] = {t.name: t for t in [
    Task("sst2", "SST-2", "cls", "glue/sst2", ("nyu-mll/glue", "sst2"),
         render=lambda ex: f"{_clean(ex['sentence'])} It was", label_words=(" terrible", " great")),
    Task("rte", "RTE", "cls", "glue/rte", ("nyu-mll/glue", "rte"),
         render=lambda ex: f"{_clean(ex['sentence1'])} Does this mean that \"{_clean(ex['sentence2'])}\" is true? "
                           "Yes or No?",
         label_words=YES_NO),  # label 0 = entailment
    Task("mrpc", "MRPC", "cls", "glue/mrpc", ("nyu-mll/glue", "mrpc"),
         render=lambda ex: "Do the following two sentences mean the same thing? Yes or No? "
                           f"Sentence 1: {_clean(ex['sentence1'])} Sentence 2: {_clean(ex['sentence2'])}",
         label_words=NO_YES),  # label 1 = equivalent
    Task("qqp", "QQP", "cls", "glue/qqp", ("nyu-mll/glue", "qqp"),
         render=lambda ex: "Are these two questions asking the same thing? Yes or No? "
                           f"Question 1: {_clean(ex['question1'])} Question 2: {_clean(ex['question2'])}",
         label_words=NO_YES),  # label 1 = duplicate
    Task("qnli", "QNLI", "cls", "glue/qnli", ("nyu-mll/glue", "qnli"),
         render=lambda ex: "Does this sentence answer the question? Yes or No? "
                           f"Sentence 1: {_clean(ex['question'])} Sentence 2: {_clean(ex['sentence'])}",
         label_words=YES_NO),  # label 0 = entailment (the sentence answers)
    Task("wnli", "WNLI", "cls", "glue/wnli", ("nyu-mll/glue", "wnli"),
         render=lambda ex: "Given the first sentence, is the second sentence true? Yes or No? "
                           f"Sentence 1: {_clean(ex['sentence1'])} Sentence 2: {_clean(ex['sentence2'])}",
         label_words=NO_YES),  # label 1 = entailment
    Task("boolq", "BoolQ", "cls", "super_glue/boolq", ("aps/super_glue", "boolq"),
         render=lambda ex: f"{_clean(ex['passage'])} {_clean(ex['question'])}?",
         label_words=NO_YES, splits=("validation",)),
    Task("cb", "CB", "cls", "super_glue/cb", ("aps/super_glue", "cb"),
         render=lambda ex: f"Suppose {_clean(ex['premise'])} Can we infer that \"{_clean(ex['hypothesis'])}\"? "
                           "Yes, No, or Maybe?",
         label_words=(" Yes", " No", " Maybe")),  # entailment, contradiction, neutral
    Task("wsc", "WSC", "cls", "super_glue/wsc.fixed", ("aps/super_glue", "wsc.fixed"),
         render=lambda ex: f"{_clean(ex['text'])} In the previous sentence, does the pronoun "
                           f"\"{ex['span2_text']}\" refer to {ex['span1_text']}? Yes or No?",
         label_words=NO_YES),
    Task("wic", "WiC", "cls", "super_glue/wic", ("aps/super_glue", "wic"),
         render=lambda ex: f"Does the word \"{ex['word']}\" have the same meaning in these two sentences? "
                           f"Yes, No? {_clean(ex['sentence1'])} {_clean(ex['sentence2'])}",
         label_words=NO_YES),
    Task("multirc", "MultiRC", "cls", "super_glue/multirc", ("aps/super_glue", "multirc"),
         render=lambda ex: f"{_clean(ex['paragraph'])} Question: {_clean(ex['question'])} "
                           f"I found this answer \"{_clean(ex['answer'])}\". Is that correct? Yes or No?",
         label_words=NO_YES),
    Task("copa", "COPA", "mch", "super_glue/copa", ("aps/super_glue", "copa"), options=_copa_options),
    Task("winogrande", "WinoGrande", "mch", "winogrande", ("allenai/winogrande", "winogrande_xl"),
         options=_winogrande_options, splits=("validation",)),
    Task("squad", "SQuAD", "qa", "squad", ("rajpurkar/squad", None),
         render=lambda ex: f"Title: {ex['title'].replace('_', ' ')}\nContext: {_clean(ex['context'])}\n"
                           f"Question: {_clean(ex['question'])}\nAnswer:",
         splits=("validation",), metric="f1"),
]}

# The tasks of the paper's two accuracy tables (Gao et al. Tables 1 and 2); CB comes from Guo et al.
# the MeZO sampling protocol (Malladi et al., used by Gao et al.): examples per split drawn for one seed
PROTOCOL = {"n_train": 1000, "n_val": 500, "n_test": 1000}
TABLE1_TASKS = ("sst2", "rte", "mrpc", "qqp", "qnli", "wnli")
TABLE2_TASKS = ("sst2", "rte", "boolq", "wsc", "wic", "multirc", "copa", "winogrande", "squad")


def get_task(name: str) -> Task:
    """The task called ``name`` (case and dashes ignored: "SST-2" works); unknown names list the known ones."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[key]


def check_single_token(task: Task, tokenizer) -> list[int]:
    """Token ids of a classification task's label words; each must be exactly one token for ``tokenizer``."""
    ids = []
    for word in task.label_words:
        pieces = tokenizer(word, add_special_tokens=False).input_ids
        if len(pieces) != 1:
            raise ValueError(f"task {task.name!r}: label word {word!r} is {len(pieces)} tokens "
                             f"{tokenizer.convert_ids_to_tokens(pieces)} for this tokenizer, not one")
        ids.append(pieces[0])
    return ids
