"""A Stack's program from a git repository: the branch's head, a commit checked out.

A checkout is held to the operator's source size cap (--max-source-bytes) as it is written: git has no
limit of its own on what a fetch brings, so the repository is measured while git fetches and git is
stopped beyond the cap; the commit's files are summed from its tree before any is checked out, and the
tree is measured again once it is (attributes can make a file larger than its blob).

Git credentials reach git through its environment (extra header, askpass, key file), never through
argv or the URL; a GitHub App's are first exchanged at GitHub's API for a short-lived installation
token. Over SSH, the host keys trusted are the git auth Secret's `known_hosts` (Flux's key) when it has
one; otherwise the first key each host shows is pinned in the Stack's own state directory, and a later
fetch that meets another key is refused.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ..services.redaction import Redactor
from .archive import SizeCap, SourceError, SourceTooLarge, byte_size, tree_bytes

DEFAULT_FETCH_TIMEOUT = 60.0
# How often a running git's repository is measured against the size cap.
WATCH_SECONDS = 0.25
GITHUB_API = "https://api.github.com"
GITHUB_APP_FIELD = "spec.gitAuth.githubApp"
KNOWN_HOSTS_KEY = "known_hosts"  # in the git auth Secret, as in a Flux GitRepository's: the SSH host keys to trust
HOST_KEY_PIN_FILE = "known_hosts"  # in a Stack's (Workspace's) state directory: the SSH host keys first seen


@dataclasses.dataclass(frozen=True)
class GitHubApp:
    """A GitHub App installation's credentials; git gets a short-lived installation token minted from them."""

    app_id: str
    installation_id: str
    private_key: str


@dataclasses.dataclass(frozen=True)
class GitCredentials:
    """Resolved credentials; exactly one mode is used (ssh key, then token, then basic auth, as PKO). Their
    secrets, and those minted from them, are registered with `redactor`: that of the namespace whose
    Stack or Workspace they fetch for."""

    redactor: Redactor = dataclasses.field(kw_only=True, repr=False, compare=False)
    token: str = ""
    username: str = ""
    password: str = ""
    ssh_private_key: str = ""
    ssh_passphrase: str = ""
    github_app: GitHubApp | None = None
    known_hosts: str = ""  # the SSH host keys to trust, as ssh's known_hosts file; "" pins the first seen

    def __post_init__(self) -> None:
        self.redactor.add(self.token, self.password, self.ssh_private_key, self.ssh_passphrase,
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


def github_app_token(app: GitHubApp, redactor: Redactor, api: str = GITHUB_API,
                     timeout: float = DEFAULT_FETCH_TIMEOUT) -> str:
    """An installation access token for `app` (valid 1 h), from GitHub's API, registered with `redactor`
    (as the JWT that asked for it); SourceError naming the field."""
    if not app.installation_id.strip().isdigit():
        raise SourceError(f"{GITHUB_APP_FIELD}.installationID: not a numeric installation ID (fix: use the ID "
                          "in the App installation's URL)")
    jwt = github_app_jwt(app, time.time())
    redactor.add(jwt)
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
    redactor.add(token)
    return token


@dataclasses.dataclass(frozen=True)
class HostKeys:
    """The SSH host keys a fetch trusts: exactly those of `file` when they were given (`given`: the git auth
    Secret's known_hosts), else the first key each host shows, which ssh adds to `file` (the pin) and
    requires from then on."""

    file: Path
    given: bool

    @classmethod
    def of(cls, creds: GitCredentials | None, scratch: Path, pin: Path) -> "HostKeys":
        if creds is not None and creds.known_hosts.strip():
            given = scratch / "known_hosts"
            given.write_text(creds.known_hosts.rstrip("\n") + "\n")
            return cls(given, True)
        pin.parent.mkdir(parents=True, exist_ok=True)  # ssh pins nothing into a directory that is not there
        return cls(pin, False)

    def refusal(self, output: str) -> str | None:
        """Why ssh refused the host's key, and the fix, if it did."""
        if "Host key verification failed" not in output:
            return None
        named = re.search(r"(?:host key for|host key is known for) (\S+)", output, re.I)
        host = f"the git host {named.group(1)}" if named else "the git host"
        keyscan = "as `ssh-keyscan -p PORT HOST` prints it"
        if self.given:
            return (f"SSH refused {host}: its host key is not in the known_hosts of the git auth Secret (fix: add "
                    f"the host's public key there, {keyscan})")
        return (f"SSH refused {host}: its host key changed since the first fetch, whose key is pinned in {self.file} "
                f"(fix: if the host's key really changed, put its public key under known_hosts in the git auth "
                f"Secret, {keyscan}, which is then trusted instead of the pin; or have the operator's admins "
                f"delete {self.file})")


def build_ssh_command(key_file: Path | None, host_keys: HostKeys) -> list[str]:
    """The ssh git runs: with only `key_file`, and trusting only `host_keys` (never the system's known hosts):
    `yes` refuses any other key, `accept-new` pins a host's first key and refuses a changed one."""
    identity = ["-i", str(key_file)] if key_file is not None else []
    return ["ssh", *identity, "-o", "IdentitiesOnly=yes",
            "-o", f"StrictHostKeyChecking={'yes' if host_keys.given else 'accept-new'}",
            "-o", f"UserKnownHostsFile={host_keys.file}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "BatchMode=no"]


def _git_env(creds: GitCredentials | None, scratch: Path, host_keys: HostKeys) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "GIT_SSH_COMMAND": shlex.join(build_ssh_command(None, host_keys)),
    }
    if creds is None:
        return env
    if creds.github_app is not None:
        # GitHub takes an installation token as the password of the user x-access-token.
        token = github_app_token(creds.github_app, creds.redactor)
        creds = GitCredentials(username="x-access-token", password=token, redactor=creds.redactor)
    if creds.ssh_private_key:
        key = scratch / "id_key"
        key.write_text(creds.ssh_private_key.rstrip("\n") + "\n")
        key.chmod(0o600)
        env["GIT_SSH_COMMAND"] = shlex.join(build_ssh_command(key, host_keys))
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
    creds.redactor.add(basic)
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


def _run_git(args: list[str], env: dict[str, str], cwd: Path | None, timeout: float, host_keys: HostKeys,
             check: Callable[[], None] | None = None) -> str:
    """git's output; SourceError if it fails or outlasts `timeout`. `check`, if given, is called every
    WATCH_SECONDS while git runs and once it is done: what it raises stops git (its whole process group:
    index-pack, ssh) and is raised."""
    deadline = time.monotonic() + timeout
    with subprocess.Popen(["git", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as process:
        while True:
            try:
                out, err = process.communicate(timeout=WATCH_SECONDS if check else timeout)
                break
            except subprocess.TimeoutExpired:
                try:
                    if time.monotonic() >= deadline:
                        raise SourceError(f"git {args[0]} timed out after {timeout:g}s") from None
                    if check is not None:
                        check()
                except SourceError:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.communicate()
                    raise
    if process.returncode != 0:
        output = err or out
        refusal = host_keys.refusal(output)
        raise SourceError(f"git {args[0]} failed: {refusal or git_failure(output, process.returncode)}")
    if check is not None:
        check()  # what git wrote since the last look
    return out


def _branch_ref(branch: str) -> str:
    return branch if branch.startswith("refs/") else f"refs/heads/{branch}"


def git_branch_head(url: str, branch: str, creds: GitCredentials | None, host_key_pin: Path,
                    timeout: float = DEFAULT_FETCH_TIMEOUT) -> str:
    """The commit a branch points at, via `git ls-remote` (no clone). `host_key_pin`: the file, in the
    Stack's (or Workspace's) own state, that pins its SSH hosts' keys (see HostKeys)."""
    ref = _branch_ref(branch)
    with tempfile.TemporaryDirectory(prefix="strata-git-") as scratch:
        host_keys = HostKeys.of(creds, Path(scratch), host_key_pin)
        out = _run_git(["ls-remote", "--", url, ref], _git_env(creds, Path(scratch), host_keys), None, timeout,
                       host_keys)
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if name == ref:
            return sha
    raise SourceError(f"branch {branch!r} not found in {url}")


def git_checkout(url: str, commit: str, dest: Path, creds: GitCredentials | None, host_key_pin: Path,
                 timeout: float = DEFAULT_FETCH_TIMEOUT, cap: SizeCap = SizeCap()) -> str:
    """Fetch exactly `commit` (shallow) into `dest`, held to `cap` (see the module's docstring); returns the
    full SHA checked out."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="strata-git-") as scratch:
        host_keys = HostKeys.of(creds, Path(scratch), host_key_pin)
        env = _git_env(creds, Path(scratch), host_keys)

        def git(*args: str, check: Callable[[], None] | None = None) -> str:
            return _run_git(list(args), env, dest, timeout, host_keys, check)

        def fetched_within_cap() -> None:
            if tree_bytes(dest / ".git") > cap.max_bytes:
                raise cap.refusal(f"what git fetched for commit {commit} from {url}")

        git("init", "--quiet", ".")
        git("remote", "add", "origin", url)
        try:
            git("fetch", "--quiet", "--depth=1", "origin", commit, check=fetched_within_cap)
        except SourceTooLarge:
            raise
        except SourceError:
            # Abbreviated SHAs, or servers refusing to serve an unadvertised object: fetch every
            # branch and tag, then resolve the commit locally.
            git("fetch", "--quiet", "origin", "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*",
                check=fetched_within_cap)
        files = blob_bytes(git("ls-tree", "-r", "-l", "-z", commit))
        if files > cap.max_bytes:
            raise cap.refusal(f"the checkout of commit {commit} ({byte_size(files)} of files)")
        git("-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit)
        checked_out = tree_bytes(dest)
        if checked_out > cap.max_bytes:
            raise cap.refusal(f"the checkout of commit {commit} ({byte_size(checked_out)} of files)")
        return git("rev-parse", "HEAD").strip()


def blob_bytes(listing: str) -> int:
    """The bytes of the files `git ls-tree -r -l -z` lists (a submodule's size is "-": none here)."""
    total = 0
    for entry in listing.split("\0"):
        fields = entry.partition("\t")[0].split()
        if len(fields) == 4 and fields[3].isdigit():
            total += int(fields[3])
    return total
