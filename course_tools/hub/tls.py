"""The certificate `course hub` serves HTTPS with: the instructor's, or one made for the room.

Learners' passwords cross the room's network, so off loopback the hub's proxy serves HTTPS
(JupyterHub's `ssl_cert`/`ssl_key`, which it hands to configurable-http-proxy):

* with `--ssl-cert`/`--ssl-key` (or $COURSE_HUB_SSL_CERT/$COURSE_HUB_SSL_KEY), the instructor's
  certificate (a domain name's, e.g. from Let's Encrypt);
* without one, a self-signed certificate made here for the hub's address (kept in the hub's
  folder and reused while it names that address), whose SHA-256 fingerprint `course hub` prints:
  the browser warns about it once, and a learner compares the fingerprint it shows with the one
  on the board before going on;
* plain HTTP on a loopback address (nothing crosses a network), or when asked for in so many
  words (`--insecure-http`, $COURSE_HUB_INSECURE_HTTP=1).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

DAYS = 30   # a workshop's certificate: made again after a month


@dataclass(frozen=True)
class TLS:
    scheme: str                  # "https" or "http"
    cert: Path | None = None
    key: Path | None = None
    fingerprint: str | None = None   # SHA-256, AA:BB:..., of the certificate served
    self_signed: bool = False


def is_loopback(ip: str) -> bool:
    if ip in ("localhost", ""):
        return ip == "localhost"
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def fingerprint(cert_pem: bytes) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    digest = x509.load_pem_x509_certificate(cert_pem).fingerprint(hashes.SHA256())
    return ":".join(f"{b:02X}" for b in digest)


def primary_address() -> str | None:
    """The address this machine reaches the network from (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))   # TEST-NET-1: never routed anywhere real
            return s.getsockname()[0]
        except OSError:
            return None


def names_for(ip: str) -> tuple[list[str], list[str]]:
    """(IP addresses, DNS names) a certificate for a hub listening on `ip` must name."""
    ips = [] if ip in ("0.0.0.0", "::", "") else [ip]
    if not ips:
        ips = [a for a in [primary_address()] if a]
    dns = [socket.gethostname()]
    return ips, [d for d in dns if d]


def make_self_signed(folder: Path, ip: str) -> tuple[Path, Path]:
    """A fresh key and self-signed certificate for `ip` in `folder` (key mode 0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    ips, dns = names_for(ip)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (ips or dns or ["course hub"])[0]),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "attention course hub")])
    now = datetime.datetime.now(datetime.timezone.utc)
    sans = [x509.IPAddress(ipaddress.ip_address(a)) for a in ips] + [x509.DNSName(d) for d in dns]
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=DAYS))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    key_path, cert_path = folder / "hub.key", folder / "hub.crt"
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _still_good(cert_path: Path, ip: str) -> bool:
    """The kept certificate names `ip` and has a week left."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    named = {str(a) for a in sans.get_values_for_type(x509.IPAddress)}
    wanted = set(names_for(ip)[0])
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
    return wanted <= named and left > datetime.timedelta(days=7)


def choose(ip: str, hub_dir: Path, cert: str | None = None, key: str | None = None,
           insecure_http: bool = False) -> TLS:
    """How the hub on `ip` serves learners. Raises ValueError with what to fix."""
    if bool(cert) != bool(key):
        raise ValueError("give both --ssl-cert and --ssl-key (PEM files), or neither")
    if cert:
        cert_path, key_path = Path(cert).resolve(), Path(key).resolve()
        for path in (cert_path, key_path):
            if not path.is_file():
                raise ValueError(f"{path}: no such file (--ssl-cert/--ssl-key take PEM files)")
        try:
            printed = fingerprint(cert_path.read_bytes())
        except ValueError:
            raise ValueError(f"{cert_path} is not a PEM certificate") from None
        return TLS("https", cert_path, key_path, printed)
    if insecure_http or is_loopback(ip):
        return TLS("http")
    folder = Path(hub_dir) / "tls"
    cert_path, key_path = folder / "hub.crt", folder / "hub.key"
    if not (key_path.is_file() and _still_good(cert_path, ip)):
        cert_path, key_path = make_self_signed(folder, ip)
    return TLS("https", cert_path, key_path, fingerprint(cert_path.read_bytes()), self_signed=True)
