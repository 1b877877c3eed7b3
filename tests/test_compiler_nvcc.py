"""The committed compiler facts match a fresh build of every stage (needs nvcc and cuobjdump, no GPU).

Run `python -m hopattn.compiler` (or `nox -s facts`) and commit kernels/compiler_facts/ when this fails.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from hopattn import build, cuda_tools, lineage
from hopattn.compiler import facts as producer
from hopattn.records import compiler_facts as record

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]  # the fixture compiles every stage afresh

# What ptxas reports depends only on nvcc; the SASS text also on the cuobjdump/nvdisasm releases.
PTXAS_KEYS = ("registers", "barriers", "static_smem", "stack_frame", "spill_stores", "spill_loads",
              "dynamic_smem", "function", "source_hash", "nvcc_flags")


def _tools_or_skip() -> dict[str, str]:
    try:
        build.nvcc()
    except build.BuildError:
        pytest.skip("nvcc not found (install the CUDA toolkit or pip's nvidia-cuda-nvcc)")
    for tool in ("cuobjdump", "nvdisasm"):
        if cuda_tools.find(tool) is None:
            pytest.skip(f"{tool} not found (pip install nvidia-cuda-{tool})")
    return producer.toolchain()


@pytest.fixture(scope="module")
def fresh() -> list[tuple[lineage.Stage, dict, dict | None]]:
    tools = _tools_or_skip()
    stages = lineage.discover()
    # Two stages at a time: the machines this runs on have two cores.
    with ThreadPoolExecutor(max_workers=2) as pool:
        facts = list(pool.map(lambda s: producer.collect(s, tools), stages))
    return [(s, f, record.load(s)) for s, f in zip(stages, facts)]


def test_committed_ptxas_facts_match_a_fresh_build(fresh):
    bad = []
    for stage, new, old in fresh:
        if old is None:
            bad.append(f"{stage.name}: no committed facts")
            continue
        diff = [k for k in PTXAS_KEYS if old.get(k) != new.get(k)]
        if diff:
            bad.append(f"{stage.name}: {', '.join(f'{k} {old.get(k)!r} -> {new.get(k)!r}' for k in diff)}")
    assert not bad, "stale compiler facts (run `python -m hopattn.compiler`):\n" + "\n".join(bad)


def test_committed_sass_facts_match_a_fresh_build(fresh):
    bad, other_tools = [], []
    for stage, new, old in fresh:
        if old is None:
            bad.append(f"{stage.name}: no committed facts")
        elif old.get("toolchain") != new["toolchain"]:
            other_tools.append(stage.name)
        elif record.dumps(old) != record.dumps(new):
            bad.append(f"{stage.name}: SASS facts differ")
    assert not bad, "stale compiler facts (run `python -m hopattn.compiler`):\n" + "\n".join(bad)
    if other_tools:
        pytest.skip(f"facts of {', '.join(other_tools)} were made with other tool releases "
                    f"({fresh[0][1]['toolchain']} here); their SASS was not compared")
