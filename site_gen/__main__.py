"""`python -m site_gen [--root DIR] [--out DIR]`: render the generated pages without MkDocs.

Checks every input and reports how long rendering took; with --out, also writes the pages, assets
and fragments there to read (MkDocs itself gets them in memory, through site_gen/hook.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hopattn.records import files

from . import site


def main(argv=None) -> int:
    here = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(prog="python -m site_gen", description=__doc__)
    ap.add_argument("--root", type=Path, default=here, help="repository root (default: this checkout)")
    ap.add_argument("--out", type=Path, default=None, help="write the generated files into this folder")
    args = ap.parse_args(argv)
    generated, _, seconds = site.generate(args.root)
    if args.out is not None:
        for path, text in {**generated.pages, **generated.assets}.items():
            files.write_if_changed(args.out / path, text)
        for name, html in generated.fragments.items():
            files.write_if_changed(args.out / "fragments" / f"{name}.html", html)
    print(f"site_gen: {len(generated.pages)} pages, {len(generated.assets)} assets, "
          f"{len(generated.fragments)} fragments in {seconds:.2f} s"
          + (f", written to {args.out}" if args.out is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
