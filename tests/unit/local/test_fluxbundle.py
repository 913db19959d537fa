import gzip
import io
import tarfile

from strata_components.local.fluxbundle import bundle_settings, deterministic_tar_gz, localize_base

BASE = """resources:
- https://github.com/fluxcd/source-controller/releases/download/v1.9.5/source-controller.crds.yaml
- https://github.com/fluxcd/source-controller/releases/download/v1.9.5/source-controller.deployment.yaml
- account.yaml
"""


def test_release_urls_become_local_files_and_give_the_pins():
    text, pins = localize_base(BASE)
    assert "https://" not in text
    assert "- source-controller.crds.yaml\n- source-controller.deployment.yaml\n- account.yaml" in text
    assert pins == {"source-controller": "v1.9.5"}


def test_bundle_tarball_is_deterministic_and_flat():
    files = {"rbac.yaml": "kind: ClusterRole\n", "a.yaml": "kind: Service\n"}
    first, second = deterministic_tar_gz(files), deterministic_tar_gz(dict(reversed(files.items())))
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(first))) as archive:
        members = archive.getmembers()
        assert [m.name for m in members] == ["a.yaml", "rbac.yaml"]
        assert all(m.mtime == 0 and m.uid == 0 for m in members)
        assert archive.extractfile("rbac.yaml").read() == b"kind: ClusterRole\n"


def test_bundle_settings_name_the_default_controllers():
    settings = bundle_settings()
    assert settings["version"].startswith("v")  # pulumi-flux asks for `latest` otherwise
    assert settings["controllers"] == ["source-controller", "kustomize-controller", "helm-controller",
                                       "notification-controller"]
