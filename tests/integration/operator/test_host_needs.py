"""What a Stack needs from the operator's host, through the real operator: its file:// backend
directory, created when missing, and the provider plugins the operator has, shared through its
plugin cache. What retrying cannot fix stalls the Stack at once, naming the fix."""

import sys
import textwrap

from .conftest import condition, eventually_constant, stash_program

SERVER = "github://api.github.com/strata-test"  # unreachable from here, like pulumi-flux's for an offline host
# A real gRPC provider plugin: the Pulumi Python SDK's provider server, run by this interpreter.
PROVIDER = textwrap.dedent(f"""\
    #!{sys.executable}
    import sys
    from pulumi.provider import Provider, main
    main(Provider("0.0.1", '{{"name": "strataprobe", "version": "0.0.1"}}'), sys.argv[1:])
    """)


def _stalled_message(stacks, name: str) -> str:
    return condition(stacks.wait_stalled(name, "UpdateFailed", 120), "Stalled")["message"]


def test_a_missing_backend_directory_is_created_private_and_the_update_goes_on(stacks, tmp_path):
    backend = tmp_path / "not-yet" / "state"
    stacks.program("hello", stash_program(greeting="hi"))
    stacks.create("hello", stacks.spec(programRef={"name": "hello"}, backend=backend.as_uri()))
    assert stacks.wait_ready("hello", 90)["status"]["outputs"] == {"greeting": "hi"}
    assert backend.is_dir() and backend.stat().st_mode & 0o777 == 0o700
    assert list(backend.rglob("hello*.json")) or list(backend.rglob("dev.json"))


def test_a_backend_directory_that_cannot_be_created_stalls_at_once_naming_it(stacks, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    stacks.program("nowhere", stash_program(greeting="hi"))
    stacks.create("nowhere", stacks.spec(programRef={"name": "nowhere"}, backend=(blocker / "state").as_uri()))
    message = _stalled_message(stacks, "nowhere")
    assert f"cannot create the file:// backend's directory {blocker / 'state'}: Not a directory" in message
    assert "Retrying cannot fix this" in message
    # Not retried with backoff (the first retry would come after 10 s): it waits for a change.
    assert eventually_constant(lambda: stacks.runs("nowhere"), 12) == 1


def test_a_missing_plugin_stalls_with_its_install_command_then_runs_from_the_operators_cache(stacks,
                                                                                             plugin_cache):
    stacks.program("probe", {"resources": {"probe": {
        "type": "pulumi:providers:strataprobe", "options": {"version": "0.0.1", "pluginDownloadURL": SERVER}}}})
    stacks.create("probe", stacks.spec(programRef={"name": "probe"}))
    message = _stalled_message(stacks, "probe")
    command = f"PULUMI_HOME={plugin_cache.parent} pulumi plugin install resource strataprobe 0.0.1 --server {SERVER}"
    assert command in message, message

    # Installed where the message says (laid out as that command leaves it: GitHub is unreachable here),
    # then a reconcile request, as the message says.
    plugin = plugin_cache / "resource-strataprobe-v0.0.1"
    plugin.mkdir()
    (plugin / "pulumi-resource-strataprobe").write_text(PROVIDER)
    (plugin / "pulumi-resource-strataprobe").chmod(0o755)
    stacks.patch("probe", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "plugin-installed"}}})
    ready = stacks.wait_ready("probe", 90)
    assert ready["status"]["lastUpdate"]["state"] == "succeeded"
