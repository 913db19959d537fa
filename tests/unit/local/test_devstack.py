import pytest

from strata_components.local import devstack


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PULUMI_BACKEND_URL", "file:///elsewhere")
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    monkeypatch.setattr(devstack, "installed", lambda: type("T", (), {"bin_dirs": [tmp_path / "tc" / "bin"]})())
    (tmp_path / "Pulumi.yaml").write_text("name: strata\nruntime: python\nbackend:\n  url: file://~/state/pulumi\n")
    return tmp_path


def test_dev_stack_uses_the_projects_backend_and_a_private_generated_passphrase(project, tmp_path):
    env = devstack.dev_environment(project, tmp_path / "home" / "strata" / "platform")
    assert (tmp_path / "home" / "state" / "pulumi").is_dir()
    assert "PULUMI_BACKEND_URL" not in env
    passphrase_file = tmp_path / "home" / "strata" / "passphrase"
    assert passphrase_file.stat().st_mode & 0o077 == 0
    assert env["PULUMI_CONFIG_PASSPHRASE"] == passphrase_file.read_text().strip()
    assert len(env["PULUMI_CONFIG_PASSPHRASE"]) >= 32
    again = devstack.dev_environment(project, tmp_path / "home" / "strata" / "platform")
    assert again["PULUMI_CONFIG_PASSPHRASE"] == env["PULUMI_CONFIG_PASSPHRASE"]
    assert env["PATH"].startswith(str(tmp_path / "tc" / "bin"))


def test_a_given_passphrase_wins_and_nothing_is_generated(project, tmp_path, monkeypatch):
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "mine")
    env = devstack.dev_environment(project, tmp_path / "home" / "strata" / "platform")
    assert env["PULUMI_CONFIG_PASSPHRASE"] == "mine"
    assert not (tmp_path / "home" / "strata" / "passphrase").exists()


def test_a_non_file_backend_is_refused_by_name(project):
    (project / "Pulumi.yaml").write_text("name: strata\nruntime: python\nbackend:\n  url: s3://bucket\n")
    with pytest.raises(devstack.DevStackError, match="expects a file:// backend"):
        devstack.project_backend(project)


def test_up_stops_at_once_naming_what_is_missing(project, monkeypatch, tmp_path):
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(devstack.DevStackError) as error:
        devstack.up(project, tmp_path / "state")
    assert "pulumi-language-python" in str(error.value) and "pulumi plugin install resource flux" in str(error.value)
