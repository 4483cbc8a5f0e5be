"""Rewrite the results tables of the docs pages from the committed result files.

Every measured table of the docs lives in a JSON file under docs/results/ (its device,
versions, date and command beside the numbers), and a page shows it between
`<!-- results:NAME:start -->` and `<!-- results:NAME:end -->`, NAME being the file's stem.
This script renders each such section from its file; `tests/test_docs.py` checks that the
committed pages equal what the committed files render to.

`make bench` writes its records (`jaxformer bench NAME --out docs/results/...`) and then
runs this.

    python experiments/update_docs.py [--docs docs]
"""

from __future__ import annotations

import argparse
import pathlib
import re

from jaxformer import results as results_lib
from jaxformer.bench.report import docs_tables

# A report of the XLA-vs-eager lab, docs/results/xla_vs_eager/DIR/report.json, rendered by
# the lab's own renderer (jaxformer.bench.report.docs_tables).
LAB_SECTION = re.compile(
    r"(<!-- lab:(?P<dir>[\w.-]+):start -->\n).*?(<!-- lab:(?P=dir):end -->)", re.S
)


def render_page(text: str, results: pathlib.Path) -> str:
    """The page with each results section rendered from results/NAME.json
    (`jaxformer.results`) and each lab section from its report."""

    def lab_section(match: re.Match) -> str:
        path = lab_report(results, match["dir"])
        if not path.exists():
            raise SystemExit(f"a page shows lab:{match['dir']}, but {path} does not exist")
        body = re.sub(r"^#", "##", docs_tables(path), flags=re.M)  # under the page's heading
        body = re.sub(r"\]\((\w+\.png)\)", rf"](xla_vs_eager/{match['dir']}/\1)", body)
        return match.group(1) + body + match.group(3)

    return LAB_SECTION.sub(lab_section, results_lib.render_page(text, results))


def lab_report(results: pathlib.Path, name: str) -> pathlib.Path:
    """The committed report.json of the XLA-vs-eager lab's run `name`."""
    return results / "xla_vs_eager" / name / "report.json"


def pages(docs: pathlib.Path) -> list[pathlib.Path]:
    return sorted(docs.rglob("*.md"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", default="docs")
    args = parser.parse_args(argv)
    docs = pathlib.Path(args.docs)
    for page in pages(docs):
        text = page.read_text()
        new = render_page(text, docs / "results")
        if new != text:
            page.write_text(new)
            print(f"updated {page}")


if __name__ == "__main__":
    main()
