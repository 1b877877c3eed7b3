"""A CUDA-aware C++ lexer and a whole-file highlighter that yields per-line token runs.

Pygments' own CudaLexer derives from CLexer, so templates, namespaces and constexpr come out plain;
this one starts from the C++ lexer and re-tags CUDA's qualifiers, built-in variables, vector types
and intrinsics. Files are lexed whole (block comments and strings spanning lines stay correct) and
only then split into lines, so highlighting survives the diff.
"""

from __future__ import annotations

import re

from pygments.lexers.c_cpp import CppLexer
from pygments.token import STANDARD_TYPES, Keyword, Name, _TokenType

QUALIFIERS = frozenset(["__global__", "__device__", "__host__", "__shared__", "__constant__", "__managed__", "__restrict__", "__forceinline__", "__noinline__", "__launch_bounds__", "__grid_constant__", "__cluster_dims__", "__align__", "__builtin_assume", "asm", "volatile"])
BUILTIN_VARS = frozenset(["threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "clusterDim"])
TYPES = frozenset(["dim3", "half", "half2", "__half", "__half2", "__nv_bfloat16", "__nv_bfloat162", "nv_bfloat16", "nv_bfloat162", "cudaStream_t", "cudaError_t", "CUtensorMap", "uint2", "uint4", "int2", "int4", "float2", "float4", "char4", "uchar4", "ushort2", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "int8_t", "int16_t", "int32_t", "int64_t", "size_t"])
# __syncthreads, __shfl_xor_sync, __expf, __float2bfloat16, ... and the usual math/atomic helpers.
_INTRINSIC_RE = re.compile(r"^(__[a-z][a-z0-9_]*|atomic[A-Z][A-Za-z]*|exp2f|expf|rsqrtf|fmaxf|fminf|"
                           r"cvta_to_shared|__cvta_generic_to_shared)$")


class CudaCppLexer(CppLexer):
    """C++ with CUDA keywords, built-ins and intrinsics tagged (for .cu and .cuh files)."""

    name = "CUDA C++ (hopattn)"
    aliases = ("cuda-cpp",)
    filenames = ()  # never picked by file name: callers ask for it explicitly

    def get_tokens_unprocessed(self, text, stack=("root",)):
        for index, token, value in super().get_tokens_unprocessed(text, stack):
            if token in Name or token is Keyword or token in Keyword.Reserved:
                if value in QUALIFIERS:
                    token = Keyword.Reserved
                elif value in BUILTIN_VARS:
                    token = Name.Builtin
                elif value in TYPES:
                    token = Keyword.Type
                elif token in Name and _INTRINSIC_RE.match(value):
                    token = Name.Builtin
            yield index, token, value


def css_class(token: _TokenType) -> str:
    """Pygments' short class (``k``, ``nf``, ...) of a token, walking up to the nearest known type."""
    while token not in STANDARD_TYPES:
        token = token.parent
    return STANDARD_TYPES[token]


Line = tuple[tuple[str, str], ...]  # (css class, text) runs of one line, without the newline


def highlight_lines(source: str) -> list[Line]:
    """Lex ``source`` whole, then split the token stream at newlines into one run list per line."""
    lines: list[list[tuple[str, str]]] = [[]]
    lexer = CudaCppLexer(stripnl=False, ensurenl=False, tabsize=0)
    for token, value in lexer.get_tokens(source):
        cls = css_class(token)
        if cls in ("w", "", "n"):  # whitespace, plain text and plain names look alike: no span
            cls = ""
        parts = value.split("\n")
        for i, part in enumerate(parts):
            if i:
                lines.append([])
            if part:
                run = lines[-1]
                if run and run[-1][0] == cls:  # merge neighbours of one class: smaller HTML
                    run[-1] = (cls, run[-1][1] + part)
                else:
                    run.append((cls, part))
    if source.endswith("\n") or not source:
        lines.pop()
    return [tuple(line) for line in lines]
