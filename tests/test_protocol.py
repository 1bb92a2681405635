"""The parsers of the roles' replies on malformed output: each is parsed as documented or is invalid, never
silently read as another action (`centralrl.harness.protocol`)."""

from __future__ import annotations

import pytest

from centralrl.harness.protocol import (
    STOP_STRINGS,
    Action,
    parse_answer,
    parse_central,
    parse_note,
    parse_single_agent,
)


@pytest.mark.parametrize(
    "text, action",
    [
        # an opening <conclude> mentioned in the thoughts ended the episode before the sub-question after it
        (
            "<think>ok <conclude> later</think><subquestion>Where born?</subquestion>",
            Action("delegate", "Where born?"),
        ),
        ("<think>done</think><conclude></conclude>", Action("conclude")),
        ("<think>done</think><conclude >\n</conclude>", Action("conclude")),
        ("<think>done</think><conclude/>", Action("conclude")),
        ("<think>done</think><conclude>", Action("conclude")),  # cut at the reply's end
        ("<think>done</think><conclude> because", Action("invalid")),
        ("<subquestion>Q<conclude></conclude>", Action("conclude")),  # the first complete action
        ("<think>x</think><subquestion>Who?", Action("invalid")),
        ("<think>x</think></conclude>", Action("invalid")),
    ],
)
def test_a_central_reply_is_its_first_complete_action(text, action):
    assert parse_central(text) == action


@pytest.mark.parametrize(
    "text, action",
    [
        # an unclosed <answer> swallowed the search after it: "later</think><search>q</search>" was the answer
        ("<think>I will write <answer> later</think><search>q</search>", Action("search", "q")),
        ("<think>hm</think><answer>New\nYork</answer>", Action("answer", "New York")),
        ("<think>hm</think><answer>Oslo\nsince the passage says so", Action("answer", "Oslo")),  # cut: first line
        ("<think>hm</think><answer></answer>", Action("invalid")),
    ],
)
def test_a_single_agent_reply_is_its_first_complete_action(text, action):
    assert parse_single_agent(text) == action


def test_answers_and_notes_are_read_alike_in_every_role():
    # the conclusion agent kept only the first line of a closed answer, the single agent all of it
    assert parse_answer("<answer>New\nYork</answer>") == ("New York", True)
    assert parse_single_agent("<answer>New\nYork</answer>") == Action("answer", "New York")
    assert parse_answer("<answer>Oslo\nbecause") == ("Oslo", True)
    assert parse_answer("<answer>Oslo <note>x</note>") == ("", False)  # cut, but a tag follows
    assert parse_note("<note>A was born in") == ("A was born in", True)  # cut by max_new_tokens: kept
    assert parse_note("<note>A <think>y")[1] is False


@pytest.mark.parametrize(
    "reply",
    [
        "done</think><conclude/>",
        "done</think><conclude />",
        "x</think><conclude></conclude>",
        "x<conclude> </conclude>",
    ],
)
def test_every_closed_conclude_the_parser_accepts_ends_generation(reply):
    """Generation stops at a stop string; a conclude the parser accepts but no stop ends (`<conclude />` did) ran
    on to `max_new_tokens`, and those tokens were trained with the episode's advantage."""
    assert parse_central(reply).kind == "conclude"
    assert any(stop in reply for stop in STOP_STRINGS["central"])
