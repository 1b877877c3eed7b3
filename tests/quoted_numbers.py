"""The numbers that README.md and the stages' notes quote from the committed records, found and
checked against those records (tests/test_quoted_numbers.py runs it).

What a number quotes is read from where it stands:

- **Its source** is the nearest run or log the text cites above it in the same section (a run id
  such as ``run 20261129T173630Z`` or ``T181749Z``, or a log such as
  ``bench/logs/nvidia-h200-20261129T1736.log`` or ``…T1044.log``). A run the committed results
  file holds (bench/results/nvidia-h200.json) is checked against that file; an earlier run, or a
  run whose entries a later run replaced in the file (it keeps one entry per arm, shape and mask),
  is checked against the summary table of its log in bench/logs/ (the harness prints every arm's
  TFLOP/s and ratios there). Text that cites nothing quotes the
  results file as it is now.
- **What it is** comes from the table it stands in (a column ``TFLOP/s``, ``stage 17``,
  ``FA3``, ``vs FA4``, ``22 / FA3``, ``over cuDNN``, ``11 / 10``; a row naming the shape and the
  mask) or from a sentence of a known form (``441 / 453 / 457 TFLOP/s at 4k / 8k / 16k``,
  ``+25 % over stage 07 at 8k``, ``0.69× FlashAttention-4``, ``stage 07 sits at 366 TFLOP/s at
  8k``). The stage is the notes' own unless the table or sentence names another.

Not checked, by rule (each reported with its reason by test_quoted_numbers.py):

- a section whose heading says "Prediction" (and not "measure"), and a paragraph that opens with
  "Predicted", "Prediction" or "Expect": predictions, not quotes;
- a paragraph or table after the marker ``<!-- numbers: unchecked, <reason> -->`` on a line of its
  own (up to the next blank line after the next paragraph or table): numbers quoted from a
  development loop, a profiler or another tool that writes no committed record;
- a number whose source is a log that is not committed or has no summary table (it is listed);
- a number of a stage whose entry in the results file was measured on sources other than the
  stage's current ones (the entry's source hash against the stage's): skipped, with the two
  hashes, until the stage is measured again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from hopattn import lineage
from hopattn.records import models as model_records
from hopattn.records import results

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
LOGS = REPO / "bench" / "logs"
GPU = "nvidia-h200"
SHAPES = {"4k": 4096, "8k": 8192, "16k": 16384}
BY_LENGTH = {v: k for k, v in SHAPES.items()}
PEER_WORDS = {"fa3": "fa3", "fa4": "fa4", "cudnn": "cudnn", "flashattention-3": "fa3", "flashattention-4": "fa4",
              "flashattention-2": "fa2"}
MARKER = re.compile(r"^<!--\s*numbers:\s*unchecked,?\s*(.*?)\s*-->\s*$")
# a run id, "20261129T173630Z", or its start, "20261202T0007", or after one of the same day "T0009"
RUN_RE = re.compile(r"(?<![\w-])(?:(20\d{6})T|T)(\d{6}Z|\d{4}(?![\d.]))")
LOG_RE = re.compile(r"(?:bench/logs/)?((?:[a-z0-9-]+-)?(?:nvidia-h200-)?(20\d{6})T(\d{4})[\w.-]*?\.log)|…(T\d{4}[\w-]*\.log)")
NUM = r"(\d+(?:\.\d+)?)"
# tools that time or profile without writing a committed record: what they printed is quoted as is
TOOL_RE = re.compile(r"research/(?:devtime|variants|compare|ncu_once|ncu_fa4|sched_sim|ltx2_shapes)\.py|"
                     r"development (?:timing )?loop|Nsight Compute")


@dataclass(frozen=True)
class Quote:
    """One number as written, what it stands for, and where it is."""

    file: str
    line: int
    text: str  # the number as written ("441.6", "+28", "0.69")
    what: tuple  # ("tflops", subject, shape, causal) | ("ratio", stage, peer, shape, causal) | ("gain", stage, other, shape, causal, percent)
    approx: bool = False  # "about", "near", "≈", "~": within 3 %

    @property
    def value(self) -> float:
        return float(self.text.replace("−", "-").replace("+", ""))

    @property
    def decimals(self) -> int:
        return len(self.text.split(".")[1]) if "." in self.text else 0


@dataclass
class Verdict:
    quote: Quote
    source: str  # "record", "log <name>", or why there is none
    expected: float | None = None
    ok: bool | None = None  # None: not checked (see reason)
    reason: str = ""

    def line(self) -> str:
        q = self.quote
        where = f"{q.file}:{q.line}"
        if self.ok is False:
            return (f"{where}: {q.text} ({_describe(q.what)}) but {self.source} says {self.expected:.4g}"
                    + (f" ({self.reason})" if self.reason else ""))
        return f"{where}: {q.text} ({_describe(q.what)}): {self.reason}"


def _describe(what: tuple) -> str:
    kind = what[0]
    if kind in ("model", "spread"):
        return " ".join(str(w) for w in what[1:])
    mask = lambda c: "causal" if c else "non-causal"  # noqa: E731
    if kind == "tflops":
        return f"TFLOP/s of {_name(what[1])} at {what[2]} {mask(what[3])}"
    if kind == "ratio":
        return f"{_name(what[1])} over {what[2]} at {what[3]} {mask(what[4])}"
    return (f"{_name(what[1])} over stage {what[2]} at {what[3]} {mask(what[4])}"
            + (", in per cent" if what[5] else ""))


def _name(subject: str) -> str:
    return f"stage {subject}" if subject.isdigit() else subject


# --- the records ------------------------------------------------------------------------------

@dataclass
class Records:
    nums: results.GpuResults
    hashes: dict[str, str]
    logs: dict[str, dict] = field(default_factory=dict)  # log name -> {(kind, name, shape, causal): entry}

    @classmethod
    def load(cls) -> Records:
        nums = next(n for n in results.load_indexed(RESULTS) if n.gpu == GPU)
        return cls(nums, {s.id: s.source_hash() for s in lineage.discover()})

    @property
    def runs(self) -> set[str]:
        """The benchmark record's runs and the model record's (bench.models), the ids a page may cite."""
        models = RESULTS / f"models-{GPU}.json"
        model_runs = json.loads(models.read_text()).get("runs", []) if models.is_file() else []
        return set(self.nums.data["runs"]) | set(model_runs)

    def log(self, name: str) -> dict | None:
        if name not in self.logs:
            path = LOGS / name
            self.logs[name] = parse_log(path.read_text()) if path.is_file() else None
        return self.logs[name]

    def log_of_run(self, run_id: str) -> str | None:
        day, hhmm = run_id[:8], run_id[9:13]
        found = sorted(p.name for p in LOGS.glob(f"{GPU}-{day}T{hhmm}*.log"))
        return found[0] if found else None

    def stale(self, stage_id: str, entry: dict | None) -> str | None:
        """Why a stage's entry is not its current sources' (None: it is)."""
        if entry is None or stage_id not in self.hashes or not results.is_stale(entry, self.hashes[stage_id]):
            return None
        return (f"stage {stage_id}'s record is stale: measured on source {entry['source_hash']}, its sources are now "
                f"{self.hashes[stage_id]}; measure it again to check this number")


_ROW = re.compile(r"^(stage \d\d|[a-z][\w-]*)\s+(\S+) (non-causal|causal)\s+(\w+)\s+(.*)$")


def parse_log(text: str) -> dict:
    """The summary table `python -m bench` prints at the end of a run: per arm, shape and mask its
    TFLOP/s and its ratios to the reference peers timed in the run. A log cut before its header
    names the ratio columns by the peer whose own row reads 1.000 in it."""
    head = None
    rows = []
    for line in text.splitlines():
        if line.startswith("arm ") and "TFLOP/s" in line:
            head = re.findall(r"vs (\w+)", line)
            continue
        m = _ROW.match(line)
        if m and m.group(4) == "ok":
            rows.append(m.groups())
    if head is None:  # no header: each ratio column is the peer's whose own row reads 1.000 there
        width = max((len(r[4].split()) for r in rows), default=0) - 4
        head = [None] * max(width, 0)
        for arm, _shape, _mask, _status, rest in rows:
            for i, cell in enumerate(rest.split()[3:3 + len(head)]):
                if cell == "1.000" and not arm.startswith("stage "):
                    head[i] = arm
    out: dict = {}
    for arm, shape, mask, _status, rest in rows:
        cells = rest.split()
        try:
            tflops = float(cells[0])
        except (ValueError, IndexError):
            continue
        ratios = {}
        for i, peer in enumerate(head):  # "-": that peer did not run
            try:
                if peer:
                    ratios[peer] = float(cells[3 + i])
            except (ValueError, IndexError):
                pass
        kind, name = ("stage", arm.split()[1]) if arm.startswith("stage ") else ("peer", arm)
        out[(kind, name, shape, mask == "causal")] = {"tflops": tflops, "ratios": ratios}
    return out


# --- the documents ----------------------------------------------------------------------------

@dataclass
class Block:
    kind: str  # "table" | "para"
    start: int  # 1-based line of its first line
    lines: list[str]
    section: str  # the headings above it, joined by " / "
    cited: list[tuple[int, str]]  # (line, citation) seen in the section up to and including this block
    unchecked: str | None  # the reason of a `numbers: unchecked` marker above it
    before: list[tuple[int, str]] = field(default_factory=list)  # the section's citations above the block
    own: list[tuple[int, str]] = field(default_factory=list)  # (character offset, citation) within it


def blocks(text: str) -> list[Block]:
    out: list[Block] = []
    heads: list[tuple[int, str]] = []
    cited: list[tuple[int, str]] = []
    marker: str | None = None
    cur: list[str] = []
    start = 0
    kind = ""
    fence = False

    def flush():
        nonlocal cur, marker
        if cur:
            b = Block(kind, start, cur, " / ".join(h for _, h in heads), [], marker, before=list(cited))
            offset = 0
            for i, ln in enumerate(cur):
                found = _citations(ln, with_pos=True)
                cited.extend((start + i, c) for _, c in found)
                b.own.extend((offset + pos, c) for pos, c in found)
                offset += len(ln) + 1
            b.cited = list(cited)
            out.append(b)
            # a marker covers the block after it, and the table its lead paragraph introduces
            if marker is not None and not (kind == "para" and _next_is_table(text, start + len(cur) - 1)):
                marker = None
        cur = []

    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            flush()
            fence = not fence
            continue
        if fence:
            continue
        m = MARKER.match(line.strip())
        if m:
            flush()
            marker = m.group(1) or "marked unchecked"
            continue
        h = re.match(r"^(#+)\s+(.*)", line)
        if h:
            flush()
            level = len(h.group(1))
            heads = [x for x in heads if x[0] < level] + [(level, h.group(2))]
            cited = []
            marker = None
            continue
        if not line.strip():
            flush()
            continue
        this = "table" if line.lstrip().startswith("|") else "para"
        if cur and this != kind:
            flush()
        if not cur:
            start, kind = n, this
        cur.append(line)
    flush()
    return out


def _next_is_table(text: str, after: int) -> bool:
    for line in text.splitlines()[after:]:
        if line.strip():
            return line.lstrip().startswith("|")
    return False


def _citations(line: str, with_pos: bool = False) -> list:
    """Runs and logs a line cites, as "run <id>" or "log <name>", in order ("T181749Z" after a run
    of the same day is that day's)."""
    found = []
    day = None
    for m in RUN_RE.finditer(line):
        day = m.group(1) or day
        found.append((m.start(), f"run {day or '?'}T{m.group(2).rstrip('Z')}"))
    last_day = None
    for m in LOG_RE.finditer(line):
        if m.group(1):
            name = m.group(1)
            if not name.startswith(("nvidia-h200-", "models-", "compare-", "trace-", "gpu-", "softmax-", "ltx2-")):
                name = f"{GPU}-{name}"
            last_day = m.group(2)
            found.append((m.start(), f"log {name}"))
        else:
            found.append((m.start(), f"log …{m.group(4)}"))
    for m in TOOL_RE.finditer(line):
        found.append((m.start(), f"tool {m.group(0)}"))
    out = sorted(found)
    if last_day is not None:
        out = [(pos, c.replace("run ?", f"run {last_day}")) for pos, c in out]
    return out if with_pos else [c for _, c in out]


def is_prediction(b: Block) -> bool:
    last = b.section.split(" / ")[-1].lower() if b.section else ""
    if "predict" in last and "measure" not in last:
        return True
    first = b.lines[0].lstrip("*_ -").lower()
    return first.startswith(("predicted", "prediction", "expect", "written from the sass"))


# --- what a table says --------------------------------------------------------------------------

def _cells(line: str) -> list[str]:
    return [c.strip().strip("*").strip() for c in line.strip().strip("|").split("|")]


def _shape_of(label: str) -> str | None:
    low = label.lower()
    for sh in ("16k", "8k", "4k"):
        if re.search(rf"(?<![\w.]){sh}(?![\w-])", low):
            return sh
    for n, sh in BY_LENGTH.items():
        if re.search(rf"\b{n}\b", label):
            return sh
    return None


def _mask_of(label: str) -> bool | None:
    low = label.lower()
    if "non-causal" in low:
        return False
    if re.search(r"\bcausal\b", low):
        return True
    return None


def _subject(text: str, own: str) -> str | None:
    """The stage or peer a column header or phrase names ("stage 17", "this stage", "FA3")."""
    low = text.lower().replace("**", "").strip()
    low = re.sub(r",?\s*tflop/s$", "", low).strip()
    m = re.fullmatch(r"stage (\d\d)", low)
    if m:
        return m.group(1)
    if low in ("this stage", "tflop/s", ""):
        return own
    return PEER_WORDS.get(low)


def _column(head: str, own: str):
    """What a column holds: ("tflops", subject) | ("ratio", stage, peer) | ("gain", stage, other) | None."""
    h = head.lower().replace("**", "").strip()
    s = _subject(h, own) if h not in ("",) else None
    if h == "tflop/s" or (s is not None and h != ""):
        return ("tflops", s)
    m = re.fullmatch(r"(?:vs|over) (fa3|fa4|cudnn|flashattention-[34])", h)
    if m:
        return ("ratio", own, PEER_WORDS[m.group(1)])
    m = re.fullmatch(r"(\d\d|this stage) / (fa3|fa4|cudnn)", h)
    if m:
        return ("ratio", own if m.group(1) == "this stage" else m.group(1), m.group(2))
    m = re.fullmatch(r"(\d\d) / (\d\d)", h)
    if m:
        return ("gain", m.group(1), m.group(2))
    m = re.fullmatch(r"over stage (\d\d)(?: \(ratio of medians\))?", h)
    if m:
        return ("gain", own, m.group(1))
    return None


def table_quotes(file: str, b: Block, own: str) -> tuple[list[Quote], list[str]]:
    """The quotes of a results table, and the headers of the columns it could not read."""
    rows = [r for r in b.lines if not re.fullmatch(r"\|?[\s:|-]+\|?", r.strip())]
    if len(rows) < 2:
        return [], []
    head = _cells(rows[0])
    default_mask = _mask_of(head[0])
    columns = [_column(h, own) for h in head[1:]]
    if not any(columns) or not any(c and c[0] == "tflops" for c in columns) and not any(
            c and c[0] in ("ratio", "gain") for c in columns):
        return [], []
    unread = [h for h, c in zip(head[1:], columns) if c is None and h]
    out = []
    for row in rows[1:]:
        cells = _cells(row)
        label = cells[0]
        if re.search(r"Llama|Wan|LTX", label) or any(re.search(r"\d ms\b", c) for c in cells):
            continue  # a model's row: the model record's, not the results file's
        shape, mask = _shape_of(label), _mask_of(label)
        mask = default_mask if mask is None else mask
        if mask is None:
            mask = False
        line = b.start + b.lines.index(row)
        for cell, col in zip(cells[1:], columns):
            if col is None:
                continue
            parts = [p.strip().strip("*").strip() for p in cell.split(" / ")]
            if shape is None and len(parts) == 3:  # a row per mask, its cells at 4k / 8k / 16k
                shapes = list(SHAPES)
            elif shape is not None and len(parts) == 1:
                shapes = [shape]
            else:
                continue
            for sh, part in zip(shapes, parts):
                m = re.fullmatch(r"([+−-]?\d+(?:\.\d+)?)\s*(%|×)?", part.replace(",", ""))
                if not m:
                    continue
                text, unit = m.group(1), m.group(2)
                if col[0] == "tflops":
                    what = ("tflops", col[1], sh, mask)
                elif col[0] == "ratio":
                    what = ("ratio", col[1], col[2], sh, mask)
                else:
                    what = ("gain", col[1], col[2], sh, mask, unit == "%")
                out.append(Quote(file, line, text, what))
    return out, unread


# --- what a sentence says -----------------------------------------------------------------------

APPROX = r"(?:(about|near|roughly|~|≈)\s?)?"
SENTENCES = (
    # 441 / 453 / 457 TFLOP/s at 4k / 8k / 16k
    (re.compile(rf"{APPROX}{NUM} / {NUM} / {NUM}\s+TFLOP/s at 4k / 8k / 16k"), "three"),
    # +28% over stage 07 (at 8k)
    # (not one of a list, "+2.5 %, +4.6 % and +2.4 % over stage 18": a shape each, said elsewhere)
    (re.compile(rf"(?<!%, )(?<!% and )([+−-]{NUM}) ?% (?:over|on) stage (\d\d)(?: at (4k|8k|16k))?"), "gain"),
    # 0.69× FlashAttention-4 / FA3 / cuDNN (not the end of a range, "0.97–1.02×")
    (re.compile(r"(?<![\d.][–-])(?<![\d.] to )(\d\.\d+)× (FlashAttention-[34]|FA[34]|cuDNN)\b"), "ratio"),
    # stage 07 sits near 320 TFLOP/s at 8k; Stage 07 reaches 366 TFLOP/s at 8k
    (re.compile(rf"[Ss]tage (\d\d) (?:sits|reaches|runs|is)(?: at| near)? {APPROX}{NUM}\s+TFLOP/s at (4k|8k|16k)"),
     "other"),
    # Measured: 82 TFLOP/s at 8k
    (re.compile(rf"Measured(?: at 8k)?: {APPROX}{NUM}\s+TFLOP/s(?: at (4k|8k|16k))?"), "own"),
)


def sentence_quotes(file: str, b: Block, own: str) -> list[tuple[int, Quote]]:
    text = "\n".join(b.lines)
    starts = [0]
    for ln in b.lines:
        starts.append(starts[-1] + len(ln) + 1)

    def line_of(pos: int) -> int:
        return b.start + max(i for i, s in enumerate(starts) if s <= pos)

    def shape_near(pos: int, end: int) -> str:
        sentence_end = text.find(".", end)
        found = _shape_of(text[end:sentence_end if sentence_end > 0 else None][:40])
        return found or "8k"

    out = []
    for rx, kind in SENTENCES:
        for m in rx.finditer(text):
            before = text[max(0, m.start() - 60):m.start()].lower()
            causal = "causal" in before and "non-causal" not in before
            if kind == "three":
                approx = bool(m.group(1))
                for sh, val in zip(SHAPES, m.groups()[1:4]):
                    out.append((m.start(), Quote(file, line_of(m.start()), val, ("tflops", own, sh, causal), approx)))
            elif kind == "gain":
                sh = m.group(4) or "8k"
                out.append((m.start(), Quote(file, line_of(m.start()), m.group(1),
                                             ("gain", own, m.group(3), sh, causal, True))))
            elif kind == "ratio":
                peer = PEER_WORDS[m.group(2).lower()]
                out.append((m.start(), Quote(file, line_of(m.start()), m.group(1),
                                             ("ratio", own, peer, shape_near(m.start(), m.end()), causal))))
            elif kind == "other":
                out.append((m.start(), Quote(file, line_of(m.start()), m.group(3),
                                             ("tflops", m.group(1), m.group(4), False), bool(m.group(2)))))
            else:
                out.append((m.start(), Quote(file, line_of(m.start()), m.group(2),
                                             ("tflops", own, m.group(3) or "8k", False), bool(m.group(1)))))
    return out


# --- checking --------------------------------------------------------------------------------

def sources(b: Block, rec: Records, cited: list[str] | None = None) -> list[tuple[str, str | None]]:
    """Where a block's numbers come from, nearest citation first (the last of ``cited``, by default
    every citation of the section up to the block's end): ("record", run id or None), ("log", name)
    or ("none", why). Text that cites nothing quotes the results file as it is."""
    cited = [c for _, c in b.cited] if cited is None else cited
    if not cited:
        return [("record", None)]
    out: list[tuple[str, str | None]] = []
    last_log = None
    resolved = []
    for c in cited:  # "…T1044.log" is the last full log name's with its time replaced
        if c.startswith("log …") and last_log:
            c = "log " + re.sub(r"T\d{4}.*$", c[5:], last_log)
        elif c.startswith("log "):
            last_log = c[4:]
        resolved.append(c)
    for c in reversed(resolved):
        if c.startswith("tool "):
            src = ("none", f"quoted from {c[5:]}, which writes no committed record")
        elif c.startswith("run "):
            run = c[4:]
            if "?" in run:
                continue
            full = next((r for r in sorted(rec.runs) if r.startswith(run)), None)
            if full is not None:  # the file's entries of that run, else (a later run replaced them) its log
                log = rec.log_of_run(full)
                if log:
                    if ("record", full) not in out:
                        out.append(("record", full))
                    src = ("log", log)
                else:
                    src = ("record", full)
            else:
                log = rec.log_of_run(run)
                src = ("log", log) if log else ("none", f"run {run} is in no committed record or log")
        else:
            name = c[4:]
            m = re.search(r"(20\d{6})T(\d{4})", name)
            run = next((r for r in rec.runs if m and r.startswith(f"{m.group(1)}T{m.group(2)}")), None)
            if run is not None and name.startswith(f"{GPU}-"):
                if ("record", run) not in out:
                    out.append(("record", run))
                src = ("log", name) if rec.log(name) else ("record", run)
            elif name.startswith(f"{GPU}-") and rec.log(name):
                src = ("log", name)
            else:
                src = ("none", f"quoted from {name}, which holds no harness summary")
        if src not in out:
            out.append(src)
    return out or [("record", None)]


def _entry(rec: Records, source: tuple[str, str | None], kind: str, name: str, shape: str, causal: bool):
    if source[0] == "none":
        return None
    if source[0] == "record":
        e = rec.nums.by_key.get((kind, name, shape, causal))
        if e is None or e.get("status") != "ok":
            return None
        if source[1] is not None and e["run_id"] != source[1]:
            return None
        return e
    table = rec.log(source[1])
    if table is None:
        return None
    return table.get((kind, name, shape, causal))


def _values(q: Quote, source, rec: Records) -> list[float]:
    what = q.what

    def get(subject, shape, causal):
        return _entry(rec, source, "stage" if subject.isdigit() else "peer", subject, shape, causal)

    if what[0] == "tflops":
        e = get(what[1], what[2], what[3])
        return [e["tflops"]] if e else []
    if what[0] == "ratio":
        e = get(what[1], what[3], what[4])
        return [e["ratios"][what[2]]] if e and what[2] in (e.get("ratios") or {}) else []
    a, b = get(what[1], what[3], what[4]), get(what[2], what[3], what[4])
    if not a or not b:
        return []
    v = a["tflops"] / b["tflops"]
    return [(v - 1) * 100 if what[5] else v]


def _stages_of(q: Quote) -> list[tuple[str, str, bool]]:
    w = q.what
    if w[0] == "tflops":
        return [(w[1], w[2], w[3])] if w[1].isdigit() else []
    if w[0] == "ratio":
        return [(w[1], w[3], w[4])]
    return [(w[1], w[3], w[4]), (w[2], w[3], w[4])]


def check(q: Quote, srcs: list[tuple[str, str | None]], rec: Records) -> Verdict:
    """The quote against the first of its sources that holds what it stands for."""
    for src in srcs:
        values = _values(q, src, rec)
        if not values:
            continue
        where = "the results file" if src[0] == "record" else f"log {src[1]}"
        if src[0] == "record":
            for sid, shape, causal in _stages_of(q):
                why = rec.stale(sid, rec.nums.stage(sid, shape, causal))
                if why:
                    return Verdict(q, where, reason=why)
        v = values[0]
        tol = 0.5 * 10 ** -q.decimals + 1e-9
        if q.approx:
            tol = max(tol, abs(v) * 0.03)
        if q.what[0] == "gain" and q.what[5]:
            tol += 0.06  # a percentage from two rounded TFLOP/s
        return Verdict(q, where, expected=v, ok=abs(q.value - v) <= tol)
    names = [f"log {s[1]}" if s[0] == "log" else "the results file" if s[0] == "record" else s[1] for s in srcs]
    return Verdict(q, ", ".join(names), reason="not found in " + "; ".join(names))


def document_verdicts(path: Path, rec: Records, own: str | None, sections: tuple[str, ...] | None = None,
                      sentences: bool = True) -> list[Verdict]:
    """Every quote of one Markdown file, checked or with the reason it is not. ``own``: the stage of
    a notes file; ``sections``: only the sections whose heading path contains one of these."""
    rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    out = []
    for b in blocks(path.read_text()):
        if sections is not None and not any(s in b.section for s in sections):
            continue
        if b.kind == "table":
            placed = [(None, q) for q in table_quotes(rel, b, own or "")[0]]
        elif sentences and own:
            placed = sentence_quotes(rel, b, own)
        else:
            placed = []
        if not placed:
            continue
        quotes = [q for _, q in placed]
        if is_prediction(b):
            out += [Verdict(q, "", reason="a prediction") for q in quotes]
            continue
        if b.unchecked is not None:
            out += [Verdict(q, "", reason=f"marked unchecked: {b.unchecked}") for q in quotes]
            continue
        if b.kind == "table":  # a table quotes one run: the cited one that matches most of it, nearest first
            srcs = sources(b, rec)
            best = max(srcs, key=lambda src: sum(bool(check(q, [src], rec).ok) for q in quotes))
            if sum(bool(check(q, [best], rec).ok) for q in quotes) == 0:
                best = srcs[0]
            ordered = [best] + [x for x in srcs if x != best]
            out += [check(q, ordered, rec) if best[0] != "none" else Verdict(q, "", reason=best[1]) for q in quotes]
            continue
        for pos, q in placed:  # a sentence quotes what the text cited last before it (else after it, within the block)
            earlier = [c for _, c in b.before]
            inside = [c for at, c in b.own if at < pos] or [c for _, c in b.own]
            srcs = sources(b, rec, earlier + inside)
            first = srcs[0]
            out.append(check(q, srcs, rec) if first[0] != "none" else Verdict(q, "", reason=first[1]))
    return out


# --- the model record ---------------------------------------------------------------------------

MODEL_WORDS = (("Llama-3.1-8B prefill at 32k", "llama-3.1-8b-prefill-32k"),
               ("Llama-3.1-8B prefill at 8k", "llama-3.1-8b-prefill-8k"),
               ("- LTX-2:", "ltx-2-512x768x121"),  # its step by the rule below; its replayed calls here
               ("SD3 Medium at 1024 px", "sd3-medium-1024px"),
               ("Gemma-3-12B prefill at 8k", "gemma-3-12b-prefill-8k"))


def model_verdicts(path: Path, lines: range | None = None) -> list[Verdict]:
    """The README's model bullets: every speedup, spread and sample count against the model record."""
    record = model_records.load_all(RESULTS)[GPU]
    rel = path.relative_to(REPO).as_posix()
    text = path.read_text().splitlines()
    out = []
    models = record["models"]

    def case(key, backend="hopattn"):
        return models[key]["cases"][backend]

    for n, line in enumerate(text, 1):
        if lines is not None and n not in lines:
            continue
        found = []
        for words, key in MODEL_WORDS:
            if words in line:
                found.append(key)
        if "Wan2.1" in line and "14B" in line and "1.3B" in line:
            m = re.search(rf"{NUM}× a step for 14B, {NUM}× for 1\.3B", line)
            if m:
                out += [_model_check(rel, n, m.group(1), case("wan2.1-t2v-14b-480p")["speedup_step"], "Wan2.1 14B step"),
                        _model_check(rel, n, m.group(2), case("wan2.1-t2v-1.3b-480p")["speedup_step"], "Wan2.1 1.3B step")]
        if line.strip().startswith("- LTX-2:"):
            m = re.search(rf"{NUM}×", line)
            if m:
                out.append(_model_check(rel, n, m.group(1), case("ltx-2-512x768x121")["speedup_step"], "LTX-2 step"))
        m = re.search(r"(\d+) steps of each backend", line)
        if m:
            for key in sorted(models):
                for backend in ("hopattn", "sdpa"):
                    out.append(_model_check(rel, n, m.group(1), models[key]["cases"][backend]["step_ms"]["samples"],
                                            f"{key} {backend} samples"))
        for key in found:
            block = " ".join(text[n - 1:n + 3])
            block = block.split("    - ", 2)[1] if block.count("    - ") > 1 else block
            step = re.search(rf"{NUM}× (?:a step|by the medians)", block)
            if step:
                out.append(_model_check(rel, n, step.group(1), case(key)["speedup_step"], f"{key} step", text))
            fa3 = re.search(rf"FA3 through the same path: {NUM}×", block)
            if fa3:
                out.append(_model_check(rel, n, fa3.group(1), case(key, "fa3")["speedup_step"], f"{key} FA3 step",
                                        text))
            attn = re.search(rf"replayed,?\s+(?:run at\s+)?{NUM}×", block)
            if attn:
                out.append(_model_check(rel, n, attn.group(1), case(key)["speedup_attention"], f"{key} attention",
                                        text))
            spreads = re.findall(rf"{NUM} % \((hopattn|SDPA)\)", block)
            for val, who in spreads:
                backend = "hopattn" if who == "hopattn" else "sdpa"
                out.append(_model_check(rel, n, val, case(key, backend)["step_ms"]["spread_pct"], f"{key} {who} spread",
                                        text))
            single = re.search(rf"spread {NUM} %,", block)
            if single:
                out.append(_model_check(rel, n, single.group(1), case(key)["step_ms"]["spread_pct"], f"{key} spread",
                                        text))
    return out


def _model_check(file: str, line: int, text: str, expected: float, what: str, lines: list[str] | None = None) -> Verdict:
    if lines is not None:  # the line the number stands on, of the bullet's first four
        line = next((line + k for k in range(4) if line - 1 + k < len(lines) and text in lines[line - 1 + k]), line)
    q = Quote(file, line, text, ("model", what))
    tol = 0.5 * 10 ** -q.decimals + 1e-9
    return Verdict(q, "the model record", expected=expected, ok=abs(q.value - expected) <= tol)


# --- the README ---------------------------------------------------------------------------------

# Its Status section's sentences, each of a known form: (pattern, what each group stands for).
def _words(pattern: str) -> re.Pattern:
    """A sentence's pattern that holds across line breaks: each space matches any whitespace."""
    return re.compile(pattern.replace(" ", r"\s+"))


README_SENTENCES = (
    (_words(rf"{NUM} in the harness \(and {NUM} at 8k\)"),
     (("tflops", "22", "16k", False), ("tflops", "22", "8k", False))),
    (_words(rf"FA3 made {NUM} at 16k"), (("tflops", "fa3", "16k", False),)),
    (_words(rf"8k BSHD with the mask, {NUM}"), (("ratio", "22", "fa3", "8k-bshd", True),)),
    (_words(rf"the medians read {NUM} against FA3's {NUM}"),
     (("tflops", "22", "8k-bshd", True), ("tflops", "fa3", "8k-bshd", True))),
    (_words(rf"64 sequences of 512 keys with the mask(?:: level)?, {NUM}"), (("ratio", "22", "fa3", "512x64", True),)),
    (_words(rf"level with it at 4k and 8k causal \({NUM} and {NUM}\)"),
     (("ratio", "22", "fa3", "4k", True), ("ratio", "22", "fa3", "8k", True))),
    (_words(rf"Its rounds spread {NUM} to {NUM} %"), (("spread", "22", "min"), ("spread", "22", "max"))),
)


def readme_verdicts(rec: Records, path: Path = REPO / "README.md") -> list[Verdict]:
    """README.md's Status section: its table, its sentences of a known form, its model bullets."""
    rel = path.relative_to(REPO).as_posix()
    text = path.read_text()
    out = []
    status = [b for b in blocks(text) if b.section.startswith("hopattn") and b.section.endswith("Status")]
    for b in status:
        if b.kind == "table":
            quotes, _ = table_quotes(rel, b, "")
            srcs = sources(b, rec)
            out += [check(q, srcs, rec) for q in quotes]
            continue
        joined = "\n".join(b.lines)
        for rx, whats in README_SENTENCES:
            for m in rx.finditer(joined):
                line = b.start + joined[:m.start()].count("\n")
                for val, what in zip(m.groups(), whats):
                    q = Quote(rel, line, val, what)
                    out.append(_spread(q, rec) if what[0] == "spread" else check(q, [("record", None)], rec))
    lines = range(min(b.start for b in status), max(b.start + len(b.lines) for b in status)) if status else None
    return out + model_verdicts(path, lines)


def _spread(q: Quote, rec: Records) -> Verdict:
    """The smallest or largest spread of a stage's rounds over the six points (4k, 8k, 16k, both masks)."""
    sid = q.what[1]
    entries = [rec.nums.stage(sid, sh, c) for sh in SHAPES for c in (False, True)]
    for e in entries:
        why = rec.stale(sid, e)
        if why:
            return Verdict(q, "the results file", reason=why)
    spreads = [e["spread_pct"] for e in entries if e and e.get("spread_pct") is not None]
    v = min(spreads) if q.what[2] == "min" else max(spreads)
    return Verdict(q, "the results file", expected=v, ok=abs(q.value - v) <= 0.5 * 10 ** -q.decimals + 1e-9)
