"""The operator's start and stop, before and after any controller runs: Kopf's settings (PKO's finalizer or
its shard's, our own Events only), the engine of the executor chosen, metrics, and the Flux event sink; the probe
that says the engine is ready."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
# Raised out of kopf.run once a startup handler failed for good (Kopf does not export it).
from kopf._core.engines.activities import ActivityError as StartupFailed

from ..decisions.backoff import ApiRetryDelays
from ..engine.pod.executor import PodEngine
from ..engine.port import Engine, EngineUnavailable
from ..engine.process.executor import AutomationEngine
from ..services import events, metrics
from ..services.fair_slots import FairSlots
from ..services.kube import Kube
from ..services.redaction import install_log_redaction
from ..sources.work import SourceWork
from .context import Context, OperatorSettings, passes_in_flight


def describe_startup_failure(err: StartupFailed) -> str:
    """The handler's own error, which says what failed (Kopf's message only says that one did)."""
    cause = err.__cause__
    if cause is None:
        return str(err)
    if isinstance(cause, kopf.PermanentError):
        return str(cause)  # ours, naming the cause and the fix
    return f"{type(cause).__name__}: {cause}; fix: see the error logged above"


# Startup handlers fail for good (errors=PERMANENT): Kopf's default retries them every 60 s forever, each
# try forking another fork server, while nothing says the operator is not running.
@kopf.on.startup(errors=kopf.ErrorsMode.PERMANENT)
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    options: OperatorSettings = memo.get("operator_settings") or OperatorSettings()
    shard = options.shard  # the main operator keeps PKO's finalizer; a shard has names of its own
    settings.persistence.finalizer = shard.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=shard.annotations_prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=shard.annotations_prefix)
    settings.posting.level = 100  # only our explicit, redacted Events; never Kopf's log lines
    settings.watching.server_timeout = 270
    settings.networking.error_backoffs = ApiRetryDelays()  # ride out a sick API server, and come back spread
    # A Stack's daemon told to stop returns at once when idle (it drains only a running update): waiting a
    # moment for that spares a deleted Stack's finalizer Kopf's re-check after the whole drain period.
    settings.background.instant_exit_timeout = 2.0
    if memo.get("watched_namespaces"):
        # `--namespace` takes exact names: nothing to scan for. Scanning, Kopf drops a namespace from its
        # watch once it reads it terminating with no condition yet True (what a namespace with pods reads
        # first), so its Stacks' deletion went unseen and their finalizers held the namespace for good.
        settings.scanning.disabled = True
    install_log_redaction()
    kube = Kube.from_environment(options.kubeconfig)
    sources = SourceWork(options.max_source_bytes)
    engine: Engine = (PodEngine(options.engine, options.workspace, kube, sources) if options.workspace is not None
                      else AutomationEngine(options.engine))
    try:
        options.engine.state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise kopf.PermanentError(f"the state directory {options.engine.state_dir} (--state-dir) cannot be made "
                                  f"({err.strerror}); fix: give --state-dir a directory this user may write")
    serving = options.metrics
    if serving.port:  # before anything is forked: a port taken since the preflight fails here
        access = metrics.ReviewedAccess(kube.review) if serving.auth == "kubernetes" else None
        try:
            metrics.serve(serving.port, serving.address, access)
        except OSError as err:
            raise kopf.PermanentError(f"the metrics port {serving.port} (--metrics-port) cannot be bound on "
                                      f"{serving.address} ({err.strerror}); fix: give --metrics-port a free port "
                                      "(0 turns it off)")
        host = f"[{serving.address}]" if ":" in serving.address else serving.address
        logger.info("metrics at http://%s:%d%s%s", host, serving.port, metrics.METRICS_PATH,
                    ", to clients whose token may get it (TokenReview, SubjectAccessReview)" if access else "")
    try:
        await engine.start()  # so the first update does not wait for it
    except EngineUnavailable as err:
        logger.warning("%s; the first update will try again", err)
    # Last: the engine probe and leader election read its presence as "configured".
    memo.ctx = Context(kube=kube, engine=engine, settings=options,
                       passes=FairSlots(passes_in_flight(options.engine.concurrency)), sources=sources)
    if options.flux_events_address:
        events.start_flux_events(options.flux_events_address)
        logger.info("Stack Events also go to Flux's notification-controller at %s", options.flux_events_address)
    if isinstance(engine, AutomationEngine):
        executor = f"process executor ({await asyncio.to_thread(engine.isolation_summary)})"
    else:
        executor = f"pod executor (a workspace pod per Stack, image {options.workspace.image})"
    logger.info("strata operator started: %s, concurrency %d, state in %s; owns %s", executor,
                options.engine.concurrency, options.engine.state_dir, options.shard.describe())


@kopf.on.cleanup()
async def stop_flux_events(**_: Any) -> None:
    await events.stop_flux_events()


@kopf.on.probe(id="engine")
def engine_ready(memo: kopf.Memo, **_: Any) -> bool:
    return "ctx" in memo
