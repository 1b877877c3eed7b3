"""The on-disk records: one module per format, each the only code that reads or writes it.

  results.py          bench/results/<gpu>.json: the benchmark harness's timings (python -m bench)
  compiler_facts.py   kernels/compiler_facts/<lineage>/<NN-slug>.json: what nvcc and ptxas made of
                      each stage (python -m hopattn.compiler)

A format module holds the schema version, a ``validate(data, where)`` that names the file and the
field on error (fields.Checker), the load and write functions, and the helpers its readers need;
it writes through files.py (one JSON form: sorted keys, fixed precision, atomic replace) and
imports only the standard library and hopattn.lineage, so the site builds without torch. The
records later work adds follow the same pattern beside these: the per-warp traces of the
instrumented stages (traces.py) and the model runs (model_results.py).
"""
