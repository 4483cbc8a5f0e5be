"""The documentation runs as written: every Python block of the README and of the docs
pages (docs/**/*.md) runs in a fresh folder, and where a `print(...)` line carries a
comment, the comment is what it prints. A block that needs 8 devices says `# 8 devices`,
one too slow for the quick suite `# slow`; one that imports torch or transformers is
skipped where they are not installed (the Python 3.12 line). The results pages equal what
their committed result files render to."""

import contextlib
import io
import pathlib
import re
import shutil

import jax
import pytest

from jaxformer import cli
from jaxformer_lab import results
from jaxformer_lab.results import Record

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
OPTIONAL = ("torch", "transformers", "safetensors")  # extras no CPU wheel brings to every line


def _blocks() -> dict[str, str]:
    """Each distinct Python block, named by its first page and position there (the README
    repeats some of the pages' blocks; each runs once)."""
    blocks = {}
    for page in PAGES:
        found = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
        for i, block in enumerate(found, 1):
            blocks.setdefault(block, f"{page.relative_to(ROOT)}:{i}")
    return blocks


BLOCKS = _blocks()


def _param(block: str, name: str):
    marks = [pytest.mark.devices(8)] if "# 8 devices" in block else []
    marks += [pytest.mark.slow] if re.search(r"^# slow\b", block, re.M) else []
    return pytest.param(block, name, marks=marks, id=name)


def test_the_pages_have_python_blocks():
    assert len(BLOCKS) >= 8
    assert any(name.startswith("README.md") for name in BLOCKS.values())


@pytest.mark.parametrize("block, name", [_param(b, n) for b, n in BLOCKS.items()])
def test_python_block_runs_as_written(block, name, tmp_path, monkeypatch):
    imported = re.findall(r"^(?:import|from) ([\w., ]+)", block, re.M)
    for module in {m.strip().split(".")[0] for line in imported for m in line.split(",")}:
        if module in OPTIONAL:
            pytest.importorskip(module, reason=f"the block imports {module}, not installed here")
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    # A block is user code: it may broadcast as NumPy does (the package is checked elsewhere).
    with contextlib.redirect_stdout(printed), jax.numpy_rank_promotion("allow"):
        exec(compile(block, name, "exec"), {"__name__": "__docs__"})
    promised = [m.strip() for m in re.findall(r"^print\(.*\)\s+# (.*)$", block, re.M)]
    prints = re.findall(r"^print\(", block, re.M)
    if promised and len(promised) == len(prints):
        assert printed.getvalue().strip().splitlines()[-len(promised) :] == promised


def test_results_pages_equal_what_their_result_files_render_to():
    stale = results.render_pages(ROOT / "docs", write=False)
    assert not stale, f"{stale} differ from their result files: run `jaxformer docs`"


def test_jaxformer_docs_rewrites_a_stale_section_and_check_names_it(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    shutil.copy(ROOT / "docs/results/make_train.json", tmp_path / "results")
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n<!-- results:make_train:start -->\nstale\n<!-- results:make_train:end -->\n"
    )
    assert cli.main(["docs", "--docs", str(tmp_path), "--check"]) == 1
    assert "stale" in page.read_text() and f"differs: {page}" in capsys.readouterr().out
    assert cli.main(["docs", "--docs", str(tmp_path)]) == 0
    assert "stale" not in page.read_text() and "*Command:" in page.read_text()
    assert cli.main(["docs", "--docs", str(tmp_path), "--check"]) == 0
    assert cli.main(["docs", "--docs", str(tmp_path / "nowhere")]) == 2


def test_every_result_file_is_shown_and_names_where_it_comes_from():
    shown = set()
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        shown |= set(re.findall(r"^<!-- results(?:-headline)?:([\w/.-]+):start -->$", text, re.M))
    folder = ROOT / "docs/results"
    files = sorted(folder.glob("*.json")) + sorted(folder.glob("xla_vs_eager/*/record.json"))
    assert files and {str(f.relative_to(folder).with_suffix("")) for f in files} == shown
    for f in files:
        record = Record.read(f)
        assert record.command and record.device and record.date and record.source, f.name


def test_a_result_renders_as_a_table_with_its_provenance():
    result = {
        "command": "python experiments/x.py",
        "device": "a CPU",
        "versions": {"jax": "0.10.2"},
        "date": "2026-11-23",
        "source": "a test",
        "tables": [{"columns": ["a", "b"], "align": "lr", "rows": [["x", "1"]]}],
    }
    text = Record.from_dict(result).markdown()
    assert text.splitlines()[:3] == ["| a | b |", "| --- | ---: |", "| x | 1 |"]
    assert "`python experiments/x.py`" in text and "jax 0.10.2" in text and "2026-11-23" in text
    bad = dict(result, tables=[{"columns": ["a", "b"], "align": "l", "rows": []}])
    with pytest.raises(ValueError, match="2 columns"):
        Record.from_dict(bad).markdown()
    with pytest.raises(ValueError, match=r"missing \['source'\], unknown \['counts'\]"):
        Record.from_dict({k: v for k, v in result.items() if k != "source"} | {"counts": 1})


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_block_markers_become_pytest_marks():
    names = {m.name for m in _param("# slow\nx = 1  # 8 devices\n", "page.md:1").marks}
    assert names == {"slow", "devices"}
    assert not _param("x = 1  # not slow\n", "page.md:2").marks
