"""The README and the docs site (issue 26, item 7): the README keeps the two set-up commands first
and stays under 250 lines; its test command is the one CI runs; every page of docs/ is in the MkDocs
nav and every page the nav names exists (`mkdocs build --strict` in .ci/run builds it)."""
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _nav_pages(nav) -> list[str]:
    out = []
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            out.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return out


def test_the_readme_starts_with_the_two_commands_and_stays_short():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) < 250
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block and text.index("```bash") < text.index("\n## ")            # before any section
    install, test = block.group(1).strip().splitlines()
    assert install.startswith("pip install . && vfl simulate")
    assert test.startswith('pip install -e ".[test]" && python -m pytest')


def test_ci_runs_the_readmes_test_command_exactly_and_builds_the_docs_strictly():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"```bash\n.*?\n(.*?)\n```", readme, re.S).group(1).split("&& ", 1)[1].strip()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci and "-n auto" in command          # the suite runs on every core
    assert any(line.startswith("mkdocs build --strict") for line in ci)
    assert any(line.startswith("pip install") and "docs" in line for line in ci)


def test_every_docs_page_is_in_the_nav_and_every_nav_page_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages
    assert config["strict"] is True and config["theme"]["name"] == "material"


def test_readme_links_point_at_existing_pages():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 15
    assert [link for link in links if not (ROOT / link).is_file()] == []
