"""Measured results as data: one record type that a benchmark or a study writes, and that
the documentation's pages render.

A `Record` is its tables (caption, columns, alignment, rows, notes), for a report also a
body of markdown ahead of them, and where they come from: the command that made them, the
device, the versions, the date and the source (the code's commit, or what the record was
computed from). `capture(tables)` fills in the provenance itself; `Record.write(path)`
writes the JSON the pages render from; `render_page` rewrites each section of a page marked

    <!-- results:NAME:start -->  ...  <!-- results:NAME:end -->

with the record docs/results/NAME.json (`results-headline:NAME`: the tables without a
report's body; `results-summary:NAME`: its one-sentence summary and provenance).
`render_pages` (`jaxformer docs`) runs it over every page and the README beside the docs;
`tests/lab/test_docs.py` checks that the committed pages equal what their records render."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import re
from typing import Any

from jaxformer.checks import BadValue, MissingFile
from jaxformer.files import code_version, command_line, describe_device, versions, write_whole
from jaxformer_lab.markdown import table

# A section shows a record whole ("results"), or its tables without a report's body
# ("results-headline": a page that links the report itself).
SECTION = re.compile(
    r"(<!-- (?P<kind>results|results-headline|results-summary):(?P<name>[\w-]+(?:/[\w.-]+)*)"
    r":start -->\n).*?(<!-- (?P=kind):(?P=name):end -->)",
    re.S,
)
FIGURE_LINK = re.compile(r"\]\(([\w.-]+\.(?:png|svg))\)")


@dataclasses.dataclass
class Table:
    """One table of a record: a caption above it, notes below it."""

    columns: list[str]
    rows: list[list[Any]]
    align: str  # one letter per column: "l" or "r"
    caption: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)

    def markdown(self) -> list[str]:
        """The caption, the table and its notes as markdown lines."""
        lines = [self.caption, ""] if self.caption else []
        lines += table(self.columns, self.rows, self.align) + [""]
        for note in self.notes:
            lines += [note, ""]
        return lines


@dataclasses.dataclass
class Record:
    """Tables (after `body`, a report's markdown, if any) and their provenance; `data` holds
    the raw figures they were made from."""

    tables: list[Table]
    command: str
    device: str
    date: str
    source: str
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    data: dict[str, Any] | None = None
    body: str | None = None
    summary: str | None = None  # the finding in one sentence, with its intervals

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_dict(cls, fields: dict[str, Any], where: str = "a record") -> Record:
        """A record from its JSON fields; a missing or unknown field is an error naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        missing = {"tables", "command", "device", "date", "source"} - set(fields)
        if missing or set(fields) - known:
            raise BadValue(
                f"{where}: a record has the fields {sorted(known)}; missing "
                f"{sorted(missing)}, unknown {sorted(set(fields) - known)}"
            )
        tables = [Table(**t) for t in fields["tables"]]
        return cls(**(fields | {"tables": tables}))

    @classmethod
    def read(cls, path: str | pathlib.Path) -> Record:
        path = pathlib.Path(path)
        if not path.is_file():
            raise MissingFile(f"{path}: no such record")
        try:
            fields = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise BadValue(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
        return cls.from_dict(fields, str(path))

    def write(self, path: str | pathlib.Path) -> None:
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")

    def markdown(self) -> str:
        """The body, each table with its caption and notes, then one line of provenance."""
        lines = [self.body.rstrip("\n"), ""] if self.body else []
        lines += [line for t in self.tables for line in t.markdown()]
        return "\n".join(lines + [self.provenance()]) + "\n"

    def provenance(self) -> str:
        """One line naming the command, device, versions, date and source."""
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        parts = [
            f"Command: `{self.command}`",
            f"device: {self.device}",
            f"versions: {versions}" if versions else None,
            f"date: {self.date}",
            f"source: {self.source}",
        ]
        return "*" + "; ".join(p for p in parts if p) + ".*"


def check_out(path: str | pathlib.Path, flag: str = "--out") -> None:
    """Refuse (BadValue) a record's path that `write` could not write: a folder, or one
    under a file or a folder this process may not write; checked before the work."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise BadValue(f"{flag} {path} is a folder; give the record's file path")
    there = next(p for p in path.parents if p.exists())
    if not there.is_dir() or not os.access(there, os.W_OK):
        why = "is a file" if not there.is_dir() else "cannot be written"
        raise BadValue(f"{flag} {path}: {there} {why}; choose another {flag}")


def capture(
    tables: list[Table],
    *,
    source: str | None = None,
    data: dict | None = None,
    body: str | None = None,
    summary: str | None = None,
) -> Record:
    """A record of `tables` made now by this process: its command line, this machine's
    first device, the versions of the packages it has imported, today's date (UTC) and,
    unless `source` is given, the code's commit."""
    return Record(
        tables=tables,
        command=command_line(),
        device=describe_device(),
        date=datetime.datetime.now(datetime.UTC).date().isoformat(),
        source=source or code_version(),
        versions=versions(),
        data=data,
        body=body,
        summary=summary,
    )


def render_page(text: str, results: pathlib.Path, page_dir: pathlib.Path | None = None) -> str:
    """`text` (a page in `page_dir`, by default `results`) with each results section rendered
    from results/NAME.json, the record's headings one level down (the page's own heading
    sits above them) and its figures' links made from the page."""

    def section(match: re.Match) -> str:
        path = results / f"{match['name']}.json"
        if not path.exists():
            raise MissingFile(f"a page shows results:{match['name']}, but {path} does not exist")
        record = Record.read(path)
        if match["kind"] == "results-summary":
            if not record.summary:
                raise BadValue(f"a page shows results-summary:{match['name']}; {path} has none")
            return match.group(1) + f"{record.summary} {record.provenance()}\n" + match.group(4)
        if match["kind"] == "results-headline":
            record = dataclasses.replace(record, body=None)
        body = re.sub(r"^#", "##", record.markdown(), flags=re.M)
        where = os.path.relpath(path.parent, page_dir or results)
        body = FIGURE_LINK.sub(lambda m: f"]({where}/{m[1]})", body)
        return match.group(1) + body + match.group(4)

    return SECTION.sub(section, text)


def render_pages(docs: pathlib.Path, *, write: bool = True) -> list[pathlib.Path]:
    """The pages under `docs`, and the README beside it, whose sections differ from
    docs/results' records, rewritten (with write=False, only listed)."""
    changed = []
    readme = [docs.parent / "README.md"] if (docs.parent / "README.md").is_file() else []
    for page in [*readme, *sorted(docs.rglob("*.md"))]:
        text = page.read_text()
        new = render_page(text, docs / "results", page.parent)
        if new != text:
            changed.append(page)
            if write:
                page.write_text(new)
    return changed
