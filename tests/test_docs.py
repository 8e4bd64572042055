"""The README and the docs site stay what CONTRIBUTING.md says they are: a short README whose two
commands are the ones CI runs, and whose links lead to files that exist (the site's own links are
checked by `mkdocs build --strict`, which .ci/run runs; it does not read the README)."""

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_is_a_short_tour():
    assert len(README.read_text().splitlines()) <= 250


def test_readmes_two_commands_come_first_and_are_what_ci_runs():
    text = README.read_text()
    first_block = text[text.index("```bash\n") + len("```bash\n"):]
    install, tests = first_block[:first_block.index("```")].splitlines()
    assert install.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install -e \".[dev]\"")
    assert install.endswith("autofl search --space search_spaces/quickstart.yaml")
    assert tests == ". .venv/bin/activate && python -m pytest"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert 'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]"' in ci
    assert ci[-1] == tests  # the suite is CI's last step


def test_readmes_links_lead_to_files_that_exist():
    targets = [t for t in LINK.findall(README.read_text()) if "://" not in t and not t.startswith("#")]
    assert targets, "the README links into docs/"
    missing = [t for t in targets if not (REPO / t.split("#")[0]).exists()]
    assert not missing, missing


def test_every_docs_page_the_readme_links_is_in_the_sites_nav():
    def pages(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from pages(value) if isinstance(value, list) else [value]

    in_nav = set(pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]))
    linked = {t.split("#")[0].removeprefix("docs/") for t in LINK.findall(README.read_text()) if t.startswith("docs/")}
    assert linked and linked <= in_nav, linked - in_nav
