import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from strata_components.local.pki import ensure_pki


def _load(path):
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_pki_issues_a_chain_the_apiserver_and_clients_can_use(tmp_path):
    pki = ensure_pki(tmp_path / "pki")
    ca = _load(pki / "ca.crt")
    server = _load(pki / "apiserver.crt")
    server.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    admin = _load(pki / "admin.crt")
    admin.verify_directly_issued_by(ca)
    assert admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    usage = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    assert (pki / "ca.key").stat().st_mode & 0o077 == 0


def test_pki_is_created_once(tmp_path):
    pki = ensure_pki(tmp_path / "pki")
    before = (pki / "ca.crt").read_bytes()
    ensure_pki(pki)
    assert (pki / "ca.crt").read_bytes() == before


def test_a_platform_made_before_a_client_identity_existed_keeps_its_ca_and_gets_only_the_new_certificate(tmp_path):
    pki = ensure_pki(tmp_path / "pki")
    ca, admin = (pki / "ca.crt").read_bytes(), (pki / "admin.crt").read_bytes()
    (pki / "kubelet-client.crt").unlink()
    (pki / "kubelet-client.key").unlink()
    ensure_pki(pki)
    assert (pki / "ca.crt").read_bytes() == ca and (pki / "admin.crt").read_bytes() == admin
    _load(pki / "kubelet-client.crt").verify_directly_issued_by(_load(pki / "ca.crt"))


def test_node_certificates_name_the_node_in_the_nodes_group(tmp_path):
    from strata_components.local.pki import issue_client_certificate

    pki = ensure_pki(tmp_path / "pki")
    issue_client_certificate(pki, "node-real-0", "system:node:real-0", "system:nodes")
    cert = _load(pki / "node-real-0.crt")
    cert.verify_directly_issued_by(_load(pki / "ca.crt"))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:real-0"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    assert (pki / "node-real-0.key").stat().st_mode & 0o077 == 0


def test_etcd_has_a_ca_of_its_own_so_no_other_certificate_of_the_platform_opens_it(tmp_path):
    """etcd holds every Secret in the clear: only the API server's etcd client certificate (and the health
    check's) is signed by the CA etcd trusts; the admin's, the controllers' and the git server's are not."""
    pki = ensure_pki(tmp_path / "pki")
    etcd_ca = _load(pki / "etcd" / "ca.crt")
    for stem in ("apiserver-etcd-client", "healthcheck-client", "server"):
        _load(pki / "etcd" / f"{stem}.crt").verify_directly_issued_by(etcd_ca)
        assert (pki / "etcd" / f"{stem}.key").stat().st_mode & 0o077 == 0
    for stem in ("admin", "controller-manager", "scheduler", "git-server", "kubelet-client"):
        with pytest.raises((ValueError, InvalidSignature)):  # another issuer: etcd refuses it
            _load(pki / f"{stem}.crt").verify_directly_issued_by(etcd_ca)
    sans = _load(pki / "etcd" / "server.crt").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
