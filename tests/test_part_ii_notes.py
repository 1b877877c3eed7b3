"""Part II's notes against the runs they cite: every stage of the RMSNorm forward and backward and the
softmax forward and backward and the cross-entropy has a "## Measured" section after its prediction that names the command and
the committed log it quotes, and every row of its table has the GB/s and the × copy that log printed for
that stage and length (the notes quote the log; a re-run that changes the numbers makes this fail until
the notes are rewritten from it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hopattn import cross_entropy_lineage, lineage, rowwise, rowwise_backward, softmax_lineage

ROOT = lineage.RMSNORM_DIR.parent.parent
LINEAGES = {"rmsnorm": (rowwise.discover, "python -m bench.rowwise", None),
            "rmsnorm_backward": (rowwise_backward.discover, "python -m bench.rowwise_backward", None),
            "softmax": (softmax_lineage.discover, "python -m bench.rowwise_softmax", "forward"),
            "softmax_backward": (softmax_lineage.discover_backward, "python -m bench.rowwise_softmax", "backward"),
            # every direction of one run, each row naming its own (fused, forward, backward)
            "cross_entropy": (cross_entropy_lineage.discover, "python -m bench.rowwise_cross_entropy", "all")}
RECORDS = {"cross_entropy": ("cross_entropy_fused", "cross_entropy_forward", "cross_entropy_backward")}
STAGES = [(folder, s) for folder, (discover, _c, _d) in LINEAGES.items() for s in discover()]
LINE = re.compile(r"\]\s+(?:(forward|backward|fused) )?(\d+k) (stage \d\d|copy)\s+(\d+) GB/s\s+\S+ ms\s+spread \S+ %\s+"
                  r"vs copy (\S+)")
ROW = re.compile(r"^\| (\d+k) \| (\d+) \| ([\d.]+) \| (\d+) \|", re.M)
DIRECTED_ROW = re.compile(r"^\| (fused|forward|backward) \| (\d+k) \| (\d+) \| ([\d.]+) \| (\d+) \|", re.M)


def logged(path: Path, direction: str | None) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        m = LINE.search(line)
        if m and direction == "all":
            out[(f"{m.group(1)} {m.group(2)}", m.group(3))] = (m.group(4), m.group(5))
        elif m and (direction is None or m.group(1) == direction):
            out[(m.group(2), m.group(3))] = (m.group(4), m.group(5))
    return out


def awaiting_its_run(folder: str, stage) -> bool:
    """A lineage's newest stage whose Measured section says "**Not measured yet.**" while no record of the
    lineage holds an entry of it: written before its GPU run, as a stage's prediction is."""
    notes = stage.notes_path.read_text()
    if "**Not measured yet.**" not in notes[notes.index("## Measured"):]:
        return False
    assert stage.number == LINEAGES[folder][0]()[-1].number, f"{stage.name}: only a lineage's newest stage awaits its run"
    for results in RECORDS.get(folder, (folder,)):
        record = ROOT / "bench" / "results" / results / "nvidia-h200.json"
        arms = {e["arm"] for e in json.loads(record.read_text())["entries"]} if record.is_file() else set()
        assert f"stage {stage.id}" not in arms, f"{record} measures {stage.name}: rewrite its Measured section"
    return True


@pytest.mark.parametrize(("folder", "stage"), STAGES, ids=[f"{f}-{s.name}" for f, s in STAGES])
def test_the_measured_section_quotes_its_log(folder, stage):
    _discover, command, direction = LINEAGES[folder]
    notes = stage.notes_path.read_text()
    assert notes.index("## Prediction") < notes.index("## Measured") < notes.index("## What the compiler made of it")
    measured = notes[notes.index("## Measured"):notes.index("## What the compiler made of it")]
    assert f"`{command}`" in measured
    if awaiting_its_run(folder, stage):  # it names the command that will measure it, and no log yet
        assert f"research/{folder}/gpu_run.sh" in measured and not re.search(r"`bench/logs/[^`]+\.log`", measured)
        return
    logs = re.findall(r"`(bench/logs/[^`]+\.log)`", measured)
    assert logs and all((ROOT / log).is_file() for log in logs), logs
    if len(logs) > 1:  # others cited beside it (the GPU call's whole output, another lineage's run): the
        # one quoted is the bench's own log, the one that starts with the command's header line
        logs = [log for log in logs if (ROOT / log).read_text().startswith(f"# {command}")]
    assert len(logs) == 1, logs
    for results in RECORDS.get(folder, (folder,)):
        assert f"`bench/results/{results}/nvidia-h200.json`" in measured
    found = logged(ROOT / logs[0], direction)
    if direction == "all":
        rows = [(f"{d} {size}", *rest) for d, size, *rest in DIRECTED_ROW.findall(measured)]
    else:
        rows = ROW.findall(measured)
    assert rows and [size for size, *_ in rows] == [size for size, arm in found if arm == f"stage {stage.id}"]
    for size, gbps, copy_ratio, copy_gbps in rows:
        assert (gbps, copy_ratio) == found[(size, f"stage {stage.id}")], (size, gbps, copy_ratio)
        assert copy_gbps == found[(size, "copy")][0], size
