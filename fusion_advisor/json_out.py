"""``--json-out``: a command's JSON result printed and written atomically, never over a file the command did not
write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from fusion_advisor.errors import UserError
from fusion_advisor.files import atomic_write_bytes, check_out_file


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` atomically (:func:`fusion_advisor.files.atomic_write_bytes`), refusing a
    file this command did not write.

    Raises:
        UserError: ``path`` holds something else, or cannot be written.
    """
    def foreign(p: Path) -> str | None:
        why = _not_json(p)
        if why is None and not _json_written_like(p, data):
            why = "holds JSON that this command did not write; refusing to overwrite it (choose another file)"
        return why

    check_out_file(path, "--json-out", foreign)
    try:
        atomic_write_bytes(path, (json.dumps(data, indent=2, allow_nan=False) + "\n").encode("utf-8"))
    except OSError as e:
        raise UserError(f"--json-out {path}: cannot write: {e.strerror or e}") from e


def check_json_out(path: Optional[Path]) -> None:
    """Refuse a --json-out that cannot be written (a folder, a missing or read-only folder, a file that is not
    JSON) before the command's work, not after it; whether an existing JSON file is this command's own is checked
    when it is written (:func:`write_json_atomic`: it needs the result's keys)."""
    if path is not None:
        check_out_file(path, "--json-out", _not_json, example="result.json", writable=True)


def _not_json(path: Path) -> str | None:
    """Why an existing --json-out must not be overwritten for what it is (not a JSON file), else None."""
    if path.suffix != ".json" or not _is_json(path):
        return "exists and is not a JSON file; refusing to overwrite it"
    return None


def _json_written_like(path: Path, data: dict) -> bool:
    """Whether the JSON object in ``path`` looks like an earlier output of the command about to write ``data``:
    at least half of its top-level keys are keys of ``data`` (outputs differ by a key or two between runs, a user's
    own JSON shares none)."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(old, dict) or not old:
        return False
    return 2 * len(set(old) & set(data)) >= len(old)


def _is_json(path: Path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def emit_json(data: dict, json_out: Optional[Path]) -> None:
    """Print ``data`` as JSON on stdout, and write it to ``json_out`` too when given."""
    typer.echo(json.dumps(data, indent=2, allow_nan=False))
    if json_out is not None:
        write_json_atomic(json_out, data)
