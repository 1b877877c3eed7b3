"""The provenance every record carries and every producer's log starts with: the run header (date,
commit, dirty flag, command, environment), the git state it reads, and how a producer names a path.

The producers (``python -m bench``, ``bench.trace``, ``bench.models``, the scripts in research/) all
build their run through ``new_run`` and print ``log_header`` as their first line, so a record and
the log of the run that made it say the same thing. Standard library only.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def git_state(root: Path = REPO_ROOT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout; (None, None) when unknown.

    HOPATTN_GIT_COMMIT / HOPATTN_GIT_DIRTY, when set, win over git: a working tree copied to a GPU
    machine may carry no .git, or a stale one that names an older commit. A value that is not a
    full 40-digit hash raises ValueError: an abbreviated one would otherwise be ignored in silence
    and the stale .git recorded instead."""
    commit = os.environ.get("HOPATTN_GIT_COMMIT", "").strip().lower()
    if commit and not _COMMIT_RE.fullmatch(commit):
        raise ValueError(f"HOPATTN_GIT_COMMIT={commit!r} is not a full 40-digit commit hash "
                         "(git rev-parse HEAD gives one)")
    if commit:
        dirty_text = os.environ.get("HOPATTN_GIT_DIRTY", "").strip().lower()
        return commit, {"1": True, "true": True, "0": False, "false": False}.get(dirty_text)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30)
        if head.returncode == 0 and _COMMIT_RE.fullmatch(head.stdout.strip()):
            # the results folder is what this run writes: a file left there by an earlier run is not "dirty"
            status = subprocess.run(["git", "status", "--porcelain", "--", ".", ":(exclude)bench/results"],
                                    cwd=root, capture_output=True, text=True, timeout=30)
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
            return head.stdout.strip(), dirty
    except (OSError, subprocess.TimeoutExpired):
        pass
    return None, None


def run_id_and_date(now: dt.datetime | None = None) -> tuple[str, str]:
    """('20261129T153000Z', '2026-11-29T15:30:00Z') for ``now`` (default: the current UTC time)."""
    now = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc).replace(microsecond=0)
    return now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run(command: str, environment: dict, *, date: str | None = None,
            git: tuple[str | None, bool | None] | None = None) -> dict:
    """The run header of a record: {date, git_commit, git_dirty, command, environment}.

    ``date``: as run_id_and_date gives it (default: now); ``git``: (commit, dirty) read once at the
    start of a long run (default: git_state() now, which raises ValueError on a bad
    HOPATTN_GIT_COMMIT). A format that names a field otherwise (the model records' ``dirty``)
    renames it in its own module."""
    commit, dirty = git_state() if git is None else git
    return {"date": date or run_id_and_date()[1], "git_commit": commit, "git_dirty": dirty, "command": command,
            "environment": environment}


def log_header(command: str, git: tuple[str | None, bool | None] | None = None, date: str | None = None) -> str:
    """The first line of a producer's output, so that a log kept under bench/logs says what made it:
    '# python -m bench.trace --stages 21 (2026-12-01T15:50:00Z, source 455f352)'."""
    if git is None:
        try:
            git = git_state()
        except ValueError:
            git = (None, None)
    commit, dirty = git
    source = "source unknown" if commit is None else f"source {commit[:7]}"
    source += {True: " with uncommitted changes", False: ""}.get(dirty, "")
    return f"# {command} ({date or run_id_and_date()[1]}, {source})"


def script_command(argv: list[str] | None = None) -> str:
    """The command line of a script run as ``python <path> <args>`` (research/), its path as
    shown_path gives it: 'python research/compare.py 21 fa3 --shapes 8k'."""
    argv = sys.argv if argv is None else argv
    return shlex.join(["python", shown_path(argv[0]).removesuffix(" (outside the repository)"), *argv[1:]])


def shown_path(path, root: Path = REPO_ROOT) -> str:
    """A path as a log should print it: relative to the repository when inside it (what a reader of
    the committed log can open); elsewhere its file name, marked as outside (a file worth citing is
    committed under bench/logs/ by that name)."""
    path = Path(path).resolve()
    try:
        return path.relative_to(root.resolve()).as_posix()
    except ValueError:
        return f"{path.name} (outside the repository)"
