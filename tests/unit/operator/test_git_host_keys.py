"""SSH git trusts exactly the host keys it was given (the git auth Secret's known_hosts, Flux's key), else
the first key each host showed, pinned in the Stack's own state: a later fetch meeting another key is
refused, saying so and how to fix it. Against a real SSH server (asyncssh serving git-upload-pack) with
OpenSSH's client, as the operator runs it."""

import asyncio
import shlex

import asyncssh
import pytest

from strata_components.local.gitserver import GitRepos
from strata_operator.api.stack import parse_stack_spec
from strata_operator.api.workspace import GitAuthRefs, KeyRef
from strata_operator.services.redaction import Redactor
from strata_operator.sources.archive import SourceError
from strata_operator.sources.git import GitCredentials, HostKeys, _git_env, build_ssh_command, git_branch_head
from strata_operator.sources.references import resolve_stack
from strata_operator.sources.workspace_program import git_credentials
from tests.integration.operator.ssh_git_server import SshGitServer

KNOWN = "[git.example]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnownHostKeyOfTheGitServer00000000000\n"


def test_given_host_keys_are_the_only_ones_trusted(tmp_path):
    keys = HostKeys.of(GitCredentials(ssh_private_key="k", known_hosts=KNOWN, redactor=Redactor()), tmp_path,
                       tmp_path / "state" / "known_hosts")
    assert keys == HostKeys(tmp_path / "known_hosts", given=True) and keys.file.read_text() == KNOWN
    assert not (tmp_path / "state").exists()  # nothing pinned beside given keys
    command = build_ssh_command(tmp_path / "id_key", keys)
    assert command[:3] == ["ssh", "-i", str(tmp_path / "id_key")]
    options = dict(command[i + 1].split("=", 1) for i, word in enumerate(command) if word == "-o")
    assert options == {"IdentitiesOnly": "yes", "StrictHostKeyChecking": "yes",
                       "UserKnownHostsFile": str(tmp_path / "known_hosts"), "GlobalKnownHostsFile": "/dev/null",
                       "BatchMode": "no"}


@pytest.mark.parametrize("creds", [None, GitCredentials(token="t-0a1b", redactor=Redactor()),
                                   GitCredentials(ssh_private_key="k", known_hosts=" \n", redactor=Redactor())])
def test_without_given_host_keys_the_first_seen_are_pinned_in_the_stacks_state(tmp_path, creds):
    pin = tmp_path / "stacks" / "team" / "app" / "known_hosts"
    keys = HostKeys.of(creds, tmp_path / "scratch", pin)
    assert keys == HostKeys(pin, given=False) and pin.parent.is_dir()  # ssh pins nothing into a missing directory
    command = shlex.split(_git_env(creds, tmp_path, keys)["GIT_SSH_COMMAND"])
    assert "StrictHostKeyChecking=accept-new" in command and f"UserKnownHostsFile={pin}" in command
    assert "GlobalKnownHostsFile=/dev/null" in command
    assert ("-i" in command) == bool(creds and creds.ssh_private_key)


CHANGED = ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
           "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
           "Host key for [git.example]:2222 has changed and you have requested strict checking.\n"
           "Host key verification failed.\nfatal: Could not read from remote repository.\n")
UNKNOWN = ("No ED25519 host key is known for [git.example]:2222 and you have requested strict checking.\n"
           "Host key verification failed.\nfatal: Could not read from remote repository.\n")


def test_a_refused_host_key_is_said_with_its_fix(tmp_path):
    pinned = HostKeys(tmp_path / "known_hosts", given=False).refusal(CHANGED)
    assert pinned.startswith("SSH refused the git host [git.example]:2222: its host key changed since the first "
                             f"fetch, whose key is pinned in {tmp_path / 'known_hosts'} (fix: ")
    assert "under known_hosts in the git auth Secret" in pinned and f"delete {tmp_path / 'known_hosts'})" in pinned
    given = HostKeys(tmp_path / "known_hosts", given=True).refusal(UNKNOWN)
    assert given == ("SSH refused the git host [git.example]:2222: its host key is not in the known_hosts of the git "
                     "auth Secret (fix: add the host's public key there, as `ssh-keyscan -p PORT HOST` prints it)")
    assert HostKeys(tmp_path, given=False).refusal("git@h: Permission denied (publickey).\n") is None


async def _secrets(_namespace, name):
    return {"ssh": {"key": "-----BEGIN OPENSSH PRIVATE KEY-----\nk\n-----END OPENSSH PRIVATE KEY-----\n",
                    "known_hosts": KNOWN},
            "flux-style": {"sshPrivateKey": "k2", "known_hosts": KNOWN}}.get(name)


@pytest.mark.parametrize("git_auth", [
    {"gitAuth": {"sshAuth": {"sshPrivateKey": {"type": "Secret", "secret": {"name": "ssh", "key": "key"}}}}},
    {"gitAuthSecret": "flux-style"},
])
def test_a_stacks_host_keys_are_its_ssh_keys_secrets_known_hosts(git_auth):
    spec = parse_stack_spec({"stack": "dev", "projectRepo": "ssh://git@git.example:2222/app.git", "branch": "main",
                             **git_auth}, "team")
    resolved = asyncio.run(resolve_stack(spec, "team", _secrets, _secrets))
    assert resolved.git.known_hosts == KNOWN and resolved.git.ssh_private_key


def test_a_workspaces_host_keys_are_its_ssh_keys_secrets_known_hosts():
    auth = GitAuthRefs(ssh_private_key=KeyRef("ssh", "key"))
    assert asyncio.run(git_credentials(auth, "team", _secrets)).known_hosts == KNOWN


@pytest.fixture
def ssh_git(tmp_path):
    """A real SSH git server holding repository `app`, and the credentials of its one authorized key."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    server = SshGitServer(tmp_path / "repos", [key.export_public_key().decode()])
    server.root.mkdir()
    server.start()
    GitRepos(server.root, "").create("app", {"Pulumi.yaml": "name: app\nruntime: yaml\n"})
    yield server, key.export_private_key().decode()
    server.stop()


def test_a_changed_host_key_is_refused_once_the_first_was_pinned(tmp_path, ssh_git):
    server, private_key = ssh_git
    url, pin = server.url("app"), tmp_path / "state" / "known_hosts"
    creds = GitCredentials(ssh_private_key=private_key, redactor=Redactor())
    first = git_branch_head(url, "main", creds, pin)
    first_key = server.known_hosts().split()[-1]
    assert first_key in pin.read_text()
    assert git_branch_head(url, "main", creds, pin) == first  # the same key: trusted again
    server.rotate_host_key()
    with pytest.raises(SourceError, match="its host key changed since the first fetch") as refused:
        git_branch_head(url, "main", creds, pin)
    assert str(pin) in str(refused.value) and first_key in pin.read_text()  # the pin stays as it was
    given = GitCredentials(ssh_private_key=private_key, known_hosts=server.known_hosts(), redactor=Redactor())
    assert git_branch_head(url, "main", given, pin) == first  # the fix the message names


def test_given_host_keys_refuse_a_host_that_is_not_among_them(tmp_path, ssh_git):
    server, private_key = ssh_git
    creds = GitCredentials(ssh_private_key=private_key, known_hosts=KNOWN, redactor=Redactor())
    with pytest.raises(SourceError, match="its host key is not in the known_hosts of the git auth Secret"):
        git_branch_head(server.url("app"), "main", creds, tmp_path / "known_hosts")
    assert not (tmp_path / "known_hosts").exists()
