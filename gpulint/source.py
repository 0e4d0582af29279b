"""Reading Python files faithfully and writing them back without disturbing anything outside the edits."""

from __future__ import annotations

import io
import os
import re
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path

_BOM = b"\xef\xbb\xbf"


class SourceError(Exception):
    """A file that cannot be read or decoded; the message is one line and names no traceback."""


@dataclass(frozen=True)
class SourceFile:
    path: Path
    raw: bytes
    text: str  # decoded, BOM removed, line endings untouched
    encoding: str  # codec to re-encode `text` with
    bom: bool

    def encode(self, text: str) -> bytes:
        data = text.encode(self.encoding)
        return _BOM + data if self.bom else data


def decode_source(raw: bytes, path: Path) -> SourceFile:
    if b"\x00" in raw:
        raise SourceError("file contains NUL bytes (binary file?)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:
        raise SourceError(f"invalid encoding declaration: {exc.msg}") from None
    bom = raw.startswith(_BOM)
    body = raw[len(_BOM):] if bom else raw
    codec = "utf-8" if encoding == "utf-8-sig" else encoding
    try:
        text = body.decode(codec)
    except UnicodeDecodeError as exc:
        line = body.count(b"\n", 0, exc.start) + 1
        column = exc.start - (body.rfind(b"\n", 0, exc.start) + 1) + 1
        where = f"byte {body[exc.start:exc.start + 1].hex()} at line {line}, column {column}"
        cookie = _cookie_line(raw)
        if cookie is None:
            raise SourceError(f"not valid UTF-8 ({where}: {exc.reason}); Python reads files without an "
                              f"encoding line as UTF-8") from None
        raise SourceError(f"not valid {codec} as line {cookie} declares ({where}: {exc.reason})") from None
    except LookupError as exc:
        raise SourceError(f"cannot decode as {codec}: {exc}") from None
    return SourceFile(path=path, raw=raw, text=text, encoding=codec, bom=bom)


_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")


def _cookie_line(raw: bytes) -> int | None:
    """The line (1 or 2) of the file's encoding declaration, if it has one."""
    for number, line in enumerate(raw.splitlines()[:2], start=1):
        if _COOKIE.match(line):
            return number
    return None


def read_source(path: Path) -> SourceFile:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SourceError(exc.strerror or str(exc)) from None
    return decode_source(raw, path)


def newline_of(text: str) -> str:
    """The file's dominant line ending, used for text that fixes insert."""
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf * 2 >= text.count("\n") else "\n"


def write_source_atomically(source: SourceFile, new_text: str) -> None:
    """Write `new_text` in the file's own encoding, BOM and mode, via a temp file and rename.

    A symlink is written through: its target gets the new text and the link stays a link. A file with other
    hard links is rewritten in place (one write of the whole text), so that every link sees the fix; a rename
    would split the links. Refuses (SourceError) when the file changed on disk since it was read, so a
    concurrent edit is never lost.
    """
    data = source.encode(new_text)
    try:
        path = Path(os.path.realpath(source.path))  # the file itself, behind any symlinks
        current = path.read_bytes()
    except OSError as exc:
        raise SourceError(exc.strerror or str(exc)) from None
    if current != source.raw:
        raise SourceError("file changed on disk while gpulint was fixing it; left untouched")
    try:
        info = path.stat()
        mode = stat.S_IMODE(info.st_mode)
        if not mode & stat.S_IWUSR or not os.access(path, os.W_OK):  # root ignores modes; we do not
            raise SourceError("file is read-only; left untouched")
        if info.st_nlink > 1:
            _rewrite_in_place(path, data)
            return
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".gpulint", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise SourceError(f"cannot write: {exc.strerror or exc}") from None


def _rewrite_in_place(path: Path, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.write(data)
        handle.truncate()
        handle.flush()
        os.fsync(handle.fileno())
