"""The training text: this Python installation's standard library and installed packages (sources, docstrings,
.rst/.md docs), found through ``sysconfig``/``site`` so every machine builds it offline from what it has.

Deterministic from the seed for a given installation: files are listed in sorted order, each package's files
are shuffled with a generator seeded from (seed, package) before its byte cap applies, and a file is held out
when a hash of (seed, its path relative to its root) falls in the held-out fraction. Showcase modules (those the
README's example asks about) are never held out.
"""
from __future__ import annotations

import hashlib
import os
import random
import site
import sysconfig
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = (".py", ".rst", ".md", ".txt")
MAX_FILE_BYTES = 400_000          # larger files are generated tables, not prose or code
SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", "test", "tests", "testing", "_vendor", "vendor",
             "node_modules", ".git", "include", "idle_test", "data"}
SHOWCASE = ("json/__init__.py", "json/encoder.py", "json/decoder.py", "os.py", "pathlib.py", "collections/__init__.py",
            "functools.py", "itertools.py", "re/__init__.py", "random.py", "textwrap.py", "shutil.py", "string.py")


@dataclass(frozen=True)
class SourceFile:
    root: str        # "stdlib" or the top-level package name
    rel: str         # path relative to the stdlib / site-packages directory
    text: str
    held_out: bool

    @property
    def is_python(self) -> bool:
        return self.rel.endswith(".py")

    @property
    def module(self) -> str:
        """Dotted module name of a .py file (``json/__init__.py`` -> ``json``)."""
        parts = self.rel[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)


def search_roots() -> tuple[Path, list[Path]]:
    paths = sysconfig.get_paths()
    stdlib = Path(paths["stdlib"])
    sites = [paths.get("purelib"), paths.get("platlib"), *site.getsitepackages()]
    user = site.getusersitepackages()
    sites.append(user if isinstance(user, str) else None)
    seen, out = set(), []
    for s in sites:
        if s and Path(s).is_dir() and Path(s).resolve() not in seen:
            seen.add(Path(s).resolve())
            out.append(Path(s))
    return stdlib, out


def _walk(base: Path, top: Path):
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")
                             and not d.endswith((".dist-info", ".egg-info")))
        for f in sorted(filenames):
            if f.endswith(TEXT_SUFFIXES) and not f.startswith(("LICENSE", "COPYING")):
                p = Path(dirpath) / f
                yield p, p.relative_to(base).as_posix()


def _read(p: Path) -> str | None:
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            return None
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.strip() else None


def _held_out(seed: int, root: str, rel: str, fraction: float) -> bool:
    if root == "stdlib" and rel in SHOWCASE:
        return False
    h = int.from_bytes(hashlib.sha256(f"{seed}:{root}:{rel}".encode()).digest()[:8], "little")
    return h / 2 ** 64 < fraction


def collect(seed: int, *, package_cap_mb: float = 6.0, total_cap_mb: float = 120.0,
            held_out_fraction: float = 0.02, stdlib_only: bool = False, limit_files: int | None = None) -> list[SourceFile]:
    """The corpus files: the whole standard library (its tests excluded), then each installed top-level package
    up to ``package_cap_mb``, until ``total_cap_mb``. ``limit_files`` keeps the first N (smoke tests)."""
    stdlib, sites = search_roots()
    groups: dict[str, list[tuple[Path, str]]] = {"stdlib": list(_walk(stdlib, stdlib))}
    if not stdlib_only:
        for s in sites:
            for top in sorted(s.iterdir()):
                if top.is_dir() and top.name not in SKIP_DIRS and not top.name.endswith((".dist-info", ".egg-info")) \
                        and top.name.isidentifier() and top.name not in groups:
                    groups[top.name] = list(_walk(s, top))
    out: list[SourceFile] = []
    total, cap_total = 0, int(total_cap_mb * 1e6)
    for root, files in groups.items():
        if root != "stdlib":
            random.Random(f"{seed}:{root}").shuffle(files)
        cap, used = (float("inf") if root == "stdlib" else package_cap_mb * 1e6), 0
        for p, rel in files:
            if used >= cap or total >= cap_total or (limit_files is not None and len(out) >= limit_files):
                break
            text = _read(p)
            if text is None:
                continue
            out.append(SourceFile(root, rel, text, _held_out(seed, root, rel, held_out_fraction)))
            used += len(text)
            total += len(text)
    return out
