"""A git server over SSH on loopback that checks keys, for the gitAuth sshAuth tests.

The SSH side is a real SSHv2 server (asyncssh) accepting only the authorized public keys; a session's
command must be `git-upload-pack '<repo>'`, which runs the real git-upload-pack on a repository under
`root`. OpenSSH's client (as the operator runs it) talks to it as to any hosted git service.
"""

from __future__ import annotations

import asyncio
import shlex
import threading
from pathlib import Path

import asyncssh


class SshGitServer:
    def __init__(self, root: Path, authorized_keys: list[str]):
        self.root = root.resolve()
        self.authorized = asyncssh.import_authorized_keys("\n".join(authorized_keys) + "\n")
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._server: asyncssh.SSHAcceptor | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="ssh-git-server", daemon=True)

    def start(self) -> "SshGitServer":
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _listen(self) -> asyncssh.SSHAcceptor:
        return await asyncssh.create_server(
            asyncssh.SSHServer, "127.0.0.1", 0, server_host_keys=[self.host_key],
            authorized_client_keys=self.authorized, process_factory=self._serve, encoding=None,
            password_auth=False, kbdint_auth=False)

    def stop(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    async def _close(self) -> None:
        self._server.close()
        await self._server.wait_closed()

    def url(self, name: str) -> str:
        return f"ssh://git@127.0.0.1:{self.port}/{name}.git"

    def known_hosts(self) -> str:
        """The server's host key as a known_hosts line (what `ssh-keyscan -p PORT 127.0.0.1` prints)."""
        return f"[127.0.0.1]:{self.port} {self.host_key.export_public_key().decode().strip()}\n"

    def rotate_host_key(self) -> None:
        """Present a new host key on the same address from now on, as a reinstalled server or a man in the
        middle does."""
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")

        async def update() -> None:
            self._server.update(server_host_keys=[self.host_key])

        asyncio.run_coroutine_threadsafe(update(), self.loop).result(10)

    async def _serve(self, process: asyncssh.SSHServerProcess) -> None:
        words = shlex.split(process.command or "")
        repository = (self.root / words[1].lstrip("/")).resolve() if len(words) == 2 else None
        if words[:1] != ["git-upload-pack"] or repository is None or self.root not in repository.parents:
            process.stderr.write(b"only git-upload-pack of a repository here\n")
            process.exit(1)
            return
        upload = await asyncio.create_subprocess_exec(
            "git-upload-pack", str(repository), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        await process.redirect(stdin=upload.stdin, stdout=upload.stdout, stderr=upload.stderr)
        process.exit(await upload.wait())
