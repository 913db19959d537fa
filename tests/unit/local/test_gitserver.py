import base64
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from strata_components.local import processes
from strata_components.local.gitserver import GitRepos, _split_cgi_output


@pytest.fixture
def git_server(tmp_path):
    def start(auth: str | None = None, push: str | None = None):
        port = processes.free_ports(1)[0]
        argv = [sys.executable, "-m", "strata_components.local.gitserver", f"--root={tmp_path / 'repos'}",
                f"--port={port}"]
        if auth:
            (tmp_path / "auth").write_text(auth)
            argv.append(f"--auth-file={tmp_path / 'auth'}")
        if push:
            (tmp_path / "push-auth").write_text(push)
            argv.append(f"--push-auth-file={tmp_path / 'push-auth'}")
        (tmp_path / "repos").mkdir(exist_ok=True)
        processes.start(processes.HostProcess("git", argv), tmp_path / "run", tmp_path / "logs")
        processes.wait_until(lambda: not processes.port_is_free(port), 10, "git server")
        return GitRepos(tmp_path / "repos", f"http://127.0.0.1:{port}", tmp_path / "push-auth" if push else None)

    yield start
    processes.stop(tmp_path / "run", "git")


def test_smart_http_clone_sees_every_commit(git_server, tmp_path):
    repos = git_server()
    url = repos.create("app", {"Pulumi.yaml": "name: app\nruntime: yaml\n"})
    second = repos.commit("app", {"Pulumi.yaml": None, "dir/Pulumi.yaml": "name: moved\n"}, "move")
    heads = subprocess.run(["git", "ls-remote", url], capture_output=True, text=True, check=True).stdout
    assert f"{second}\trefs/heads/main" in heads
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", url, str(clone)], check=True)
    assert (clone / "dir" / "Pulumi.yaml").read_text() == "name: moved\n"
    assert not (clone / "Pulumi.yaml").exists()
    # Smart protocol: the advertisement answers with the git-upload-pack media type.
    with urllib.request.urlopen(f"{url}/info/refs?service=git-upload-pack") as response:
        assert response.headers["Content-Type"] == "application/x-git-upload-pack-advertisement"


def test_basic_auth_is_enforced(git_server):
    repos = git_server(auth="alice:s3cret")
    repos.create("private", {"a": "b"})
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{repos.url('private')}/info/refs?service=git-upload-pack")
    assert denied.value.code == 401
    request = urllib.request.Request(f"{repos.url('private')}/info/refs?service=git-upload-pack",
                                     headers={"Authorization": "Basic " + base64.b64encode(b"alice:s3cret").decode()})
    with urllib.request.urlopen(request) as response:
        assert response.status == 200


def test_creating_a_repository_twice_is_refused(git_server):
    repos = git_server()
    repos.create("twice")
    with pytest.raises(FileExistsError, match="twice"):
        repos.create("twice")


def test_cgi_headers_split_on_crlf_or_lf():
    assert _split_cgi_output(b"Status: 200\r\nA: b\r\n\r\nbody\n\nmore") == (b"Status: 200\r\nA: b", b"body\n\nmore")
    assert _split_cgi_output(b"A: b\n\nbody") == (b"A: b", b"body")
    assert _split_cgi_output(b"no headers") == (b"no headers", b"")


def test_only_a_successful_push_is_announced():
    from strata_components.local.gitserver import pushed_repository

    assert pushed_repository("POST", "/team/app.git/git-receive-pack", 200) == "team/app.git"
    assert pushed_repository("POST", "/app.git/git-upload-pack", 200) is None  # a fetch
    assert pushed_repository("GET", "/app.git/info/refs", 200) is None
    assert pushed_repository("POST", "/app.git/git-receive-pack", 401) is None


def test_a_gitrepository_matches_its_repository_with_or_without_git_suffix():
    from strata_components.local.gitserver import _same_repository

    base = "http://127.0.0.1:8000"
    assert _same_repository("http://127.0.0.1:8000/app.git", base, "app.git")
    assert _same_repository("http://127.0.0.1:8000/app/", base, "app.git")
    assert not _same_repository("http://127.0.0.1:8000/app-2.git", base, "app.git")
    assert not _same_repository("http://127.0.0.1:9000/app.git", base, "app.git")


def _push(url: str, clone, content: str) -> subprocess.CompletedProcess:
    (clone / "file").write_text(content)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "credential.helper="]
    subprocess.run([*git, "commit", "-qam", content], cwd=clone, check=True)
    return subprocess.run([*git, "push", "-q", url, "HEAD:main"], cwd=clone, capture_output=True, text=True,
                          env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/bin:/bin"})


def test_anyone_may_fetch_but_only_the_push_credential_pushes(git_server, tmp_path):
    """What reaches the server's port (a team's program on the host, say) reads the repositories, as a public
    repository is read, and cannot change them: a push without the credential, or with a wrong one, is refused."""
    repos = git_server(push="strata:push-s3cret")
    url = repos.create("platform", {"file": "v1"})
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", url, str(clone)], check=True)
    head = repos.head("platform")
    for intruder in (url, url.replace("http://", "http://strata:wrong@")):
        refused = _push(intruder, clone, f"intruder via {intruder}")
        assert refused.returncode != 0 and ("Authentication failed" in refused.stderr or
                                            "could not read Username" in refused.stderr), refused
        assert repos.head("platform") == head
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{url}/info/refs?service=git-receive-pack")
    assert denied.value.code == 401
    assert _push(repos.push_url("platform"), clone, "owner").returncode == 0
    assert repos.head("platform") != head


def test_a_server_without_a_push_credential_takes_no_push(git_server, tmp_path):
    repos = git_server()
    url = repos.create("read-only", {"file": "v1"})
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{url}/info/refs?service=git-receive-pack")
    assert denied.value.code == 403
    with pytest.raises(RuntimeError, match="no push credential"):
        repos.push_url("read-only")
