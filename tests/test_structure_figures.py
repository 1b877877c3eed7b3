"""The figures of stages 23 and 24's changes: the kernel's code by role, read out of kernel.cu
(site_gen/diagrams/structure.py, code_parse.py), and the tile of each head dim, read out of
HeadDimTile<D> (head_dims.py). Checked against the sources with plain regular expressions of
their own, so a parse that drifted from the source fails here."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET

import pytest
from hopattn import lineage

from site_gen.diagrams import all_diagrams, concept_diagrams, stage_diagrams
from site_gen.diagrams.code_parse import StructureError, lambdas, parse
from site_gen.diagrams.head_dims import head_dim_tiles
from site_gen.diagrams.section import distinct, last_change
from site_gen.diagrams.structure import structure_diagram
from site_gen.pages.stage import lead_for

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def stages():
    return lineage.discover()


@pytest.fixture(scope="module")
def by_id(stages):
    return {s.id: s for s in stages}


def _texts(svg: str) -> str:
    return "\n".join("".join(t.itertext()) for t in ET.fromstring(svg).iter(SVG + "text"))


def _methods(source: str, struct: str) -> list[str]:
    """The method names of ``struct`` in a kernel.cu, by a regex of this test's own."""
    m = re.search(rf"\bstruct {struct}\b[^;{{]*\{{", source)
    assert m, struct
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        i += 1
    return re.findall(r"__device__ __forceinline__ [^;{}()]*?\b(\w+)\(", source[m.end():i])


def _drawn(stages):
    every = all_diagrams(stages)
    return {s.number: (s, [d for d in every if d.stage == s.number]) for s in stages}


def test_stage_23_opens_with_its_code_by_role(stages, by_id):
    mine = stage_diagrams(by_id["23"], stages) + concept_diagrams(by_id["23"], stages)
    assert lead_for(by_id["23"], mine) == "s23-structure"
    d = next(d for d in mine if d.id == "s23-structure")
    assert d.kind == "structure" and d.stage == 23
    text = _texts(d.svg)
    for role in ("Setup, every thread", "Producer: producer.run", "Tile scheduler", "Consumer warpgroups",
                 "Mainloop, mma side", "Epilogue", "Softmax"):
        assert role in text, role
    source = by_id["23"].kernel_path.read_text()
    for struct in ("TileScheduler", "Producer", "ConsumerMainloop", "Softmax", "Epilogue"):
        assert struct in text
        for name in _methods(source, struct):
            assert re.search(rf"\b{name}\b", text), (struct, name)
    # the state structs with their members, in declaration order
    for struct in ("ProducerState", "ConsumerPipeline", "Softmax"):
        m = re.search(rf"\bstruct {struct} \{{(.*?)\n\}};", source, re.S)
        members = re.findall(r"^    (?:bool|float|int|uint32_t) ([^;(]+);", m.group(1), re.M)
        members = [re.sub(r"\s*=\s*(\{[^}]*\}|[^,]+)|\[\w*\]", "", x) for x in members]
        names = [x.strip() for part in members for x in part.split(",")]
        assert f"{struct}" in text and ", ".join(names) in text, (struct, names)
    # the consumers' loop, in the order kernel.cu calls it
    loop = [c.function.name for c in parse(by_id["23"].kernel_path).consumer]
    assert loop == ["receive", "describe_tile", "tile_rows", "mma", "store", "finish"]
    lines = text.split("\n")
    at = [next(i for i, ln in enumerate(lines) if re.search(rf"\b{n}\(", ln)) for n in ("receive", "mma", "finish")]
    assert at == sorted(at)


def test_it_counts_stage_22_from_its_source(stages, by_id):
    source = by_id["22"].kernel_path.read_text()
    n = len(re.findall(r"=\s*\[&\]", source))
    lines = source.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.startswith("__global__"))
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")  # the function's closing brace
    found = lambdas(by_id["22"].kernel_path)
    assert len(found.names) == n == 12
    assert found.lines == end - start + 1
    text = _texts(structure_diagram(by_id["23"], stages).svg)
    assert f"one __global__ attention_kernel of {found.lines} lines" in text
    assert f"{n} lambdas capturing" in text
    for name in found.names:
        assert name in text


def test_deterministic_and_unlike_stage_22s_figures(stages, by_id):
    a, b = structure_diagram(by_id["23"], stages), structure_diagram(by_id["23"], stages)
    assert a.svg == b.svg and a.signature == b.signature
    drawn = _drawn(stages)
    for d in drawn[22][1]:
        assert d.svg != a.svg and not a.same_picture(d)
    assert last_change("structure", by_id["23"], drawn) is None  # new on stage 23
    assert a in distinct(stages, drawn)


def test_the_same_source_draws_the_same_picture(stages, by_id, tmp_path):
    """A stage whose kernel.cu has stage 23's structure shows it unchanged since 23 (the picture's
    signature is what the parse found, not the stage's name)."""
    folder = tmp_path / "attention"
    shutil.copytree(by_id["23"].kernel_path.parent.parent / "common", folder / "common")
    for sid, name in (("22", "22_fast-divmod"), ("23", "23_roles"), ("24", "24_copy-of-23")):
        src = by_id[sid].kernel_path.parent
        shutil.copytree(src, folder / name)
    shutil.copy(by_id["23"].kernel_path, folder / "24_copy-of-23" / "kernel.cu")
    copied = {s.id: s for s in (lineage.load_stage(folder / n) for n in ("22_fast-divmod", "23_roles", "24_copy-of-23"))}
    d23, d24 = structure_diagram(copied["23"], list(copied.values())), structure_diagram(copied["24"], list(copied.values()))
    assert d23.same_picture(d24) and d23.id != d24.id
    assert "new" not in _texts(d24.svg).split("\n")  # nothing it calls is new against 23


def test_stage_24_marks_what_its_kernel_adds(stages, by_id):
    text = _texts(structure_diagram(by_id["24"], stages).svg)
    assert "next_consumer(" in text and "store_zeros(" in text
    assert "not in stage 23's kernel.cu:" in text


def test_a_source_without_the_structure_fails_loudly(stages, by_id, tmp_path):
    with pytest.raises(StructureError, match="22_fast-divmod/kernel.cu: the producer branch of attention_kernel "
                                             "calls no method of a struct"):
        parse(by_id["22"].kernel_path)
    with pytest.raises(StructureError, match="22_fast-divmod/kernel.cu"):
        structure_diagram(by_id["22"], stages)
    bad = tmp_path / "kernel.cu"
    bad.write_text(by_id["23"].kernel_path.read_text().replace("setmaxnreg_dec", "setmaxnreg_off"))
    with pytest.raises(StructureError, match=f"{re.escape(str(bad))}: attention_kernel has no producer branch"):
        parse(bad)
    bad.write_text("__device__ __forceinline__ int f() { return 0; }\n")
    with pytest.raises(StructureError, match="no __global__ function"):
        parse(bad)


def test_the_tile_of_each_head_dim(stages, by_id):
    s = by_id["24"]
    mine = stage_diagrams(s, stages) + concept_diagrams(s, stages)
    assert lead_for(s, mine) == "c-head-dim-tiles"
    d = head_dim_tiles(s, stages)
    assert d.svg == head_dim_tiles(s, stages).svg
    text = _texts(d.svg)
    source = s.kernel_path.read_text()
    for dim, dim_v in s.head_dims:
        m = re.search(rf"struct HeadDimTile<{dim}> \{{(.*?)\}};", source, re.S)
        assert m, dim
        n = dict((k, int(v)) for k, v in re.findall(r"constexpr int (\w+) = (\d+);", m.group(1)))
        assert n["HEAD_DIM"] == dim and n["HEAD_DIM_V"] == dim_v
        assert f"HeadDimTile<{dim}>" in text
        assert f"{n['CONSUMERS'] * 64} ×" in text
        assert f"{n['CONSUMERS']} consumers × {n['CONSUMER_REGS']} registers" in text
        assert f"{n['KV_STAGES']} K/V buffers · {n['Q_STAGES']} Q buffer" in text
        if dim_v != dim:
            assert f"V {dim_v}" in text
        smem = s.constants(dim)["SMEM_BYTES"]
        assert f"{smem / 1024:.1f} KiB" in text
    # the notes' table says the same shared memory (kernel.cu and notes.md agree)
    notes = s.notes_path.read_text()
    for dim, _dv in s.head_dims:
        assert f"{s.constants(dim)['SMEM_BYTES'] / 1024:.1f} KiB" in notes
    assert f"draw head dim {s.head_dim}" in text


def test_each_figure_of_a_stage_of_several_head_dims_states_the_one_it_draws(stages, by_id):
    for d in stage_diagrams(by_id["24"], stages):
        if d.kind != "structure":
            assert f"Drawn for head dim {by_id['24'].head_dim}" in d.caption, d.id
    for d in stage_diagrams(by_id["23"], stages):  # one head dim: nothing to say
        assert "Drawn for head dim" not in d.caption
