"""The paper's input transformations (Figure 1): exact token layouts and truncation."""

import keras
import pytest

import kgpt
from kgpt.tasks import heads, transforms

S, D, E = 100, 101, 102  # start, delimiter, extract
LAYOUT = transforms.Layout(S, D, E)


def views(transform, segments, choices=(), max_length=64):
    return transforms.build_views(transform, segments, choices, LAYOUT, max_length)


def test_classification_layout():
    assert views(transforms.Classification(), [[1, 2, 3]]) == ([[S, 1, 2, 3, E]], 0)
    # Several segments are concatenated without a delimiter.
    assert views(transforms.Classification(), [[1], [2, 3]]) == ([[S, 1, 2, 3, E]], 0)


def test_entailment_layout():
    assert views(transforms.Entailment(), [[1, 2], [3]]) == ([[S, 1, 2, D, 3, E]], 0)


def test_similarity_has_both_orders():
    assert views(transforms.Similarity(), [[1, 2], [3]]) == ([[S, 1, 2, D, 3, E], [S, 3, D, 1, 2, E]], 0)


def test_multiple_choice_one_view_per_answer():
    got, cut = views(transforms.MultipleChoice(3), [[1, 2], [3]], [[7], [8, 9], [10]])
    assert got == [[S, 1, 2, 3, D, 7, E], [S, 1, 2, 3, D, 8, 9, E], [S, 1, 2, 3, D, 10, E]]
    assert cut == 0


def test_truncation_cuts_the_end_of_the_longest_segment():
    # Budget 8 - 3 specials = 5 text tokens: the 6-token premise loses 2 from its end.
    got, cut = views(transforms.Entailment(), [[1, 2, 3, 4, 5, 6], [7]], max_length=8)
    assert got == [[S, 1, 2, 3, 4, D, 7, E]] and cut == 2
    # The question of a multiple-choice context survives; the long article is cut.
    got, cut = views(transforms.MultipleChoice(2), [list(range(1, 11)), [50, 51]], [[60], [61]], max_length=9)
    assert got[0] == [S, 1, 2, 3, 50, 51, D, 60, E] and cut == 2 * 7


def test_truncate_evens_out_long_segments():
    assert transforms.truncate([[1] * 6, [2] * 5], 6) == ([[1] * 3, [2] * 3], 5)
    assert transforms.truncate([[1, 2], [3]], 10) == ([[1, 2], [3]], 0)
    with pytest.raises(ValueError, match=r"^budget must be an integer >= 0, got -1\.$"):
        transforms.truncate([[1, 2], [3]], -1)


def test_no_room_for_text_is_an_error():
    with pytest.raises(ValueError, match="max_length=3 leaves no room"):
        views(transforms.Entailment(), [[1], [2]], max_length=3)


def test_check_reports_wrong_arity():
    assert "needs 2 text segments, got 1" in transforms.Entailment().check(["a"])
    assert "needs 4 answer choices, got 2" in transforms.MultipleChoice(4).check(["ctx"], ["a", "b"])


def test_multiple_choice_with_a_context_count_refuses_another_and_keeps_it_in_its_config():
    race = transforms.MultipleChoice(4, num_segments=2)
    assert race.check(["article", "question"], ["a", "b", "c", "d"]) is None
    # An answer too many, split as a text line is: read as a third context segment before.
    assert race.check(["article", "question", "a"], ["b", "c", "d", "e"]) == (
        "multiple_choice needs 2 context segments, got 3"
    )
    assert transforms.MultipleChoice(4).check(["article", "question", "a"], ["b", "c", "d", "e"]) is None
    assert race.get_config() == {"num_choices": 4, "num_segments": 2}
    assert transforms.MultipleChoice(4).get_config() == {"num_choices": 4}  # as models saved before it have it
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(race))
    assert restored == race and restored.num_segments == 2
    with pytest.raises(ValueError, match="num_segments must be an integer >= 1, got 0"):
        transforms.MultipleChoice(2, num_segments=0)


def test_a_multiple_choice_head_with_names_writes_and_reads_them():
    race = heads.MultipleChoiceHead(4, names="ABCD")
    assert race.target("C") == 2 and race.target(3) == 3 and race.prediction_name(2) == "C"
    assert race.output_names() == ["A", "B", "C", "D"]
    with pytest.raises(kgpt.DataError, match=r"^x:1: answer 'E' is not a choice index 0\.\.3 or one of A, B, C, D\.$"):
        race.target("E", "x:1")
    cloze = heads.MultipleChoiceHead(2, names=("1", "2"))
    assert cloze.target("1") == 0 and cloze.target(1) == 1  # a text is a name, an int an index
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(race))
    assert restored == race and restored.names == ["A", "B", "C", "D"]
    assert heads.MultipleChoiceHead(4).get_config() == {"num_choices": 4}  # as models saved before names have it
    assert heads.MultipleChoiceHead(4).prediction_name(2) == 2
    with pytest.raises(kgpt.DataError, match=r"^answer '²' is not a choice index 0\.\.3\.$"):  # int()'s ValueError
        heads.MultipleChoiceHead(4).target("²")
    for names, error in ((("A", "A"), "2 distinct choice names"), ("ABC", "2 distinct"), (("a\tb", "c"), "a tab")):
        with pytest.raises(ValueError, match=error):
            heads.MultipleChoiceHead(2, names=names)


def test_the_shortest_view_holding_text_is_the_transformations():
    assert transforms.Classification().min_length == 3  # [start] t [extract]
    assert transforms.Entailment().min_length == transforms.Similarity().min_length == 5  # and a delimiter, a second t
    assert transforms.MultipleChoice(4).min_length == transforms.MultipleChoice(4, num_segments=2).min_length == 5


def test_multiple_choice_needs_two_choices_or_more():
    for make in (transforms.MultipleChoice, heads.MultipleChoiceHead):
        with pytest.raises(ValueError, match="num_choices must be an integer >= 2, got 1"):
            make(1)
        with pytest.raises(TypeError, match="num_choices must be an integer, got 2.0"):
            make(2.0)
    assert transforms.Similarity().check(["a", "b"]) is None
