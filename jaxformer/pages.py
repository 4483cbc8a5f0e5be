"""The docs pages' results sections, rendered from the committed files (`jaxformer docs`).

Every measured table of the docs lives in a file under docs/results/, and a page shows it
between markers that name the file:

    <!-- results:NAME:start --> ... <!-- results:NAME:end -->   results/NAME.json, a
        `jaxformer.results.Record` (device, versions, date and command beside the numbers)
    <!-- lab:DIR:start --> ... <!-- lab:DIR:end -->             results/xla_vs_eager/DIR/
        report.json, a report of the XLA-vs-eager lab (`jaxformer.bench.report`)

`render_pages` rewrites each section from its file; `tests/test_docs.py` checks that the
committed pages equal what the committed files render to.
"""

from __future__ import annotations

import pathlib
import re

from jaxformer import results
from jaxformer.bench.report import docs_tables
from jaxformer.checks import MissingFile

LAB_SECTION = re.compile(
    r"(<!-- lab:(?P<dir>[\w.-]+):start -->\n).*?(<!-- lab:(?P=dir):end -->)", re.S
)


def render_page(text: str, folder: pathlib.Path) -> str:
    """`text` with each results section rendered from `folder`/NAME.json and each lab
    section from `folder`/xla_vs_eager/DIR/report.json (its headings one level down, its
    figures' links from the page)."""

    def lab_section(match: re.Match) -> str:
        path = folder / "xla_vs_eager" / match["dir"] / "report.json"
        if not path.exists():
            raise MissingFile(f"a page shows lab:{match['dir']}, but {path} does not exist")
        body = re.sub(r"^#", "##", docs_tables(path), flags=re.M)
        body = re.sub(r"\]\((\w+\.png)\)", rf"](xla_vs_eager/{match['dir']}/\1)", body)
        return match.group(1) + body + match.group(3)

    return LAB_SECTION.sub(lab_section, results.render_page(text, folder))


def render_pages(docs: pathlib.Path, *, write: bool = True) -> list[pathlib.Path]:
    """The pages under `docs` whose sections differ from docs/results' files, rewritten
    (with write=False, only listed)."""
    changed = []
    for page in sorted(docs.rglob("*.md")):
        text = page.read_text()
        new = render_page(text, docs / "results")
        if new != text:
            changed.append(page)
            if write:
                page.write_text(new)
    return changed
