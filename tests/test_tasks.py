"""Templates render as in Gao et al. Table 11 (CB: Guo et al. Table 11); label words are single tokens."""
import pytest

from fixtures import _row
from prge_lib.data.tasks import TASKS, Task, check_single_token, get_task

GOLDEN = {
    "sst2": "film number 3 is fine . It was",
    "rte": 'Sentence 3 is about a cat. Does this mean that "Sentence 3 is about a dog." is true? Yes or No?',
    "mrpc": "Do the following two sentences mean the same thing? Yes or No? "
            "Sentence 1: Sentence 3 is about a cat. Sentence 2: Sentence 3 is about a dog.",
    "qqp": "Are these two questions asking the same thing? Yes or No? Question 1: Why is 3 odd? Question 2: Is 3 odd?",
    "qnli": "Does this sentence answer the question? Yes or No? Sentence 1: What is 3? "
            "Sentence 2: Sentence 3 is about a cat.",
    "wnli": "Given the first sentence, is the second sentence true? Yes or No? "
            "Sentence 1: Sentence 3 is about a cat. Sentence 2: Sentence 3 is about a dog.",
    "boolq": "Numbers -- 3 is a number. is 3 a number?",
    "cb": 'Suppose Sentence 3 is about a cat. Can we infer that "Sentence 3 is about a dog."? Yes, No, or Maybe?',
    "wsc": 'Ann met Bo 3 times because she liked him . In the previous sentence, does the pronoun "she" '
           "refer to Ann? Yes or No?",
    "wic": 'Does the word "bank" have the same meaning in these two sentences? Yes, No? '
           "The bank 3 is open. The river bank is wet.",
    "multirc": 'Tom has 3 apples. He eats one. Question: How many apples? I found this answer "3". '
               "Is that correct? Yes or No?",
    "squad": "Title: Some Title\nContext: The answer is 3 apples.\nQuestion: What is the answer?\nAnswer:",
}

# The label names each hub dataset documents for its `label` column (its ClassLabel features, in id
# order), and the answer word the templates mean by each name. The test derives the expected label words
# from these two facts instead of restating the task table.
HUB_LABEL_NAMES = {
    "sst2": ("negative", "positive"), "rte": ("entailment", "not_entailment"),
    "qnli": ("entailment", "not_entailment"), "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"), "wnli": ("not_entailment", "entailment"),
    "boolq": ("False", "True"), "wsc": ("False", "True"), "wic": ("False", "True"),
    "multirc": ("False", "True"), "cb": ("entailment", "contradiction", "neutral"),
}
ANSWER_FOR = {"negative": " terrible", "positive": " great", "entailment": " Yes", "not_entailment": " No",
              "equivalent": " Yes", "not_equivalent": " No", "duplicate": " Yes", "not_duplicate": " No",
              "True": " Yes", "False": " No", "contradiction": " No", "neutral": " Maybe"}


def test_fourteen_tasks_of_three_kinds():
    assert len(TASKS) == 14
    kinds = {name: t.kind for name, t in TASKS.items()}
    assert [n for n, k in kinds.items() if k == "mch"] == ["copa", "winogrande"]
    assert [n for n, k in kinds.items() if k == "qa"] == ["squad"]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_template_golden_string(name):
    assert get_task(name).prompt(_row(name, 3)) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(HUB_LABEL_NAMES))
def test_label_words_follow_the_hub_label_encoding(name):
    assert get_task(name).label_words == tuple(ANSWER_FOR[label] for label in HUB_LABEL_NAMES[name])


def test_every_classification_task_has_documented_label_names():
    assert sorted(HUB_LABEL_NAMES) == sorted(n for n, t in TASKS.items() if t.kind == "cls")


def test_copa_options_join_premise_and_lower_cased_choice():
    effect, cause = _row("copa", 1), _row("copa", 2)
    assert get_task("copa").options(effect) == [("The glass 1 fell so", " it broke."),
                                                ("The glass 1 fell so", " it sang.")]
    assert get_task("copa").options(cause)[0] == ("The glass 2 fell because", " it broke.")


def test_winogrande_options_fill_the_blank_and_share_the_continuation():
    opts = get_task("winogrande").options(_row("winogrande", 4))
    assert opts == [("Ann gave Bo 4 books because Ann", " had too many."),
                    ("Ann gave Bo 4 books because Bo", " had too many.")]
    assert get_task("winogrande").gold(_row("winogrande", 4)) == 0  # answer "1" -> option index 0


def test_gold_and_target_text():
    assert get_task("sst2").target_text(_row("sst2", 1)) == " great"
    assert get_task("squad").gold(_row("squad", 5)) == ["5 apples"]
    assert get_task("copa").target_text(_row("copa", 1)) == " it sang."


def test_training_pair_is_the_prompt_and_answer_or_the_right_option():
    sst2, copa = get_task("sst2"), get_task("copa")
    assert sst2.training_pair(_row("sst2", 1)) == (sst2.prompt(_row("sst2", 1)), " great")
    assert copa.training_pair(_row("copa", 1)) == copa.options(_row("copa", 1))[1]


def test_task_names_are_forgiving_and_unknown_names_list_the_known_ones():
    assert get_task("SST-2") is TASKS["sst2"] and get_task("WinoGrande") is TASKS["winogrande"]
    with pytest.raises(KeyError, match="unknown task 'sst3'.*sst2, rte"):
        get_task("sst3")


@pytest.mark.parametrize("name", [n for n, t in TASKS.items() if t.kind == "cls"])
def test_label_words_are_single_tokens_for_smollm2(name, tokenizer):
    ids = check_single_token(get_task(name), tokenizer)
    assert len(set(ids)) == len(ids)


def test_multi_token_label_word_is_named(tokenizer):
    bad = Task("toy", "Toy", "cls", "toy", ("toy", None), render=str, label_words=(" Yes", " unbelievably"))
    with pytest.raises(ValueError, match="' unbelievably' is [2-9] tokens"):
        check_single_token(bad, tokenizer)


def test_multiple_choice_task_has_no_single_prompt():
    with pytest.raises(TypeError, match="multiple choice"):
        get_task("copa").prompt(_row("copa", 1))
