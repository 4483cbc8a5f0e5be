"""Run records read in place, from a folder or from its compressed archive.

A study's records (a sweep's run folders, one machine's runs) are committed as one archive,
`NAME.tar.xz` beside where the folder NAME was, its files under `NAME/`. `tree(path)` opens
a path inside such an archive without extracting it: `records/sweeps/NAME/base/seed0`
reads `records/sweeps/NAME.tar.xz` (when no folder NAME is there), and so does the
archive's own path. What it returns reads like a read-only pathlib.Path: `/`, `name`,
`parent`, `exists`, `is_dir`, `is_file`, `iterdir`, `read_text`, `read_bytes`. A path
in no archive is returned as it is. `pack(folder)` writes a folder's archive: its files in
order, without times or owners, so that the same files make the same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import lzma
import pathlib
import tarfile

from jaxformer.checks import BadValue, MissingFile

SUFFIX = ".tar.xz"


def tree(path: str | pathlib.Path) -> pathlib.Path | Member:
    """`path`, or where an archive holds it: an existing folder or file is read as it is."""
    path = pathlib.Path(path)
    if path.exists() and not _is_archive(path):
        return path
    for parent in [p for p in (path, *path.parents) if p.name]:
        archive = parent if _is_archive(parent) else parent.with_name(parent.name + SUFFIX)
        if _is_archive(archive) and not parent.is_dir():
            inside = path.relative_to(parent).as_posix()
            return Member(archive, "" if inside == "." else inside)
    return path


def pack(folder: str | pathlib.Path) -> pathlib.Path:
    """Write `folder`'s files to FOLDER.tar.xz beside it (replacing one there); its path."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise MissingFile(f"{folder}: no such folder")
    archive = folder.with_name(folder.name + SUFFIX)
    with tarfile.open(archive, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{folder.name}/{path.relative_to(folder).as_posix()}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return archive


@dataclasses.dataclass(frozen=True)
class Member:
    """A file or folder `at` (a relative POSIX path; "" the top) in a records archive."""

    archive: pathlib.Path
    at: str = ""

    def __str__(self) -> str:
        return str(self.archive / self.at) if self.at else str(self.archive)

    def __truediv__(self, name: str) -> Member:
        return self.joinpath(name)

    def joinpath(self, *names: str) -> Member:
        return Member(self.archive, "/".join(p for p in (self.at, *names) if p))

    @property
    def name(self) -> str:
        return self.at.rpartition("/")[2] if self.at else self.archive.name[: -len(SUFFIX)]

    @property
    def parent(self) -> Member | pathlib.Path:
        return Member(self.archive, self.at.rpartition("/")[0]) if self.at else self.archive.parent

    def resolve(self) -> Member:
        return Member(self.archive.resolve(), self.at)

    def is_file(self) -> bool:
        return self.at in _contents(self.archive)[0]

    def is_dir(self) -> bool:
        return self.at in _contents(self.archive)[1]

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def iterdir(self):
        """The files and folders directly in this folder, in name order."""
        if not self.is_dir():
            raise NotADirectoryError(f"{self}: not a folder")
        files, folders = _contents(self.archive)
        prefix = f"{self.at}/" if self.at else ""
        names = {p[len(prefix) :].split("/")[0] for p in (*files, *folders) if p.startswith(prefix)}
        return iter(self / n for n in sorted(names - {""}))

    def read_bytes(self) -> bytes:
        files = _contents(self.archive)[0]
        if self.at not in files:
            raise (IsADirectoryError if self.is_dir() else FileNotFoundError)(f"{self}")
        return files[self.at]

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)


def _is_archive(path: pathlib.Path) -> bool:
    return path.name.endswith(SUFFIX) and path.is_file()


def _contents(archive: pathlib.Path) -> tuple[dict[str, bytes], frozenset[str]]:
    """The archive's files (path under its top folder -> bytes) and its folders ("" the top),
    read once while the file is unchanged."""
    stat = archive.stat()
    return _read(archive.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _read(archive: pathlib.Path, *_changed) -> tuple[dict[str, bytes], frozenset[str]]:
    top = archive.name[: -len(SUFFIX)] + "/"
    files = {}
    try:
        with tarfile.open(archive, "r:xz") as tar:
            for info in tar:
                if not info.name.startswith(top):
                    raise BadValue(f"{archive}: {info.name} is not under {top} (its folder)")
                if info.isfile():
                    files[info.name[len(top) :]] = tar.extractfile(info).read()
    except (tarfile.TarError, lzma.LZMAError, EOFError) as e:
        raise BadValue(f"{archive}: not a readable .tar.xz ({e}); the file is damaged") from None
    folders = {"/".join(p.split("/")[:i]) for p in files for i in range(p.count("/") + 1)}
    return files, frozenset(folders)
