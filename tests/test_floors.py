"""The import floors (docs/architecture.md, pyproject.toml [tool.importlinter]) checked at run time.

import-linter checks the static import graph; these tests check what really gets loaded in a fresh
interpreter, that nothing imports the top floor (``cli``, a module import-linter cannot take as a
root), and that no import hides inside a function to dodge a cycle.
"""
from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:    # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("crypto", "protocols", "datasets", "vfl", "parties")
BOTTOM = ("crypto", "protocols", "datasets")
#: optional extras (pyproject's [project.optional-dependencies] and sklearn's bundled data): a module
#: that cannot be imported because one of these is missing is skipped, nothing else is
OPTIONAL_EXTRAS = ("grpc", "cryptography", "matplotlib", "xgboost", "dask", "distributed")

#: the only imports allowed inside a function: (module holding the import, imported module (a dotted
#: prefix), reason). Everything else goes at the top of its module.
FUNCTION_IMPORT_ALLOWED = [
    ("protocols.certs", "cryptography", "optional extra [net]: certificates only when TLS is asked for"),
    ("protocols.grpc_wire", "grpc", "optional extra [net]: the gRPC transport without grpcio installed "
                                    "must still import and say which extra to install"),
    ("protocols.grpc_server", "grpc._cython", "optional extra [net]: cancelling a stalled stream reaches into "
                                              "grpcio's core, only when a stream stalls"),
    ("protocols.grpc_server", "grpc_health", "optional extra [net]: the standard gRPC health service, only when a "
                                             "server starts (a server without it still serves, and says so)"),
    ("vfl.commands.serve", "uvicorn", "optional extra [serve]: `vfl serve` only; the CLI works without it and "
                                      "says which extra to install"),
    ("vfl.commands.serve", "vfl.serving", "optional extra [serve]: the FastAPI app, imported by `vfl serve` only"),
    ("protocols.psi", "cryptography", "optional extra [net]: X25519 only for the PSI alignment"),
    ("datasets.catalogue", "sklearn.datasets", "bundled example data: loading it costs seconds, only on use"),
    ("vfl.compare", "matplotlib", "optional extra [plot]: plotting only when a figure is asked for"),
    ("vfl.core.explain", "matplotlib", "optional extra [plot]: the explanations' summary plot only when asked for"),
    ("vfl.compare", "xgboost", "optional test/benchmark dependency: the centralised XGBoost baseline"),
    ("vfl.compare", "sklearn.metrics", "the XGBoost baseline's AUC, only when the xgboost arm runs (with "
                                       "the optional xgboost import beside it)"),
    ("datasets.parquet", "pyarrow", "optional extra [parquet]: CSV input must work without pyarrow; reading a "
                                    "Parquet table says which extra to install"),
    ("crypto.cluster", "crypto.dask_executor", "optional extra [dask]: distributed is imported only when a "
                                                "party asks for a Dask executor"),
    ("datasets", "datasets.", "lazy package attributes (PEP 562, importlib.import_module): the floors that "
                              "need only datasets.errors do not pay for pandas"),
    ("datasets.pieces", "pyarrow", "optional extra [parquet]: the Arrow types of a Parquet table's schema, only "
                                   "when a Parquet table is opened piece by piece"),
    ("crypto.worker", "crypto.worker.", "the `ext` operation imports a module the party allowed (Executor.allow: "
                                        "a module above this floor whose WORKER_OPS read a party's own data) by "
                                        "name, in the worker only"),
    ("vfl.core.dp_budget", "dp_accounting",
     "optional extra [dp]: Google's accountant only for --dp-model with dp_delta"),
    ("vfl.commands.report_html", "jinja2", "optional extra [report]: the HTML model report only when one is "
                                           "rendered (--format json needs neither)"),
    ("vfl.commands.report_html", "matplotlib", "optional extra [report]: the report's figures only when an HTML "
                                               "report is rendered"),
    ("vfl.core.dp_noise", "opendp",
     "optional extra [dp]: OpenDP's Laplace, Gaussian and noisy max only when a DP mechanism draws noise"),
]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _fresh(script: str) -> dict:
    """Run ``script`` in a fresh interpreter from the repository root; it prints one JSON object."""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


_IMPORT_ALL = """
import importlib, json, pkgutil, sys
optional = {optional!r}
loaded, skipped = [], {{}}
def load(name):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in optional:
            raise
        skipped[name] = exc.name
        return
    loaded.append(name)
for name in {modules!r}:
    load(name)
    pkg = sys.modules.get(name)
    for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), name + "."):
        load(info.name)
print(json.dumps({{"loaded": loaded, "skipped": skipped, "modules": sorted(sys.modules)}}))
"""


def _import_in_fresh_interpreter(modules) -> dict:
    return _fresh(_IMPORT_ALL.format(optional=OPTIONAL_EXTRAS, modules=list(modules)))


def _offenders(modules, forbidden) -> list[str]:
    return [m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden)]


def _parsed_files() -> tuple:
    """``(module, path, tree)`` of every package module, parsed once per test process (the static
    checks only read them)."""
    return _parse_all(ROOT, PACKAGES)


@functools.cache
def _parse_all(root: Path, packages: tuple) -> tuple:
    return tuple((module, path, ast.parse(path.read_text(), filename=str(path))) for module, path in _package_files())


def _package_files():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), path


def _learner_core() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = [c for c in config["tool"]["importlinter"]["contracts"]
                 if c["name"].startswith("The learner core")]
    assert len(contracts) == 1, "pyproject.toml needs exactly one 'The learner core ...' contract"
    assert contracts[0]["type"] == "forbidden"
    sources = contracts[0]["source_modules"]
    return [name for name, _ in _package_files()
            if any(name == src or name.startswith(src + ".") for src in sources)]


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """Absolute name of the module a ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, tree: ast.AST):
    """``(node, imported module names)`` of every import statement under ``tree``; ``from x import y``
    yields both ``x`` and ``x.y`` (y may be a submodule); ``importlib.import_module`` / ``__import__``
    calls yield their first argument when it is a string constant, else ``<prefix>.``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, [alias.name]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            yield node, [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__"):
            fn = ast.unparse(node.func)
            if fn in ("importlib.import_module", "import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield node, [arg.value]
                elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                    yield node, [str(arg.values[0].value)]   # f"{__name__}.{x}": only its constant head
                else:
                    yield node, [f"{module}."]                # dynamic: taken as a submodule of its own


def _function_imports():
    """``(module, function, line, imported, statement)`` of every import inside a function of a package
    module."""
    for module, path, tree in _parsed_files():
        seen = set()
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node, names in _imports(module, path, fn):
                if (id(node), names[0]) in seen:     # nested functions: report once
                    continue
                seen.add((id(node), names[0]))
                yield module, fn.name, node.lineno, names, ast.unparse(node)


def _allowed(module: str, names: list[str]):
    """The allow-list entry covering an import (None if there is none)."""
    for entry in FUNCTION_IMPORT_ALLOWED:
        where, prefix, _ = entry
        if where != module:
            continue
        below = prefix if prefix.endswith(".") else prefix + "."
        if any(name == prefix or name.startswith(below) for name in names):
            return entry
    return None


# --------------------------------------------------------------------------- what a fresh interpreter loads


def test_bottom_floor_loads_nothing_of_vfl_or_parties():
    """Every module of crypto, protocols and datasets, imported in a fresh interpreter, loads no module
    of the floors above (nor cli)."""
    got = _import_in_fresh_interpreter(BOTTOM)
    expected = {name for name, _ in _package_files() if name.split(".")[0] in BOTTOM}
    assert expected - set(got["skipped"]) <= set(got["loaded"])
    optional = {"protocols.grpc_wire", "protocols.grpc_security", "protocols.grpc_server", "protocols.grpc_client",
                "protocols.certs", "protocols.psi"}
    assert not (set(got["skipped"]) - optional), got["skipped"]
    assert _offenders(got["modules"], ("vfl", "parties", "cli")) == []


def test_learner_core_loads_no_crypto_protocols_or_parties():
    """The learner core (the modules of the import-linter contract 'The learner core ...') imported in a
    fresh interpreter loads no module of crypto, protocols or parties."""
    core = _learner_core()
    assert "vfl.core.boosting" in core and "vfl.core.split" in core
    got = _fresh(f"""
import importlib, json, sys
first = {{}}
for name in {core!r}:
    before = set(sys.modules)
    importlib.import_module(name)
    first.update({{m: name for m in set(sys.modules) - before}})
print(json.dumps({{"modules": sorted(sys.modules), "first": first}}))
""")
    assert set(core) <= set(got["modules"])
    bad = {m: f"loaded by importing {got['first'][m]}"
           for m in _offenders(got["modules"], ("crypto", "protocols", "parties", "cli"))}
    assert bad == {}


def test_fresh_interpreter_check_can_fail():
    """The checks above do see a forbidden module when one is loaded."""
    got = _fresh("import json, sys\nimport parties.active\nprint(json.dumps({'modules': sorted(sys.modules)}))")
    assert "parties.active" in _offenders(got["modules"], ("parties",))
    assert "crypto" in _offenders(got["modules"], ("crypto",))


# --------------------------------------------------------------------------- static checks over the source


def test_no_package_imports_cli():
    """cli.py is the top floor: no module of any package imports it (import-linter cannot see it)."""
    bad = []
    for module, path, tree in _parsed_files():
        for node, names in _imports(module, path, tree):
            if any(n == "cli" or n.startswith("cli.") for n in names):
                bad.append(f"{module}:{node.lineno}")
    assert bad == []


def test_no_import_inside_functions():
    """Imports go at the top of their module; inside a function only the allow-listed optional extras
    and lazy package attributes (FUNCTION_IMPORT_ALLOWED, each with its reason)."""
    bad = [f"{module}.{fn}:{line}: {text}" for module, fn, line, names, text in _function_imports()
           if _allowed(module, names) is None]
    assert bad == [], "imports inside functions:\n" + "\n".join(bad)


def test_function_import_allow_list_is_used_and_explained():
    """Every allow-list entry still covers an import and gives a reason (stale entries go)."""
    used = {_allowed(module, names) for module, _, _, names, _ in _function_imports()}
    assert [e[:2] for e in FUNCTION_IMPORT_ALLOWED if e not in used] == []
    assert all(len(reason) > 20 for _, _, reason in FUNCTION_IMPORT_ALLOWED)


@pytest.mark.parametrize("source, found", [
    ("def f():\n    import os\n", ["os"]),
    ("def f():\n    from .split import goes_left\n", ["vfl.split"]),
    ("def f():\n    def g():\n        from crypto import packing\n", ["crypto"]),
    ("class A:\n    def m(self):\n        import importlib\n        importlib.import_module('parties')\n",
     ["importlib", "parties"]),
    ("import os\n\n\ndef f():\n    return os.sep\n", []),
])
def test_function_import_scan_finds_them(tmp_path, monkeypatch, source, found):
    """The AST scan sees plain, relative, nested, method and importlib imports, and only those."""
    pkg = tmp_path / "vfl"
    pkg.mkdir()
    (pkg / "mod.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("vfl",))
    assert [names[0] for _, _, _, names, _ in _function_imports()] == found
