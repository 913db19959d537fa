"""The operator's start and stop, before and after any controller runs: Kopf's settings (PKO's finalizer or
its shard's, our own Events only), the engine of the executor chosen, metrics, and the Flux event sink; the probe
that says the engine is ready."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from ..engine.pod.executor import PodEngine
from ..engine.port import Engine, EngineUnavailable
from ..engine.process.executor import AutomationEngine
from ..services import events, metrics
from ..services.kube import Kube
from ..services.redaction import install_log_redaction
from .context import Context, OperatorSettings, passes_in_flight


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    options: OperatorSettings = memo.get("operator_settings") or OperatorSettings()
    shard = options.shard  # the main operator keeps PKO's finalizer; a shard has names of its own
    settings.persistence.finalizer = shard.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=shard.annotations_prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=shard.annotations_prefix)
    settings.posting.level = 100  # only our explicit, redacted Events; never Kopf's log lines
    settings.watching.server_timeout = 270
    install_log_redaction()
    kube = Kube.from_environment(options.kubeconfig)
    engine: Engine = (PodEngine(options.engine, options.workspace, kube) if options.workspace is not None
                      else AutomationEngine(options.engine))
    memo.ctx = Context(kube=kube, engine=engine, settings=options,
                       passes=asyncio.Semaphore(passes_in_flight(options.engine.concurrency)))
    options.engine.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        await engine.start()  # so the first update does not wait for it
    except EngineUnavailable as err:
        logger.warning("%s; the first update will try again", err)
    if options.metrics_port:
        metrics.serve(options.metrics_port)
    if options.flux_events_address:
        events.start_flux_events(options.flux_events_address)
        logger.info("Stack Events also go to Flux's notification-controller at %s", options.flux_events_address)
    executor = (f"pod executor (a workspace pod per Stack, image {options.workspace.image})"
                if options.workspace is not None else "process executor")
    logger.info("strata operator started: %s, concurrency %d, state in %s; owns %s", executor,
                options.engine.concurrency, options.engine.state_dir, options.shard.describe())


@kopf.on.cleanup()
async def stop_flux_events(**_: Any) -> None:
    await events.stop_flux_events()


@kopf.on.probe(id="engine")
def engine_ready(memo: kopf.Memo, **_: Any) -> bool:
    return "ctx" in memo
