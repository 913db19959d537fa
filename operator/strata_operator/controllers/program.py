"""The Program controller: a Program's `.status` as PKO v2 writes it (its artifact: generation and digest),
and the Stacks that run it woken when it changes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kopf

from ..api import GROUP, VERSION
from ..api import status as st
from ..api.program import program_revision, program_status
from ..decisions.planning import ready_for_another_revision
from .context import Context, owned, utc_now

# How long a changed Program's status waits for the Stacks that run it to say they will run it.
ANNOUNCE_WAIT_SECONDS = 5.0


@kopf.on.event(GROUP, VERSION, "programs")
async def program_changed(namespace: str, name: str, body: kopf.Body, type: str | None, memo: kopf.Memo,
                          **_: Any) -> None:
    ctx: Context = memo.ctx
    ctx.registry.wake_where(namespace, lambda w: w.program == name)  # our Stacks may run another shard's Program
    if type == "DELETED" or not owned(ctx, body):
        return
    previous = dict(body.get("status") or {})
    status = program_status(dict(body), previous, st.rfc3339(utc_now()))
    if status != previous:  # our own patch's event comes back equal: no write loop
        if status.get("observedGeneration") != previous.get("observedGeneration"):
            await _until_stacks_announce(ctx, namespace, name, program_revision(dict(body)))
        await ctx.kube.patch_program_status(namespace, name, st.merge_patch(previous, status))


async def _until_stacks_announce(ctx: Context, namespace: str, name: str, revision: str) -> None:
    """The Program's observedGeneration tells kstatus (and a Flux Kustomization waiting on it) that it is
    current, while its Stacks still read Ready from the previous revision until their woken passes say
    Reconciling: written first, a Kustomization could call the commit deployed before its Stacks ran
    it. So it waits until none of them reads Ready for another revision, a few seconds at most."""
    names = {stack for (ns, stack), watched in ctx.registry.stacks.items() if ns == namespace and watched.program == name}
    deadline = time.monotonic() + ANNOUNCE_WAIT_SECONDS
    while names and time.monotonic() < deadline:
        names = {stack["metadata"]["name"] for stack in await ctx.kube.list_stacks(namespace)
                 if stack["metadata"]["name"] in names
                 and ready_for_another_revision(dict(stack.get("status") or {}), revision)}
        if names:
            await asyncio.sleep(0.2)
