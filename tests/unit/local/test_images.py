"""OCI archives written without a registry or a container tool: what `ctr images import` reads."""

from __future__ import annotations

import hashlib
import json
import tarfile

from strata_components.local.images import build_image_config, write_oci_archive


def test_an_oci_archive_names_the_image_and_every_blob_matches_its_digest(tmp_path):
    layer = tmp_path / "layer.tar"
    (tmp_path / "hello").write_text("hi")
    with tarfile.open(layer, "w") as tar:
        tar.add(tmp_path / "hello", arcname="hello")
    diff_id = "sha256:" + hashlib.sha256(layer.read_bytes()).hexdigest()
    config = build_image_config(entrypoint=["/hello"], env={"PATH": "/bin"}, user="65532", workdir="/",
                                layer_digest=diff_id, ports=(8384,))
    out = tmp_path / "image.oci.tar"
    write_oci_archive(layer, config, "strata.local/hello:1", out)

    with tarfile.open(out) as archive:
        files = {member.name: archive.extractfile(member).read() for member in archive.getmembers()}
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "strata.local/hello:1"
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "1"
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    image_config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert image_config["rootfs"]["diff_ids"] == [diff_id] == [manifest["layers"][0]["digest"]]
    assert image_config["config"]["User"] == "65532" and image_config["config"]["Entrypoint"] == ["/hello"]
    assert image_config["config"]["ExposedPorts"] == {"8384/tcp": {}}
    assert not (tmp_path / "image.oci.tar.partial").exists()


def test_a_binary_image_holds_the_binary_alone_run_by_a_numeric_non_root_user(tmp_path, monkeypatch):
    from strata_components.local.images import build_binary_image

    monkeypatch.setenv("STRATA_CACHE", str(tmp_path / "cache"))
    binary = tmp_path / "coredns"
    binary.write_bytes(b"\x7fELF static")
    binary.chmod(0o755)
    image = build_binary_image(binary, "strata.local/coredns", "v1.15.0", say=lambda _line: None)
    assert image.name == "strata.local/coredns:v1.15.0"
    with tarfile.open(image.path) as archive:
        files = {member.name: archive.extractfile(member).read() for member in archive.getmembers()}
    index = json.loads(files["index.json"])
    manifest = json.loads(files[f"blobs/sha256/{index['manifests'][0]['digest'].split(':')[1]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["config"]["User"] == "65532:65532" and config["config"]["Entrypoint"] == ["/coredns"]
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"]
    with tarfile.open(fileobj=__import__("io").BytesIO(layer)) as tar:
        (member,) = tar.getmembers()
    assert member.name == "coredns" and member.mode & 0o111 and member.uid == 0
    # Cached by content: the same binary is the same archive, another binary another one.
    assert build_binary_image(binary, "strata.local/coredns", "v1.15.0").path == image.path
    binary.write_bytes(b"\x7fELF other!")
    assert build_binary_image(binary, "strata.local/coredns", "v1.15.0", say=lambda _line: None).path != image.path


def test_a_binary_image_carries_the_extra_files_it_is_given_owned_by_root(tmp_path, monkeypatch):
    from strata_components.local.images import build_binary_image

    monkeypatch.setenv("STRATA_CACHE", str(tmp_path / "cache"))
    binary, bundle = tmp_path / "source-controller", tmp_path / "ca.crt"
    binary.write_bytes(b"\x7fELF flux")
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    image = build_binary_image(binary, "strata.local/fluxcd/source-controller", "v1.9.6", user=65534,
                               files={"/etc/ssl/certs/ca-certificates.crt": bundle}, say=lambda _line: None)
    with tarfile.open(image.path) as archive:
        blobs = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.name.startswith("blobs/")}
    (layer,) = [data for data in blobs.values() if data[257:262] == b"ustar"]
    with tarfile.open(fileobj=__import__("io").BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"source-controller", "etc/ssl/certs/ca-certificates.crt"}
    assert all(m.uid == 0 for m in members.values())
    assert any(b'"User":"65534:65534"' in data.replace(b" ", b"") for data in blobs.values())
