"""Who a party is and whom it accepts on the network: addresses, peers, the
:class:`Security` object (mutual TLS, an access token, allowed client names) and token files.

TLS with a CA the parties agree on and *mutual* authentication (the server
requires a client certificate from the CA; the client checks the server's
certificate against the peer's party *name*, whatever its address), optionally
a shared access token on top (``authorization: Bearer ...``), and optionally a
list of client certificate names a server accepts. Plaintext only with an
explicit ``insecure`` security object (the CLI's ``--insecure``).
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from datasets.errors import InputError
from protocols.certs import check_party_name, load_party_tls

MIN_TOKEN_CHARS = 16

_ADDR_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-_]+):(\d{1,5})$")


def check_address(address: str, what: str = "address") -> str:
    """``host:port`` (``[v6]:port`` for IPv6 literals), port 0..65535."""
    m = _ADDR_RE.match(address or "")
    if not m or int(m.group(2)) > 65535:
        raise InputError(f"{what} {address!r} is not HOST:PORT (e.g. 127.0.0.1:50051)")
    return address


def is_loopback(host: str) -> bool:
    """Whether ``host`` (of a listen address) is the loopback interface only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_peers(specs) -> dict[str, str]:
    """``["telco=10.0.0.7:50051", ...]`` -> ``{"telco": "10.0.0.7:50051", ...}`` (order kept)."""
    peers: dict[str, str] = {}
    for spec in specs:
        name, sep, addr = str(spec).partition("=")
        if not sep or not name:
            raise InputError(f"--peer {spec!r} must be NAME=HOST:PORT (e.g. telco=127.0.0.1:50051)")
        if name in peers:
            raise InputError(f"party {name!r} is given twice in --peer")
        peers[name] = check_address(addr, f"address of party {name!r}")
    return peers


@dataclass
class Security:
    """How a party proves who it is and whom it accepts.

    ``ca_pem``/``cert_pem``/``key_pem``: TLS material (all three, or none for
    plaintext). ``token``: a shared secret sent with every call (clients) or
    required from every caller (servers). ``allowed_clients``: certificate
    names a server accepts (empty: any certificate issued by the CA).
    """
    ca_pem: bytes | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str | None = None
    allowed_clients: tuple[str, ...] = ()

    @property
    def tls(self) -> bool:
        return self.ca_pem is not None

    def describe(self) -> str:
        parts = ["mutual TLS" if self.tls else "PLAINTEXT (--insecure)"]
        if self.token:
            parts.append("access token")
        if self.allowed_clients:
            parts.append("clients " + ", ".join(self.allowed_clients))
        return " + ".join(parts)

    @classmethod
    def from_options(cls, party: str, tls_dir=None, insecure: bool = False, token_file=None,
                     allowed_clients=()) -> "Security":
        """The security of ``party`` from CLI-style options (exactly one of ``tls_dir``/``insecure``)."""
        if tls_dir and insecure:
            raise InputError("give either --tls-dir DIR or --insecure, not both")
        if not tls_dir and not insecure:
            raise InputError("network mode needs --tls-dir DIR (certificates from `vfl certs`) or, for "
                             "plaintext on a trusted network, --insecure")
        token = read_token(token_file) if token_file else None
        allowed = tuple(allowed_clients)
        if allowed and insecure:
            raise InputError("--allow-client checks certificate names and needs --tls-dir (not --insecure); "
                             "use --token-file to authenticate clients over plaintext")
        if insecure:
            return cls(token=token)
        check_party_name(party)
        for c in allowed:
            check_party_name(c)
        ca, cert, key = load_party_tls(tls_dir, party)
        return cls(ca, cert, key, token, allowed)


def read_token(path) -> str:
    p = Path(path)
    try:
        token = p.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InputError(f"cannot read token file {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"token file {p} is not UTF-8 text (byte {exc.start}): a token is printable "
                         "characters") from None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token) or not token.isprintable():
        raise InputError(f"token in {p} must be at least {MIN_TOKEN_CHARS} printable characters without "
                         "spaces (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token

