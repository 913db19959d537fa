"""One reconcile pass over one Stack (`StackSession`): the object as read and the status it writes, only
when it changes; the source's revision, the program materialised at it, and the engine request for it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..api import FILE_BACKEND_ANNOTATION
from ..api import status as st
from ..api.program import program_revision
from ..api.stack import StackSpec
from ..api.status import condition
from ..decisions.planning import Requests
from ..engine.port import UpdateRequest
from ..services import metrics
from ..services.events import post_event
from ..services.kube import Forbidden
from ..services.redaction import Redactor, redactor_for
from ..sources.archive import SourceError, safe_extract
from ..sources.flux import download_artifact, flux_artifact
from ..sources.git import HOST_KEY_PIN_FILE, git_branch_head, git_checkout
from ..sources.project import subdir, write_program_project
from ..sources.references import RefError, Resolved
from .context import RETRY_REFS_SECONDS, Context, Watched, stack_key, utc_now


class StackSession:
    """One reconcile pass over one Stack: the object as read, and the status it will write."""

    def __init__(self, ctx: Context, body: Any, logger: Any):
        self.ctx, self.body, self.logger = ctx, body, logger
        self.meta = body.get("metadata", {})
        self.namespace, self.name = self.meta["namespace"], self.meta["name"]
        self.generation = int(self.meta.get("generation", 0))
        self.status: dict[str, Any] = dict(body.get("status") or {})
        pending = self.watched.pending
        for field, value in list(pending.items()):
            if self.status.get(field) == value:
                del pending[field]
        self.status.update(pending)
        self.requests = Requests.of(self.meta.get("annotations"), self.status)
        # What this pass found of its prerequisites' outputs (name -> digest); a run records it in lastUpdate.
        self.consumed: dict[str, str] = {}

    def resync_seconds(self, spec: StackSpec) -> int:
        return spec.resync_seconds(self.ctx.settings.min_resync_seconds)

    @property
    def redactor(self) -> Redactor:
        """What masks this Stack's status and Events: its namespace's secrets, no other namespace's."""
        return redactor_for(self.namespace)

    @property
    def host_key_pin(self) -> Path:
        """Where the SSH host keys this Stack's git source first showed are pinned (sources.git.HostKeys)."""
        return stack_state_dir(self.ctx, self.namespace, self.name) / HOST_KEY_PIN_FILE

    @property
    def key(self) -> str:
        return stack_key(self.namespace, self.name)

    @property
    def watched(self) -> Watched:
        return self.ctx.registry.stacks.setdefault((self.namespace, self.name), Watched())

    async def write(self, verdict: st.Verdict | None = None, drifted: tuple[bool, str] | None = None,
                    **fields: Any) -> None:
        """Patch status only when it changes, so idle Stacks cause no writes (and no wakeups).

        observedGeneration and observedReconcileRequest say which spec and request the conditions
        describe, so they are written only with a verdict: kstatus takes observedGeneration ==
        generation with no Reconciling/Stalled as "current", which other fields must not claim."""
        patch: dict[str, Any] = dict(fields)
        if verdict is not None:
            patch.update(observedGeneration=self.generation, observedReconcileRequest=self.requests.pulumi)
            patch["conditions"] = st.build_conditions(self.status.get("conditions"), verdict, self.generation,
                                                      utc_now())
            failing = verdict.phase == "stalled" or verdict.reason in (st.RECONCILING_RETRY,
                                                                       st.RECONCILING_PREVIEW_FAILED)
            metrics.mark_failing(self.namespace, self.name, failing)
        if drifted is not None:
            patch["conditions"] = st.with_drifted(patch.get("conditions", self.status.get("conditions")), *drifted,
                                                  self.generation, utc_now())
        changed = {k: v for k, v in patch.items() if self.status.get(k) != v}
        if "conditions" in changed and not _conditions_differ(self.status.get("conditions"), patch["conditions"]):
            del changed["conditions"]
        if not changed:
            return
        for k, v in changed.items():
            if isinstance(v, str):
                changed[k] = self.redactor.redact(v)
        if "conditions" in changed:
            changed["conditions"] = [{**c, "message": self.redactor.redact(c["message"])}
                                     for c in changed["conditions"]]
        await self.ctx.kube.patch_stack_status(
            self.namespace, self.name, {k: st.merge_patch(self.status.get(k), v) for k, v in changed.items()})
        self.status.update(changed)
        self.watched.pending.update(changed)

    async def stall(self, reason: str, message: str, event_reason: str | None = None) -> None:
        before = condition(self.status, st.STALLED)
        if event_reason and (before is None or before.get("message") != self.redactor.redact(message)):
            post_event(self.body, event_reason, message, warning=True)
        await self.write(st.Verdict("stalled", reason, message))


def _conditions_differ(old: list[dict[str, Any]] | None, new: list[dict[str, Any]]) -> bool:
    def strip(cs):
        return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in cs or []]
    return strip(old) != strip(new)


async def source_revision(session: StackSession, spec: StackSpec, resolved: Resolved) -> tuple[str, Any]:
    """(revision, handle to materialise it) without fetching the program itself."""
    ctx, ns = session.ctx, session.namespace
    watched = session.watched
    if spec.source_kind == "program" and spec.program_ref is not None:
        program = await ctx.kube.get_program(ns, spec.program_ref.name)
        if program is None:
            raise SourceError(f"unable to retrieve program {spec.program_ref.name!r} for stack")
        return program_revision(program), program
    if spec.source_kind == "local":
        # In the workspace pod, unseen here: its revision is its path (PKO's resync re-runs it periodically).
        return f"local:{spec.local_dir}", None
    if spec.source_kind == "flux" and spec.flux_source is not None:
        ref = spec.flux_source.source_ref
        try:
            source = await ctx.kube.get_flux_source(ref.api_version, ref.kind, ns, ref.name)
        except Forbidden as err:
            raise SourceError(f"spec.fluxSource.sourceRef.kind: {ref.kind}: {err}") from None
        if source is None:
            raise SourceError(f"could not resolve sourceRef: {ref.kind} {ref.name!r} not found")
        artifact = flux_artifact(source)
        return artifact.revision, artifact
    if spec.commit:
        return spec.commit, spec.commit
    # A branch: ls-remote at most once per resync period unless the spec or a request changed.
    branch_key = (session.generation, session.requests)
    sha, checked = watched.branch_head
    loop = asyncio.get_running_loop()
    if not sha or branch_key != watched.branch_key or loop.time() - checked >= session.resync_seconds(spec):
        sha = await ctx.sources.run(ns, git_branch_head, spec.project_repo, spec.branch, resolved.git,
                                    session.host_key_pin)
        watched.branch_head, watched.branch_key = (sha, loop.time()), branch_key
    return sha, sha


async def materialise_program(session: StackSession, spec: StackSpec, handle: Any, dest: Path,
                              resolved: Resolved) -> Path:
    """Write the program at the planned revision into `dest` (fetched on the source threads, held to the
    operator's source size cap); returns the project directory."""
    sources, namespace = session.ctx.sources, session.namespace
    if spec.source_kind == "local":
        dest.mkdir(parents=True, exist_ok=True)  # nothing to write: the program is in the workspace pod
        return dest
    if spec.source_kind == "program":
        write_program_project(handle, dest)
        return dest
    if spec.source_kind == "flux" and spec.flux_source is not None:
        archive, cap = dest.with_name(dest.name + ".artifact"), sources.cap("spec.fluxSource.sourceRef")
        try:
            await sources.run(namespace, download_artifact, handle, archive, cap)
            await sources.run(namespace, safe_extract, archive, dest, cap)
        finally:
            archive.unlink(missing_ok=True)
        return subdir(dest, spec.flux_source.dir, "spec.fluxSource.dir")
    await sources.run(namespace, git_checkout, spec.project_repo, handle, dest, resolved.git, session.host_key_pin,
                      cap=sources.cap("spec.projectRepo"))
    return subdir(dest, spec.repo_dir, "spec.repoDir")


def stack_state_dir(ctx: Context, namespace: str, name: str) -> Path:
    return ctx.settings.engine.state_dir / "stacks" / namespace / name


def run_directory(session: StackSession, run_name: str) -> Path:
    """The directory of the Stack's run `run_name` (status.currentUpdate.name): its source, its plan."""
    return stack_state_dir(session.ctx, session.namespace, session.name) / "runs" / run_name


async def file_backend_root(ctx: Context, namespace: str, backend_url: str) -> str:
    """The directory the platform gave the namespace for file:// state (its FILE_BACKEND_ANNOTATION), which
    the process executor's sandbox binds: "" when the backend is not file://, or runs in a workspace pod."""
    if ctx.engine.in_workspace_pods or not backend_url.startswith("file://"):
        return ""
    return (await ctx.kube.namespace_annotations(namespace)).get(FILE_BACKEND_ANNOTATION, "")


async def confinement_stalled(session: StackSession, backend_url: str) -> bool:
    """Stall the Stack, before anything is fetched or run, when its program could not be kept apart from the
    operator's files and other namespaces' under this executor (engine.confinement); True if stalled."""
    ctx = session.ctx
    root = await file_backend_root(ctx, session.namespace, backend_url)
    issue = ctx.engine.confinement(session.namespace, backend_url, root)
    if issue is None:
        return False
    await session.stall(*issue, st.EVENT_CONFIG_INVALID)
    return True


async def update_request(ctx: Context, spec: StackSpec, namespace: str, name: str, project: Path, resolved: Resolved,
                         run_dir: Path, message: str = "", real_outputs: bool = False) -> UpdateRequest:
    env = dict(resolved.env)
    if spec.service_account_name and not ctx.engine.in_workspace_pods:
        # A workspace pod runs as the ServiceAccount itself; a forked worker gets a token kubeconfig for it.
        minted = await ctx.kube.service_account_kubeconfig(namespace, spec.service_account_name)
        if minted is None:
            raise RefError(f"spec.serviceAccountName: ServiceAccount {spec.service_account_name!r} not found in "
                           f"namespace {namespace!r}")
        kubeconfig, token = minted
        redactor_for(namespace).add(token)
        path = run_dir / "kubeconfig"
        path.write_text(kubeconfig)
        path.chmod(0o600)
        env["KUBECONFIG"] = str(path)
    return UpdateRequest(
        stack_key=stack_key(namespace, name), stack_name=spec.stack, project_dir=str(project), env=env,
        secret_env=tuple(sorted(resolved.secret_env)), config=resolved.config, secret_config=resolved.secret_config,
        secrets_provider=spec.secrets_provider, create=not spec.use_local_stack_only, refresh=spec.refresh,
        expect_no_refresh_changes=spec.expect_no_refresh_changes, targets=tuple(spec.targets),
        target_dependents=spec.target_dependents, environments=tuple(spec.environment), message=message,
        run_program=spec.run_program, real_outputs=real_outputs,
        service_account=spec.service_account_name, workspace_template=spec.workspace_template or {},
        reclaim_workspace=spec.workspace_reclaim_policy == "Delete", mounted=resolved.mounted.to_json(),
        local_dir=spec.local_dir if spec.source_kind == "local" else "",
        source_root=str(_source_root(project, run_dir)),
        file_backend_root=await file_backend_root(ctx, namespace, env.get("PULUMI_BACKEND_URL", "")))


def _source_root(project: Path, run_dir: Path) -> Path:
    """The materialised source that holds the project (a repository checked out whole, the project in a
    subdirectory): the project's ancestor directly under the run's directory."""
    try:
        return run_dir / project.relative_to(run_dir).parts[0]
    except (ValueError, IndexError):
        return project


async def wait_for_reference(session: StackSession, err: RefError) -> float:
    await session.write(st.Verdict("reconciling", st.RECONCILING_RETRY, f"waiting for a reference: {err}"))
    return RETRY_REFS_SECONDS
