"""Every measurement the code, the rules, the device specs and the docs cite is a file of the repository.

Comments and reasons cite results as ``benchmarks/results/h200/<topic>/<file>``; a citation of a per-run archive that
left the tree (or a typo) is a claim nobody can check, so every cited path must exist.
"""

import itertools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: ``benchmarks/results/...`` up to a character that cannot be part of a path; ``{a,b}`` alternatives expanded.
CITATION = re.compile(r"benchmarks/results/[\w./{},-]*")
#: Where citations live: the package, the kernels, the rules, the benchmarks' code and docs, the README.
CITING = ("fusion_advisor/", "kernel_library/", "rules/", "benchmarks/", "README.md", "tests/")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    # the results' own READMEs cite their neighbours; the measured files themselves are data, not citations
    return [f for f in out.split() if f.startswith(CITING) and f.endswith((".py", ".md", ".yaml", ".sh"))
            and (not f.startswith("benchmarks/results/") or f.endswith("README.md"))]


def _expand(path: str) -> list[str]:
    parts = re.split(r"\{([^{}]*)\}", path)
    options = [p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*options)]


def _citations() -> dict[str, set[str]]:
    cited: dict[str, set[str]] = {}
    for f in _tracked():
        if f == "tests/test_citations.py":
            continue
        for m in CITATION.finditer((ROOT / f).read_text()):
            for path in _expand(m.group(0).rstrip(".,")):
                cited.setdefault(path, set()).add(f)
    return cited


def test_every_cited_result_exists():
    cited = _citations()
    assert len(cited) >= 10, "the code cites its measurements"
    missing = {p: sorted(fs) for p, fs in cited.items() if not (ROOT / p).exists()}
    assert not missing, f"cited but not in the repository: {missing}"


def test_no_citation_of_a_per_run_archive():
    # the session archives (sessionN_h200/callN/) left the tree: git history keeps them, comments cite stable files
    stale = {p: sorted(fs) for p, fs in _citations().items() if re.search(r"session\d|/call\d", p)}
    assert not stale, stale
