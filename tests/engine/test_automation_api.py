"""The real Pulumi engine from the toolchain (CLI 3.259 + YAML language host) through the Automation API.

No provider plugins exist here, so these programs use what the engine has built in: the
`pulumi:index:Stash` resource, config and secrets, and Python dynamic providers (run by the
`pulumi-resource-pulumi-python` shim the toolchain copies next to the CLI).
"""

import textwrap

from pulumi import automation as auto

from tests.engine.workspace import inline_stack, state_text, workspace_options

YAML_PROJECT = textwrap.dedent("""\
    name: engine-yaml
    runtime: yaml
    config:
      greeting:
        type: string
      apiToken:
        type: string
        secret: true
    resources:
      note:
        type: pulumi:index:Stash
        properties:
          input: ${greeting}
    outputs:
      message: ${note.output}
      token: ${apiToken}
""")
CANARY = "canary-0d6f1c0b-must-stay-encrypted"


def test_yaml_project_up_preview_destroy_with_config_and_secret_output(toolchain, pulumi_env, file_backend, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text(YAML_PROJECT)
    stack = auto.create_stack("dev", work_dir=str(project),
                              opts=workspace_options(toolchain, pulumi_env, file_backend, project))
    stack.set_config("greeting", auto.ConfigValue("hello"))
    stack.set_config("apiToken", auto.ConfigValue(CANARY, secret=True))

    up = stack.up()
    assert up.summary.result == "succeeded"
    assert up.summary.resource_changes == {"create": 2}  # the stack and the Stash
    assert up.outputs["message"].value == "hello"
    assert up.outputs["token"].secret is True and up.outputs["token"].value == CANARY
    assert CANARY not in state_text(file_backend)
    assert CANARY not in (project / "Pulumi.dev.yaml").read_text()

    preview = stack.preview()
    assert preview.change_summary == {"same": 2}

    stack.set_config("greeting", auto.ConfigValue("changed"))
    preview = stack.preview()
    assert preview.change_summary.get("update") == 1

    destroyed = stack.destroy()
    assert destroyed.summary.result == "succeeded"
    assert destroyed.summary.resource_changes == {"delete": 2}
    stack.workspace.remove_stack("dev")
    assert "dev" not in [s.name for s in stack.workspace.list_stacks()]


def test_inline_python_program_with_a_dynamic_provider(toolchain, pulumi_env, file_backend, tmp_path):
    journal = tmp_path / "journal.txt"

    def program():
        import pulumi
        from pulumi.dynamic import CreateResult, ResourceProvider, UpdateResult, Resource

        class JournalProvider(ResourceProvider):
            # Runs in the dynamic-provider plugin process, not in this test: the journal file proves it ran.
            def create(self, props):
                with open(props["journal"], "a") as handle:
                    handle.write(f"create {props['text']}\n")
                return CreateResult(id_="entry-1", outs={**props, "length": len(props["text"])})

            def update(self, _id, _olds, news):
                with open(news["journal"], "a") as handle:
                    handle.write(f"update {news['text']}\n")
                return UpdateResult(outs={**news, "length": len(news["text"])})

            def delete(self, _id, props):
                with open(props["journal"], "a") as handle:
                    handle.write("delete\n")

        class JournalEntry(Resource):
            length: pulumi.Output[int]

            def __init__(self, name, text, opts=None):
                super().__init__(JournalProvider(), name, {"text": text, "journal": str(journal), "length": None},
                                 opts)

        text = pulumi.Config().require("text")
        entry = JournalEntry("entry", text)
        pulumi.export("length", entry.length)

    stack = inline_stack(toolchain, pulumi_env, file_backend, "engine-inline", "dev", program)
    stack.set_config("text", auto.ConfigValue("four"))
    assert stack.up().outputs["length"].value == 4
    stack.set_config("text", auto.ConfigValue("sixsix"))
    up = stack.up()
    assert up.outputs["length"].value == 6 and up.summary.resource_changes.get("update") == 1
    stack.destroy()
    assert journal.read_text().splitlines() == ["create four", "update sixsix", "delete"]
    export = stack.export_stack()
    assert [r for r in export.deployment.get("resources", []) if r["type"] != "pulumi:pulumi:Stack"] == []
