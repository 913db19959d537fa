"""The few cross-cutting services every room may use; they import only api.

kube.py (the Kubernetes API calls, off the event loop), kopf_login.py (Kopf's bounded API session),
redaction.py (secrets out of logs, Events, status and errors), events.py and flux_events.py (Events, also
in Flux's format), metrics.py (Prometheus), api_health.py (whether the API server answers: a log line and a metric per
outage), memory.py (the heap handed back after a burst), fair_slots.py (slots shared fairly between
namespaces).
"""
