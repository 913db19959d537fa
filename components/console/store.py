"""What the user may see, kept current by watches under the user's own identity (an informer per kind).

Each kind is listed once, cluster-wide, then watched from that list's resourceVersion in a thread of
its own; where the user may not list it cluster-wide, only the kubeconfig's namespace is, and the
API server's refusal is kept to show on the overview. Every change is handed to the event loop, which
tells the pages' event streams which objects changed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from .. import stackctl
from .models import KINDS, Kind, key

WATCH_SECONDS = 240


class Store:
    def __init__(self, cluster: stackctl.Cluster, loop: asyncio.AbstractEventLoop) -> None:
        self.cluster = cluster
        self.loop = loop
        self.objects: dict[str, dict[str, dict[str, Any]]] = {kind.kind: {} for kind in KINDS}
        self.notes: dict[str, str] = {}  # kind -> why the user sees less of it (the API server's words)
        self.listeners: set[Callable[[set[str]], None]] = set()
        self.ready = threading.Event()
        self._stopping = threading.Event()
        self._listed: set[str] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        for kind in KINDS:
            threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind.plural}", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            return {kind: list(objs.values()) for kind, objs in self.objects.items()}

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(kind, {}).get(f"{kind}/{namespace}/{name}")

    # -- the watch threads ------------------------------------------------------------------------

    def _scope(self, kind: Kind) -> tuple[str | None, dict[str, Any]]:
        """List cluster-wide if allowed, else the kubeconfig's namespace, saying what the user misses."""
        try:
            listed = self.cluster.list_objects(kind.group, kind.version, kind.plural, None)
            self.notes.pop(kind.kind, None)
            return None, listed
        except stackctl.StackCtlError as error:
            if "forbidden" not in str(error):
                raise
            listed = self.cluster.list_objects(kind.group, kind.version, kind.plural, self.cluster.namespace)
            self.notes[kind.kind] = f"{error}; showing namespace {self.cluster.namespace} only"
            return self.cluster.namespace, listed

    def _run(self, kind: Kind) -> None:
        from kubernetes import watch
        from kubernetes.client import ApiException

        while not self._stopping.is_set():
            try:
                namespace, listed = self._scope(kind)
            except stackctl.StackCtlError as error:
                self.notes[kind.kind] = str(error)
                self._mark_listed(kind)
                if "does not serve" in str(error):
                    return  # a kind this cluster lacks (no Flux, say): nothing to watch
                self._stopping.wait(10)
                continue
            fresh = {key(kind.kind, obj): obj for obj in listed.get("items", [])}
            with self._lock:
                gone = set(self.objects[kind.kind]) - set(fresh)
                changed = {k for k, obj in fresh.items() if self.objects[kind.kind].get(k) != obj} | gone
                self.objects[kind.kind] = fresh
            self._mark_listed(kind)
            self._notify(changed)
            version = listed.get("metadata", {}).get("resourceVersion")
            args = (kind.group, kind.version, kind.plural) if namespace is None else (
                kind.group, kind.version, namespace, kind.plural)
            lister = (self.cluster.custom.list_cluster_custom_object if namespace is None
                      else self.cluster.custom.list_namespaced_custom_object)
            stream = watch.Watch()
            try:
                for event in stream.stream(lister, *args, resource_version=version, timeout_seconds=WATCH_SECONDS,
                                           allow_watch_bookmarks=True):
                    if self._stopping.is_set():
                        stream.stop()
                        return
                    obj, kind_of_event = event["object"], event["type"]
                    if kind_of_event == "BOOKMARK" or not isinstance(obj, dict) or "metadata" not in obj:
                        continue
                    object_key = key(kind.kind, obj)
                    with self._lock:
                        if kind_of_event == "DELETED":
                            self.objects[kind.kind].pop(object_key, None)
                        else:
                            self.objects[kind.kind][object_key] = obj
                    self._notify({object_key})
            except ApiException as error:  # 410 Gone: the version expired; list again
                if error.status != 410:
                    self.notes[kind.kind] = f"watching {kind.plural}: {error.status} {error.reason}"
                    self._stopping.wait(2)
            except Exception as error:  # noqa: BLE001 - a dropped connection: list and watch again
                self.notes[kind.kind] = f"watching {kind.plural}: {error}"
                self._stopping.wait(2)

    def _mark_listed(self, kind: Kind) -> None:
        self._listed.add(kind.kind)
        if len(self._listed) == len(KINDS):
            self.ready.set()

    def _notify(self, keys: set[str]) -> None:
        if keys:
            self.loop.call_soon_threadsafe(self._deliver, keys)

    def _deliver(self, keys: set[str]) -> None:
        for listener in list(self.listeners):
            listener(keys)
