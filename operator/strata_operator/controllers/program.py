"""The Program controller: a Program's `.status` as PKO v2 writes it (its artifact: generation and digest),
and the Stacks that run it woken when it changes."""

from __future__ import annotations

from typing import Any

import kopf

from ..api import GROUP, VERSION
from ..api import status as st
from ..api.program import program_status
from .context import Context, owned, utc_now


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
        await ctx.kube.patch_program_status(namespace, name, st.merge_patch(previous, status))
