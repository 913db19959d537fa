"""The address a running update's state backend is probed at, and the probe itself."""

from __future__ import annotations

import asyncio
import socket

import pytest

from strata_operator.main import build_parser
from strata_operator.services.backend_probe import backend_address, unreachable


@pytest.mark.parametrize("backend, address", [
    ("s3://state?endpoint=http://10.88.0.1:9000&use_path_style=true&region=us-east-1", ("10.88.0.1", 9000)),
    ("s3://state?endpoint=minio.storage:9000", ("minio.storage", 9000)),
    ("s3://state?endpoint=https://store.example.com", ("store.example.com", 443)),
    ("s3://state?region=eu-west-1", ("s3.eu-west-1.amazonaws.com", 443)),
    ("s3://state", ("s3.amazonaws.com", 443)),
    ("gs://state", ("storage.googleapis.com", 443)),
    ("https://api.pulumi.com", ("api.pulumi.com", 443)),
    ("http://pulumi.internal:8080", ("pulumi.internal", 8080)),
    ("file:///var/state", None),
    ("azblob://state", None),
    ("", None),
])
def test_the_address_of_a_backend_url(backend, address):
    assert backend_address(backend) == address


def test_the_probe_says_why_an_address_takes_no_connection_and_nothing_when_it_does():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert asyncio.run(unreachable(("127.0.0.1", port))) == ""
    assert asyncio.run(unreachable(("127.0.0.1", port))) == "Connection refused"


def test_the_probe_period_is_a_flag_and_zero_turns_it_off():
    assert build_parser().parse_args([]).backend_probe_seconds == 10.0
    assert build_parser().parse_args(["--backend-probe-seconds", "0"]).backend_probe_seconds == 0.0
