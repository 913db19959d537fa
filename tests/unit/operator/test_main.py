"""The operator's entry point: its flags and log lines."""

import logging

import pytest

from strata_operator.main import ObjectPrefixFormatter, build_parser, run


def test_kopf_object_records_are_prefixed_with_the_object():
    formatter = ObjectPrefixFormatter("%(message)s")
    record = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "reconciled", None, None)
    assert formatter.format(record) == "reconciled"
    record.k8s_ref = {"namespace": "ns", "name": "hello"}
    assert formatter.format(record) == "[ns/hello] reconciled"
    assert record.msg == "reconciled"  # other handlers see the record unchanged
    record.k8s_ref = {"namespace": None, "name": "cluster-wide"}
    assert formatter.format(record) == "[cluster-wide] reconciled"


def test_the_plugin_cache_defaults_to_the_operators_own_and_must_be_a_plugins_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "home"))
    assert build_parser().parse_args([]).plugin_cache == tmp_path / "home" / "plugins"
    with pytest.raises(SystemExit, match=r"--plugin-cache .*/cache: name the plugins directory of a PULUMI_HOME"):
        run(["--plugin-cache", str(tmp_path / "cache")])


def test_a_bad_watch_label_selector_stops_the_operator_before_it_starts_naming_the_flag():
    with pytest.raises(SystemExit, match=r"--watch-label-selector 'team=a=b': 'team=a=b' is not a label requirement"):
        run(["--watch-label-selector", "team=a=b"])
