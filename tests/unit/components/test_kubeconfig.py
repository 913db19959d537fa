"""The one kubeconfig renderer, used by the components and by the local platform."""

import base64

import pytest
import yaml

from strata_components.kubeconfig import (build_client_certificate_kubeconfig, build_token_kubeconfig,
                                          build_exec_kubeconfig, kubeconfig_cluster, kubeconfig_user,
                                          pem_data)
from strata_components.layers import list_status


def test_token_kubeconfig_carries_only_the_token():
    text = build_token_kubeconfig(cluster="strata", server="https://127.0.0.1:1", ca_data=pem_data("CA"),
                                  user="team-a", token="tok", namespace="team-a")
    config = yaml.safe_load(text)
    assert config["users"][0] == {"name": "team-a", "user": {"token": "tok"}}
    assert config["contexts"][0]["context"] == {"cluster": "strata", "user": "team-a", "namespace": "team-a"}
    assert config["current-context"] == "strata"
    assert kubeconfig_cluster(text) == ("https://127.0.0.1:1", pem_data("CA"))
    assert base64.b64decode(kubeconfig_cluster(text)[1]) == b"CA"
    assert kubeconfig_user(text) == {"token": "tok"}


def test_an_empty_token_is_refused():
    with pytest.raises(ValueError, match="token is empty"):
        build_token_kubeconfig(cluster="c", server="https://x", ca_data="", user="u", token="")


def test_certificate_kubeconfig_embeds_the_pair():
    config = yaml.safe_load(build_client_certificate_kubeconfig(
        cluster="strata-local", server="https://x", ca_data=pem_data("CA"), user="admin",
        certificate_data=pem_data("C"), key_data=pem_data("K")))
    user = config["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]) == b"C"
    assert base64.b64decode(user["client-key-data"]) == b"K"
    assert "token" not in user and "namespace" not in config["contexts"][0]["context"]


def test_a_kubeconfig_without_a_usable_cluster_is_named():
    with pytest.raises(ValueError, match="no usable current-context cluster"):
        kubeconfig_cluster("apiVersion: v1\nkind: Config\n")


def test_list_status_names_credentials_it_cannot_use_before_any_request():
    text = build_exec_kubeconfig(cluster="gke", server="https://127.0.0.1:1", ca_data="", command="gke-gcloud-auth-plugin",
                                 args=[])
    with pytest.raises(ValueError, match="this one has exec: pass a hand-off's kubeconfig"):
        list_status(text, "default")
