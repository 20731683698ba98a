"""Certificates for the farm's TLS profile (compose.tls.yaml) and its tests: a private CA, and a server and a client
certificate it signs.

    python3 tools/certs.py DIR [--host NAME]... [--days N]

writes DIR/ca.pem (the CA certificate clients verify with), DIR/server.pem and DIR/server.key (for Redis and
RabbitMQ; the certificate names every --host, default localhost and 127.0.0.1), DIR/client.pem and
DIR/client.key (for servers that require client certificates). Private keys get mode 0600 (0640 with --group-read,
for a server that runs as another user of the key's group); an existing DIR/ca.pem is never overwritten (run
again into an empty folder to renew). Uses `cryptography`, a dependency of the farm's [farm] extra.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from pathlib import Path
from typing import Any


def _name(common: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tuning farm"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _alt_names(hosts: list[str]) -> Any:
    from cryptography import x509

    names: list[Any] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _certificate(subject: str, key: Any, issuer: Any, issuer_key: Any, days: int, *, ca: bool,
                 hosts: list[str] | None = None, usage: Any = None) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer or _name(subject))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                                        critical=True)
    else:
        builder = builder.add_extension(x509.KeyUsage(True, True, False, False, False, False, False, False, False),
                                        critical=True).add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if hosts:
        builder = builder.add_extension(_alt_names(hosts), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def _write(path: Path, data: bytes, mode: int) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)


def make_certificates(directory: Path | str, hosts: list[str] | None = None, days: int = 825,
                      key_mode: int = 0o600) -> dict[str, Path]:
    """Write the CA, server and client certificates and keys into ``directory``; return their paths by name
    (``ca``, ``server``, ``server_key``, ``client``, ``client_key``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    directory = Path(directory)
    hosts = hosts or ["localhost", "127.0.0.1"]
    if (directory / "ca.pem").exists():
        raise FileExistsError(f"{directory / 'ca.pem'}: exists; certificates are never overwritten")
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("tuning farm CA", ca_key, None, None, days, ca=True)
    paths = {"ca": directory / "ca.pem"}
    for role, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(f"tuning farm {role}", key, ca.subject, ca_key, days, ca=False,
                            hosts=hosts if role == "server" else None, usage=usage)
        _write(directory / f"{role}.key", key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()), key_mode)
        _write(directory / f"{role}.pem", cert.public_bytes(pem), 0o644)
        paths[role], paths[f"{role}_key"] = directory / f"{role}.pem", directory / f"{role}.key"
    _write(directory / "ca.pem", ca.public_bytes(pem), 0o644)  # last: its presence means the set is complete
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--host", action="append", help="a DNS name or IP address the server certificate names")
    parser.add_argument("--days", type=int, default=825)
    parser.add_argument("--group-read", action="store_true", help="private keys get mode 0640 instead of 0600")
    args = parser.parse_args(argv)
    try:
        paths = make_certificates(args.directory, args.host, args.days, 0o640 if args.group_read else 0o600)
    except (OSError, ValueError) as e:
        print(f"certs: error: {e}", file=sys.stderr)
        return 2
    print(" ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
