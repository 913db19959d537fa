"""The cluster profile's object store: credentials per platform kept out of argv, the s3:// backend URL."""

from __future__ import annotations

import stat
from urllib.parse import parse_qs, urlsplit

from strata_components.local import objectstore, realnode
from strata_components.local.toolchain import load_specs


def test_credentials_are_generated_once_per_platform_into_a_private_aws_credentials_file(tmp_path):
    path = tmp_path / "objectstore" / "credentials"
    first = objectstore.ensure_credentials(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert objectstore.ensure_credentials(path) == first == objectstore.read_credentials(path)
    access_key, secret_key = first
    assert access_key.startswith("strata-") and len(secret_key) >= 32
    assert objectstore.ensure_credentials(tmp_path / "other" / "credentials") != first
    assert path.read_text().startswith("[default]\naws_access_key_id = ")


def test_minio_gets_its_credentials_in_its_environment_never_its_argv(tmp_path):
    process = objectstore.object_store_process(tmp_path / "minio", tmp_path, 39000, ("strata-ab12", "s3cr3t-XYZ"))
    assert not any("s3cr3t" in arg or "strata-ab12" in arg for arg in process.argv)
    assert process.env["MINIO_ROOT_USER"] == "strata-ab12" and process.env["MINIO_ROOT_PASSWORD"] == "s3cr3t-XYZ"
    # --quiet: no startup banner, which would print the root credentials into the log.
    assert "--quiet" in process.argv and f"--address={realnode.NODE_ADDRESS}:39000" in process.argv
    assert process.env["MINIO_BROWSER"] == "off"
    # Nothing in the user's home (~/.minio): data and certificates under the platform's directory.
    assert process.argv[2] == str(tmp_path / "data") and f"--certs-dir={tmp_path / 'certs'}" in process.argv


def test_the_backend_url_carries_the_options_pulumis_s3_backend_takes():
    url = urlsplit(objectstore.backend_url(39000, "team-a"))
    assert (url.scheme, url.netloc) == ("s3", "team-a")
    assert parse_qs(url.query) == {"endpoint": [f"http://{realnode.NODE_ADDRESS}:39000"], "use_path_style": ["true"],
                                   "region": ["us-east-1"]}


def test_minio_is_built_on_first_use_of_the_cluster_profile():
    spec = load_specs()["minio"]
    assert spec.module == "github.com/minio/minio" and spec.profile == "cluster" and spec.packages == {".": "minio"}
