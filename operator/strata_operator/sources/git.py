"""A Stack's program from a git repository: the branch's head, a commit checked out.

Git credentials reach git through its environment (extra header, askpass, key file), never through
argv or the URL; a GitHub App's are first exchanged at GitHub's API for a short-lived installation
token.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import shlex
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ..services.redaction import REDACTOR
from .archive import SourceError

DEFAULT_FETCH_TIMEOUT = 60.0
GITHUB_API = "https://api.github.com"
GITHUB_APP_FIELD = "spec.gitAuth.githubApp"


@dataclasses.dataclass(frozen=True)
class GitHubApp:
    """A GitHub App installation's credentials; git gets a short-lived installation token minted from them."""

    app_id: str
    installation_id: str
    private_key: str


@dataclasses.dataclass(frozen=True)
class GitCredentials:
    """Resolved credentials; exactly one mode is used (ssh key, then token, then basic auth, as PKO)."""

    token: str = ""
    username: str = ""
    password: str = ""
    ssh_private_key: str = ""
    ssh_passphrase: str = ""
    github_app: GitHubApp | None = None

    def register_secrets(self) -> None:
        REDACTOR.add(self.token, self.password, self.ssh_private_key, self.ssh_passphrase,
                     self.github_app.private_key if self.github_app else "")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def github_app_jwt(app: GitHubApp, now: float) -> str:
    """The RS256 JWT that authenticates as the App (GitHub: iat 60 s back for clock drift, at most 10 min)."""
    if not app.app_id.strip().isdigit():
        raise SourceError(f"{GITHUB_APP_FIELD}.appID: not a numeric GitHub App ID (fix: use the App's ID from its "
                          "settings page)")
    try:
        key = serialization.load_pem_private_key(app.private_key.encode(), password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise SourceError(f"{GITHUB_APP_FIELD}.privateKey: not a PEM-encoded RSA private key (fix: use the .pem "
                          "file GitHub generated for the App)")
    header = _b64url(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
    claims = _b64url(json.dumps({"iat": int(now) - 60, "exp": int(now) + 540, "iss": app.app_id.strip()}).encode())
    signature = key.sign(f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{header}.{claims}.{_b64url(signature)}"


def github_app_token(app: GitHubApp, api: str = GITHUB_API, timeout: float = DEFAULT_FETCH_TIMEOUT) -> str:
    """An installation access token for `app` (valid 1 h), from GitHub's API; SourceError naming the field."""
    if not app.installation_id.strip().isdigit():
        raise SourceError(f"{GITHUB_APP_FIELD}.installationID: not a numeric installation ID (fix: use the ID "
                          "in the App installation's URL)")
    jwt = github_app_jwt(app, time.time())
    REDACTOR.add(jwt)
    request = urllib.request.Request(
        f"{api}/app/installations/{app.installation_id.strip()}/access_tokens", method="POST",
        headers={"Authorization": f"Bearer {jwt}", "Accept": "application/vnd.github+json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            token = json.loads(response.read()).get("token", "")
    except urllib.error.HTTPError as err:
        raise SourceError(f"{GITHUB_APP_FIELD}: {api} refused the App credentials (HTTP {err.code}) (fix: check "
                          "appID, installationID and privateKey)") from None
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise SourceError(f"{GITHUB_APP_FIELD}: cannot reach {api} to mint an installation token ({reason}) "
                          "(fix: allow the operator to reach it, or use spec.gitAuth.accessToken)") from None
    if not token:
        raise SourceError(f"{GITHUB_APP_FIELD}: {api} returned no installation token")
    REDACTOR.add(token)
    return token


def _git_env(creds: GitCredentials | None, scratch: Path) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
    }
    if creds is None:
        return env
    if creds.github_app is not None:
        # GitHub takes an installation token as the password of the user x-access-token.
        creds = GitCredentials(username="x-access-token", password=github_app_token(creds.github_app))
    if creds.ssh_private_key:
        key = scratch / "id_key"
        key.write_text(creds.ssh_private_key.rstrip("\n") + "\n")
        key.chmod(0o600)
        command = ["ssh", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=accept-new",
                   "-o", f"UserKnownHostsFile={scratch / 'known_hosts'}", "-o", "BatchMode=no"]
        env["GIT_SSH_COMMAND"] = shlex.join(command)
        if creds.ssh_passphrase:
            # ssh asks SSH_ASKPASS for the key's passphrase; the script echoes it from the environment.
            askpass = scratch / "askpass"
            askpass.write_text('#!/bin/sh\nprintf "%s\\n" "$STRATA_SSH_PASSPHRASE"\n')
            askpass.chmod(0o700)
            env.update(SSH_ASKPASS=str(askpass), SSH_ASKPASS_REQUIRE="force", DISPLAY=":0",
                       STRATA_SSH_PASSPHRASE=creds.ssh_passphrase)
        return env
    if creds.token:
        user, password = "git", creds.token
    elif creds.username or creds.password:
        user, password = creds.username, creds.password
    else:
        return env
    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    REDACTOR.add(basic)
    env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.extraHeader",
               GIT_CONFIG_VALUE_0=f"Authorization: Basic {basic}")
    return env


_GIT_CAUSE = re.compile(r"^(?:fatal|error|remote):|Permission denied|Host key verification failed")


def git_failure(output: str, code: int) -> str:
    """What a failed git command said that names the cause (its fatal/error lines, ssh's refusal), not
    the advice around them ("Please make sure you have the correct access rights...")."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    causes = [line for line in lines if _GIT_CAUSE.search(line)] or lines[-1:]
    return "; ".join(dict.fromkeys(causes))[:800] or f"exit {code}"


def _run_git(args: list[str], env: dict[str, str], cwd: Path | None, timeout: float) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SourceError(f"git {args[0]} timed out after {timeout:g}s") from None
    if done.returncode != 0:
        raise SourceError(f"git {args[0]} failed: {git_failure(done.stderr or done.stdout, done.returncode)}")
    return done.stdout


def _branch_ref(branch: str) -> str:
    return branch if branch.startswith("refs/") else f"refs/heads/{branch}"


def git_branch_head(url: str, branch: str, creds: GitCredentials | None,
                    timeout: float = DEFAULT_FETCH_TIMEOUT) -> str:
    """The commit a branch points at, via `git ls-remote` (no clone)."""
    ref = _branch_ref(branch)
    with tempfile.TemporaryDirectory(prefix="strata-git-") as scratch:
        out = _run_git(["ls-remote", "--", url, ref], _git_env(creds, Path(scratch)), None, timeout)
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if name == ref:
            return sha
    raise SourceError(f"branch {branch!r} not found in {url}")


def git_checkout(url: str, commit: str, dest: Path, creds: GitCredentials | None,
                 timeout: float = DEFAULT_FETCH_TIMEOUT) -> str:
    """Fetch exactly `commit` (shallow) into `dest`; returns the full SHA checked out."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="strata-git-") as scratch:
        env = _git_env(creds, Path(scratch))
        _run_git(["init", "--quiet", "."], env, dest, timeout)
        _run_git(["remote", "add", "origin", url], env, dest, timeout)
        try:
            _run_git(["fetch", "--quiet", "--depth=1", "origin", commit], env, dest, timeout)
        except SourceError:
            # Abbreviated SHAs, or servers refusing to serve an unadvertised object: fetch every
            # branch and tag, then resolve the commit locally.
            _run_git(["fetch", "--quiet", "origin", "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"],
                     env, dest, timeout)
        _run_git(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit], env, dest, timeout)
        return _run_git(["rev-parse", "HEAD"], env, dest, timeout).strip()
