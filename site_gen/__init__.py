"""site_gen: the renderer. The lineage (kernels/attention) and the committed records (bench/results,
kernels/compiler_facts) go in; the site's generated pages come out, handed to MkDocs in memory.

  inputs.py            read and validate everything the site is made from
  site.py              render every page, asset and fragment (render, generate)
  pages/               the stage page, the overview, the gallery
  diagrams/            the #diagrams section: SVG drawn from each stage.toml
  diff_section/        the #diff section: kernel.cu and headers against the previous stage
  compiler_section/    the #compiler section and the overview's compiler table, from the facts
  benchmark_section/   the #benchmark section, the overview's tables and the progression chart
  nav.py, html.py, fragments.py, cache.py   navigation, HTML blocks, heavy HTML kept out of
                       Markdown, the disk cache of slow renderings
  hook.py              the MkDocs hook (mkdocs.yml `hooks:`)
  speed.py             `python -m site_gen.speed`: times a full build and a one-stage rebuild

`python -m site_gen` renders without MkDocs (to check inputs, time it, or look at the Markdown).
The renderer never compiles or measures: hopattn.compiler and bench produce the records.
"""
