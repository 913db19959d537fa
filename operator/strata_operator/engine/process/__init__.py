"""The process executor: operations run by workers forked by a fork server on the operator's host.

executor.py (`AutomationEngine`, its settings, a fork server per trusted domain), sandbox.py (bubblewrap
around each untrusted namespace's fork server), worker.py (`python -m
strata_operator.engine.process.worker`, the fork server and the Automation API calls), virtualenvs.py
(one virtualenv per Stack and requirements), plugins.py (language hosts and provider plugins shared by
every Stack), bytecode.py (their compiled modules, shared), memory_limit.py (an update killed for its
container's memory limit, said as such).
"""
