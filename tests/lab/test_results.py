"""jaxformer_lab.results: a record captures its own provenance, round-trips through JSON and
renders as its page shows it."""

import json

import pytest

from jaxformer_lab import results


def test_a_captured_record_names_this_process_and_round_trips(tmp_path):
    table = results.Table(["run", "ms"], [["a", "1.0"]], "lr", caption="Times:", notes=["n"])
    record = results.capture([table], data={"ms": [1.0]})
    assert record.command.startswith(("python", "jaxformer"))
    assert record.versions["python"] and record.date.count("-") == 2
    assert "commit" in record.source or "jaxformer " in record.source
    record.write(tmp_path / "r.json")
    again = results.Record.read(tmp_path / "r.json")
    assert again == record and json.loads((tmp_path / "r.json").read_text())["data"] == {
        "ms": [1.0]
    }
    text = again.markdown()
    assert text.startswith("Times:\n\n| run | ms |") and "\nn\n" in text
    assert text.rstrip().endswith(f"source: {record.source}.*")


def test_a_page_section_renders_from_its_record_and_a_missing_one_is_named(tmp_path):
    record = results.Record([results.Table(["a"], [[1]], "r")], "cmd", "cpu", "2026-01-01", "s")
    record.write(tmp_path / "one.json")
    page = "x\n<!-- results:one:start -->\nold\n<!-- results:one:end -->\ny\n"
    assert results.render_page(page, tmp_path) == page.replace("old\n", record.markdown())
    with pytest.raises(FileNotFoundError, match="results:two, but .*two.json does not exist"):
        results.render_page(page.replace("one", "two"), tmp_path)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json: not JSON"):
        results.Record.read(tmp_path / "bad.json")


def test_a_reports_body_comes_before_its_tables_and_round_trips(tmp_path):
    record = results.Record([results.Table(["a"], [[1]], "r")], "cmd", "cpu", "2026-01-01", "s")
    record.body = "## Report\n\nProse ![fig](fig.png)\n"
    record.write(tmp_path / "sub/record.json")
    assert results.Record.read(tmp_path / "sub/record.json") == record
    assert record.markdown().startswith("## Report\n\nProse ![fig](fig.png)\n\n| a |")
    page = "<!-- results:sub/record:start -->\n<!-- results:sub/record:end -->\n"
    shown = results.render_page(page, tmp_path, tmp_path.parent)
    assert f"### Report\n\nProse ![fig]({tmp_path.name}/sub/fig.png)" in shown


def test_a_headline_section_shows_the_tables_without_the_reports_body(tmp_path):
    table = results.Table(["part", "s"], [["host", "13"]], "lr", caption="Headline:")
    record = results.capture([table])
    record.body = "# Report\n\nA long report body.\n"
    record.write(tmp_path / "lab.json")
    page = "<!-- {0}:lab:start -->\n<!-- {0}:lab:end -->\n"
    whole = results.render_page(page.format("results"), tmp_path)
    headline = results.render_page(page.format("results-headline"), tmp_path)
    assert "A long report body." in whole and "Headline:" in whole
    assert "A long report body." not in headline and "Headline:" in headline
    assert headline.startswith("<!-- results-headline:lab:start -->")


def test_a_summary_section_shows_the_finding_and_its_provenance_in_the_readme_too(tmp_path):
    table = results.Table(["a"], [[1]], "r")
    record = results.Record([table], "cmd", "cpu", "2026-01-01", "commit abc", summary="It won.")
    docs = tmp_path / "docs"
    record.write(docs / "results/one.json")
    page = "x\n<!-- results-summary:one:start -->\nold\n<!-- results-summary:one:end -->\n"
    (tmp_path / "README.md").write_text(page)
    (docs / "page.md").write_text(page)
    assert results.render_pages(docs) == [tmp_path / "README.md", docs / "page.md"]
    shown = (tmp_path / "README.md").read_text()
    assert shown == page.replace("old\n", f"It won. {record.provenance()}\n")
    assert "source: commit abc" in shown and (docs / "page.md").read_text() == shown
    results.Record([table], "cmd", "cpu", "2026-01-01", "s").write(docs / "results/one.json")
    with pytest.raises(ValueError, match="results-summary:one; .*one.json has none"):
        results.render_pages(docs)
