"""Blocking keys from the fields' normalised values: dates parsed, strings folded, phone
numbers as digits, the same keyed digest on every side whatever the spelling."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.errors import ConfigError
from vflink.linkage.fields import column_key_kind, key_kind, key_text
from vflink.parties.linking import blocking_digests
from vflink.protocol import BlockingKey, EncodingSpec
from vflink.runner.encoding import blocking_plan

SECRET = b"a-test-secret-of-the-data-parties"


@settings(max_examples=60, deadline=None)
@given(y=st.integers(1900, 2030), m=st.integers(1, 12), d=st.integers(1, 28),
       sep=st.sampled_from(["-", "/", ".", " "]))
def test_a_date_written_any_accepted_way_gives_one_key(y: int, m: int, d: int,
                                                       sep: str) -> None:
    want = f"{y:04d}{m:02d}{d:02d}"
    for text in (want, f"{y:04d}{sep}{m:02d}{sep}{d:02d}", f"{d:02d}{sep}{m:02d}{sep}{y:04d}",
                 f"{d}{sep}{m}{sep}{y}", f" {y:04d}-{m}-{d}T10:00 "):
        assert key_text(text, "date") == want, text


def test_strings_phones_and_numbers_fold_to_one_key() -> None:
    assert key_text("  O'Brien-Smith ", "string") == key_text("o brien  smith", "string")
    assert key_text("José", "string") == key_text("jose", "string")
    assert key_text("+61 (02) 9876-5432", "digits") == "610298765432"
    assert key_text("02 9876 5432", "digits") == key_text("0298765432", "digits")
    assert key_text("1.50", "number") == key_text("1.5", "number") == "1.5"
    assert key_text("not a date", "date") == "not a date"  # falls back to the string
    assert key_text(None) == key_text(float("nan")) == key_text("  ") == ""


def test_the_kind_a_column_shows() -> None:
    assert key_kind(["19560409", "09/04/1956", ""]) == "date"
    assert key_kind(["(02) 9876 5432", "0412 345 678", "+61 2 9999 0000"]) == "digits"
    assert key_kind(["0298765432", "0412345678"]) == "string"  # digits only: as strings
    assert key_kind(["smith", "jones"]) == "string"
    assert column_key_kind("date", "string") == "date"
    assert column_key_kind("numeric", "string") == "number"
    assert column_key_kind("string", "digits") == "digits"
    assert column_key_kind(None, "date") == "date"


def test_both_sides_digest_differently_written_dates_alike() -> None:
    a = pd.DataFrame({"dob": ["19560409", "19800101", ""], "name": ["Ann", "Bo", "Cy"]})
    b = pd.DataFrame({"birth": ["09/04/1956", "1980-01-01", "02/02/1990"],
                      "nom": ["ann", "BO ", "cy"]})
    da = blocking_digests(a, [BlockingKey(column="dob", kinds=("date",)),
                              BlockingKey(column="name", columns=("dob",),
                                          kinds=("string", "date"))], SECRET)
    db = blocking_digests(b, [BlockingKey(column="birth", kinds=("date",)),
                              BlockingKey(column="nom", columns=("birth",),
                                          kinds=("string", "date"))], SECRET)
    for key in range(2):
        assert (da[key][0] == db[key][0]).all() and (da[key][1] == db[key][1]).all()
        assert not da[key][2].any()  # no date: no key
    as_strings = blocking_digests(b, [BlockingKey(column="birth")], SECRET)
    assert not (as_strings[0][0] == da[0][0]).all()  # the old behaviour: never together
    with pytest.raises(ConfigError, match="`kinds` must name one of"):
        blocking_digests(a, [BlockingKey(column="dob", kinds=("calendar",))], SECRET)


def test_the_plan_gives_each_rule_column_its_field_normalisation_and_atoms() -> None:
    from vflink.linkage.fields import Blocking, FieldSpec

    a = pd.DataFrame({"dob": ["19560409"], "name": ["ann"], "tel": ["(02) 9876 5432"]})
    b = pd.DataFrame({"dob": ["09/04/1956"], "name": ["ann"], "tel": ["02-9876-5432"]})
    fields = (FieldSpec(on=("name",)), FieldSpec(on=("dob",)))
    encodings = (EncodingSpec(encoder="bloom", kind="string"),
                 EncodingSpec(encoder="bloom", kind="date"))
    kinds, atoms = blocking_plan(
        (Blocking(on=["name", "dob"]), Blocking(on="tel"), Blocking(on="name", prefix=2)),
        fields, encodings, a, b)
    assert kinds == (("string", "date"), ("digits",), ("string",))
    assert atoms == ((0, 1), (-1,), (-2,))  # a prefix is no whole field
