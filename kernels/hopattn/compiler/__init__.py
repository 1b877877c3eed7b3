"""The compiler-facts producer: compiles each stage as hopattn.build does, reads ptxas' report and
the sm_90a SASS (cuobjdump, nvdisasm), and writes one record per stage
(kernels/compiler_facts/<lineage>/<NN-slug>.json, format in hopattn.records.compiler_facts).

    python -m hopattn.compiler                     # refresh the facts of every changed stage, every lineage
    python -m hopattn.compiler 7 9-11              # some stages (of every lineage that has them)
    python -m hopattn.compiler --lineage backward  # Act V only (kernels/attention_backward)
    python -m hopattn.compiler --lineage rmsnorm   # Part II's RMSNorm (kernels/rmsnorm): every template instance
    python -m hopattn.compiler --lineage softmax   # so too rmsnorm_backward, softmax, softmax_backward (Part II)
    python -m hopattn.compiler --check             # only report missing or stale facts (exit 1 if any)

Modules: facts (one stage's record, and the refresh), ptxas (the -Xptxas=-v report), sass (the
SASS listing, opcode counts, the main loop), line_info (source lines of the SASS).
"""
