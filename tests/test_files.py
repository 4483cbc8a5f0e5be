"""The provenance a record carries (jaxformer.files): the code's commit, read once, and the
command as typed."""

import subprocess
import sys
from importlib import metadata

from jaxformer import files


def test_the_code_is_a_commit_only_in_jaxformers_own_checkout(tmp_path, monkeypatch, request):
    """Installed into a folder another git repository holds (a project's .venv), the code
    is the package's version, not that repository's commit. Either is read once a process:
    a commit made while a run trains is not the code it runs."""
    files.code_version.cache_clear()
    request.addfinalizer(files.code_version.cache_clear)  # the stand-in's answer goes too
    here = files.code_version()
    assert here.startswith("jaxformer at commit ")  # this checkout
    git = files._git

    def elsewhere(cwd, *args):
        return str(tmp_path) if args == ("rev-parse", "--show-toplevel") else git(cwd, *args)

    monkeypatch.setattr(files, "_git", elsewhere)
    assert files.code_version() == here
    files.code_version.cache_clear()
    assert files.code_version() == f"jaxformer {metadata.version('jaxformer')}"


def test_the_command_of_a_module_run_is_the_command_typed(tmp_path):
    code = "import sys; sys.argv = ['x.py', '--a', 'b c']; from jaxformer import files; "
    code += "print(files.command_line())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "python x.py --a 'b c'"
