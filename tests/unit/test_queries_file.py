"""``queries.sql`` splits into named statements, and its fragments expand where they are used:
alone, with a parameter, or with a word of the file (never a value). No database."""

from __future__ import annotations

import pytest

from aioqueue._queries import parse

TEXT = """\
-- fragment: status_is
-- A comment of the fragment, left out.
j.status = '{arg}'

-- fragment: limited
LIMIT {arg}

-- name: listed
-- A comment of the statement, left out.
SELECT j.id FROM {schema}.jobs AS j WHERE {status_is(pending)} OR {status_is(dead)} {limited($2)};
"""


def test_a_fragment_expands_with_a_parameter_or_a_word_and_leaves_the_schema_for_later() -> None:
    assert parse(TEXT) == {
        "listed": "SELECT j.id FROM {schema}.jobs AS j WHERE j.status = 'pending' OR j.status = 'dead' LIMIT $2",
    }


def test_a_value_is_not_a_fragments_argument() -> None:
    # Only $n or a lower-case word: anything else is left as written, and PREPARE refuses it.
    assert parse("-- fragment: f\n{arg}\n\n-- name: q\nSELECT {f('x')}\n") == {"q": "SELECT {f('x')}"}


def test_a_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="names 'q' twice"):
        parse("-- name: q\nSELECT 1;\n\n-- fragment: q\n1\n")
