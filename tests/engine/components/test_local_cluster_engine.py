"""The local Cluster's dynamic provider and the ProjectRepo publication, run by the real engine.

`up` starts a real local platform (from a fresh state directory, no host controllers, to stay
light) and returns its kubeconfig as a secret; a second `up` changes nothing; `destroy` stops
every process it started. The project is published to the platform's own git server and read
back over smart HTTP.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from strata_components.local.platform import LocalPlatform, PlatformConfig
from tests.engine.workspace import inline_stack, state_text


def _remote_head(url: str) -> str:
    listing = subprocess.run(["git", "ls-remote", url, "refs/heads/main"], capture_output=True, text=True,
                             check=True, timeout=30).stdout
    return listing.split()[0]


def _pid_alive(pid: int) -> bool:
    """Running, not a zombie awaiting its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_local_platform_up_same_destroy_with_a_published_project(toolchain, pulumi_env, file_backend, tmp_path):
    state_dir = tmp_path / "platform"
    project = tmp_path / "project"
    (project / "programs" / "platform").mkdir(parents=True)
    program_file = project / "programs" / "platform" / "__main__.py"
    program_file.write_text("print('layer 1')\n")

    def program():
        import pulumi

        from strata_components.cluster import LocalPlatformResource
        from strata_components.project_repo import ProjectRepo

        platform = LocalPlatformResource("dev-platform", {"state_dir": str(state_dir), "host_controllers": []})
        repo = ProjectRepo("project-repo", {"state_dir": str(state_dir), "git_url": platform.git_url,
                                            "source_dir": str(project), "include": ["programs"]})
        for name in ("kubeconfig", "server", "flux_bundle_url", "git_url"):
            pulumi.export(name, getattr(platform, name))
        pulumi.export("repoUrl", repo.url)
        pulumi.export("commit", repo.commit)

    stack = inline_stack(toolchain, pulumi_env, file_backend, "strata-engine-cluster", "dev", program)
    local = LocalPlatform(PlatformConfig(state_dir=state_dir, host_controllers=()), toolchain=toolchain)
    try:
        up = stack.up()
        assert up.summary.resource_changes == {"create": 3}
        outputs = up.outputs
        assert outputs["kubeconfig"].secret and not outputs["server"].secret
        kubeconfig = outputs["kubeconfig"].value
        assert kubeconfig == (state_dir / "kubeconfig").read_text()
        assert yaml.safe_load(kubeconfig)["clusters"][0]["cluster"]["server"] == outputs["server"].value
        client_key = yaml.safe_load(kubeconfig)["users"][0]["user"]["client-key-data"]
        state = state_text(file_backend)
        assert client_key not in state and kubeconfig not in state
        assert all(local.status().values())
        pids = [json.loads(path.read_text())["pid"] for path in (state_dir / "run").glob("*.json")]

        # The URLs are the platform's free-picked ports, and both servers answer on them.
        ports = json.loads((state_dir / "platform.json").read_text())["ports"]
        assert outputs["flux_bundle_url"].value == f"http://127.0.0.1:{ports['flux_bundle']}"
        assert outputs["git_url"].value == f"http://127.0.0.1:{ports['git']}"
        assert outputs["repoUrl"].value == f"{outputs['git_url'].value}/strata.git"
        first = outputs["commit"].value
        assert _remote_head(outputs["repoUrl"].value) == first

        again = stack.up()
        assert again.summary.resource_changes == {"same": 3}
        assert again.outputs["commit"].value == first and _remote_head(outputs["repoUrl"].value) == first

        program_file.write_text("print('layer 1, changed')\n")
        changed = stack.up()
        assert changed.summary.resource_changes == {"same": 2, "update": 1}
        second = changed.outputs["commit"].value
        assert second != first and _remote_head(outputs["repoUrl"].value) == second

        destroyed = stack.destroy()
        assert destroyed.summary.resource_changes == {"delete": 3}
        assert not any(local.status().values())
        assert pids and not [pid for pid in pids if _pid_alive(pid)]
        assert not (state_dir / "git" / "strata.git").exists()
    finally:
        local.down(say=lambda _line: None)
