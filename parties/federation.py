"""The federation file (``federation.toml``): who is in the federation and who may ask what.

A deployment starts from one file every party holds a copy of (see docs/federation.md)::

    [federation]
    active = "bank"              # the one party that holds the labels and trains
    min_node_rows = 2            # no histogram of a node with fewer rows (optional)

    [parties.bank]
    hosts = ["bank.internal"]    # extra certificate names of this party (optional)

    [parties.telco]
    address = "10.0.0.7:50051"   # where the passive party listens (required for a passive party)
    hosts = ["10.0.0.7"]
    train = ["bank"]             # who may train against telco (default: the active party)
    predict = ["bank", "scorer"] # who may predict against telco (default: the party that trained the model)
    screen = ["bank"]            # who may screen telco's features (WOE/IV, issue 33; default: nobody)
    screen_epsilon = 1.0         # DP noise on the screening counts telco returns (optional; default: exact)
    serve_requests_per_second = 50   # online scoring: each caller's rate limit at telco (optional)
    serve_rows_per_day = 100000      # online scoring: each caller's applicants per UTC day (optional)
    explain_features = true      # telco splits its explanations among its own features (default false;
                                 # what it learns then: docs/threat-model.md)

:func:`load_federation` parses it with the standard library's ``tomllib`` and checks it; every
mistake is an :class:`FederationError` naming the file, the table and the key.

:class:`Access` is what a passive party's server applies to every session it opens (deny by
default): under TLS a caller is a federation party only when its certificate names are that
party's own names (its name and its hosts, nothing else: a certificate that is also valid for
another party's name is nobody); training is served only to the parties allowed to train, and
prediction only to the parties allowed to predict (by default the party that trained the model,
whose identity the passive party binds into its model file).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from datasets.errors import InputError, ProtocolError
from parties.passive_limits import KEYS as LIMIT_KEYS
from parties.passive_limits import Limits, parse_limits
from protocols.certs import check_party_name, party_like
from protocols.grpc_security import check_address

try:                       # the standard library from Python 3.11 on
    import tomllib
except ModuleNotFoundError:          # pragma: no cover - Python 3.10
    tomllib = None

#: no histogram is served for a node holding fewer rows than this (a federation setting); 2 is the
#: smallest node the learner core ever splits (``TreeGrower._splittable``), so no model changes
DEFAULT_MIN_NODE_ROWS = 2
#: the most a federation may set (a larger floor stops most trees from growing)
MAX_MIN_NODE_ROWS = 1 << 20
#: the most active-only first rounds a passive party may require
MAX_ROUNDS_SETTING = 1 << 20

_FED_KEYS = {"active", "min_node_rows", "dp_model_min_node_rows"}
_PARTY_KEYS = {"address", "hosts", "train", "predict", "drift", "screen", "screen_epsilon",
               "serve_requests_per_second", "serve_rows_per_day", "require_active_only_rounds",
               "categorical_ordered", "explain_features", *LIMIT_KEYS}
#: what a passive party answers a drift request with (issue 34): PSI per feature by position (the
#: default: its feature names are not shared), by name, or nothing (it declines)
DRIFT_POLICIES = ("positions", "names", "decline")
#: how much each drift policy shares (the stricter of two is the one sharing less)
_DRIFT_SHARES = {"names": 2, "positions": 1, "decline": 0}


def stricter_drift(a: str, b: str) -> str:
    """The drift policy of ``a`` and ``b`` that shares less."""
    return min(a, b, key=_DRIFT_SHARES.__getitem__)


#: the largest online scoring limits a federation may set (beyond them: a typo)
MAX_SERVE_RATE = 1e6
MAX_SERVE_ROWS_PER_DAY = 10 ** 12


class FederationError(InputError):
    """A mistake in a federation file: names the file, the table and the key."""


@dataclass(frozen=True)
class PartyEntry:
    """One party of the federation file."""
    name: str
    address: str | None = None
    hosts: tuple[str, ...] = ()
    train: tuple[str, ...] | None = None        # None: the default (the active party)
    predict: tuple[str, ...] | None = None      # None: the default (the trainer of the model)
    drift: str = "positions"                    # DRIFT_POLICIES: how a passive party answers drift requests
    screen: tuple[str, ...] = ()                # who may screen this party's features (default: nobody)
    screen_epsilon: float | None = None         # DP noise on the screening counts it returns (None: exact)
    serve_requests_per_second: float | None = None  # online scoring: per-caller rate limit (None: none)
    serve_rows_per_day: int | None = None           # online scoring: per-caller applicants per UTC day
    # a passive party's own exchange settings (issue 31): the fewest first rounds on the active party's
    # features only a training must agree, and categorical features as ordered bins (no per-category sums)
    require_active_only_rounds: int = 0
    categorical_ordered: bool = False
    limits: Limits = field(default_factory=Limits)   # a passive party's own caps (parties.passive_limits)
    explain_features: bool = False              # opt-in: it splits its explanations among its own features

    @property
    def cert_names(self) -> frozenset[str]:
        """The names this party's certificate may carry: its own name and its hosts."""
        return frozenset((self.name, *self.hosts))


@dataclass(frozen=True)
class Federation:
    """A checked federation file (:func:`load_federation`)."""
    path: str
    active: str
    parties: dict = field(default_factory=dict)     # name -> PartyEntry, in file order
    min_node_rows: int = DEFAULT_MIN_NODE_ROWS
    #: the floor of a training labelled a DP released model (--dp-model grows every node, whatever its
    #: rows); None: min_node_rows (such a training is then refused unless min_node_rows is 1)
    dp_model_min_node_rows: int | None = None

    @property
    def passives(self) -> dict[str, str]:
        """``{passive party: address}`` in file order (what ``--peer`` would give): the parties with
        an address; a party without one only predicts (a client, never trained with)."""
        return {p.name: p.address for p in self.parties.values() if p.name != self.active and p.address}

    def party(self, name: str, what: str = "--name") -> PartyEntry:
        if name not in self.parties:
            raise InputError(f"{self.path}: party {name!r} ({what}) is not in the federation "
                             f"(its parties: {', '.join(self.parties)})")
        return self.parties[name]

    def party_of(self, cert_names) -> str | None:
        """The federation party a certificate identifies, or None: it must carry that party's name
        and no name outside that party's own (its name and hosts)."""
        names = {str(n).casefold() for n in cert_names}
        for p in self.parties.values():
            own = {n.casefold() for n in p.cert_names}
            if p.name.casefold() in names and names <= own:
                return p.name
        return None

    def trainers(self, passive: str) -> tuple[str, ...]:
        p = self.party(passive)
        return p.train if p.train is not None else (self.active,)

    def screeners(self, passive: str) -> tuple[str, ...]:
        """The parties allowed to screen ``passive``'s features (WOE/IV; default: nobody)."""
        return self.party(passive).screen

    def predictors(self, passive: str) -> tuple[str, ...] | None:
        """The parties allowed to predict against ``passive``; None: the trainer of each model."""
        return self.party(passive).predict


def _err(path, table: str, key: str | None, message: str) -> FederationError:
    where = f"[{table}]" + (f" {key}" if key else "")
    return FederationError(f"federation file {path}: {where}: {message}")


def _names(path, table, key, value, parties) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _err(path, table, key, f"expected a list of party names, got {value!r}")
    unknown = [v for v in value if v not in parties]
    if unknown:
        raise _err(path, table, key, f"{unknown[0]!r} is not a party of the federation "
                                     f"(its parties: {', '.join(parties)})")
    if len(set(value)) != len(value):
        raise _err(path, table, key, "a party is named twice")
    return tuple(value)


def _host(path, table, value) -> str:
    if not isinstance(value, str) or not value:
        raise _err(path, table, "hosts", f"expected a list of DNS names or IP addresses, got {value!r}")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    labels = value.split(".")
    for label in labels:
        try:
            check_party_name(label)
        except InputError:
            raise _err(path, table, "hosts", f"{value!r} is neither an IP address nor a DNS name") from None
    return value


def _serve_limits(path, table: str, t: dict, active: bool) -> dict:
    """A passive party's online scoring limits (``serve_requests_per_second``, ``serve_rows_per_day``)."""
    out = {}
    for key, integer, top in (("serve_requests_per_second", False, MAX_SERVE_RATE),
                              ("serve_rows_per_day", True, MAX_SERVE_ROWS_PER_DAY)):
        if key not in t:
            continue
        if active:
            raise _err(path, table, key, "the active party serves no online scoring (a passive party's table sets "
                                         "the limits it applies)")
        v = t[key]
        ok = not isinstance(v, bool) and (isinstance(v, int) if integer else isinstance(v, (int, float)))
        if not ok or not 0 < v <= top:
            kind = "an integer" if integer else "a number"
            raise _err(path, table, key, f"expected {kind} more than 0 and at most {top:g}, got {v!r}")
        out[key] = int(v) if integer else float(v)
    return out


def parse_federation(data: dict, path="federation.toml") -> Federation:
    """Check a parsed federation file (a dict, as ``tomllib`` gives it)."""
    if not isinstance(data, dict):
        raise FederationError(f"federation file {path}: not a TOML table")
    extra = set(data) - {"federation", "parties"}
    if extra:
        raise FederationError(f"federation file {path}: unknown table or key {sorted(extra)[0]!r} "
                              "(expected [federation] and [parties.NAME])")
    fed = data.get("federation")
    if not isinstance(fed, dict):
        raise _err(path, "federation", None, "missing (it names the active party: active = \"NAME\")")
    extra = set(fed) - _FED_KEYS
    if extra:
        raise _err(path, "federation", sorted(extra)[0], f"unknown key (known: {', '.join(sorted(_FED_KEYS))})")
    tables = data.get("parties")
    if not isinstance(tables, dict) or not tables:
        raise _err(path, "parties", None, "missing: give one [parties.NAME] table per party")
    names = list(tables)
    folded: dict[str, str] = {}
    for name in names:
        try:
            check_party_name(name)
        except InputError as exc:
            raise _err(path, f"parties.{name}", None, str(exc)) from None
        if name.casefold() in folded:       # certificate names (DNS) do not tell case apart
            raise _err(path, f"parties.{name}", None, f"{name!r} and {folded[name.casefold()]!r} differ only in case: "
                                                      "certificate names do not tell them apart")
        folded[name.casefold()] = name
        if name == "ca":
            raise _err(path, f"parties.{name}", None, "'ca' is reserved for the CA's own files")
        if not isinstance(tables[name], dict):
            raise _err(path, f"parties.{name}", None, "expected a table")
    if len(names) < 2:
        raise _err(path, "parties", None, f"a federation needs at least two parties, got {names}")
    active = fed.get("active")
    if not isinstance(active, str) or active not in tables:
        raise _err(path, "federation", "active", f"{active!r} is not one of the parties ({', '.join(names)})")
    min_rows = fed.get("min_node_rows", DEFAULT_MIN_NODE_ROWS)
    if isinstance(min_rows, bool) or not isinstance(min_rows, int) or not 1 <= min_rows <= MAX_MIN_NODE_ROWS:
        raise _err(path, "federation", "min_node_rows", f"expected an integer 1..{MAX_MIN_NODE_ROWS}, "
                                                        f"got {min_rows!r}")
    dp_rows = fed.get("dp_model_min_node_rows")
    if dp_rows is not None and (isinstance(dp_rows, bool) or not isinstance(dp_rows, int)
                                or not 1 <= dp_rows <= MAX_MIN_NODE_ROWS):
        raise _err(path, "federation", "dp_model_min_node_rows", f"expected an integer 1..{MAX_MIN_NODE_ROWS}, "
                                                                 f"got {dp_rows!r}")
    entries: dict[str, PartyEntry] = {}
    owner: dict[str, str] = {}          # certificate name -> party
    for name in names:
        t, table = tables[name], f"parties.{name}"
        extra = set(t) - _PARTY_KEYS
        if extra:
            raise _err(path, table, sorted(extra)[0], f"unknown key (known: {', '.join(sorted(_PARTY_KEYS))})")
        address = t.get("address")
        if address is not None:
            if not isinstance(address, str):
                raise _err(path, table, "address", f"expected \"HOST:PORT\", got {address!r}")
            try:
                check_address(address)
            except InputError:
                raise _err(path, table, "address", f"{address!r} is not HOST:PORT (e.g. 10.0.0.7:50051)") from None
            if name == active:
                raise _err(path, table, "address", "the active party serves nothing: its table takes no address")
        hosts = t.get("hosts", [])
        if not isinstance(hosts, list):
            raise _err(path, table, "hosts", f"expected a list of DNS names or IP addresses, got {hosts!r}")
        hosts = tuple(_host(path, table, h) for h in hosts)
        for h in (name, *hosts):
            other = folded.get(h.casefold())
            if other is not None and other != name:
                raise _err(path, table, "hosts", f"{h!r} is the name of party {other!r}: a certificate valid for "
                                                 "another party's name would let this party pass as it")
            if owner.get(h.casefold(), name) != name:
                raise _err(path, table, "hosts", f"{h!r} is already a certificate name of party "
                                                 f"{owner[h.casefold()]!r}: two parties cannot share a host name; on "
                                                 "one machine omit hosts (peers are verified by party name, not by "
                                                 "address; names are compared ignoring case)")
            owner[h.casefold()] = name
        lists = {}
        for key in ("train", "predict", "screen"):
            if key in t:
                if name == active:
                    raise _err(path, table, key, "the active party serves no training or prediction (only a "
                                                 "passive party's table says who may ask it)")
                lists[key] = _names(path, table, key, t[key], names)
        if lists and address is None and name != active:
            raise _err(path, table, "address", "missing: a passive party needs the HOST:PORT it listens on "
                                               "(a party without an address only predicts: it serves nothing)")
        if name in lists.get("train", ()) or name in lists.get("predict", ()):
            raise _err(path, table, "train" if name in lists.get("train", ()) else "predict",
                       "a party cannot be its own client")
        drift = t.get("drift", "positions")
        if drift not in DRIFT_POLICIES:
            raise _err(path, table, "drift", f"expected one of {', '.join(DRIFT_POLICIES)}, got {drift!r}")
        if name == active and "drift" in t:
            raise _err(path, table, "drift", "the active party answers no drift requests (only a passive party's "
                                             "table says how it answers them)")
        if name in lists.get("screen", ()):
            raise _err(path, table, "screen", "a party cannot be its own client")
        eps = t.get("screen_epsilon")
        if eps is not None:
            if name == active:
                raise _err(path, table, "screen_epsilon", "the active party serves no screening")
            if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < float("inf"):
                raise _err(path, table, "screen_epsilon", f"expected a number > 0 (the DP epsilon of the screening "
                                                          f"counts), got {eps!r}")
            eps = float(eps)
        rounds, ordered = t.get("require_active_only_rounds", 0), t.get("categorical_ordered", False)
        if isinstance(rounds, bool) or not isinstance(rounds, int) or not 0 <= rounds <= MAX_ROUNDS_SETTING:
            raise _err(path, table, "require_active_only_rounds", f"expected an integer 0..{MAX_ROUNDS_SETTING}, "
                                                                  f"got {rounds!r}")
        if not isinstance(ordered, bool):
            raise _err(path, table, "categorical_ordered", f"expected true or false, got {ordered!r}")
        if name == active and (rounds or ordered):
            raise _err(path, table, "require_active_only_rounds" if rounds else "categorical_ordered",
                       "a passive party's setting (the active party answers no request)")
        given = {k: t[k] for k in LIMIT_KEYS if k in t}
        if given and name == active:
            raise _err(path, table, sorted(given)[0], "a passive party's limit: the active party serves nothing")
        limits = parse_limits(given, lambda key, msg, table=table: _err(path, table, key, msg))
        serve_limits = _serve_limits(path, table, t, name == active)
        explain = t.get("explain_features", False)
        if not isinstance(explain, bool):
            raise _err(path, table, "explain_features", f"expected true or false, got {explain!r}")
        if explain and name == active:
            raise _err(path, table, "explain_features", "only a passive party's table may say it (the active party "
                                                        "explains its own features anyway)")
        entries[name] = PartyEntry(name, address, hosts, lists.get("train"), lists.get("predict"), drift,
                                   lists.get("screen", ()), eps, require_active_only_rounds=int(rounds),
                                   categorical_ordered=ordered, limits=limits, explain_features=explain,
                                   **serve_limits)
    clients = {c for e in entries.values() for c in (*(e.train or ()), *(e.predict or ()))}
    for e in entries.values():
        if e.name != active and e.address is None and e.name not in clients:
            raise _err(path, f"parties.{e.name}", "address", "missing: a passive party needs the HOST:PORT it "
                                                             "listens on (only a party named in a train or "
                                                             "predict list may go without one: it only asks)")
    return Federation(str(path), active, entries, int(min_rows), None if dp_rows is None else int(dp_rows))


def load_federation(path) -> Federation:
    """Read and check a federation file (``tomllib``; a clear error for every mistake)."""
    p = Path(path)
    if tomllib is None:         # pragma: no cover
        raise FederationError(f"federation file {p}: reading TOML needs Python 3.11 or later (tomllib)")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise FederationError(f"cannot read federation file {p}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))       # a byte-order mark some editors write
    except UnicodeDecodeError:
        raise FederationError(f"federation file {p}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise FederationError(f"federation file {p}: not valid TOML: {exc}") from None
    return parse_federation(data, p)


# --------------------------------------------------------------------------- access
CERT_PREFIX = "certificate "


_party_like = party_like     # the rule 'own names' (protocols.certs)


def cert_names_of(client: str) -> set[str] | None:
    """The certificate names in a caller's identity (``Caller.client`` under TLS), else None."""
    client = str(client)
    if not client.startswith(CERT_PREFIX):
        return None
    return set(client[len(CERT_PREFIX):].split("/"))


@dataclass(frozen=True)
class Access:
    """Who a passive party serves (deny by default under TLS).

    ``tls``: the server authenticates callers by certificate; without it (``--insecure``) the
    caller's name is only claimed and nothing here is enforced (the transport refuses a
    non-loopback listen address then). ``federation``: the federation file, or None, with
    ``allowed_clients`` (``--allow-client``) the only clients (the transport checks them)."""
    party: str
    tls: bool
    federation: Federation | None = None
    allowed_clients: tuple[str, ...] = ()

    @property
    def min_node_rows(self) -> int:
        return self.federation.min_node_rows if self.federation is not None else DEFAULT_MIN_NODE_ROWS

    @property
    def limits(self) -> Limits:
        """This party's own limits: its federation entry's, else the defaults; without a federation file
        (``--allow-client``, ``--insecure``) prediction over training rows stays allowed, as there is no
        file to allow it in (every other default applies)."""
        if self.federation is None:
            return Limits(predict_training_rows=True)
        return self.federation.party(self.party).limits

    def identity(self, client: str) -> str:
        """The caller as a model file records its trainer: the federation party its certificate
        identifies (or ``client`` itself without a federation)."""
        if not self.tls:
            return str(client)
        names = cert_names_of(client)
        if self.federation is None:
            return self._allowed_identity(client, names)
        party = self.federation.party_of(names or ())
        if party is None:
            raise ProtocolError(f"party {self.party!r} refuses a caller with certificate names "
                                f"{sorted(names or [])}: rule 'federation identity': a client certificate must "
                                "carry one federation party's name and only that party's own names "
                                f"({self.federation.path})")
        return party

    def _allowed_identity(self, client: str, names) -> str:
        """Without a federation file, ``--allow-client`` under the own-names rule: the certificate carries
        exactly one allowed name and no other party-like name (a single DNS label other than
        ``localhost``); IP addresses and dotted host names are a party's hosts. The identity stays the
        certificate's names (as model files record their trainer); one without an allowed name is
        refused by the transport."""
        if names is None or not self.allowed_clients:
            return str(client)
        allowed = {a.casefold(): a for a in self.allowed_clients}
        mine = [allowed[n.casefold()] for n in names if n.casefold() in allowed]
        others = sorted(n for n in names if n.casefold() not in allowed and _party_like(n))
        if len(mine) > 1 or mine and others:
            raise ProtocolError(f"party {self.party!r} refuses a caller with certificate names {sorted(names)}: rule "
                                "'own names': an allowed client's certificate carries its one name (of "
                                f"{list(self.allowed_clients)}) and no other party's name")
        return str(client)

    def check_train(self, client: str) -> str:
        """The caller's identity if it may train against this party, else a ProtocolError."""
        who = self.identity(client)
        if self.federation is not None and self.tls:
            allowed = self.federation.trainers(self.party)
            if who not in allowed:
                raise ProtocolError(f"party {self.party!r} refuses to train for {who!r}: rule 'who may train': "
                                    f"only {list(allowed)} may ({self.federation.path})")
        return who

    def check_screen(self, client: str) -> str:
        """The caller's identity if it may screen this party's features (issue 33: a disclosure the
        party grants in its federation entry's ``screen`` list; default nobody), else a ProtocolError.
        Without TLS the caller's name is only claimed: the list must grant screening to someone."""
        who = self.check_train(client)
        allowed = self.federation.screeners(self.party) if self.federation is not None else ()
        if (who not in allowed) if self.tls else not allowed:
            raise ProtocolError(f"party {self.party!r} refuses to screen its features for {who!r}: rule 'who may "
                                f"screen': only {list(allowed)} may"
                                + (f" ({self.federation.path}, its [parties.{self.party}] screen list)"
                                   if self.federation is not None else " (no federation file grants screening)"))
        return who

    def check_predict(self, client: str, trainer: str | None, model_id: str) -> str:
        """The caller's identity if it may predict with model ``model_id`` (trained by ``trainer``)."""
        who = self.identity(client)
        if not self.tls:
            return who
        allowed = self.federation.predictors(self.party) if self.federation is not None else None
        if allowed is None:         # the default: the party that trained the model
            if trainer is None:     # a model file from before trainers were recorded
                allowed = (self.federation.active,) if self.federation is not None else None
            else:
                allowed = (trainer,)
        if allowed is not None and who not in allowed:
            raise ProtocolError(f"party {self.party!r} refuses prediction with model {model_id!r} for {who!r}: "
                                f"rule 'who may predict': only {list(allowed)} may"
                                + (f" ({self.federation.path})" if self.federation is not None else
                                   " (the client that trained it)"))
        return who
