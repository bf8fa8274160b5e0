"""Every fenced Python example of the docs runs (issue 37, item 5): the ```python blocks of a page
run in order, in one namespace, in an empty directory, in a fresh interpreter, as a reader who ran
`pip install .` would run them: on bundled data or data the page creates, never on
../shared/datasets. And the one-machine recipe of docs/deployment.md (three processes over mutual
TLS) runs as written, on free ports."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def blocks(page: Path, lang: str) -> list[tuple[int, str]]:
    """``(line, code)`` of the page's fenced blocks of ``lang`` (line: the code's first line)."""
    text = page.read_text()
    return [(text[:m.start(2)].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == lang]


PAGES = sorted(p for p in [*DOCS.rglob("*.md"), ROOT / "README.md"] if blocks(p, "python"))

RUNNER = textwrap.dedent("""\
    import sys
    page, parts = sys.argv[1], sys.argv[2:]
    ns = {"__name__": "__main__"}
    for part in parts:
        line, _, code = part.partition(":")
        exec(compile("\\n" * (int(line) - 1) + code, page, "exec"), ns)
    """)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VFL_SHARED_DATASETS", "PYTHONWARNINGS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["VFL_SHARED_DATASETS"] = str(Path("/nonexistent-shared-datasets"))   # examples must not need them
    return env


def test_the_docs_have_python_examples_and_none_reads_the_shared_datasets():
    assert {p.name for p in PAGES} >= {"getting-started.md", "learner.md", "deployment.md", "README.md"}
    for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]:
        for lang in ("python", "bash", ""):
            for line, code in blocks(page, lang):
                assert "shared/datasets" not in code, f"{page.name}:{line} reads ../shared/datasets"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_python_example_of_the_page_runs(page, tmp_path):
    parts = [f"{line}:{code}" for line, code in blocks(page, "python")]
    res = subprocess.run([sys.executable, "-c", RUNNER, str(page), *parts], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{page.name}: an example failed\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _recipe() -> tuple[str, str, str]:
    """The python, toml and bash blocks of deployment.md's "One machine, three processes"."""
    text = (DOCS / "deployment.md").read_text()
    start = text.index("## One machine, three processes")
    section = text[start:text.index("\n## ", start + 1)]
    found = {m.group(1): m.group(2) for m in FENCE.finditer(section)}
    return found["python"], found["toml"], found["bash"]


@pytest.mark.slow
def test_the_one_machine_recipe_runs_as_written(tmp_path):
    pytest.importorskip("grpc")
    pytest.importorskip("cryptography")
    python, toml, bash = _recipe()
    ports = _free_ports(2)
    for old, new in zip(("50051", "50052"), ports):           # the recipe's ports may be taken here
        toml, bash = toml.replace(old, str(new)), bash.replace(old, str(new))
    env = _env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    res = subprocess.run([sys.executable, "-c", python], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    (tmp_path / "federation.toml").write_text(toml)
    # its own process group: if a step fails (bash -e), the passive parties it started in the background
    # are killed with it instead of holding the output pipes open
    script = "trap 'kill $(jobs -p) 2>/dev/null' EXIT\n" + bash      # a failing step stops the background jobs
    proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            out, err = proc.communicate()
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    assert "saved model" in res.stdout and "wrote scores.csv" in res.stdout
    assert re.search(r"round 5: train logloss [0-9.]+, auc 0\.9", res.stdout + res.stderr)
    scores = (tmp_path / "scores.csv").read_text().splitlines()
    assert scores[0] == "id,proba" and len(scores) == 570
    assert "telco: shutting down (" in res.stderr and "shop: shutting down (" in res.stderr
