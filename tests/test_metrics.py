"""Hand-computed cases for the FlashRAG / Search-R1 answer metrics."""

import pytest

from centralrl.metrics import acc, em, f1, normalize_answer


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("The  Cat!", "cat"),
        ("an apple a day", "apple day"),
        ("Theater", "theater"),  # 'the' only as a whole word
        ("U.S.A.", "usa"),
        ("São Paulo", "são paulo"),  # unicode letters kept
        ("1,000 «years»", "1000 «years»"),  # only ASCII punctuation is dropped
        ("", ""),
    ],
)
def test_normalize(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_em_matches_any_of_several_golden_answers():
    golden = ["Johann Sebastian Bach", "J. S. Bach", "Bach"]
    assert em("bach.", golden) == 1.0
    assert em("J S Bach", golden) == 1.0
    assert em("Sebastian", golden) == 0.0


def test_em_accepts_a_single_string():
    assert em("The Paris", "paris") == 1.0


def test_acc_is_substring_cover():
    assert acc("The answer is Paris, France", ["Paris"]) == 1.0
    assert acc("Parisian", ["paris"]) == 1.0  # substring, not token: FlashRAG sub-EM behaves so
    assert acc("London", ["Paris", "City of Light"]) == 0.0


def test_f1_hand_computed():
    # pred tokens {new, york, city}; gold {new, york}: precision 2/3, recall 1 -> F1 0.8
    assert f1("New York City", ["New York"]) == pytest.approx(0.8)
    # best over golden answers: vs "York" P=1/3 R=1 -> 0.5; vs "New York" 0.8
    assert f1("New York City", ["York", "New York"]) == pytest.approx(0.8)
    # repeated tokens count with multiplicity: pred [a1,a1,b], gold [a1,b]: same=2, P=2/3, R=1 -> 0.8
    assert f1("bob bob smith", ["bob smith"]) == pytest.approx(0.8)


def test_f1_yes_no_mismatch_scores_zero_even_with_overlap():
    assert f1("yes", ["no"]) == 0.0
    assert f1("yes", ["yes"]) == 1.0
    assert f1("no", ["no way"]) == 0.0  # prediction is special and differs from the golden answer
    assert f1("yes it is", ["yes"]) == 0.0  # golden is special and differs from the prediction


def test_empty_prediction_scores_zero_everywhere():
    for metric in (em, f1, acc):
        assert metric("", ["Paris"]) == 0.0


def test_articles_and_punctuation_do_not_count_as_tokens():
    assert f1("The Beatles!", ["beatles"]) == 1.0
    assert em("A Tale of Two Cities", ["Tale of Two Cities"]) == 1.0


def test_unicode_answers():
    assert em("Zürich", ["zürich"]) == 1.0
    assert em("Zurich", ["Zürich"]) == 0.0  # no accent folding, as in FlashRAG
    assert f1("München Bayern", ["München"]) == pytest.approx(2 / 3)
