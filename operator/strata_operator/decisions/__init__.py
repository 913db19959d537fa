"""What to do, decided by pure functions of the objects, the engine's results and the time; no I/O, no
clock reads. Imports only api.

planning.py (run now, or why not and when to look again), backoff.py (retry delays), approval.py
(manual approval of the exact plan), rollout.py (a Program's waves), outputs.py (outputs digests and the
outputs Secret), lease.py (leader election's rules).
"""
