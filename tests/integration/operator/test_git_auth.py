"""gitAuth against git servers that check credentials: an access token and basic auth each fetch when
right, and when wrong stall the Stack with a clear status and a StackGitAuthenticationFailure Event,
with neither the wrong nor the right credential in the status, the Events or the operator's log.

The servers are the platform's own git server started with an auth file, on loopback; without the
credential they answer 401, as a hosted git service does."""

from __future__ import annotations

import base64
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from strata_components.local import processes
from strata_components.local.gitserver import GitRepos
from strata_components.local.kube import write_private

from .conftest import stash_project

TOKEN = "ghp-token-5a1f0c-do-not-leak"
PASSWORD = "basic-password-8e2d44-do-not-leak"
WRONG = "wrong-credential-31c9aa-do-not-leak"
# What the operator sends: a token as the password of user `git` (PKO does the same), or the user's pair.
SERVERS = {"token": f"git:{TOKEN}", "basic": f"alice:{PASSWORD}"}


@pytest.fixture(scope="module")
def servers(platform, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, GitRepos]]:
    started = {}
    for mode, credentials in SERVERS.items():
        root = tmp_path_factory.mktemp(f"git-{mode}")
        auth_file = write_private(root / "auth", credentials)
        (port,) = processes.free_ports(1)
        process = processes.HostProcess(f"git-auth-{mode}", [
            sys.executable, "-m", "strata_components.local.gitserver", f"--root={root / 'repos'}",
            f"--port={port}", f"--auth-file={auth_file}"])
        (root / "repos").mkdir()
        platform.start_controller(process, ready=lambda port=port: not processes.port_is_free(port))
        started[mode] = GitRepos(root / "repos", f"http://127.0.0.1:{port}")
    yield started
    for mode in SERVERS:
        platform.stop_controller(f"git-auth-{mode}")


def _auth(mode: str, secret: str) -> dict:
    ref = {"type": "Secret", "secret": {"name": secret, "key": "value"}}
    if mode == "token":
        return {"accessToken": ref}
    return {"basicAuth": {"userName": {"type": "Secret", "secret": {"name": secret, "key": "user"}}, "password": ref}}


def test_each_mode_fetches_with_the_right_credential_and_stalls_clearly_with_a_wrong_one(stacks, servers, operator):
    stacks.secret("right-token", {"value": TOKEN})
    stacks.secret("right-basic", {"user": "alice", "value": PASSWORD})
    stacks.secret("wrong-token", {"value": WRONG})
    stacks.secret("wrong-basic", {"user": "alice", "value": WRONG})
    for mode, repos in servers.items():
        url = repos.create(f"{stacks.namespace}-{mode}", {"Pulumi.yaml": stash_project(mode, mode=mode)})
        for verdict in ("right", "wrong"):
            stacks.create(f"{verdict}-{mode}", stacks.spec(stack=f"{verdict}-{mode}", projectRepo=url, branch="main",
                                                          gitAuth=_auth(mode, f"{verdict}-{mode}")))

    for mode in servers:
        assert stacks.wait_ready(f"right-{mode}", 90)["status"]["outputs"] == {"mode": mode}
        wrong = stacks.wait_stalled(f"wrong-{mode}", "SourceUnavailable", 90)
        stalled = next(c for c in wrong["status"]["conditions"] if c["type"] == "Stalled")
        assert "git ls-remote failed" in stalled["message"] or "git fetch failed" in stalled["message"], stalled
        assert stacks.events(f"wrong-{mode}", "StackGitAuthenticationFailure"), f"no auth failure Event for {mode}"
        assert stacks.runs(f"wrong-{mode}") == 0

    everything = {
        "status": json.dumps([stacks.get(f"{v}-{m}") for v in ("right", "wrong") for m in servers]),
        "events": json.dumps([e.to_dict() for e in stacks.core.list_namespaced_event(stacks.namespace).items],
                             default=str),
        "operator log": operator.log_text(),
        "operator state": "\n".join(p.read_text(errors="replace") for p in Path(operator.state_dir).rglob("*")
                                    if p.is_file() and p.stat().st_size < 1 << 20),
    }
    # Each credential alone, and as the Authorization header git sends it (base64 of user:password).
    forms = {secret: [secret, *(base64.b64encode(f"{user}{secret}".encode()).decode() for user in ("", "git:", "alice:"))]
             for secret in (TOKEN, PASSWORD, WRONG)}
    for secret, encodings in forms.items():
        for where, text in everything.items():
            assert not any(form in text for form in encodings), f"{secret} leaked into the {where}"


class EchoingServer(ThreadingHTTPServer):
    """Refuses every request with 403 and a text/plain body quoting the credential it was sent, decoded,
    as a misconfigured proxy might; git prints such a body as `remote:` lines, which the Stalled
    message keeps."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                sent = self.headers.get("Authorization", "").removeprefix("Basic ")
                body = f"credentials {base64.b64decode(sent).decode(errors='replace')} refused\n".encode()
                self.send_response(403)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(("127.0.0.1", 0), Handler)


def test_a_credential_a_server_echoes_back_is_masked_in_the_status_events_and_log(stacks, operator):
    """Redaction, not only git's discretion: the credential comes back in git's own output (the server's
    refusal, quoted), and every mode's value is masked wherever that output goes."""
    server = EchoingServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/echo.git"
        stacks.secret("echoed-token", {"value": TOKEN})
        stacks.secret("echoed-basic", {"user": "alice", "value": PASSWORD})
        for mode in SERVERS:
            stacks.create(f"echoed-{mode}", stacks.spec(stack=f"echoed-{mode}", projectRepo=url, branch="main",
                                                        gitAuth=_auth(mode, f"echoed-{mode}")))
        messages = {}
        # basicAuth's user name comes from the Secret too, so it is masked as well.
        for mode, user in (("token", "git"), ("basic", "[secret]")):
            stalled = stacks.wait_stalled(f"echoed-{mode}", "SourceUnavailable", 90)
            messages[mode] = next(c for c in stalled["status"]["conditions"] if c["type"] == "Stalled")["message"]
            # The server's words are there, with the credential masked in them.
            assert f"remote: credentials {user}:[secret] refused" in messages[mode], messages[mode]
            assert stacks.wait_events(f"echoed-{mode}", "StackGitAuthenticationFailure")
    finally:
        server.shutdown()
    everything = "\n".join([
        json.dumps([stacks.get(f"echoed-{mode}") for mode in SERVERS]),
        json.dumps([e.to_dict() for e in stacks.core.list_namespaced_event(stacks.namespace).items], default=str),
        operator.log_text()])
    for secret in (TOKEN, PASSWORD):
        assert secret not in everything, f"{secret} leaked"


def test_an_ssh_key_fetches_when_authorized_and_a_wrong_key_stalls_clearly(stacks, operator, tmp_path):
    """sshAuth against a real SSH server that checks keys: the authorized key (also one protected by a
    passphrase, given as sshAuth.password) fetches; a key the server does not know stalls the Stack with
    StackGitAuthenticationFailure, and no private key or passphrase shows anywhere."""
    import asyncssh

    from .ssh_git_server import SshGitServer

    passphrase = "ssh-passphrase-77c1e0-do-not-leak"
    right, protected, wrong = (asyncssh.generate_private_key("ssh-ed25519") for _ in range(3))
    server = SshGitServer(tmp_path / "repos", [key.export_public_key().decode() for key in (right, protected)])
    server.root.mkdir()
    server.start()
    try:
        repos = GitRepos(server.root, f"ssh://git@127.0.0.1:{server.port}")
        repos.create(f"{stacks.namespace}-ssh", {"Pulumi.yaml": stash_project("ssh", mode="ssh")})
        url = server.url(f"{stacks.namespace}-ssh")
        keys = {"right": right.export_private_key().decode(),
                "protected": protected.export_private_key(passphrase=passphrase).decode(),
                "wrong": wrong.export_private_key().decode()}
        for name, key in keys.items():
            stacks.secret(f"ssh-{name}", {"key": key, "passphrase": passphrase})
            auth = {"sshPrivateKey": {"type": "Secret", "secret": {"name": f"ssh-{name}", "key": "key"}}}
            if name == "protected":
                auth["password"] = {"type": "Secret", "secret": {"name": f"ssh-{name}", "key": "passphrase"}}
            stacks.create(f"ssh-{name}", stacks.spec(stack=f"ssh-{name}", projectRepo=url, branch="main",
                                                     gitAuth={"sshAuth": auth}))

        for name in ("right", "protected"):
            assert stacks.wait_ready(f"ssh-{name}", 90)["status"]["outputs"] == {"mode": "ssh"}
        stalled = stacks.wait_stalled("ssh-wrong", "SourceUnavailable", 90)
        message = next(c for c in stalled["status"]["conditions"] if c["type"] == "Stalled")["message"]
        assert "Permission denied (publickey)" in message, message
        assert stacks.wait_events("ssh-wrong", "StackGitAuthenticationFailure")
        assert stacks.runs("ssh-wrong") == 0
    finally:
        server.stop()

    everything = "\n".join([
        json.dumps([stacks.get(f"ssh-{name}") for name in keys]),
        json.dumps([e.to_dict() for e in stacks.core.list_namespaced_event(stacks.namespace).items], default=str),
        operator.log_text(),
        *(p.read_text(errors="replace") for p in Path(operator.state_dir).rglob("*")
          if p.is_file() and p.stat().st_size < 1 << 20)])
    for name, key in keys.items():
        body = max(key.splitlines(), key=len)  # the longest base64 line of the private key
        assert body not in everything, f"the {name} private key leaked"
    assert passphrase not in everything


def test_a_changed_ssh_host_key_stalls_the_stack_until_its_secret_names_the_new_one(stacks, operator, tmp_path):
    """Trust on first use, pinned per Stack: the first fetch pins the SSH server's host key in the Stack's
    own state directory. Once the server presents another key on the same address (reinstalled, or a man in
    the middle), the next fetch is refused: the Stack stalls SourceUnavailable saying the host key changed
    and how to fix it, and nothing runs. The new key under `known_hosts` in the Secret of the Stack's SSH key
    (Flux's convention) is then the one trusted, and the Stack goes Ready again."""
    import asyncssh

    from .ssh_git_server import SshGitServer

    key = asyncssh.generate_private_key("ssh-ed25519")
    server = SshGitServer(tmp_path / "repos", [key.export_public_key().decode()])
    server.root.mkdir()
    server.start()
    try:
        repo = f"{stacks.namespace}-pinned"
        GitRepos(server.root, f"ssh://git@127.0.0.1:{server.port}").create(
            repo, {"Pulumi.yaml": stash_project("pinned", mode="ssh")})
        stacks.secret("ssh-pinned", {"key": key.export_private_key().decode()})
        auth = {"sshAuth": {"sshPrivateKey": {"type": "Secret", "secret": {"name": "ssh-pinned", "key": "key"}}}}
        stacks.create("pinned", stacks.spec(stack="pinned", projectRepo=server.url(repo), branch="main",
                                            gitAuth=auth))
        assert stacks.wait_ready("pinned", 90)["status"]["outputs"] == {"mode": "ssh"}
        pin = operator.state_dir / "stacks" / stacks.namespace / "pinned" / "known_hosts"
        first_key = server.known_hosts().split()[-1]
        assert first_key in pin.read_text()
        runs = stacks.runs("pinned")

        server.rotate_host_key()
        stacks.patch("pinned", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "rotated"}}})
        stalled = stacks.wait_stalled("pinned", "SourceUnavailable", 60)
        message = next(c for c in stalled["status"]["conditions"] if c["type"] == "Stalled")["message"]
        assert "its host key changed since the first fetch" in message and str(pin) in message, message
        assert "put its public key under known_hosts in the git auth Secret" in message, message
        assert stacks.runs("pinned") == runs
        assert first_key in pin.read_text(), "a refused key never replaces the pinned one"

        stacks.core.patch_namespaced_secret("ssh-pinned", stacks.namespace,
                                            {"stringData": {"known_hosts": server.known_hosts()}})
        stacks.patch("pinned", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "trusted"}}})
        stacks.wait_ready("pinned", 90)
        stacks.wait_events("pinned", "StackUpdateDetected", count=runs + 1)  # the request ran, with the new key
    finally:
        server.stop()
