"""The process executor's sandbox as built (bubblewrap's arguments) and the refusals in front of it."""

from __future__ import annotations

from pathlib import Path

from strata_operator.api import FILE_BACKEND_ANNOTATION
from strata_operator.api.status import EXECUTOR_CANNOT_ISOLATE
from strata_operator.api.validation import STALLED_SPEC_INVALID
from strata_operator.engine.process.executor import AutomationEngine, Domain, EngineSettings, confinement_issue
from strata_operator.engine.process.sandbox import SandboxMounts, bwrap_argv, system_root_args


def _binds(argv: list[str]) -> list[tuple[str, str]]:
    return [(argv[i], argv[i + 1]) for i, arg in enumerate(argv) if arg in ("--bind", "--ro-bind")
            and argv[i + 1] == argv[i + 2]]


def test_the_sandbox_binds_its_own_directories_writable_and_the_rest_read_only():
    mounts = SandboxMounts(read_only=(Path("/opt/tools"), Path("/opt/tools/bin"), Path("/srv/op/stacks/team-a")),
                           writable=(Path("/srv/op/sandboxes/team-a"), Path("/srv/state/team-a")),
                           workdir=Path("/srv/op/sandboxes/team-a/.worker"))
    argv = bwrap_argv("/usr/bin/bwrap", mounts, ["python3", "-m", "worker"])
    assert argv[0] == "/usr/bin/bwrap" and argv[-4:] == ["--", "python3", "-m", "worker"]
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--die-with-parent"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    binds = [b for b in _binds(argv) if b[1].startswith("/srv") or b[1].startswith("/opt")]
    assert binds == [("--ro-bind", "/opt/tools"), ("--bind", "/srv/state/team-a"),
                     ("--ro-bind", "/srv/op/stacks/team-a"), ("--bind", "/srv/op/sandboxes/team-a")]
    assert argv[argv.index("--chdir") + 1] == "/srv/op/sandboxes/team-a/.worker"
    # /tmp is the sandbox's own, made before anything is bound under it.
    assert argv.index("--tmpfs") < min(argv.index(path) for _, path in binds)


def test_a_writable_directory_inside_a_read_only_one_is_bound_after_it():
    mounts = SandboxMounts(read_only=(Path("/home/u/.cache/strata"),), writable=(Path("/home/u/.cache/strata/uv-ns/a"),),
                           workdir=Path("/"))
    binds = _binds(bwrap_argv("bwrap", mounts, ["true"]))
    assert binds.index(("--ro-bind", "/home/u/.cache/strata")) < binds.index(("--bind", "/home/u/.cache/strata/uv-ns/a"))


def test_the_system_is_read_only_and_etc_holds_no_more_than_programs_need(tmp_path):
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "lib").symlink_to("usr/lib")
    (tmp_path / "etc" / "ssl").mkdir(parents=True)
    for name in ("resolv.conf", "passwd", "shadow", "sudoers"):
        (tmp_path / "etc" / name).write_text("")
    (tmp_path / "etc" / "kubernetes").mkdir()
    args = system_root_args(tmp_path)
    assert ["--ro-bind", "/usr", "/usr"] == args[:3] and ["--symlink", "usr/lib", "/lib"] == args[3:6]
    bound = [args[i + 1] for i, arg in enumerate(args) if arg == "--ro-bind"]
    assert {"/etc/resolv.conf", "/etc/passwd", "/etc/ssl"} <= set(bound)
    assert not {"/etc/shadow", "/etc/sudoers", "/etc/kubernetes", "/etc"} & set(bound)


def test_trusted_namespaces_are_never_refused():
    assert confinement_issue("strata-system", "", True, "file:///anywhere", "") is None
    assert confinement_issue("strata-system", "", True, "s3://bucket", "") is None


def test_a_namespace_that_cannot_be_sandboxed_is_refused_naming_the_fixes():
    reason, message = confinement_issue("team-a", "bubblewrap (bwrap) is not installed", False, "s3://bucket", "")
    assert reason == EXECUTOR_CANNOT_ISOLATE
    assert "'team-a'" in message and "bubblewrap (bwrap) is not installed" in message
    for fix in ("--executor pod", "executor: \"pod\"", "--trusted-namespace"):
        assert fix in message


def test_file_state_must_be_inside_the_directory_the_platform_gave_the_namespace(tmp_path):
    root = tmp_path / "teams" / "alpha"
    assert confinement_issue("team-a", "", False, "s3://bucket?endpoint=x", "") is None
    assert confinement_issue("team-a", "", False, root.as_uri(), root.as_uri()) is None
    assert confinement_issue("team-a", "", False, (root / "app").as_uri(), str(root)) is None
    for stolen in (tmp_path / "teams" / "beta", tmp_path / "teams" / "alpha-other", root / ".." / "beta"):
        reason, message = confinement_issue("team-a", "", False, f"file://{stolen}", str(root))
        assert reason == STALLED_SPEC_INVALID and message.startswith("spec.backend")
        assert str(root) in message and FILE_BACKEND_ANNOTATION in message
    reason, message = confinement_issue("team-a", "", False, (root / "app").as_uri(), "")
    assert reason == STALLED_SPEC_INVALID and f"has no annotation {FILE_BACKEND_ANNOTATION}" in message


def test_each_sandboxed_namespace_gets_its_own_python_cache(tmp_path):
    engine = AutomationEngine(EngineSettings(pulumi_command="/bin/true", state_dir=tmp_path / "state",
                                             python_cache=tmp_path / "cache" / "uv",
                                             trusted_namespaces=frozenset({"strata-system"})))
    assert engine.python_cache(Domain()) == tmp_path / "cache" / "uv"
    assert engine.python_cache(Domain("team-a")) == tmp_path / "cache" / "uv-namespaces" / "team-a"
    assert engine.bytecode_cache(Domain("team-a")) == tmp_path / "cache" / "uv-namespaces" / "team-a-bytecode"
    assert engine.trusts("strata-system") and not engine.trusts("team-a")
    assert engine.sandbox_dir("team-a/app") == tmp_path / "state" / "sandboxes" / "team-a" / "app"
    assert engine.stack_dir("team-a/app") == tmp_path / "state" / "stacks" / "team-a" / "app"
