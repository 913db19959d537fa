import signal
import sys

# In a container this process is PID 1, and the kernel drops any signal PID 1 has no handler for: until Kopf
# installs its own, a SIGTERM (a pod deleted while it starts) would be ignored for the whole grace period
# (330 s). Nothing runs yet that needs draining, so it exits at once.
signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))

from .main import run  # noqa: E402 - after the handler: importing takes seconds

sys.exit(run(sys.argv[1:]))
