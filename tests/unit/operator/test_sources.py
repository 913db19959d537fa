"""Flux artifact verification and safe unpacking, Program projects, git against a local repository."""

import functools
import hashlib
import http.server
import io
import os
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from strata_operator.services.redaction import Redactor
from strata_operator.api.program import program_revision, program_status
from strata_operator.sources.archive import SizeCap, SourceError, SourceTooLarge, UnsafeArchive, safe_extract
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


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def served(tmp_path):
    """tmp_path over HTTP, as source-controller serves its artifacts: the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietFiles, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def artifact_for(path: Path, base_url: str, algorithm="sha256", corrupt=False):
    digest = hashlib.new(algorithm, path.read_bytes()).hexdigest()
    if corrupt:
        digest = ("0" if digest[0] != "0" else "1") + digest[1:]
    return FluxArtifact(f"{base_url}/{path.name}", "main@sha1:abc", f"{algorithm}:{digest}")


@pytest.mark.parametrize("algorithm", ["sha256", "sha384", "sha512"])
def test_download_verifies_digest(tmp_path, served, algorithm):
    src = make_tar(tmp_path / "a.tar.gz", [("Pulumi.yaml", "file", "name: p\nruntime: yaml\n")])
    download_artifact(artifact_for(src, served, algorithm), tmp_path / "got.tar.gz")
    assert (tmp_path / "got.tar.gz").read_bytes() == src.read_bytes()


def test_bad_digest_is_refused(tmp_path, served):
    src = make_tar(tmp_path / "a.tar.gz", [("x", "file", "x")])
    with pytest.raises(SourceError, match="digest mismatch"):
        download_artifact(artifact_for(src, served, corrupt=True), tmp_path / "got.tar.gz")


def test_unknown_digest_algorithm_is_refused(tmp_path, served):
    src = make_tar(tmp_path / "a.tar.gz", [("x", "file", "x")])
    with pytest.raises(SourceError, match="unsupported artifact digest"):
        download_artifact(FluxArtifact(f"{served}/{src.name}", "r", "md5:abc"), tmp_path / "got")


@pytest.mark.parametrize("scheme", ["file://", "FILE://", "ftp://127.0.0.1"])
def test_an_artifact_is_never_read_from_the_operators_own_files(tmp_path, scheme):
    """A forged status.artifact.url (or a Workspace's spec.flux.url) naming the operator's own files: refused
    before anything is read, even with the file's right digest."""
    src = make_tar(tmp_path / "a.tar.gz", [("x", "file", "x")])
    digest = "sha256:" + hashlib.sha256(src.read_bytes()).hexdigest()
    with pytest.raises(SourceError, match="not http:// or https://"):
        download_artifact(FluxArtifact(f"{scheme}{src}", "r", digest), tmp_path / "got")
    assert not (tmp_path / "got").exists()


def test_an_artifact_url_urllib_cannot_use_fails_as_a_source_error_without_its_password(tmp_path):
    """urllib quotes a URL's userinfo outside the URL when it cannot parse the host ("nonnumeric port:
    'PASSWORD@host'"), where the URL pattern does not mask it: the error masks the URL's password itself."""
    password = "artifact-password-0b7e-unit"
    with pytest.raises(SourceError) as refused:
        download_artifact(FluxArtifact(f"http://flux:{password}@127.0.0.1/a.tar.gz", "r", "sha256:" + "0" * 64),
                          tmp_path / "got")
    assert "artifact download from http://[secret]@127.0.0.1/a.tar.gz failed" in str(refused.value)
    assert password not in str(refused.value)


def test_oversized_download_is_refused(tmp_path, served):
    src = make_tar(tmp_path / "a.tar.gz", [("x", "file", "y" * 100_000)])
    with pytest.raises(UnsafeArchive, match=r"spec.fluxSource.sourceRef: the artifact at http://\S+ exceeds the "
                                            "operator's source size cap of 100 bytes"):
        download_artifact(artifact_for(src, served), tmp_path / "got", SizeCap(100, "spec.fluxSource.sourceRef"))


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
    ([("hard", "lnk", "/etc/passwd")], "is a hard link"),
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
    with pytest.raises(UnsafeArchive, match=r"spec.flux.url: the archive, unpacked \(at entry 'f\d'\), exceeds the "
                                            "operator's source size cap of 2000000 bytes"):
        safe_extract(src, tmp_path / "out", SizeCap(2_000_000, "spec.flux.url"))


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
        github_app_token(app, Redactor(), api="http://127.0.0.1:9")
    assert str(caught.value).startswith(field) and "fix:" in str(caught.value) and "nope" not in str(caught.value)


def test_an_unreachable_github_api_names_the_field_and_the_fix(app_key):
    _, pem = app_key
    with pytest.raises(SourceError) as caught:
        github_app_token(GitHubApp("1", "2", pem), Redactor(), api="http://127.0.0.1:9", timeout=5)
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
    url, pin = repo.as_uri(), tmp_path / "state" / "known_hosts"
    assert git_branch_head(url, "main", None, pin) == head
    assert git_branch_head(url, "refs/heads/main", None, pin) == head
    assert git_checkout(url, first, tmp_path / "co", None, pin) == first
    assert (tmp_path / "co/Pulumi.yaml").read_text() == "name: p\nruntime: yaml\n"
    assert git_checkout(url, head[:10], tmp_path / "co2", None, pin) == head
    with pytest.raises(SourceError, match="branch 'nope' not found"):
        git_branch_head(url, "nope", None, pin)


def test_a_git_failure_says_its_cause_not_the_advice_around_it():
    from strata_operator.sources.git import git_failure

    ssh = ("Warning: Permanently added '[127.0.0.1]:4022' (ED25519) to the list of known hosts.\n"
           "git@127.0.0.1: Permission denied (publickey).\nfatal: Could not read from remote repository.\n\n"
           "Please make sure you have the correct access rights\nand the repository exists.\n")
    assert git_failure(ssh, 128) == ("git@127.0.0.1: Permission denied (publickey).; "
                                     "fatal: Could not read from remote repository.")
    assert git_failure("something odd\nlast words\n", 1) == "last words"
    assert git_failure("", 128) == "exit 128"


def _committed(tmp_path: Path, files: dict[str, bytes]) -> tuple[str, str]:
    """A repository holding `files` in one commit: its file:// URL and the commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for name, data in files.items():
        (repo / name).write_bytes(data)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    return repo.as_uri(), git(repo, "rev-parse", "HEAD")


CAP_FIX = "(fix: make the source smaller, e.g. keep large files and build outputs out of it, or have the " \
          "operator's admins raise --max-source-bytes)"


def test_a_checkout_whose_files_pass_the_cap_is_refused_before_any_is_written(tmp_path):
    """A megabyte of zeros is a kilobyte of git objects: the fetch is small, the checkout would not be. The
    commit's tree says so before anything is checked out (a zip bomb of a repository never reaches the disk)."""
    url, commit = _committed(tmp_path, {"Pulumi.yaml": b"name: p\nruntime: yaml\n", "zeros.bin": b"\0" * 1_000_000})
    dest = tmp_path / "co"
    with pytest.raises(SourceTooLarge) as refused:
        git_checkout(url, commit, dest, None, tmp_path / "pin", cap=SizeCap(100_000, "spec.projectRepo"))
    assert str(refused.value) == (f"spec.projectRepo: the checkout of commit {commit} (1000022 bytes of files) "
                                  f"exceeds the operator's source size cap of 100000 bytes {CAP_FIX}")
    assert [path.name for path in dest.iterdir()] == [".git"]  # nothing checked out


def test_what_git_fetches_beyond_the_cap_is_refused(tmp_path):
    """Incompressible data: what the fetch brings is already beyond the cap (git has no limit of its own on a
    fetch, the operator measures the repository while git fetches and once it is done)."""
    url, commit = _committed(tmp_path, {"Pulumi.yaml": b"name: p\nruntime: yaml\n", "noise.bin": os.urandom(300_000)})
    with pytest.raises(SourceTooLarge, match=rf"^spec.git.url: what git fetched for commit {commit} from {url} "
                                             "exceeds the operator's source size cap of 200000 bytes"):
        git_checkout(url, commit, tmp_path / "co", None, tmp_path / "pin", cap=SizeCap(200_000, "spec.git.url"))


def test_a_checkout_that_attributes_make_larger_than_its_files_is_measured_once_checked_out(tmp_path):
    """`eol=crlf` doubles a file of newlines as it is checked out: the tree is measured again then."""
    url, commit = _committed(tmp_path, {".gitattributes": b"*.txt text eol=crlf\n", "lines.txt": b"\n" * 60_000})
    with pytest.raises(SourceTooLarge, match=rf"the checkout of commit {commit} \(120020 bytes of files\) exceeds"):
        git_checkout(url, commit, tmp_path / "co", None, tmp_path / "pin", cap=SizeCap(100_000, "spec.projectRepo"))
    assert git_checkout(url, commit, tmp_path / "co2", None, tmp_path / "pin", cap=SizeCap(200_000)) == commit


def test_a_git_that_passes_the_cap_is_stopped_with_its_whole_process_group(tmp_path):
    """What the size watch raises stops git at once, and what git started (index-pack, ssh): here an alias's
    shell and its two sleeps."""
    from strata_operator.sources.git import HostKeys, _run_git

    marker = f"{30 + os.getpid() % 1000 / 1000:.3f}"  # how long each sleep is: what finds them after
    looks = []

    def check() -> None:
        looks.append(time.monotonic())
        if len(looks) == 2:
            raise SizeCap(1, "spec.projectRepo").refusal("what git fetched")

    started = time.monotonic()
    with pytest.raises(SourceTooLarge, match="^spec.projectRepo: what git fetched exceeds"):
        _run_git(["-c", f"alias.slow=!sleep {marker} & sleep {marker}; wait", "slow"],
                 {"PATH": "/usr/bin:/bin"}, tmp_path, 60, HostKeys(tmp_path / "pin", False), check)
    assert time.monotonic() - started < 5
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.split()
    assert left == [], left


def test_a_download_that_trickles_past_its_deadline_is_refused(tmp_path):
    """An artifact server that sends a byte within every read's timeout would hold a source thread for good."""
    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)

        def log_message(self, *_args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        with pytest.raises(SourceError, match=r"artifact download from http://127.0.0.1:\d+/a.tar.gz took more "
                                              r"than 0.5s"):
            download_artifact(FluxArtifact(f"http://127.0.0.1:{server.server_address[1]}/a.tar.gz", "r",
                                           "sha256:" + "0" * 64), tmp_path / "got", timeout=5, deadline_seconds=0.5)
        assert time.monotonic() - started < 3
    finally:
        server.shutdown()


def test_a_workspaces_host_directory_beyond_the_cap_is_not_copied(tmp_path):
    from strata_operator.api.workspace import parse_workspace
    from strata_operator.sources.workspace_program import materialise

    program = tmp_path / "program"
    program.mkdir()
    (program / "Pulumi.yaml").write_text("name: p\nruntime: yaml\n")
    (program / "data.bin").write_bytes(b"\0" * 5000)
    spec = parse_workspace({"local": {"dir": str(program)}})
    with pytest.raises(SourceTooLarge, match=rf"^spec.local.dir: '{program}' \(5022 bytes of files\) exceeds the "
                                             "operator's source size cap of 4096 bytes"):
        materialise(spec, tmp_path / "dest", None, tmp_path / "pin", True, max_bytes=4096)
    assert not (tmp_path / "dest").exists()
    assert materialise(spec, tmp_path / "dest", None, tmp_path / "pin", True, max_bytes=8192)[0] == tmp_path / "dest"
