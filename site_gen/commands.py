"""The command a record says produced it, as a reader would run it.

A run records its command line as it was typed. On the GPU machine that line may name where its
files went outside the repository (``--out /root/out/…/nvidia-h200.json``, ``--raw …``), to be copied
back into ``bench/results/``; a reader who runs the command without them writes the same record in
its default place. So a page shows the command without options whose value is an absolute path
outside a repository path, and says nothing else changed."""

from __future__ import annotations

import shlex

# options that only choose where a run writes its files
_WHERE = ("--out", "--raw")


def reader_command(command: str) -> str:
    """``command`` without the --out / --raw options that point outside the repository."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: show it as recorded
        return command
    kept, skip = [], False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        name, eq, value = word.partition("=")
        if name in _WHERE:
            value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            if value.startswith("/"):
                skip = not eq
                continue
        kept.append(word)
    return shlex.join(kept) if kept != words else command
