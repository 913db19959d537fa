"""Shards: several operators splitting one fleet by label, Flux's convention.

Flux's controllers scale horizontally with `--watch-label-selector`: the main controller runs with
`!sharding.fluxcd.io/key` and each shard with `sharding.fluxcd.io/key=<shard>`, so every object has
exactly one owner. The operator takes the same flag. The main operator (no selector, or Flux's main
one) keeps PKO's finalizer, Kopf's annotations and the Lease that a single operator has always used,
so adding shards changes nothing for the Stacks it keeps. A shard gets names of its own, derived from
its selector: its finalizer, Kopf's progress annotations and its leader Lease never touch the main
operator's or another shard's, so a Stack moved between shards (relabelled) is let go by one and
taken by the other without both writing the same keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping

from . import FINALIZER
from .label_selector import LabelSelector, parse_label_selector

SHARD_KEY = "sharding.fluxcd.io/key"
MAIN_SELECTOR = f"!{SHARD_KEY}"  # what Flux's main controller watches once shards exist
ANNOTATIONS_PREFIX = "strata.pulumi.com"  # Kopf's progress and diff-base annotations


@dataclasses.dataclass(frozen=True)
class Shard:
    """The Stacks, Programs, Workspaces and Updates this operator owns, and the names it keeps them by."""

    selector: LabelSelector = LabelSelector()

    @classmethod
    def of(cls, selector_text: str) -> "Shard":
        return cls(parse_label_selector(selector_text))

    @property
    def is_main(self) -> bool:
        return self.selector.canonical in ("", MAIN_SELECTOR)

    @property
    def suffix(self) -> str:
        """"" for the main operator; else `shard-<hash of the selector>`, one per meaning of it."""
        if self.is_main:
            return ""
        return "shard-" + hashlib.sha256(self.selector.canonical.encode()).hexdigest()[:10]

    @property
    def finalizer(self) -> str:
        return f"{FINALIZER}/{self.suffix}" if self.suffix else FINALIZER

    @property
    def annotations_prefix(self) -> str:
        return f"{self.suffix}.{ANNOTATIONS_PREFIX}" if self.suffix else ANNOTATIONS_PREFIX

    def lease_name(self, base: str) -> str:
        return f"{base}-{self.suffix}" if self.suffix else base

    def owns(self, labels: Mapping[str, str] | None) -> bool:
        return self.selector.matches(labels)

    def describe(self) -> str:
        if not self.selector.requirements:
            return "every object (no --watch-label-selector)"
        return f"objects whose labels match {self.selector.text!r}"
