"""common/fast_divmod.cuh divides exactly (needs nvcc, no GPU): its functions are __host__ __device__,
so a small host program checks them against `/` and `%` over the divisors and numerators the
stages meet, the edges of its proof (powers of two and their neighbours, 2^31 - 1) and random ones
(about 38 million pairs). And stage 22's concept figure draws what nvcc compiles a division to."""

from __future__ import annotations

import subprocess

import pytest
from hopattn import build, lineage

pytestmark = pytest.mark.nvcc

PROGRAM = r"""
#include <cstdio>
#include <cstdint>
#include "fast_divmod.cuh"

static uint64_t state = 0x9e3779b97f4a7c15ull;
static uint32_t next_random() {  // xorshift64*: the same numbers on every machine
    state ^= state >> 12; state ^= state << 25; state ^= state >> 27;
    return uint32_t((state * 0x2545f4914f6cdd1dull) >> 32);
}

static int check(int d, int n) {
    const FastDivmod f = make_fast_divmod(d);
    int q, r;
    fast_divmod(n, f, q, r);
    if (q != n / d || r != n % d || fast_div(n, f) != n / d) {
        printf("FAIL d=%d n=%d: %d r %d, expected %d r %d\n", d, n, q, r, n / d, n % d);
        return 1;
    }
    return 0;
}

int main() {
    const int max_int = 2147483647;
    int divisors[4096], count = 0;
    for (int d = 1; d <= 1100; ++d) divisors[count++] = d;
    for (int k = 1; k <= 30; ++k)
        for (int delta = -1; delta <= 1; ++delta) divisors[count++] = (1 << k) + delta;
    divisors[count++] = max_int;
    divisors[count++] = max_int - 1;
    while (count < 4096) divisors[count++] = int(next_random() >> (1 + next_random() % 31)) + 1;
    long checked = 0;
    for (int i = 0; i < count; ++i) {
        const int d = divisors[i];
        const int edges[] = {0, 1, d - 1, d, d + 1, 2 * d - 1, max_int, max_int - 1, max_int - d + 1, 1 << 30};
        for (int n : edges)
            if (n >= 0) { if (check(d, n)) return 1; ++checked; }
        for (int j = 0; j < 2000; ++j) {  // multiples of d and their neighbours, and anything
            const int n = int(next_random() & 0x7fffffff);
            const int64_t m = int64_t(n / d) * d;
            const int64_t around[] = {n, m - 1, m, m + d - 1};
            for (int64_t a : around)
                if (a >= 0 && a <= max_int) { if (check(d, int(a))) return 1; ++checked; }
        }
    }
    for (int n = 0; n < (1 << 20); ++n)  // every numerator below 2^20 for a few tile-sized divisors
        for (int d : {3, 7, 24, 48, 132}) { if (check(d, n)) return 1; ++checked; }
    printf("ok %ld\n", checked);
    return 0;
}
"""


def test_fast_divmod_matches_integer_division(tmp_path):
    try:
        nvcc = build.nvcc()
    except build.BuildError:
        pytest.skip("nvcc not found (install the CUDA toolkit or pip's nvidia-cuda-nvcc)")
    source = tmp_path / "check.cu"
    source.write_text(PROGRAM)
    binary = tmp_path / "check"
    subprocess.run([str(nvcc), "-O2", "-std=c++17", "-I", str(lineage.ATTENTION_DIR / "common"), str(source),
                    "-o", str(binary)], check=True, capture_output=True, timeout=300)
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok "), result.stdout
    assert int(result.stdout.split()[1]) > 37_000_000  # the pairs stage 22's notes say were checked


CHAINS = r"""
#include "fast_divmod.cuh"
extern "C" __global__ void runtime_divmod(const int* n, int* q, int* r, int d) {  // describe_tile's / and %
    const int i = n[threadIdx.x];
    q[threadIdx.x] = i / d;
    r[threadIdx.x] = i % d;
}
extern "C" __global__ void host_divmod(const int* n, int* q, int* r, FastDivmod f) {  // stage 22's
    int quotient, remainder;
    fast_divmod(n[threadIdx.x], f, quotient, remainder);
    q[threadIdx.x] = quotient;
    r[threadIdx.x] = remainder;
}
"""
# What is not the division: parameters, the thread's index, the addresses, the loads and stores.
NOT_ARITHMETIC = ("LDC", "ULDC", "S2R", "LDG", "STG", "EXIT", "BRA", "NOP")


def _arithmetic(instrs) -> tuple[str, ...]:
    return tuple(i.opcode for i in instrs
                 if not i.opcode.startswith(NOT_ARITHMETIC) and not (i.opcode == "IMAD.WIDE.U32" and ", 0x4," in i.operands))


def test_the_concept_figure_draws_the_divisions_nvcc_compiles(tmp_path):
    """Stage 22's figure draws one division (with its remainder) as the instructions of
    site_gen's RUNTIME_DIVISION and FAST_DIVISION: they must be what nvcc makes of them."""
    from hopattn import cuda_tools
    from hopattn.compiler import sass

    from site_gen.diagrams.concepts.scheduling import FAST_DIVISION, RUNTIME_DIVISION

    try:
        nvcc = build.nvcc()
    except build.BuildError:
        pytest.skip("nvcc not found (install the CUDA toolkit or pip's nvidia-cuda-nvcc)")
    if cuda_tools.find("cuobjdump") is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    source, cubin = tmp_path / "chains.cu", tmp_path / "chains.fatbin"  # a fatbin: cuobjdump names its arch
    source.write_text(CHAINS)
    subprocess.run([str(nvcc), "-O3", "-std=c++17", "-arch=sm_90a", "-fatbin", "-I", str(lineage.ATTENTION_DIR / "common"),
                    str(source), "-o", str(cubin)], check=True, capture_output=True, timeout=300)
    functions = sass.parse_sass(sass.dump_sass(cubin))
    why = "nvcc compiles it otherwise now: update site_gen/diagrams/concepts/scheduling.py"
    assert _arithmetic(functions["runtime_divmod"]) == RUNTIME_DIVISION, why
    assert _arithmetic(functions["host_divmod"]) == FAST_DIVISION, why
