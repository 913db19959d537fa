"""The workspace agent, `python -m strata_operator.engine.pod.agent`: the process of a Stack's workspace pod.

It serves HTTPS on STRATA_AGENT_PORT with the key pair in STRATA_AGENT_DIR and accepts only requests
bearing that directory's token. The operator uploads the program's source (a tarball named by its
sha256), then asks for operations; each runs exactly as under the process executor, through an
`AutomationEngine` inside the pod (a forked worker per operation, the Stack's environment only),
with the references the kubelet resolved (Secrets as the pod's environment) filled in here. An
operation outlives the connection that asked for it: an operator that dies mid-update leaves the
update to finish, and its successor's `recover` waits for it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import hashlib
import hmac
import json
import logging
import os
import re
import shutil
import ssl
import tempfile
import typing
from pathlib import Path

from aiohttp import web

from ...api import RESOURCES_FIELD_ENV
from ...api.workspace_values import ConfigItem, ConfigUnavailable, MountedRefs, config_values
from ...services.redaction import install_log_redaction
from ...sources.archive import DEFAULT_MAX_SOURCE_BYTES, SOURCE_CAP_HEADER, SizeCap, SourceError, safe_extract
from ..port import EngineUnavailable, Operation, UpdateRequest, UpdateResult
from ..process.executor import IMAGE_PULUMI_VERSION, AutomationEngine, EngineSettings
from ..process.memory_limit import ContainerMemory
from ..process.plugins import default_plugin_cache
from .bundle import BUNDLE_ENV, launcher
from .workspace_pod import RefUnavailable, resolve_in_workspace

KEEP_SOURCES = 2
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
OPERATIONS = frozenset(typing.get_args(Operation))
log = logging.getLogger("strata_operator.engine.pod.agent")  # not __name__: run as __main__
FORKSERVER_START = web.AppKey("forkserver_start", asyncio.Task)


class Agent:
    def __init__(self, workspace: Path, token: str, engine: AutomationEngine):
        self.workspace, self.token, self.engine = workspace, token, engine
        self.sources = workspace / "sources"
        self.sources.mkdir(parents=True, exist_ok=True)

    @web.middleware
    async def authenticate(self, request: web.Request, handler):
        if request.path == "/healthz":
            return await handler(request)
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return web.json_response({"error": "unauthorized"}, status=401)
        return await handler(request)

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    def _source_dir(self, request: web.Request) -> Path:
        digest = request.match_info["digest"]
        if not _DIGEST.match(digest):
            raise web.HTTPBadRequest(text="a source is named by its sha256")
        return self.sources / digest

    async def has_source(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._source_dir(request).is_dir() else 404)

    async def put_source(self, request: web.Request) -> web.Response:
        """A source tarball, streamed to disk as it comes and unpacked from there, held to the operator's
        source size cap (its SOURCE_CAP_HEADER), packed and unpacked."""
        dest = self._source_dir(request)
        if dest.is_dir():
            return web.Response(status=200)
        cap = SizeCap(int(request.headers.get(SOURCE_CAP_HEADER, DEFAULT_MAX_SOURCE_BYTES)), "the program's source")
        digest, size = hashlib.sha256(), 0
        with tempfile.NamedTemporaryFile(dir=self.sources, suffix=".tar.gz", delete=False) as archive:
            async for chunk in request.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > cap.max_bytes:
                    Path(archive.name).unlink()
                    raise web.HTTPRequestEntityTooLarge(max_size=cap.max_bytes, actual_size=size)
                digest.update(chunk)
                archive.write(chunk)
        try:
            if digest.hexdigest() != dest.name:
                raise web.HTTPBadRequest(text="the source does not match its digest")
            staging = Path(tempfile.mkdtemp(dir=self.sources, prefix=".staging-"))
            try:
                await asyncio.to_thread(safe_extract, Path(archive.name), staging, cap)
            except SourceError as err:
                shutil.rmtree(staging, ignore_errors=True)
                raise web.HTTPBadRequest(text=str(err)) from None
            staging.rename(dest)
        finally:
            Path(archive.name).unlink(missing_ok=True)
        self._prune(keep=dest)
        return web.Response(status=201)

    def _prune(self, keep: Path) -> None:
        """Keep the newest sources only (one in use, one to go back to)."""
        found = sorted((p for p in self.sources.iterdir() if p.is_dir() and not p.name.startswith(".")),
                       key=lambda p: p.stat().st_mtime, reverse=True)
        for old in [p for p in found if p != keep][KEEP_SOURCES - 1:]:
            shutil.rmtree(old, ignore_errors=True)

    async def run(self, request: web.Request) -> web.Response:
        body = await request.json()
        operation = body.get("operation")
        if operation not in OPERATIONS:
            raise web.HTTPBadRequest(text=f"unknown operation {operation!r}")
        update = UpdateRequest.from_json(body["request"])
        if body.get("local_dir"):
            # spec.workspaceTemplate.spec.local.dir: a directory of this pod (its image, or a volume).
            project = Path(str(body["local_dir"]))
            if not project.is_absolute() or not (project / "Pulumi.yaml").is_file() \
                    and not (project / "Pulumi.yml").is_file():
                failure = UpdateResult("blocked", f"spec.workspaceTemplate.spec.local.dir: {project} holds no Pulumi "
                                                  "project (Pulumi.yaml) in the workspace pod; mount the program there "
                                                  "(a volume through spec.workspaceTemplate.spec.podTemplate)")
                return web.json_response({"result": json.loads(failure.to_json())})
            # A copy to run in: the directory may be read-only (a ConfigMap volume, the image), and the
            # update writes the stack's settings file beside Pulumi.yaml.
            copy = self.workspace / "local"
            shutil.rmtree(copy, ignore_errors=True)
            await asyncio.to_thread(shutil.copytree, project, copy)
            project = source_root = copy
        else:
            source_root = self.sources / str(body.get("source", ""))
            project = source_root / str(body.get("subdir", "."))
            if not _DIGEST.match(str(body.get("source", ""))) or not project.is_dir() \
                    or not project.resolve().is_relative_to(self.sources.resolve()):
                return web.json_response({"error": "source missing: upload it first"}, status=409)
        try:
            env, secret_config, secret_env = resolve_in_workspace(MountedRefs.from_json(update.mounted),
                                                                  os.environ, update.env)
            config, item_secrets = config_values(map(ConfigItem.from_json, update.env_config),
                                                 {**(self.engine.settings.inherited_env or {}), **env})
        except (RefUnavailable, ConfigUnavailable) as err:
            return web.json_response({"result": json.loads(UpdateResult("failed", str(err)).to_json())})
        secret_config = {**secret_config, **item_secrets}
        plan_file = ""
        if update.plan_file:
            plans = self.workspace / "plans"
            plans.mkdir(exist_ok=True)
            plan_file = str(plans / f"{operation}.json")
            Path(plan_file).unlink(missing_ok=True)
            if body.get("plan"):
                Path(plan_file).write_bytes(base64.b64decode(body["plan"]))
        update = dataclasses.replace(
            update, project_dir=str(project), source_root=str(source_root), env=env,
            config={**update.config, **config},
            secret_config={**update.secret_config, **secret_config},
            secret_env=tuple(sorted({*update.secret_env, *secret_env})), plan_file=plan_file, mounted={})
        result = await self.engine.run(operation, update)
        answer = {"result": json.loads(result.to_json())}
        if operation == "preview" and plan_file and Path(plan_file).is_file():
            answer["plan"] = base64.b64encode(Path(plan_file).read_bytes()).decode()
        return web.json_response(answer)

    async def cancel(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"cancelled": await self.engine.cancel(str(body.get("stack_key", "")))})

    def app(self) -> web.Application:
        # client_max_size bounds the bodies read whole (a run's JSON, with its plan); uploads stream.
        app = web.Application(middlewares=[self.authenticate], client_max_size=DEFAULT_MAX_SOURCE_BYTES)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_route("HEAD", "/sources/{digest}", self.has_source)
        app.router.add_put("/sources/{digest}", self.put_source)
        app.router.add_post("/run", self.run)
        app.router.add_post("/cancel", self.cancel)
        return app


def agent_engine_settings(environ: typing.Mapping[str, str], workspace: Path) -> EngineSettings:
    """Updates run in the pod's own environment (its image's PATH and ENV, workspaceTemplate's env and
    envFrom), less the agent's variables; the pulumi CLI is the image's when it has one (PKO's workspace
    image holds it), else the operator's, which a foreign image gets through the bundle (bundle.py). The
    provider plugins linked into every Stack's PULUMI_HOME are the image's (the operator image's PULUMI_HOME
    holds the ones the layers use: nothing in a cluster can download them)."""
    bundle = environ.get(BUNDLE_ENV, "")
    path = os.pathsep.join(filter(None, [environ.get("PATH", ""), str(Path(bundle) / "bin") if bundle else ""]))
    return EngineSettings(
        state_dir=workspace / "state", concurrency=2, plugin_cache=default_plugin_cache(environ), host_path=path,
        # uv's cache in the workspace volume: the default, under HOME, is on the pod's read-only root.
        python_cache=workspace / "uv",
        # One environment per pod: a store would be compiled (9 s of CPU) for that environment alone.
        bytecode_cache=None,
        inherited_env={name: value for name, value in environ.items() if not name.startswith("STRATA_")},
        python_command=tuple(launcher(Path(bundle))) if bundle else (),
        # Set by the operator's image only, whose CLI is the one on PATH.
        pulumi_version=environ.get(IMAGE_PULUMI_VERSION, ""),
        container_memory=ContainerMemory("the workspace pod",
                                         environ.get(RESOURCES_FIELD_ENV, "spec.workspaceTemplate.spec.resources")),
        # The pod is the sandbox: it holds one Stack of one namespace, under that Stack's own identity.
        trusted_namespaces=frozenset({"*"}))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    credentials = Path(os.environ.get("STRATA_AGENT_DIR", "/var/run/strata/agent"))
    workspace = Path(os.environ.get("STRATA_WORKSPACE", "/workspace"))
    port = int(os.environ.get("STRATA_AGENT_PORT", "8443"))
    # A server context that verifies no client (the token authenticates): create_default_context would
    # also load the system's CA bundle, tens of milliseconds of CPU per pod for nothing.
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(credentials / "tls.crt", credentials / "tls.key")
    engine = AutomationEngine(agent_engine_settings(os.environ, workspace))
    agent = Agent(workspace, (credentials / "token").read_text().strip(), engine)
    log.info("workspace agent on :%d; %s", port, engine.settings.summary())
    app = agent.app()
    app.on_startup.append(functools.partial(_start_engine, engine))
    web.run_app(app, port=port, ssl_context=tls, print=None, access_log=None)


async def _start_engine(engine: AutomationEngine, app: web.Application) -> None:
    """Start the fork server (its imports and the CLI's version probe) while the operator still waits for the
    pod's readiness and uploads the program, rather than on the first operation; one that fails to start is
    started again by that operation, which says why."""
    async def start() -> None:
        try:
            await engine.start()
        except (EngineUnavailable, OSError) as err:
            log.warning("the fork server did not start ahead of the first operation: %s", err)

    app[FORKSERVER_START] = asyncio.get_running_loop().create_task(start())


if __name__ == "__main__":
    main()
