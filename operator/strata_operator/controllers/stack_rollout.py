"""A Stack's place in its Program's rollout (`rollout.waves`): the Stacks of the Program, whether this
Stack's wave may run a revision yet, and the progress written on the Program."""

from __future__ import annotations

from typing import Any

from ..api import status as st
from ..decisions.rollout import RolloutStack, rollout_gate, rollout_progress
from .stack_session import StackSession


async def rollout_stacks(session: StackSession, program: dict[str, Any]) -> list[RolloutStack]:
    """The Stacks of this namespace whose source is this Program."""
    name = program["metadata"]["name"]
    found = []
    for other in await session.ctx.kube.list_stacks(session.namespace):
        spec = other.get("spec") or {}
        if (spec.get("programRef") or {}).get("name") == name and not spec.get("projectRepo") \
                and not spec.get("fluxSource"):
            found.append(RolloutStack(other["metadata"]["name"], other["metadata"].get("labels") or {},
                                      (other.get("status") or {}).get("lastUpdate") or {}))
    return found


async def gate_on_rollout(session: StackSession, program: dict[str, Any], waves, revision: str) -> st.Verdict | None:
    """Whether this Stack's wave may run `revision` yet; the Program's progress is brought up to date."""
    stacks = await rollout_stacks(session, program)
    await write_rollout_progress(session, program, waves, stacks, revision)
    return rollout_gate(waves, stacks, session.name, revision)


async def write_rollout_progress(session: StackSession, program: dict[str, Any], waves, stacks: list[RolloutStack],
                                 revision: str) -> None:
    progress = rollout_progress(waves, stacks, revision)
    before = (program.get("status") or {}).get("rollout")
    if progress != before:
        await session.ctx.kube.patch_program_status(session.namespace, program["metadata"]["name"],
                                                    {"rollout": st.merge_patch(before, progress)})
        program.setdefault("status", {})["rollout"] = progress
