"""``fedcluster-make-certs``: everything a secure deployment needs, made in one folder.

Writes into ``--out``:

* ``ca.crt``, ``ca.key``          a certificate authority (ECDSA P-384, self-signed). ``ca.crt``
                                 goes to every SuperNode (``--root-certificates``) and to
                                 ``flwr`` (``root-certificates`` in the connection); ``ca.key``
                                 stays offline.
* ``superlink.crt``, ``superlink.key``  the SuperLink's TLS certificate, signed by the CA, with
                                 a subject alternative name for every ``--host`` (DNS names
                                 and IP addresses alike); for ``flower-superlink
                                 --ssl-ca-certfile ca.crt --ssl-certfile superlink.crt
                                 --ssl-keyfile superlink.key``.
* ``supernode-N.key``, ``supernode-N.key.pub``  one ECDSA P-384 key pair per SuperNode in
                                 OpenSSH format (what ``ssh-keygen -t ecdsa -b 384`` makes):
                                 the private key stays on device N
                                 (``--auth-supernode-private-key``), the public key is
                                 registered with ``flwr supernode register``.

and prints the commands to start and register everything. Private keys are written with
mode 0600. Existing files are never overwritten without ``--force``.

Uses the ``cryptography`` package (a dependency of flwr). Nothing here imports flwr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .cli import ToolParser, integer, output_folder, refuse

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
MAX_SUPERNODES = 1000  # key pairs in one call: checked before any file is written
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def connection_name(text: str) -> str:
    """An argparse type: a flwr connection name, a bare TOML key (it heads ``[superlink.NAME]``)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", text):
        raise argparse.ArgumentTypeError(f"must be 1 to 64 letters, digits, '-' or '_' (a TOML key), got {text!r}")
    return text


def _checked_host(host: str) -> str:
    """``host`` as a subject alternative name: an IP address or a DNS name (labels of
    letters, digits and hyphens, at most 253 characters); anything else is refused by name."""
    name = host.strip()
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    labels = name.rstrip(".").split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"--host {host!r} is neither an IP address nor a DNS name (letters, digits, hyphens and dots)")
    return name


@dataclass
class Made:
    out: Path
    ca_cert: Path
    ca_key: Path
    superlink_cert: Path
    superlink_key: Path
    supernode_keys: list[Path]  # private keys; the public key is the same path + ".pub"
    hosts: tuple[str, ...]


def _write(path: Path, data: bytes, private: bool) -> None:
    """A new file at ``path``, never through a link: whatever stood there (``--force``) is
    removed first, and the file is created exclusively, so a link planted in between makes
    the write fail instead of writing a key where the link points."""
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            raise IsADirectoryError(f"{path} is a folder, not a file this tool wrote")
        path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    mode = 0o600 if private else 0o644
    fd = os.open(path, flags, mode)
    os.fchmod(fd, mode)  # the mode asked for, whatever the umask
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _subject_alternative_names(hosts):
    from cryptography import x509

    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


MAX_DAYS = 3653


def make_certs(out: Path, hosts=DEFAULT_HOSTS, supernodes: int = 2, days: int = 365, force: bool = False) -> Made:
    """Make the CA, the SuperLink certificate and ``supernodes`` SuperNode key pairs."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    hosts = tuple(_checked_host(h) for h in hosts)
    if not hosts:
        raise ValueError("give at least one --host (the names and addresses SuperNodes and flwr use for the SuperLink)")
    if not 0 <= supernodes <= MAX_SUPERNODES:
        raise ValueError(
            f"--supernodes must be between 0 and {MAX_SUPERNODES}, got {supernodes} "
            "(each is a key pair to register and keep; make more in further folders)"
        )
    if not 1 <= days <= MAX_DAYS:  # X.509 dates end in 9999; a certificate of centuries is a typo
        raise ValueError(f"--days must be between 1 and {MAX_DAYS} (ten years), got {days}")
    out = Path(out).expanduser().resolve()
    made = Made(
        out,
        out / "ca.crt",
        out / "ca.key",
        out / "superlink.crt",
        out / "superlink.key",
        [out / f"supernode-{i}.key" for i in range(1, supernodes + 1)],
        hosts,
    )
    targets = [made.ca_cert, made.ca_key, made.superlink_cert, made.superlink_key]
    targets += [p for key in made.supernode_keys for p in (key, key.with_name(key.name + ".pub"))]
    existing = [p.name for p in targets if p.exists()]
    if existing and not force:
        raise FileExistsError(f"{out} already holds {', '.join(existing)}; choose another --out or pass --force")
    out.mkdir(parents=True, exist_ok=True)

    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)
    pem_key = lambda key: key.private_bytes(  # noqa: E731
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedcluster CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    link_key = ec.generate_private_key(ec.SECP384R1())
    link_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(link_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(_subject_alternative_names(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, True, False, False, False, False), critical=True
        )  # digital_signature, key_agreement
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    _write(made.ca_key, pem_key(ca_key), private=True)
    _write(made.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(made.superlink_key, pem_key(link_key), private=True)
    _write(made.superlink_cert, link_cert.public_bytes(serialization.Encoding.PEM), private=False)
    for index, path in enumerate(made.supernode_keys, start=1):
        key = ec.generate_private_key(ec.SECP384R1())
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        _write(path, private, private=True)
        _write(path.with_name(path.name + ".pub"), public + f" fedcluster-supernode-{index}\n".encode(), private=False)
    return made


def instructions(made: Made, connection: str = "my-superlink", port: int = 8000) -> str:
    """The commands that use what ``make_certs`` wrote (printed by the console script)."""
    host = made.hosts[0]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [
        f"Wrote to {made.out}: ca.crt, ca.key (keep offline), superlink.crt/.key "
        f"(SANs: {', '.join(made.hosts)}), {len(made.supernode_keys)} SuperNode key pair(s).",
        "",
        "1. SuperLink (on the server):",
        "   FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 flower-superlink --host 0.0.0.0 --port "
        f"{port} --disable-runtime-dependency-installation \\",
        f"       --ssl-ca-certfile {made.ca_cert} --ssl-certfile {made.superlink_cert} --ssl-keyfile "
        f"{made.superlink_key} \\",
        "       --enable-supernode-auth",
        "2. A connection for flwr, in $FLWR_HOME/config.toml (default ~/.flwr/config.toml):",
        f"   [superlink.{connection}]",
        f'   address = "{address}"',
        f'   root-certificates = "{made.ca_cert}"',
        "3. Register every SuperNode's public key (from where flwr runs):",
    ]
    lines += [f"   flwr supernode register {key}.pub {connection}" for key in made.supernode_keys]
    lines.append(
        "4. Start SuperNode N on its device with its own key and data file (copy ca.crt and supernode-N.key there;"
    )
    lines.append("   SuperNodes sharing a host need one --port each):")
    for index, key in enumerate(made.supernode_keys, start=1):
        lines.append(
            f"   FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 flower-supernode --superlink {address} "
            f"--root-certificates {made.ca_cert} --auth-supernode-private-key {key} --port {9093 + index} "
            f"--node-config 'data-path=\"/data/client.npy\"'"
        )
    lines.append(
        f'5. flwr run . {connection} --run-config "k=8 min-nodes={max(len(made.supernode_keys), 1)} '
        "output-dir='/abs/out'\""
    )
    lines.append(f"   then: flwr ls {connection}; flwr log RUN_ID {connection} --show")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(
        prog="fedcluster-make-certs",
        description="Make a CA, the SuperLink's TLS certificate and SuperNode authentication key pairs, "
        "and print the commands that use them.",
    )
    parser.add_argument("--out", default="certs", help="folder to write into (default ./certs)")
    parser.add_argument(
        "--host",
        action="append",
        default=None,
        help="a name or address clients use for the SuperLink (repeatable; the first is the one printed); "
        f"default: {', '.join(DEFAULT_HOSTS)}",
    )
    parser.add_argument(
        "--supernodes",
        type=integer(0, MAX_SUPERNODES),
        default=2,
        help=f"number of SuperNode key pairs, 0 to {MAX_SUPERNODES} (default 2)",
    )
    parser.add_argument(
        "--days",
        type=integer(1, MAX_DAYS),
        default=365,
        help=f"validity of the certificates in days, 1 to {MAX_DAYS} (default 365)",
    )
    parser.add_argument(
        "--connection",
        type=connection_name,
        default="my-superlink",
        help="the flwr connection name used in the printed commands (letters, digits, - and _)",
    )
    parser.add_argument(
        "--port",
        type=integer(1, 65535),
        default=8000,
        help="the SuperLink's port used in the printed commands (default 8000)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite existing files in --out")
    args = parser.parse_args(argv)
    try:
        hosts = tuple(_checked_host(host) for host in args.host or DEFAULT_HOSTS)
        keys = [f"supernode-{i}.key{end}" for i in range(1, args.supernodes + 1) for end in ("", ".pub")]
        out = output_folder(
            args.out,
            "--out",
            writes=("ca.crt", "ca.key", "superlink.crt", "superlink.key", *keys),
            overwrite=args.force,
            overwrite_flag="--force",
        )
    except ValueError as exc:
        parser.error(str(exc) if str(exc).startswith("argument") else f"argument {exc}")
    try:
        made = make_certs(out, hosts, args.supernodes, args.days, args.force)
    except (ValueError, OSError) as exc:
        return refuse("fedcluster-make-certs", exc)
    except ImportError as exc:
        return refuse("fedcluster-make-certs", f"needs the 'cryptography' package (pip install cryptography): {exc}")
    print(instructions(made, args.connection, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
