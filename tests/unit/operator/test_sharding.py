"""Shards (Flux's convention): label selectors as `kubectl -l` writes them, and the names each shard keeps."""

import pytest

from strata_operator.api import FINALIZER
from strata_operator.api.label_selector import parse_label_selector
from strata_operator.api.sharding import SHARD_KEY, Shard


@pytest.mark.parametrize("text, labels, expected", [
    ("", {}, True),
    ("app=web", {"app": "web"}, True),
    ("app==web", {"app": "db"}, False),
    ("app!=web", {}, True),  # as apimachinery: != also matches objects without the key
    ("app!=web", {"app": "web"}, False),
    ("tier in (a, b),app", {"tier": "b", "app": "x"}, True),
    ("tier in (a, b),app", {"tier": "b"}, False),
    ("tier notin (a)", {}, True),
    ("tier notin (a)", {"tier": "a"}, False),
    (f"!{SHARD_KEY}", {"team": "alpha"}, True),
    (f"!{SHARD_KEY}", {SHARD_KEY: "shard1"}, False),
    (f"{SHARD_KEY}=shard1", {SHARD_KEY: "shard1"}, True),
    (f"{SHARD_KEY}=shard1", {SHARD_KEY: "shard2"}, False),
])
def test_selectors_match_as_kubectl_does(text, labels, expected):
    assert parse_label_selector(text).matches(labels) is expected


@pytest.mark.parametrize("text, names", [
    ("a=b=c", "'a=b=c' is not a label requirement; write key, !key, key=value"),
    ("a=b,,c", "an empty requirement (two commas in a row)"),
    ("-bad=1", "'-bad' is not a label key"),
    ("x in ()", "`x in ()` names no value"),
    ("x=-v", "'-v' is not a label value"),
])
def test_a_bad_selector_names_the_requirement_and_how_to_write_it(text, names):
    with pytest.raises(ValueError) as raised:
        parse_label_selector(text)
    assert str(raised.value).startswith(f"--watch-label-selector {text!r}: ")
    assert names in str(raised.value)


def test_the_main_operator_keeps_pkos_finalizer_annotations_and_lease():
    for text in ("", f"!{SHARD_KEY}", f" !{SHARD_KEY} "):
        main = Shard.of(text)
        assert main.is_main
        assert (main.finalizer, main.annotations_prefix, main.lease_name("strata-operator-leader")) == (
            FINALIZER, "strata.pulumi.com", "strata-operator-leader")
    assert Shard.of("").owns({SHARD_KEY: "shard1"})  # no selector: every object, as before shards
    assert not Shard.of(f"!{SHARD_KEY}").owns({SHARD_KEY: "shard1"})


def test_each_shard_has_names_of_its_own_one_per_meaning_of_its_selector():
    one, two = Shard.of(f"{SHARD_KEY}=shard1"), Shard.of(f"{SHARD_KEY}=shard2")
    names = {(s.finalizer, s.annotations_prefix, s.lease_name("strata-operator-leader")) for s in (one, two)}
    assert len(names) == 2 and not one.is_main
    assert one.finalizer.startswith(f"{FINALIZER}/shard-")
    assert one.annotations_prefix.endswith(".strata.pulumi.com")
    assert one.lease_name("strata-operator-leader").startswith("strata-operator-leader-shard-")
    # Spelled differently, same meaning: same names, so reformatting a flag does not orphan finalizers.
    assert Shard.of(f"{SHARD_KEY} in (shard1)").finalizer == Shard.of(f"{SHARD_KEY}==shard1").finalizer == one.finalizer
    assert one.owns({SHARD_KEY: "shard1"}) and not one.owns({}) and not one.owns({SHARD_KEY: "shard2"})


def test_every_object_has_exactly_one_owner_among_the_main_operator_and_its_shards():
    operators = [Shard.of(f"!{SHARD_KEY}"), Shard.of(f"{SHARD_KEY}=shard1"), Shard.of(f"{SHARD_KEY}=shard2")]
    for labels in ({}, {"app": "x"}, {SHARD_KEY: "shard1"}, {SHARD_KEY: "shard2", "app": "y"}):
        assert sum(operator.owns(labels) for operator in operators) == 1
