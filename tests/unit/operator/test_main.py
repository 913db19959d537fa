"""The operator's entry point: its log lines."""

import logging

from strata_operator.main import ObjectPrefixFormatter


def test_kopf_object_records_are_prefixed_with_the_object():
    formatter = ObjectPrefixFormatter("%(message)s")
    record = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "reconciled", None, None)
    assert formatter.format(record) == "reconciled"
    record.k8s_ref = {"namespace": "ns", "name": "hello"}
    assert formatter.format(record) == "[ns/hello] reconciled"
    assert record.msg == "reconciled"  # other handlers see the record unchanged
    record.k8s_ref = {"namespace": None, "name": "cluster-wide"}
    assert formatter.format(record) == "[cluster-wide] reconciled"
