"""Certificates for network mode: a development CA and one certificate per party.

``vfl certs --out DIR --party bank --party telco`` writes::

    DIR/ca.pem        the CA certificate every party trusts (public)
    DIR/ca.key        the CA's private key (keep it away from the parties; needed
                      only to issue more certificates later)
    DIR/bank.pem      bank's certificate (CN and DNS name "bank"), signed by the CA
    DIR/bank.key      bank's private key (give it to bank only)
    ...

A party's certificate serves both roles: a passive party presents it as a
server, the active party as a client (mutual TLS). Parties are verified *by
name*: the active party connects to ``telco=10.0.0.7:50051`` and accepts only
a certificate issued by the CA for the name ``telco``, whatever the address;
a passive party can restrict its clients to named certificates
(``--allow-client bank``).

Keys are ECDSA P-256. This is a development CA: in production use your
organisation's PKI and pass the same file layout.
"""
from __future__ import annotations

import datetime as _dt
import ipaddress
import re
from pathlib import Path

from datasets.errors import InputError, VFLError
from datasets.files import write_bytes_atomic

NET_EXTRA_HINT = "install the network extra: pip install '.[net]' (grpcio, cryptography)"
#: the longest validity `vfl certs --days` accepts (an X.509 date ends in the year 9999)
MAX_DAYS = 36500
_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


class MissingDependency(VFLError):
    """An optional dependency (the ``net`` extra) is not installed."""


def require_cryptography():
    try:
        import cryptography  # noqa: F401
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise MissingDependency(f"certificates need the 'cryptography' package: {NET_EXTRA_HINT}") from None
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def check_party_name(name: str) -> str:
    """Party names used in certificates must be DNS labels (letters, digits, inner hyphens)."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InputError(f"party name {name!r} cannot be used in a certificate: use letters, digits and "
                         "hyphens (a DNS label, at most 63 characters, no leading or trailing hyphen)")
    return name


def _write(path: Path, data: bytes, private: bool) -> None:
    """Through the one atomic writer: a fresh temporary file (O_EXCL|O_NOFOLLOW, so neither a
    pre-created ``NAME.key.tmp`` nor a symlink is written through) with mode 0600 from the start
    for private keys (0644 for certificates), renamed over ``path``."""
    write_bytes_atomic(path, data, mode=0o600 if private else 0o644)


def _now():
    return _dt.datetime.now(_dt.timezone.utc)


def _new_key(ec):
    return ec.generate_private_key(ec.SECP256R1())


def _load_ca(out: Path):
    x509, hashes, serialization, ec, _, _ = require_cryptography()
    try:
        cert = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the CA in {out} (ca.pem, ca.key): {exc}") from None
    return cert, key


def create_ca(out: Path, common_name: str = "vfl-boost development CA", days: int = 825):
    x509, hashes, serialization, ec, _, NameOID = require_cryptography()
    key = _new_key(ec)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5)).not_valid_after(now + _dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write(out / "ca.key", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()), private=True)
    _write(out / "ca.pem", cert.public_bytes(serialization.Encoding.PEM), private=False)
    return cert, key


def issue_party_cert(out: Path, party: str, ca_cert, ca_key, hosts: tuple[str, ...] = (), days: int = 825):
    """Write ``party.pem``/``party.key``: CN and DNS name = the party name, plus ``hosts``."""

    x509, hashes, serialization, ec, EKU, NameOID = require_cryptography()
    check_party_name(party)
    key = _new_key(ec)
    sans = [x509.DNSName(party)]
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = _now()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, party)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5)).not_valid_after(now + _dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([EKU.SERVER_AUTH, EKU.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write(out / f"{party}.key", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()), private=True)
    _write(out / f"{party}.pem", cert.public_bytes(serialization.Encoding.PEM), private=False)
    return out / f"{party}.pem", out / f"{party}.key"


def make_certs(out, parties, hosts=(), days: int = 825, overwrite: bool = False,
               party_hosts: dict | None = None) -> list[Path]:
    """Create (or reuse) the CA in ``out`` and issue one certificate per party; return the files written.

    ``hosts`` go into every certificate, ``party_hosts[p]`` into party ``p``'s only (a federation
    file's hosts). A host equal to another party's name is refused: that party's certificate would
    then be valid for the other's name and pass as it."""
    parties = list(parties)
    party_hosts = {p: tuple(party_hosts.get(p, ())) for p in parties} if party_hosts else {}
    for p in parties:
        for h in (*hosts, *party_hosts.get(p, ())):
            if h in parties and h != p:
                raise InputError(f"host {h!r} for the certificate of party {p!r} is the name of party {h!r}: "
                                 f"{p}'s certificate would be valid for {h!r} and pass as it; give each party "
                                 "only its own hosts (vfl certs --federation FILE)")
    if not parties:
        raise InputError("give at least one --party NAME")
    for p in parties:
        check_party_name(p)
    if len(set(parties)) != len(parties):
        raise InputError(f"party names must be unique, got {parties}")
    if "ca" in parties:
        raise InputError("'ca' is reserved for the CA's own files; choose another party name")
    if not 1 <= days <= MAX_DAYS:
        raise InputError(f"--days must be at least 1 and at most {MAX_DAYS} (100 years), got {days}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if (out / "ca.pem").exists() or (out / "ca.key").exists():
        ca_cert, ca_key = _load_ca(out)
    else:
        ca_cert, ca_key = create_ca(out, days=days)
        written += [out / "ca.pem", out / "ca.key"]
    for p in parties:
        own = tuple(dict.fromkeys((*hosts, *party_hosts.get(p, ()))))
        present = [out / f"{p}.{ext}" for ext in ("pem", "key") if (out / f"{p}.{ext}").exists()]
        if not overwrite and present:
            raise InputError(" and ".join(map(str, present)) + (" already exist" if len(present) > 1 else
                                                                 " already exists")
                             + f" (use --overwrite to replace {'them' if len(present) > 1 else 'it'})")
        written += list(issue_party_cert(out, p, ca_cert, ca_key, own, days))
    return written


def party_like(name: str) -> bool:
    """A certificate name that could be a party's name: a single DNS label (not ``localhost``, not an
    IP address, not a dotted host name)."""
    try:
        ipaddress.ip_address(name)
        return False
    except ValueError:
        pass
    return "." not in name and name.casefold() != "localhost"


def own_names_refusal(party: str, names) -> str | None:
    """Why a certificate presented as ``party``'s breaks the rule 'own names' (None: it keeps it): it
    must carry ``party``'s name and no other party-like name (another party's name would let the
    holder pass as that party too). Hosts (IP addresses, dotted names, ``localhost``) are allowed."""
    names = {str(n) for n in names}
    if party.casefold() not in {n.casefold() for n in names}:
        return f"it does not carry the name {party!r}"
    others = sorted(n for n in names if n.casefold() != party.casefold() and party_like(n))
    if others:
        return f"it also carries the name(s) {others} (another party's)"
    return None


def certificate_names(pem: bytes) -> set[str]:
    """The common name and DNS names a certificate was issued for."""
    x509, _, _, _, _, NameOID = require_cryptography()
    cert = x509.load_pem_x509_certificate(pem)
    names = {a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)}
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names |= set(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        pass
    return {str(n) for n in names}


def load_party_tls(tls_dir, party: str) -> tuple[bytes, bytes, bytes]:
    """``(ca_pem, cert_pem, key_pem)`` of ``party`` from a directory laid out by :func:`make_certs`."""
    d = Path(tls_dir)
    if not d.is_dir():
        raise InputError(f"TLS directory {d} does not exist")
    files = {"ca.pem": d / "ca.pem", f"{party}.pem": d / f"{party}.pem", f"{party}.key": d / f"{party}.key"}
    missing = [n for n, p in files.items() if not p.is_file()]
    if missing:
        raise InputError(f"TLS directory {d} lacks {', '.join(missing)} for party {party!r} "
                         f"(create them with: vfl certs --out {d} --party {party})")
    ca, cert, key = (files[n].read_bytes() for n in files)
    try:
        names = certificate_names(cert)
    except ValueError as exc:
        raise InputError(f"{files[party + '.pem']} is not a PEM certificate: {exc}") from None
    if party not in names:
        raise InputError(f"certificate {files[party + '.pem']} was issued for {sorted(names)}, not for party "
                         f"{party!r}")
    _check_tls_files(files["ca.pem"], files[f"{party}.pem"], files[f"{party}.key"], ca, cert, key)
    return ca, cert, key


def _check_tls_files(ca_path: Path, cert_path: Path, key_path: Path, ca: bytes, cert: bytes, key: bytes) -> None:
    """Refuse, naming the file, TLS material gRPC would only reject as "cannot listen" or a failed
    handshake: a CA file that holds no certificate, a key that is not a PEM private key or does not
    match the certificate, a certificate not issued by the CA."""
    x509, _, serialization, _, _, _ = require_cryptography()
    from cryptography.exceptions import InvalidSignature
    try:
        cas = x509.load_pem_x509_certificates(ca)
    except ValueError as exc:
        raise InputError(f"{ca_path} is not a PEM CA certificate: {exc}") from None
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{key_path} is not an unencrypted PEM private key: {exc}") from None
    own = x509.load_pem_x509_certificate(cert)
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if private.public_key().public_bytes(*spki) != own.public_key().public_bytes(*spki):
        raise InputError(f"{key_path} is not the key of the certificate {cert_path} (they do not match)")
    for issuer in cas:
        try:
            own.verify_directly_issued_by(issuer)
            return
        except (ValueError, TypeError, InvalidSignature):
            continue
    raise InputError(f"certificate {cert_path} was not issued by the CA in {ca_path}")
