"""``fedcluster-make-certs``: a CA, the SuperLink's certificate, SuperNode key pairs.

Checked here with the cryptography package (chain, SANs, key formats Flower loads); the
engine tier uses the same files for a real TLS + authenticated deployment."""

from __future__ import annotations

import ipaddress
import stat

import pytest

pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_ssh_private_key, load_ssh_public_key  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID  # noqa: E402

from fedcluster.tools.certs import main, make_certs  # noqa: E402


def test_superlink_certificate_is_signed_by_the_ca_with_every_host_as_san(tmp_path):
    made = make_certs(tmp_path, ("superlink.example", "10.1.2.3", "::1"), supernodes=0)
    ca = x509.load_pem_x509_certificate(made.ca_cert.read_bytes())
    link = x509.load_pem_x509_certificate(made.superlink_cert.read_bytes())
    link.verify_directly_issued_by(ca)  # raises when the signature or issuer is wrong
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not link.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = link.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["superlink.example"]
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("10.1.2.3"),
        ipaddress.ip_address("::1"),
    }
    assert ExtendedKeyUsageOID.SERVER_AUTH in link.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    key = load_pem_private_key(made.superlink_key.read_bytes(), None)
    assert key.public_key().public_numbers() == link.public_key().public_numbers()


def test_supernode_keys_are_openssh_ecdsa_pairs_and_private_files_are_0600(tmp_path):
    made = make_certs(tmp_path, supernodes=3)
    assert [p.name for p in made.supernode_keys] == ["supernode-1.key", "supernode-2.key", "supernode-3.key"]
    publics = set()
    for path in made.supernode_keys:
        private = load_ssh_private_key(path.read_bytes(), None)  # what flower-supernode does
        public = load_ssh_public_key(path.with_name(path.name + ".pub").read_bytes())  # flwr supernode register
        assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.key_size == 384
        assert private.public_key().public_numbers() == public.public_numbers()
        publics.add(public.public_numbers())
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(publics) == 3
    assert stat.S_IMODE(made.ca_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(made.superlink_key.stat().st_mode) == 0o600


def test_existing_files_are_not_overwritten_without_force(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--supernodes", "1"]) == 0
    first = (tmp_path / "ca.crt").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main(["--out", str(tmp_path), "--supernodes", "1"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "already holds" in err and "--force" in err
    assert (tmp_path / "ca.crt").read_bytes() == first
    assert main(["--out", str(tmp_path), "--supernodes", "1", "--force"]) == 0
    assert (tmp_path / "ca.crt").read_bytes() != first


def test_prints_the_secure_commands_and_one_registration_per_supernode(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--host", "server.lan", "--supernodes", "2", "--connection", "prod"]) == 0
    out = capsys.readouterr().out
    assert out.count("flwr supernode register") == 2
    assert f"flwr supernode register {tmp_path / 'supernode-2.key.pub'} prod" in out
    assert "--enable-supernode-auth" in out and "--ssl-certfile" in out and "--root-certificates" in out
    assert "--insecure" not in out
    assert 'address = "server.lan:8000"' in out
    assert "--port 9094" in out and "--port 9095" in out


def refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    return capsys.readouterr().err


def test_bad_arguments_are_named(tmp_path, capsys):
    assert "--supernodes: must be a whole number in [0, 1000]" in refused(
        capsys, ["--out", str(tmp_path), "--supernodes", "-1"]
    )
    assert "--supernodes: must be a whole number in [0, 1000]" in refused(
        capsys, ["--out", str(tmp_path / "many"), "--supernodes", "100000"]
    )
    assert not (tmp_path / "many").exists()  # refused before any file is written
    for host in ("", "bad host", "-x.example", "a" * 64 + ".example", "x..y"):
        err = refused(capsys, ["--out", str(tmp_path / "h"), "--host", "ok.example", f"--host={host}"])
        assert f"--host {host!r} is neither an IP address nor a DNS name" in err
    assert not (tmp_path / "h").exists()
    for days in ("0", "100000000"):  # 1e8 days once overflowed the date arithmetic with a raw traceback
        assert "--days: must be a whole number in [1, 3653]" in refused(
            capsys, ["--out", str(tmp_path / "d"), "--days", days]
        )
    assert not (tmp_path / "d").exists()


def test_force_never_writes_through_a_planted_link(tmp_path):
    """A link planted at OUT/ca.key must not send the CA's private key to its target."""
    make_certs(tmp_path / "out", supernodes=1)
    target = tmp_path / "elsewhere.txt"
    target.write_text("not a key")
    (tmp_path / "out" / "ca.key").unlink()
    (tmp_path / "out" / "ca.key").symlink_to(target)
    (tmp_path / "out" / "supernode-1.key").unlink()
    (tmp_path / "out" / "supernode-1.key").symlink_to(tmp_path / "dangling")
    made = make_certs(tmp_path / "out", supernodes=1, force=True)
    assert target.read_text() == "not a key" and not (tmp_path / "dangling").exists()
    assert not made.ca_key.is_symlink() and b"PRIVATE KEY" in made.ca_key.read_bytes()
    assert stat.S_IMODE(made.ca_key.stat().st_mode) == 0o600
    assert not made.supernode_keys[0].is_symlink()
