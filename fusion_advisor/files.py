"""The one output-file guard and the one atomic write, for every command that writes files.

The tool never overwrites a file it did not write: :func:`check_out_file` guards a single output file (``calibrate
--out``, ``analyze --trace``, ``--json-out``), :func:`check_folder` a folder of outputs (the report folder, apply's
and diff's files; :func:`fusion_advisor.report.write.check_files` says which of them are ours).
:func:`atomic_write_bytes` writes each file so that a reader never sees half of it.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

from fusion_advisor.errors import UserError


@contextlib.contextmanager
def no_bytecode():
    """Import the user's files without writing ``__pycache__`` beside them (the tool never writes into the model's
    folder): ``sys.dont_write_bytecode`` on for the block, as it was after it. Environments that leave
    ``PYTHONDONTWRITEBYTECODE`` unset (most) got a ``__pycache__`` folder next to every model analysed."""
    import sys

    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.dont_write_bytecode = before


def same_model_file(before: str, now: str) -> bool:
    """Whether a model file an earlier report or plan recorded (``before``, as it was typed) is the one given now:
    by resolved path where it was recorded absolute, by file name where relative (it may have been typed from
    another folder)."""
    if Path(before).is_absolute():
        return Path(before).resolve() == Path(now).resolve()
    return Path(before).name == Path(now).name


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temp file in the same folder, fsync, then ``os.replace``.

    On any failure (including KeyboardInterrupt) the temp file is removed and ``path`` is left as it was.
    The temp file is created with mode 0o666 minus the umask, like a plain ``open(path, "w")``.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def check_out_file(path: Path, flag: str, foreign: Callable[[Path], str | None], *, example: str | None = None,
                   wrong_suffix: Callable[[Path], str | None] = lambda p: None, writable: bool = False,
                   error: type[UserError] = UserError) -> None:
    """Refuse an output file the tool must not write, before any work is done.

    Args:
        path: the file to be written.
        flag: the option that named it (``"--out"``), the start of every message.
        foreign: for an existing ``path``: why it must not be overwritten (it is not ours), or None (it is ours).
        example: a file name to suggest when ``path`` is a folder; None: no folder check of its own (``foreign``
            answers for a folder then).
        wrong_suffix: why ``path``'s name cannot be right, or None.
        writable: also refuse a folder that is not writable.
        error: the :class:`UserError` subclass raised.

    Raises:
        UserError (``error``): ``flag path: reason``; checked in the order folder, name, missing folder,
        writable folder, existing file.
    """
    path = Path(path)
    if example is not None and path.is_dir():
        raise error(f"{flag} {path}: is a directory; give a file name such as {example}")
    why = wrong_suffix(path)
    if why:
        raise error(f"{flag} {path}: {why}")
    if not path.parent.is_dir():
        raise error(f"{flag} {path}: folder {path.parent} does not exist")
    if writable and not os.access(path.parent, os.W_OK | os.X_OK):
        raise error(f"{flag} {path}: folder {path.parent} is not writable")
    why = refuses_writes(path.parent) if writable else None
    if why:
        raise error(f"{flag} {path}: cannot write in {path.parent}: {why}")
    if path.exists():
        why = foreign(path)
        if why:
            raise error(f"{flag} {path}: {why}")


def refuses_writes(folder: Path) -> str | None:
    """Why ``folder`` refuses a new entry that its permission bits allow (``/proc``, ``/sys``, a read-only mount,
    root's view of any of them), else ``None``: a probe directory is made there and removed (one that cannot be
    removed is left, and the folder still counts as writable)."""
    try:
        probe = tempfile.mkdtemp(dir=folder, prefix=".fusion-advisor-probe-")
    except OSError as e:
        return e.strerror or str(e)
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return None


def check_folder(out_dir: Path, names: tuple[str, ...], is_ours: Callable[[str], bool], flag: str = "--out") -> None:
    """Refuse to write the files ``names`` into ``out_dir`` where ``out_dir`` is a file or not writable, or holds
    one of them that fusion-advisor did not write (``is_ours(name)`` False).

    Raises:
        UserError: naming the folder and the files.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{flag} {out_dir}: exists and is not a directory")
    existing = out_dir if out_dir.is_dir() else next((p for p in out_dir.parents if p.exists()), Path("."))
    if not existing.is_dir():  # --out a/b where a is a file: b cannot be made under it
        raise UserError(f"{flag} {out_dir}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {out_dir}: {existing} is not writable")
    why = refuses_writes(existing)
    if why:
        raise UserError(f"{flag} {out_dir}: cannot write in {existing}: {why}")
    if not out_dir.is_dir():
        return
    foreign = [n for n in names if (out_dir / n).exists() and not is_ours(n)]
    if foreign:
        raise UserError(f"{flag} {out_dir}: holds {', '.join(foreign)} that fusion-advisor did not write; choose "
                        "another directory (the tool never overwrites your files)")


def csv_text(rows: Iterable[dict[str, Any]], columns: Iterable[str]) -> str:
    """``rows`` as CSV text with a header of ``columns`` in that order (``\n`` line ends; keys outside
    ``columns`` are left out): the tables pandas reads (``pd.read_csv``)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
