"""`python -m site_gen [--root DIR] [--docs DIR]`: regenerate the generated pages of the site."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    here = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(prog="python -m site_gen", description=__doc__)
    ap.add_argument("--root", type=Path, default=here, help="repository root (default: this checkout)")
    ap.add_argument("--docs", type=Path, default=None, help="docs folder (default: ROOT/docs)")
    args = ap.parse_args(argv)
    sys.path[:0] = [str(args.root / "kernels"), str(args.root)]
    from .build_site import timed_generate

    changed, seconds = timed_generate(args.root, args.docs)
    for path in changed:
        print(f"wrote {path}")
    print(f"site_gen: {len(changed)} file(s) changed in {seconds:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
