"""A hostile team's program: what code the operator runs for a team can reach on the machine it runs on.

Committed under the team's path by the e2e tests and run by the real engine like any team's program. Every probe
is exported as it came back (what it read, or why it could not), so the test asserts on exactly what such a program
could print or send elsewhere. Standard library only, besides the Pulumi SDK.
"""

import base64
import json
import os
import ssl
import urllib.error
import urllib.request

import pulumi

targets = json.loads(pulumi.Config().require("targets"))
results: dict[str, str] = {}


def attempt(name: str, probe) -> None:
    try:
        results[name] = f"GOT {probe()}"[:20000]
    except Exception as err:  # noqa: BLE001 - every refusal is the answer
        results[name] = f"denied: {type(err).__name__}: {err}"[:500]


def read(path: str) -> str:
    with open(path, errors="replace") as file:
        return file.read()


def processes() -> list[str]:
    """Every process this program can see, by command line."""
    seen = []
    for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
        try:
            seen.append(read(f"/proc/{pid}/cmdline").replace("\0", " ")[:200])
        except OSError:
            continue
    return seen


def insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def etcd_secrets() -> str:
    """Every Secret in etcd, as the API server stores them, over plain HTTP or TLS (no client certificate of
    etcd's CA here)."""
    body = json.dumps({"key": base64.b64encode(b"/registry/secrets/").decode(),
                       "range_end": base64.b64encode(b"/registry/secrets0").decode()}).encode()
    refusals = []
    for scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(f"{scheme}://{targets['etcd']}/v3/kv/range", data=body, context=insecure(),
                                        timeout=10) as answer:
                return answer.read().decode(errors="replace")
        except (OSError, urllib.error.URLError) as err:
            refusals.append(f"{scheme}: {err}")
    raise ConnectionRefusedError("; ".join(refusals))


def git_push() -> int:
    """The push advertisement of the platform's repository: the first step of a push into its program's path."""
    with urllib.request.urlopen(f"{targets['git']}/info/refs?service=git-receive-pack", timeout=10) as answer:
        return answer.status


def own_token() -> str:
    """The identity this program was given: its ServiceAccount's token, in the kubeconfig the process executor
    hands it, or mounted in its workspace pod."""
    if "KUBECONFIG" not in os.environ:
        return read("/var/run/secrets/kubernetes.io/serviceaccount/token").strip()
    kubeconfig = read(os.environ["KUBECONFIG"])
    return next(line.split(":", 1)[1].strip() for line in kubeconfig.splitlines() if line.strip().startswith("token:"))


def other_teams_secrets() -> str:
    """The other team's Secrets, with the identity this program was given."""
    token = own_token()
    request = urllib.request.Request(f"{targets['apiserver']}/api/v1/namespaces/{targets['otherNamespace']}/secrets",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, context=insecure(), timeout=10) as answer:
        return answer.read().decode(errors="replace")


def plant(directory: str) -> str:
    path = os.path.join(directory, "planted-by-another-team")
    with open(path, "w") as file:
        file.write("planted")
    return path


for name, path in targets["files"].items():
    attempt(f"read {name}", lambda path=path: read(path))
for name, path in targets["directories"].items():
    attempt(f"list {name}", lambda path=path: sorted(os.listdir(path)))
for name, path in targets["writable"].items():
    attempt(f"write {name}", lambda path=path: plant(path))
attempt("processes", processes)
attempt("etcd", etcd_secrets)
attempt("git push", git_push)
attempt("other team's Secrets", other_teams_secrets)
pulumi.export("probes", results)
