"""The on-disk records: one module per format, each the only code that reads or writes it.

  results.py          bench/results/<gpu>.json: the benchmark harness's timings (python -m bench)
  traces.py           bench/results/traces/<gpu>/<NN>[-causal].json: per-warp traces of the
                      instrumented stages (python -m bench.trace)
  models.py           bench/results/models-<gpu>.json: real models with each attention backend
                      (python -m bench.models)
  compiler_facts.py   kernels/compiler_facts/<lineage>/<NN-slug>.json: what nvcc and ptxas made of
                      each stage (python -m hopattn.compiler)

Beside them, what the formats share: fields.py (the field checks), files.py (one JSON form: sorted
keys, fixed precision, atomic replace), runs.py (the run header every measured record carries, the
git state it reads, the first line of a producer's log) and shapes.py (the benchmark shapes a
results record names, and the FLOP count).

A format module holds the schema version, a ``validate(data, where)`` that names the file and the
field on error (fields.Checker), the load and write functions, and the helpers its readers need;
it writes through files.py and imports only the standard library and hopattn.lineage, so the site
builds without torch. Nothing here imports the producers (bench/): they import this.
"""
