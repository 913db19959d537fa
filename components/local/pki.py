"""The local control plane's PKI: one CA, serving and client certificates, the service-account key pair."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
API_SERVER_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local")
API_SERVER_IPS = ("127.0.0.1", "10.96.0.1")

# Client identities the control plane needs: (file stem, common name, organization).
CLIENTS = (
    ("admin", "strata-admin", "system:masters"),
    ("controller-manager", "system:kube-controller-manager", None),
    ("scheduler", "system:kube-scheduler", None),
    # kube-apiserver's identity towards kubelets (logs, exec, port-forward on real nodes).
    ("kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
    # The git server's, to announce a push to Flux: it may patch GitRepositories and nothing else.
    ("git-server", "strata:git-server", None),
)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _issue(subject: x509.Name, key, ca_cert: x509.Certificate | None, ca_key, *, ca: bool = False,
           usage: ExtendedKeyUsageOID | list[ExtendedKeyUsageOID] | None = None,
           sans: list[x509.GeneralName] | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject if ca_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False), critical=True)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage if isinstance(usage, list) else [usage]),
                                        critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
    return cert, key


def issue_client_certificate(directory: Path, stem: str, common_name: str, organization: str | None) -> None:
    """`<stem>.crt`/`<stem>.key` signed by the platform's CA, unless they exist already."""
    if (directory / f"{stem}.crt").exists() and (directory / f"{stem}.key").exists():
        return
    ca_cert, ca_key = _load_ca(directory)
    key = _key()
    cert = _issue(_name(common_name, organization), key, ca_cert, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    _write(directory / f"{stem}.key", _pem_key(key), private=True)
    _write(directory / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM))


def ensure_pki(directory: Path) -> Path:
    """Create the PKI in `directory` unless it is complete already; returns the directory.

    A platform made before a client identity was added keeps its CA and gets only the new certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    core = ["ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub"]
    if not all((directory / name).exists() for name in core):
        _create_core(directory)
    for stem, common_name, organization in CLIENTS:
        issue_client_certificate(directory, stem, common_name, organization)
    ensure_etcd_pki(directory / "etcd")
    return directory


# etcd's clients: the API server, and the platform's health check. etcd holds every Secret in the clear, and
# anything on the host's loopback (a team's program under the process executor shares the host's network)
# could read it without a certificate; with a CA of its own, no other certificate of the platform opens it.
ETCD_CLIENTS = (("apiserver-etcd-client", "kube-apiserver-etcd-client"),
                ("healthcheck-client", "kube-etcd-healthcheck-client"))


def ensure_etcd_pki(directory: Path) -> Path:
    """etcd's own CA, its serving certificate for 127.0.0.1 and its client certificates, unless present."""
    directory.mkdir(parents=True, exist_ok=True)
    if not all((directory / name).exists() for name in ("ca.crt", "ca.key", "server.crt", "server.key")):
        ca_key = _key()
        ca_cert = _issue(_name("strata-etcd-ca"), ca_key, None, ca_key, ca=True)
        _write(directory / "ca.key", _pem_key(ca_key), private=True)
        _write(directory / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM))
        server_key = _key()
        # Both uses, as kubeadm's: etcd's own HTTP gateway connects to its gRPC server with it.
        server = _issue(_name("etcd"), server_key, ca_cert, ca_key,
                        usage=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        _write(directory / "server.key", _pem_key(server_key), private=True)
        _write(directory / "server.crt", server.public_bytes(serialization.Encoding.PEM))
        for stem, _ in ETCD_CLIENTS:
            (directory / f"{stem}.crt").unlink(missing_ok=True)
    for stem, common_name in ETCD_CLIENTS:
        issue_client_certificate(directory, stem, common_name, None)
    return directory


def _create_core(directory: Path) -> None:
    ca_key = _key()
    ca_cert = _issue(_name("strata-local-ca"), ca_key, None, ca_key, ca=True)
    _write(directory / "ca.key", _pem_key(ca_key), private=True)
    _write(directory / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM))

    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in API_SERVER_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in API_SERVER_IPS]
    server_key = _key()
    server_cert = _issue(_name("kube-apiserver"), server_key, ca_cert, ca_key,
                         usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=sans)
    _write(directory / "apiserver.key", _pem_key(server_key), private=True)
    _write(directory / "apiserver.crt", server_cert.public_bytes(serialization.Encoding.PEM))
    for stem in [stem for stem, _, _ in CLIENTS]:  # leaves of an old CA would not verify under the new one
        (directory / f"{stem}.crt").unlink(missing_ok=True)

    # Service-account tokens are RSA-signed (RS256) by kube-apiserver.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(directory / "sa.key", _pem_key(sa_key), private=True)
    _write(directory / "sa.pub", sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
