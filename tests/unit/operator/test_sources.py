"""Flux artifact verification and safe unpacking, Program projects, git against a local repository."""

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from strata_operator.services.redaction import redact
from strata_operator.api.program import program_revision, program_status
from strata_operator.sources.archive import SourceError, UnsafeArchive, safe_extract
from strata_operator.sources.flux import FluxArtifact, SourceNotReady, download_artifact, flux_artifact
from strata_operator.sources.git import GitHubApp, git_branch_head, git_checkout, github_app_jwt, github_app_token
from strata_operator.sources.project import project_info, subdir, write_program_project


def make_tar(path: Path, members):
    """members: (name, kind, payload) with kind file|dir|sym|lnk|fifo."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = payload.encode() if isinstance(payload, str) else payload
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "lnk": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = payload or ""
            tar.addfile(info)
    return path


def artifact_for(path: Path, algorithm="sha256", corrupt=False):
    digest = hashlib.new(algorithm, path.read_bytes()).hexdigest()
    if corrupt:
        digest = ("0" if digest[0] != "0" else "1") + digest[1:]
    return FluxArtifact(path.as_uri(), "main@sha1:abc", f"{algorithm}:{digest}")


@pytest.mark.parametrize("algorithm", ["sha256", "sha384", "sha512"])
def test_download_verifies_digest(tmp_path, algorithm):
    src = make_tar(tmp_path / "a.tar.gz", [("Pulumi.yaml", "file", "name: p\nruntime: yaml\n")])
    download_artifact(artifact_for(src, algorithm), tmp_path / "got.tar.gz")
    assert (tmp_path / "got.tar.gz").read_bytes() == src.read_bytes()


def test_bad_digest_is_refused(tmp_path):
    src = make_tar(tmp_path / "a.tar.gz", [("x", "file", "x")])
    with pytest.raises(SourceError, match="digest mismatch"):
        download_artifact(artifact_for(src, corrupt=True), tmp_path / "got.tar.gz")


def test_unknown_digest_algorithm_is_refused(tmp_path):
    src = make_tar(tmp_path / "a.tar.gz", [("x", "file", "x")])
    with pytest.raises(SourceError, match="unsupported artifact digest"):
        download_artifact(FluxArtifact(src.as_uri(), "r", "md5:abc"), tmp_path / "got")


def test_an_artifact_url_urllib_cannot_use_fails_as_a_source_error_without_its_password(tmp_path):
    """urllib quotes a URL's userinfo outside the URL when it cannot parse the host ("nonnumeric port:
    'PASSWORD@host'"), where the URL pattern does not mask it: the password is registered first."""
    password = "artifact-password-0b7e-unit"
    with pytest.raises(SourceError) as refused:
        download_artifact(FluxArtifact(f"http://flux:{password}@127.0.0.1/a.tar.gz", "r", "sha256:" + "0" * 64),
                          tmp_path / "got")
    assert "artifact download from http://[secret]@127.0.0.1/a.tar.gz failed" in redact(str(refused.value))
    assert password not in redact(str(refused.value))


def test_oversized_download_is_refused(tmp_path):
    src = make_tar(tmp_path / "a.tar.gz", [("x", "file", "y" * 100_000)])
    with pytest.raises(UnsafeArchive, match="larger than"):
        download_artifact(artifact_for(src), tmp_path / "got", max_bytes=100)


def test_safe_extract_unpacks_a_normal_tree(tmp_path):
    src = make_tar(tmp_path / "a.tar.gz", [("proj", "dir", None), ("proj/Pulumi.yaml", "file", "name: p\n"),
                                           ("proj/link.yaml", "sym", "Pulumi.yaml")])
    safe_extract(src, tmp_path / "out")
    assert (tmp_path / "out/proj/Pulumi.yaml").read_text() == "name: p\n"
    assert (tmp_path / "out/proj/link.yaml").read_text() == "name: p\n"
    assert subdir(tmp_path / "out", "proj", "spec.fluxSource.dir") == (tmp_path / "out/proj").resolve()


@pytest.mark.parametrize("members,problem", [
    ([("../evil", "file", "x")], "escapes"),
    ([("/etc/evil", "file", "x")], "escapes"),
    ([("link", "sym", "/etc/passwd")], "points outside"),
    ([("link", "sym", "../../outside")], "points outside"),
    ([("dirlink", "sym", "."), ("dirlink/../../x", "file", "x")], "escapes"),
    ([("hard", "lnk", "/etc/passwd")], "points outside"),
    ([("pipe", "fifo", None)], "device or fifo"),
])
def test_escapes_are_refused(tmp_path, members, problem):
    src = make_tar(tmp_path / "a.tar.gz", members)
    with pytest.raises(UnsafeArchive, match=problem):
        safe_extract(src, tmp_path / "out")
    assert not (tmp_path / "evil").exists()


def test_write_through_symlinked_directory_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    src = make_tar(tmp_path / "a.tar.gz", [("d", "sym", str(outside)), ("d/x", "file", "x")])
    with pytest.raises(UnsafeArchive):
        safe_extract(src, tmp_path / "out")
    assert not (outside / "x").exists()


def test_tar_bomb_is_refused(tmp_path):
    src = make_tar(tmp_path / "bomb.tar.gz", [(f"f{i}", "file", b"\0" * 1_000_000) for i in range(5)])
    assert src.stat().st_size < 100_000  # compresses ~1000x
    with pytest.raises(UnsafeArchive, match="expands beyond"):
        safe_extract(src, tmp_path / "out", max_bytes=2_000_000)


def test_too_many_entries_is_refused(tmp_path):
    src = make_tar(tmp_path / "many.tar.gz", [(f"f{i}", "file", "") for i in range(20)])
    with pytest.raises(UnsafeArchive, match="more than 10 entries"):
        safe_extract(src, tmp_path / "out", max_members=10)


def test_missing_project_dir_is_named(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(SourceError, match="no Pulumi.yaml in spec.repoDir 'app'"):
        subdir(tmp_path / "src", "app", "spec.repoDir")


def flux_source(ready="True", artifact=None):
    return {"kind": "GitRepository", "metadata": {"name": "repo"},
            "status": {"conditions": [{"type": "Ready", "status": ready, "message": "failed to checkout"}],
                       **({"artifact": artifact} if artifact else {})}}


def test_flux_artifact_requires_ready_and_digest():
    with pytest.raises(SourceError, match="not Ready: failed to checkout") as failed:
        flux_artifact(flux_source("False"))
    assert not isinstance(failed.value, SourceNotReady)  # the controller said it failed: stall
    # A source its controller has not reported on yet is waited for, not stalled on.
    for new in ({"kind": "GitRepository", "metadata": {"name": "repo"}}, flux_source("Unknown")):
        with pytest.raises(SourceNotReady, match="is not Ready"):
            flux_artifact(new)
    with pytest.raises(SourceError, match="has no artifact"):
        flux_artifact(flux_source())
    with pytest.raises(SourceError, match="no digest"):
        flux_artifact(flux_source(artifact={"url": "http://x/a.tar.gz", "revision": "r"}))
    legacy = flux_artifact(flux_source(artifact={"url": "http://x", "revision": "r", "checksum": "ab"}))
    assert legacy.digest == "sha256:ab"


def test_program_becomes_a_yaml_project(tmp_path):
    program = {"metadata": {"name": "site", "generation": 4},
               "program": {"configuration": {"greeting": {"type": "String", "default": "hi"}},
                           "resources": {"s": {"type": "pulumi:index:Stash", "properties": {"input": "${greeting}"}}},
                           "outputs": {"out": "${s.output}"}}}
    write_program_project(program, tmp_path)
    project = yaml.safe_load((tmp_path / "Pulumi.yaml").read_text())
    assert project["name"] == "site" and project["runtime"] == "yaml"
    assert project["configuration"] == {"greeting": {"type": "String", "default": "hi"}}
    assert project["resources"]["s"]["type"] == "pulumi:index:Stash"
    assert program_revision(program) == "site/4"


def test_program_packages_reach_the_project_file(tmp_path):
    program = {"metadata": {"name": "site", "generation": 1},
               "program": {"packages": {"random": "random@4.16.0"},
                           "resources": {"r": {"type": "random:RandomString", "properties": {"length": 4}}}}}
    write_program_project(program, tmp_path)
    assert yaml.safe_load((tmp_path / "Pulumi.yaml").read_text())["packages"] == {"random": "random@4.16.0"}


def test_program_status_is_pkos_artifact_and_moves_only_when_the_program_does():
    program = {"metadata": {"name": "site", "namespace": "team", "generation": 3},
               "program": {"resources": {"s": {"type": "pulumi:index:Stash", "properties": {"input": 1}}}}}
    first = program_status(program, None, "2025-01-01T00:00:00Z")
    artifact = first["artifact"]
    assert first["observedGeneration"] == 3 and "url" not in artifact
    assert (artifact["path"], artifact["revision"]) == ("programs/team/site/3", "3")
    rendered = yaml.safe_dump({"name": "site", "runtime": "yaml", "resources": program["program"]["resources"]},
                              sort_keys=False)
    assert artifact["digest"] == "sha256:" + hashlib.sha256(rendered.encode()).hexdigest()
    assert program_status(program, first, "2025-01-02T00:00:00Z") == first  # unchanged: same time, no write
    changed = {**program, "metadata": {**program["metadata"], "generation": 4},
               "program": {"resources": {"s": {"type": "pulumi:index:Stash", "properties": {"input": 2}}}}}
    after = program_status(changed, first, "2025-01-02T00:00:00Z")["artifact"]
    assert after["lastUpdateTime"] == "2025-01-02T00:00:00Z" and after["digest"] != artifact["digest"]
    invalid = {"metadata": {"name": "bad", "generation": 2}, "program": {"resources": {"a": {}}}}
    assert program_status(invalid, first, "2025-01-02T00:00:00Z") == {"observedGeneration": 2}


@pytest.mark.parametrize("text,expected", [
    ("name: app\nruntime: yaml\n", {"name": "app", "runtime": "yaml"}),
    ("name: app\nruntime:\n  name: python\n  options: {toolchain: pip}\n", {"name": "app", "runtime": "python"}),
    ("runtime: yaml\n", None),
    ("name: [\n", None),
])
def test_project_info_reads_name_and_runtime(tmp_path, text, expected):
    (tmp_path / "Pulumi.yaml").write_text(text)
    assert project_info(tmp_path) == expected


def test_project_info_of_a_directory_without_a_project_is_none(tmp_path):
    assert project_info(tmp_path) is None


@pytest.fixture(scope="module")
def app_key():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return key, pem


def test_github_app_jwt_is_signed_by_the_app_key_for_github(app_key):
    import base64
    import json

    key, pem = app_key
    token = github_app_jwt(GitHubApp("12345", "678", pem), now=1_700_000_000)
    header, claims, signature = token.split(".")

    def decode(part):
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))

    assert json.loads(decode(header)) == {"alg": "RS256", "typ": "JWT"}
    assert json.loads(decode(claims)) == {"iat": 1_700_000_000 - 60, "exp": 1_700_000_000 + 540, "iss": "12345"}
    key.public_key().verify(decode(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256())


@pytest.mark.parametrize("app,field", [
    (GitHubApp("not-a-number", "1", "x"), "spec.gitAuth.githubApp.appID"),
    (GitHubApp("1", "abc", "x"), "spec.gitAuth.githubApp.installationID"),
    (GitHubApp("1", "2", "-----BEGIN RSA PRIVATE KEY-----\nnope\n-----END RSA PRIVATE KEY-----\n"),
     "spec.gitAuth.githubApp.privateKey"),
])
def test_bad_github_app_credentials_name_the_field_and_never_the_key(app, field):
    with pytest.raises(SourceError) as caught:
        github_app_token(app, api="http://127.0.0.1:9")
    assert str(caught.value).startswith(field) and "fix:" in str(caught.value) and "nope" not in str(caught.value)


def test_an_unreachable_github_api_names_the_field_and_the_fix(app_key):
    _, pem = app_key
    with pytest.raises(SourceError) as caught:
        github_app_token(GitHubApp("1", "2", pem), api="http://127.0.0.1:9", timeout=5)
    message = str(caught.value)
    assert message.startswith("spec.gitAuth.githubApp: cannot reach http://127.0.0.1:9")
    assert "spec.gitAuth.accessToken" in message and "PRIVATE KEY" not in message


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_AUTHOR_NAME": "t",
                               "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t"}).stdout.strip()


def test_git_branch_head_and_checkout(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "Pulumi.yaml").write_text("name: p\nruntime: yaml\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    first = git(repo, "rev-parse", "HEAD")
    (repo / "Pulumi.yaml").write_text("name: p2\nruntime: yaml\n")
    git(repo, "commit", "-q", "-am", "two")
    head = git(repo, "rev-parse", "HEAD")
    url = repo.as_uri()
    assert git_branch_head(url, "main", None) == head
    assert git_branch_head(url, "refs/heads/main", None) == head
    assert git_checkout(url, first, tmp_path / "co", None) == first
    assert (tmp_path / "co/Pulumi.yaml").read_text() == "name: p\nruntime: yaml\n"
    assert git_checkout(url, head[:10], tmp_path / "co2", None) == head
    with pytest.raises(SourceError, match="branch 'nope' not found"):
        git_branch_head(url, "nope", None)


def test_a_git_failure_says_its_cause_not_the_advice_around_it():
    from strata_operator.sources.git import git_failure

    ssh = ("Warning: Permanently added '[127.0.0.1]:4022' (ED25519) to the list of known hosts.\n"
           "git@127.0.0.1: Permission denied (publickey).\nfatal: Could not read from remote repository.\n\n"
           "Please make sure you have the correct access rights\nand the repository exists.\n")
    assert git_failure(ssh, 128) == ("git@127.0.0.1: Permission denied (publickey).; "
                                     "fatal: Could not read from remote repository.")
    assert git_failure("something odd\nlast words\n", 1) == "last words"
    assert git_failure("", 128) == "exit 128"
