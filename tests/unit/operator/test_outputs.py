"""Outputs beyond status: per-output digests that never reveal a value, and spec.outputsSecret's Secret."""

import base64
import json

from strata_operator.decisions.outputs import (MANAGED_BY_LABEL, STACK_LABEL, combine_digests, output_digest,
                                               output_digests, outputs_digest, outputs_secret_conflict,
                                               outputs_secret_data, outputs_secret_manifest, secret_needs_write)

KEY = b"k" * 32


def test_digests_change_with_values_not_with_key_order():
    assert output_digest({"a": 1, "b": [1, 2]}, False, KEY) == output_digest({"b": [1, 2], "a": 1}, False, KEY)
    assert output_digest("v1", False, KEY) != output_digest("v2", False, KEY)
    assert output_digest("v1", False, KEY).startswith("sha256:")


def test_a_secret_output_digest_is_keyed_so_guessing_its_value_needs_the_key():
    plain, keyed = output_digest("1234", False, KEY), output_digest("1234", True, KEY)
    assert keyed.startswith("hmac-sha256:") and keyed.split(":")[1] != plain.split(":")[1]
    assert output_digest("1234", True, b"other-key" * 4) != keyed
    assert "1234" not in keyed


def test_a_secret_output_without_its_real_value_has_no_digest_so_the_total_is_unknown():
    outputs = {"url": ("http://x", False), "password": (None, True)}
    digests = output_digests(outputs, None, KEY)
    assert set(digests) == {"url"}
    assert outputs_digest(outputs, digests) is None
    real = output_digests(outputs, {"url": "http://x", "password": "hunter22"}, KEY)
    assert set(real) == {"url", "password"} and real["url"] == digests["url"]
    total = outputs_digest(outputs, real)
    assert total == combine_digests(real) and total.startswith("sha256:")
    assert output_digests(outputs, {"url": "http://x", "password": "other"}, KEY)["password"] != real["password"]


def test_secret_data_holds_real_values_strings_as_is_others_as_json_and_skips_bad_keys():
    data, skipped = outputs_secret_data({"url": "http://x", "port": 5432, "cfg": {"b": 1, "a": [True]},
                                         "bad key!": "x"})
    decoded = {k: base64.b64decode(v).decode() for k, v in data.items()}
    assert decoded == {"url": "http://x", "port": "5432", "cfg": json.dumps({"a": [True], "b": 1})}
    assert skipped == ["bad key!"]


def test_the_secret_is_labelled_and_owned_by_the_stack():
    manifest = outputs_secret_manifest("ns", "app-outputs", "app", "uid-1", {"a": "YQ=="}, "42")
    meta = manifest["metadata"]
    assert meta["labels"] == {MANAGED_BY_LABEL: "strata-operator", STACK_LABEL: "app"}
    assert meta["ownerReferences"] == [{"apiVersion": "pulumi.com/v1", "kind": "Stack", "name": "app",
                                        "uid": "uid-1", "controller": True}]
    assert meta["resourceVersion"] == "42" and manifest["type"] == "Opaque"
    assert "resourceVersion" not in outputs_secret_manifest("ns", "s", "app", "u", {})["metadata"]


def test_a_secret_that_is_not_the_stacks_is_a_conflict_naming_the_field_and_the_fix():
    assert outputs_secret_conflict(None, "app", "uid-1", "s") is None
    mine = {"metadata": {"ownerReferences": [{"kind": "Stack", "name": "app", "uid": "uid-1"}]}}
    assert outputs_secret_conflict(mine, "app", "uid-1", "s") is None
    foreign = outputs_secret_conflict({"metadata": {}}, "app", "uid-1", "db-creds")
    assert foreign.startswith("spec.outputsSecret.name: Secret 'db-creds' already exists and has no owner")
    assert "Name another Secret" in foreign and "delete 'db-creds'" in foreign
    other = {"metadata": {"ownerReferences": [{"kind": "Stack", "name": "old", "uid": "uid-0"}]}}
    assert "is owned by Stack/old" in outputs_secret_conflict(other, "app", "uid-1", "s")


def test_an_unchanged_secret_is_not_written_again():
    wanted = outputs_secret_manifest("ns", "s", "app", "u", {"a": "YQ=="}, "7")
    same = {"type": "Opaque", "data": {"a": "YQ=="}, "metadata": {"labels": dict(wanted["metadata"]["labels"])}}
    assert not secret_needs_write(same, wanted)
    assert secret_needs_write(None, wanted)
    assert secret_needs_write({**same, "data": {"a": "Yg=="}}, wanted)
    assert secret_needs_write({**same, "metadata": {"labels": {}}}, wanted)
