"""A git server on loopback speaking the smart HTTP protocol (Flux's go-git client needs it).

`git http-backend` does the protocol work as a CGI program; this module is the small HTTP server in
front of it, plus helpers that create and commit to the served repositories. With an auth file
(`user:password` on one line) every request needs that HTTP basic auth; a user named `token`
stands for bearer-style access tokens sent as the password, which is how git clients send them.

A push needs the push credential (`--push-auth-file`; without one, pushes are refused): fetching is open
to whoever reaches the server, as a public repository's is, but anything on the host's loopback (a team's
program under the process executor shares the host's network) could otherwise push a commit into the
platform's program or another team's directory, which Flux and the operator would then apply.

With a kubeconfig, a push is announced to Flux the way its webhook Receivers do it: every
GitRepository whose URL is the pushed repository gets `reconcile.fluxcd.io/requestedAt`, so
source-controller fetches at once instead of at its next poll.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "strata", "GIT_AUTHOR_EMAIL": "strata@localhost",
    "GIT_COMMITTER_NAME": "strata", "GIT_COMMITTER_EMAIL": "strata@localhost",
}


def _split_cgi_output(output: bytes) -> tuple[bytes, bytes]:
    """CGI headers end at the first blank line, written with CRLF or LF."""
    ends = [(output.find(sep), sep) for sep in (b"\r\n\r\n", b"\n\n") if sep in output]
    if not ends:
        return output, b""
    index, sep = min(ends)
    return output[:index], output[index + len(sep):]


REQUESTED_AT = "reconcile.fluxcd.io/requestedAt"
GIT_REPOSITORIES = ("source.toolkit.fluxcd.io", "v1", "gitrepositories")


def pushed_repository(method: str, path: str, status: int) -> str | None:
    """The repository path (e.g. `strata.git`) a successful push request went to, else None."""
    if method != "POST" or status != 200 or not path.endswith("/git-receive-pack"):
        return None
    return path.removesuffix("/git-receive-pack").strip("/") or None


def _same_repository(url: str, base_url: str, repository: str) -> bool:
    """Whether a GitRepository's `url` names this server's `repository` (with or without `.git` or a
    trailing slash)."""
    def norm(value: str) -> str:
        return value.rstrip("/").removesuffix(".git")

    return norm(url) == norm(f"{base_url.rstrip('/')}/{repository}")


def notify_flux(kubeconfig: Path, base_url: str, repository: str) -> list[str]:
    """Ask Flux to fetch every GitRepository of `repository` now; returns their namespace/name."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        custom = client.CustomObjectsApi(api)
        now = datetime.now(timezone.utc).isoformat(timespec="microseconds")
        notified = []
        for item in custom.list_cluster_custom_object(*GIT_REPOSITORIES)["items"]:
            if not _same_repository((item.get("spec") or {}).get("url", ""), base_url, repository):
                continue
            meta = item["metadata"]
            custom.patch_namespaced_custom_object(*GIT_REPOSITORIES[:2], meta["namespace"], GIT_REPOSITORIES[2],
                                                  meta["name"], {"metadata": {"annotations": {REQUESTED_AT: now}}})
            notified.append(f"{meta['namespace']}/{meta['name']}")
        return notified
    finally:
        api.close()


def _announce(kubeconfig: Path, base_url: str, repository: str) -> None:
    try:
        notified = notify_flux(kubeconfig, base_url, repository)
        print(f"push to {repository}: requested reconciliation of {notified or 'no GitRepository'}", flush=True)
    except Exception as error:  # noqa: BLE001 - Flux still polls; the push itself has succeeded
        print(f"push to {repository}: could not notify Flux: {error}", file=sys.stderr, flush=True)


def is_push(path: str, query: str) -> bool:
    """A request of the receive-pack service: its advertisement or the push itself."""
    return path.endswith("/git-receive-pack") or "service=git-receive-pack" in query.split("&")


def _handler(root: Path, credentials: bytes | None, kubeconfig: Path | None = None,
             base_url: str = "", push_credentials: bytes | None = None) -> type[BaseHTTPRequestHandler]:
    class GitHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
            pass  # request lines could carry credentials in URLs; the CGI's own errors still reach the log

        def _authorized(self, push: bool) -> bool:
            """A push with the push credential; anything else with the server's, if it has one."""
            wanted = push_credentials if push else credentials
            if wanted is None:
                return not push
            scheme, _, value = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "basic":
                return False
            try:
                given = base64.b64decode(value, validate=True)
            except ValueError:
                return False
            return hmac.compare_digest(given, wanted)

        def _serve(self) -> None:
            path, _, query = self.path.partition("?")
            push = is_push(path, query)
            if not self._authorized(push):
                refused = push and push_credentials is None
                self.send_response(403 if refused else 401)
                if not refused:
                    self.send_header("WWW-Authenticate", 'Basic realm="strata-git"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "GIT_PROJECT_ROOT": str(root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(len(body)),
                "REMOTE_ADDR": self.client_address[0],
                "REMOTE_USER": "strata",  # lets receive-pack (push) through
                "GIT_HTTP_MAX_REQUEST_BUFFER": "100M",
            }
            if self.headers.get("Git-Protocol"):
                env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
            if self.headers.get("Content-Encoding"):
                env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
            result = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True)
            head, payload = _split_cgi_output(result.stdout)
            status = 200
            headers = []
            for line in head.decode(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.lower() == "status":
                    status = int(value.strip().split()[0])
                elif key:
                    headers.append((key, value.strip()))
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            repository = pushed_repository(self.command, path, status)
            if kubeconfig is not None and repository is not None and result.returncode == 0:
                threading.Thread(target=_announce, args=(kubeconfig, base_url, repository), daemon=True).start()

        do_GET = _serve
        do_POST = _serve

    return GitHandler


def serve(root: Path, port: int, auth_file: Path | None = None, kubeconfig: Path | None = None,
          push_auth_file: Path | None = None) -> None:
    credentials = auth_file.read_text().strip().encode() if auth_file else None
    push_credentials = push_auth_file.read_text().strip().encode() if push_auth_file else None
    handler = _handler(root, credentials, kubeconfig, base_url=f"http://127.0.0.1:{port}",
                       push_credentials=push_credentials)
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    server.serve_forever()


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, **GIT_IDENTITY, "GIT_CONFIG_NOSYSTEM": "1"}
    result = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def blob_sha(content: str) -> str:
    """The sha git gives a file with this content (what `GitRepos.tree` lists)."""
    data = content.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class GitRepos:
    """The repositories behind a git server: create them and commit files to them."""

    def __init__(self, root: Path, base_url: str, push_credentials: Path | None = None):
        self.root = root
        self.base_url = base_url.rstrip("/")
        self.push_credentials = push_credentials

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name}.git"

    def push_url(self, name: str) -> str:
        """The repository's URL with the push credential in it, for its owner's `git clone` and `git push`."""
        if self.push_credentials is None:
            raise RuntimeError(f"the git server at {self.base_url} takes no pushes: it has no push credential")
        user, _, password = self.push_credentials.read_text().strip().partition(":")
        scheme, _, rest = self.base_url.partition("://")
        return f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@{rest}/{name}.git"

    def create(self, name: str, files: dict[str, str] | None = None, branch: str = "main") -> str:
        """A new bare repository (with a first commit when `files` are given); returns its URL."""
        bare = self.root / f"{name}.git"
        if bare.exists():
            raise FileExistsError(f"git repository {name!r} already exists in {self.root}")
        _git("init", "--bare", f"--initial-branch={branch}", str(bare))
        _git("config", "http.receivepack", "true", cwd=bare)
        if files:
            self.commit(name, files, branch=branch)
        return self.url(name)

    def commit(self, name: str, files: dict[str, str | None], message: str = "update",
               branch: str = "main") -> str:
        """Write (or, with None, delete) files on `branch` and return the new commit's sha."""
        bare = self.root / f"{name}.git"
        with tempfile.TemporaryDirectory(prefix="strata-git-") as tmp:
            work = Path(tmp)
            has_branch = subprocess.run(["git", "--git-dir", str(bare), "rev-parse", "--verify", "-q", branch],
                                        capture_output=True).returncode == 0
            if has_branch:
                _git("clone", "-q", "--branch", branch, str(bare), str(work))
            else:
                _git("init", "-q", f"--initial-branch={branch}", str(work))
            for relative, content in files.items():
                target = work / relative
                if content is None:
                    target.unlink(missing_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content)
            _git("add", "-A", cwd=work)
            _git("commit", "-q", "--allow-empty", "-m", message, cwd=work)
            _git("push", "-q", str(bare), f"HEAD:refs/heads/{branch}", cwd=work)
            return _git("rev-parse", "HEAD", cwd=work)

    def head(self, name: str, branch: str = "main") -> str | None:
        """The commit sha at the tip of `branch`, or None when the repository or branch does not exist."""
        result = subprocess.run(["git", "--git-dir", str(self.root / f"{name}.git"), "rev-parse", "--verify", "-q",
                                 f"refs/heads/{branch}"], capture_output=True, text=True)
        return result.stdout.strip() if result.returncode == 0 else None

    def tree(self, name: str, branch: str = "main") -> dict[str, str]:
        """Blob sha of every file on `branch` by path ({} without such a branch); compare with `blob_sha`."""
        if self.head(name, branch) is None:
            return {}
        listing = _git("--git-dir", str(self.root / f"{name}.git"), "ls-tree", "-r", "-z", f"refs/heads/{branch}")
        entries = (line.split("\t", 1) for line in listing.split("\0") if line)
        return {path: meta.split()[2] for meta, path in entries}

    def delete(self, name: str) -> None:
        shutil.rmtree(self.root / f"{name}.git", ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the git repositories under --root over smart HTTP.")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--auth-file", type=Path, help="file holding user:password for HTTP basic auth")
    parser.add_argument("--kubeconfig", type=Path,
                        help="announce pushes to Flux: annotate the GitRepositories of the pushed repository")
    parser.add_argument("--push-auth-file", type=Path,
                        help="file holding user:password that a push needs (HTTP basic auth); without it, pushes "
                             "are refused")
    args = parser.parse_args(argv)
    serve(args.root, args.port, args.auth_file, args.kubeconfig, args.push_auth_file)


if __name__ == "__main__":
    main()
