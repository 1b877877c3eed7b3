"""Every number README.md and the stages' notes quote from a committed record agrees with it
(tests/quoted_numbers.py says how a number's source and meaning are read, and what is exempt).

A number that drifts from its record fails here, naming the file, the line and the record's
value. Numbers of a stage whose record is stale (its sources changed since it was measured) are
skipped with the reason, and so are those that quote no committed record (a development loop, a
profiler, a log without the harness's summary); -rs lists them.
"""

from __future__ import annotations

import re

import pytest
from hopattn import lineage
from quoted_numbers import REPO, Records, Verdict, blocks, document_verdicts, readme_verdicts

from site_gen.benchmark_section import headline

NOTES = sorted((REPO / "kernels" / "attention").glob("[0-9][0-9]_*/notes.md"))


@pytest.fixture(scope="module")
def rec() -> Records:
    return Records.load()


def _fail_on_drift(verdicts: list[Verdict]) -> None:
    bad = [v.line() for v in verdicts if v.ok is False]
    assert not bad, "numbers that disagree with their record:\n  " + "\n  ".join(bad)


def test_readme_quotes_its_records(rec):
    verdicts = readme_verdicts(rec)
    assert sum(v.ok is True for v in verdicts) >= 20  # the table's peers, FA3 at 16k, the model bullets
    _fail_on_drift(verdicts)


@pytest.mark.parametrize("notes", NOTES, ids=[p.parent.name for p in NOTES])
def test_notes_quote_their_records(rec, notes):
    _fail_on_drift(document_verdicts(notes, rec, notes.parent.name[:2]))


def test_what_is_not_checked_is_reported(rec):
    """The numbers left unchecked, by reason (stale stages first): shown with -rs."""
    verdicts = readme_verdicts(rec) + [v for p in NOTES for v in document_verdicts(p, rec, p.parent.name[:2])]
    left = [v for v in verdicts if v.ok is None]
    stale = [v for v in left if "stale" in v.reason]
    assert sum(v.ok is True for v in verdicts) >= 300
    if stale:
        stages = sorted({v.reason.split("'")[0] for v in stale})
        pytest.skip(f"{len(stale)} quoted numbers wait for a new measurement ({'; '.join(stages)} records are stale), "
                    f"e.g. {stale[0].line()}; {len(left) - len(stale)} more quote no committed record "
                    "(development loop, profiler, a log without the harness summary) or are predictions")


def test_the_readme_status_has_no_number_that_no_rule_reads(rec):
    """A TFLOP/s figure or a speedup in README's Status section is either read (and checked) or
    marked `<!-- numbers: unchecked, <reason> -->`: a new sentence of a new form cannot slip by."""
    read = {(v.quote.line, v.quote.text) for v in readme_verdicts(rec)}
    goals = {"700"}  # "700 TFLOP/s at 16k without a mask": the target, not a measurement
    text = (REPO / "README.md").read_text()
    unread = []
    for b in blocks(text):
        if not b.section.endswith("Status") or b.unchecked is not None or b.kind == "table":
            continue
        for i, line in enumerate(b.lines):
            for m in re.finditer(r"(?<![\w.])(\d+(?:\.\d+)?)(?:×| TFLOP/s)", line):
                if (b.start + i, m.group(1)) not in read and m.group(1) not in goals:
                    unread.append(f"README.md:{b.start + i}: {m.group(0)}")
    assert not unread, ("numbers no rule of tests/quoted_numbers.py reads (add a rule to README_SENTENCES, or "
                        "mark the paragraph unchecked with its reason):\n  " + "\n  ".join(unread))


def test_the_readme_cites_runs_the_record_holds(rec):
    text = (REPO / "README.md").read_text()
    status = text[text.index("## Status"):text.index("## ", text.index("## Status") + 3)]
    runs = re.findall(r"\b(20\d{6}T\d{4}(?:\d\dZ)?)\b", status)  # a run id, or its start
    assert runs and all(any(r.startswith(c) for r in rec.runs) for c in runs), runs


def test_the_stage_cards_state_the_records(rec):
    """Each card: the entry's TFLOP/s, its gain over the previous stage from the two entries, and
    the ratio to the peer that was fastest in its run by median TFLOP/s; a stale entry says so."""
    stages = lineage.discover()
    names = {"fa3": "FlashAttention-3", "fa4": "FlashAttention-4", "cudnn": "cuDNN"}
    for i, s in enumerate(stages):
        prev = stages[i - 1] if i else None
        cards = headline.headline(s, prev, rec.hashes, [rec.nums])
        for causal in (False, True):
            e = rec.nums.stage(s.id, headline.SHAPE, causal)
            if e is None or e["status"] != "ok":
                continue
            label = f"8k {'causal' if causal else 'non-causal'}"
            card = cards.split(f'<div class="hd-card-head">{label}</div>')[1].split('<div class="hd-card')[0:4]
            card = "".join(card)
            assert f'{e["tflops"]:.0f} <span>TFLOP/s</span>' in card, (s.id, causal)
            assert ("hd-stale" in card) == bool(rec.stale(s.id, e)), (s.id, causal)
            p = rec.nums.stage(prev.id, headline.SHAPE, causal) if prev else None
            if p is not None and p["status"] == "ok":
                assert f"{(e['tflops'] / p['tflops'] - 1) * 100:+.1f} %</span> over stage {prev.id}" in card
            fastest = _fastest(rec, e)
            assert f"{e['ratios'][fastest]:.3f}× {names[fastest]}, same run" in card, (s.id, causal)


def _fastest(rec, e) -> str:
    """The peer fastest by median TFLOP/s in the entry's own run; a peer the file holds only from a
    later run is ranked by the speed the entry's ratio to it implies (headline.best_peer's rule)."""
    def speed(k):
        pe = rec.nums.peer(k, e["shape"], e["causal"])
        return pe["tflops"] if pe and pe["run_id"] == e["run_id"] else e["tflops"] / e["ratios"][k]
    return max(e["ratios"], key=speed)


# --- the checker itself -------------------------------------------------------------------------

PARA = """# A stage

## Measured

On the H200, in the latest harness run (run 20261201T181312Z): 440 / {v} / 462 TFLOP/s at 4k / 8k / 16k,
+25 % over stage 07 at 8k and 0.67× FlashAttention-3. The first run
(`bench/logs/nvidia-h200-20261129T1610.log`) read 441 / 453 / 457 TFLOP/s at 4k / 8k / 16k.

| non-causal shape | TFLOP/s | vs FA4 | vs cuDNN |
|---|---|---|---|
| 8k (4 × 16 × 8192) | {t} | 0.693 | 0.745 |

(`bench/logs/nvidia-h200-20261129T1736.log` above.)

## Prediction

About 999 TFLOP/s at 8k.
"""


def test_a_drifted_number_fails_naming_its_line_and_the_record(tmp_path, rec):
    good = tmp_path / "good.md"
    good.write_text(PARA.format(v="458", t="453.6").replace("(`bench/logs/nvidia-h200-20261129T1736.log` above.)\n\n",
                                                           "").replace("| non-causal", "(`bench/logs/nvidia-h200-"
                                                                                       "20261129T1736.log`):\n\n| non-causal"))
    assert all(v.ok is not False for v in document_verdicts(good, rec, "08"))
    bad = tmp_path / "bad.md"
    bad.write_text(good.read_text().replace("440 / 458 / 462", "440 / 459 / 462").replace("| 453.6 |", "| 455.0 |"))
    drift = [v.line() for v in document_verdicts(bad, rec, "08") if v.ok is False]
    assert len(drift) == 2
    assert drift[0].startswith("bad.md:5: 459 (TFLOP/s of stage 08 at 8k non-causal) but the results file says 458.4")
    assert "455.0" in drift[1] and "log nvidia-h200-20261129T1736.log says 453.6" in drift[1]


def test_predictions_markers_and_stale_stages_are_exempt(tmp_path, rec):
    """The marker covers the paragraph after it and the table that paragraph introduces, not what
    follows; a Prediction section is not checked; a stale stage's numbers wait for a new run."""
    text = PARA.format(v="999", t="999.0").replace("On the H200", "<!-- numbers: unchecked, a dev loop -->\nOn the H200")
    text = text.replace("(`bench/logs/nvidia-h200-20261129T1736.log` above.)", "Measured: 998 TFLOP/s at 8k.")
    text += "\nMeasured: 997 TFLOP/s at 8k.\n"
    path = tmp_path / "notes.md"
    path.write_text(text)
    verdicts = document_verdicts(path, rec, "08")
    marked = {v.quote.text for v in verdicts if v.reason == "marked unchecked: a dev loop"}
    assert {"440", "999", "999.0"} <= marked and "998" not in marked
    assert any(v.ok is False and v.quote.text == "998" for v in verdicts)  # after the table: checked again
    assert [v.reason for v in verdicts if v.quote.text == "997"] == ["a prediction"]
    stale = Records(rec.nums, dict(rec.hashes, **{"08": "0" * 16}))
    path.write_text(PARA.format(v="999", t="453.6"))
    first = [v for v in document_verdicts(path, stale, "08") if v.quote.line == 5]
    assert first and all("stage 08's record is stale" in v.reason and v.ok is None for v in first)
