from strata_components.local.kube import write_private


def test_private_files_are_readable_by_the_owner_only(tmp_path):
    path = write_private(tmp_path / "k" / "config", "secret")
    assert path.read_text() == "secret"
    assert path.stat().st_mode & 0o077 == 0
