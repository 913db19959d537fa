import base64

import yaml

from strata_components.local.kube import render_kubeconfig, write_private


def test_token_kubeconfig_carries_only_the_token(tmp_path):
    text = render_kubeconfig("https://127.0.0.1:1", "CA", user="team-a", token="tok", namespace="team-a")
    config = yaml.safe_load(text)
    user = config["users"][0]["user"]
    assert user == {"token": "tok"}
    assert config["contexts"][0]["context"]["namespace"] == "team-a"
    cluster = config["clusters"][0]["cluster"]
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"CA"
    path = write_private(tmp_path / "k" / "config", text)
    assert path.stat().st_mode & 0o077 == 0


def test_certificate_kubeconfig_embeds_the_pair():
    config = yaml.safe_load(render_kubeconfig("https://x", "CA", user="admin", client_cert_pem="C", client_key_pem="K"))
    user = config["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]) == b"C"
    assert base64.b64decode(user["client-key-data"]) == b"K"
    assert "token" not in user
