"""The few cross-cutting services every room may use; they import only api.

kube.py (the Kubernetes API calls, off the event loop), kopf_login.py (Kopf's bounded API session),
redaction.py (secrets out of logs, Events, status and errors), events.py and flux_events.py (Events, also
in Flux's format), metrics.py (Prometheus), memory.py (the heap handed back after a burst).
"""
