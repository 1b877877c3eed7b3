"""The #diff section of a stage page: kernel.cu and its project headers against the previous stage.

lexer (CUDA-aware highlighting), compare (the line and token diff), render (unified and
side-by-side HTML), section (what the page shows).
"""
