"""site_gen: the renderer. The lineage (kernels/attention) and the committed records (bench/results,
kernels/compiler_facts) go in; the site's generated pages come out, handed to MkDocs in memory.

  inputs.py            read and validate everything the site is made from
  site.py              render every page, asset and fragment (render, generate)
  pages/               the stage page (its change, numbers and lead figure first), the overview,
                       the gallery, the figures of the hand-written pages
  diagrams/            the #diagrams section: SVG drawn from each stage.toml (memory movement,
                       the warp-role protocol, the pipeline timeline, concepts) and the docs' figures
  models_page.py       the "In real models" page, from bench/results/models-*.json
  diff_section/        the #diff section: kernel.cu and headers against the previous stage
  compiler_section/    the #compiler section and the overview's compiler table, from the facts
  benchmark_section/   the #benchmark section, a stage's headline numbers, the overview's tables (the
                       users' shapes too) and the climb chart (SVG)
  nav.py, html.py, fragments.py, cache.py   navigation, HTML blocks, heavy HTML kept out of
                       Markdown, the disk cache of slow renderings
  hook.py              the MkDocs hook (mkdocs.yml `hooks:`)
  speed.py             `python -m site_gen.speed`: times a full build and a one-stage rebuild

`python -m site_gen` renders without MkDocs (to check inputs, time it, or look at the Markdown).
The renderer never compiles or measures: hopattn.compiler and bench produce the records.
"""
