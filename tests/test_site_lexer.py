"""The CUDA-aware lexer: CUDA words get keyword/builtin classes, and lines split after lexing."""

from site_gen.diff_section.lexer import highlight_lines

SRC = """/* block comment
   over two lines */
template <int N>
__global__ void __launch_bounds__(128) k(const float* __restrict__ x) {
    __shared__ __nv_bfloat16 tile[N];
    int i = threadIdx.x + blockIdx.x * blockDim.x;
    asm volatile("cp.async.commit_group;\\n" ::);
    __syncthreads();
}
"""


def classes_of(line):
    return {text: cls for cls, text in line}


def test_one_run_list_per_line():
    lines = highlight_lines(SRC)
    assert len(lines) == SRC.count("\n")
    assert "".join(t for _, t in lines[3]) == SRC.splitlines()[3]


def test_block_comment_stays_comment_on_every_line():
    lines = highlight_lines(SRC)
    assert all(cls.startswith("c") for cls, _ in lines[0])
    assert all(cls.startswith("c") for cls, text in lines[1] if text.strip())


def test_cuda_words_are_tagged():
    lines = highlight_lines(SRC)
    assert classes_of(lines[3])["__global__"] == "kr"
    assert classes_of(lines[3])["__launch_bounds__"] == "kr"
    assert classes_of(lines[3])["__restrict__"] == "kr"
    assert classes_of(lines[2])["template"] == "k"  # C++ keywords survive (CudaLexer would miss this)
    assert classes_of(lines[4])["__shared__"] == "kr"
    assert classes_of(lines[4])["__nv_bfloat16"] == "kt"
    assert classes_of(lines[5])["threadIdx"] == "nb"
    assert classes_of(lines[5])["blockDim"] == "nb"
    assert classes_of(lines[6])["asm"] == "kr"
    assert classes_of(lines[6])["volatile"] == "kr"
    assert classes_of(lines[7])["__syncthreads"] == "nb"


def test_no_trailing_newline_and_empty_input():
    assert len(highlight_lines("int a;")) == 1
    assert highlight_lines("") == []
