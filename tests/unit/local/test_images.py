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
                                layer_digests=[diff_id], ports=(8384,))
    out = tmp_path / "image.oci.tar"
    write_oci_archive([layer], config, "strata.local/hello:1", out)

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


def _pulumi_install(tmp_path):
    from strata_components.local.images import PulumiInstall

    bin_dir, plugins = tmp_path / "pulumi" / "bin", tmp_path / "pulumi" / "plugins" / "resource-kubernetes-v4.34.2"
    bin_dir.mkdir(parents=True)
    plugins.mkdir(parents=True)
    for host in ("pulumi-language-python", "pulumi-language-python-exec"):
        (bin_dir / host).write_text("host")
    (plugins / "pulumi-resource-kubernetes").write_text("plugin")
    (plugins / "pulumi-resource-kubernetes").chmod(0o700)  # as `pulumi plugin install` leaves it
    return PulumiInstall(language_hosts=tuple(sorted(bin_dir.iterdir())), plugins=(plugins,))


def test_the_pulumi_layer_puts_hosts_beside_the_cli_and_plugins_under_the_images_pulumi_home(tmp_path):
    from strata_components.local.images import IMAGE_PULUMI_HOME, build_pulumi_layer_files

    install = _pulumi_install(tmp_path)
    cli = tmp_path / "toolchain" / "pulumi"
    files = build_pulumi_layer_files({"pulumi": cli}, install)
    assert files == {
        "usr/local/bin/pulumi": cli,
        "usr/local/bin/pulumi-language-python": install.language_hosts[0],
        "usr/local/bin/pulumi-language-python-exec": install.language_hosts[1],
        f"{IMAGE_PULUMI_HOME[1:]}/plugins/resource-kubernetes-v4.34.2/pulumi-resource-kubernetes":
            install.plugins[0] / "pulumi-resource-kubernetes"}


def test_the_operator_image_carries_the_pulumi_install_in_a_layer_of_its_own_runnable_by_its_user(
        tmp_path, monkeypatch):
    """A second layer, cached apart (a change to the project leaves it, and its digest, as it was);
    root-owned and 0755 though plugins install 0700, so user 65532 runs them."""
    from strata_components.local import images

    monkeypatch.setenv("STRATA_CACHE", str(tmp_path / "cache"))
    cli = tmp_path / "pulumi-cli"
    cli.write_text("cli")
    files = images.build_pulumi_layer_files({"pulumi": cli}, _pulumi_install(tmp_path))
    layer = images._pulumi_layer(files, say=lambda _line: None)
    with tarfile.open(layer) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert {name for name, m in members.items() if m.isfile()} == set(files)
    assert {"opt", "opt/pulumi", "opt/pulumi/plugins", "usr/local/bin"} <= {n for n, m in members.items() if m.isdir()}
    assert all(m.uid == 0 and m.mode == 0o755 for m in members.values())
    assert images._pulumi_layer(files, say=lambda _line: None) == layer  # cached
    cli.write_text("a newer cli")
    assert images._pulumi_layer(files, say=lambda _line: None) != layer
    assert not layer.exists()  # the stale one is gone


def test_an_archive_of_several_layers_lists_them_bottom_first(tmp_path):
    layers = []
    for name in ("base", "top"):
        (tmp_path / name).write_text(name)
        with tarfile.open(tmp_path / f"{name}.tar", "w") as tar:
            tar.add(tmp_path / name, arcname=name)
        layers.append(tmp_path / f"{name}.tar")
    diff_ids = ["sha256:" + hashlib.sha256(layer.read_bytes()).hexdigest() for layer in layers]
    config = build_image_config(entrypoint=["/top"], env={}, user="1", workdir="/", layer_digests=diff_ids)
    write_oci_archive(layers, config, "strata.local/two:1", tmp_path / "image.oci.tar")
    with tarfile.open(tmp_path / "image.oci.tar") as archive:
        files = {member.name: archive.extractfile(member).read() for member in archive.getmembers()}
    (entry,) = json.loads(files["index.json"])["manifests"]
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    assert [layer["digest"] for layer in manifest["layers"]] == diff_ids
    assert len(config["history"]) == 2


def test_a_missing_pulumi_install_is_named_with_the_commands_that_install_it(monkeypatch, tmp_path):
    from strata_components.local import images, preflight

    monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    install = images.user_pulumi_install()
    assert install.language_hosts == () and install.plugins == ()
    message = images.build_missing_install_message(install.missing)
    assert "nothing can be downloaded" in message
    assert preflight.INSTALL_PULUMI in message
    assert preflight.plugin_install_command("kubernetes") in message
    assert preflight.plugin_install_command("flux") in message  # with its --server
    assert message.endswith("fix: install them, then run `strata image build` again")
