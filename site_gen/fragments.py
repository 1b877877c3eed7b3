"""Heavy HTML kept out of Markdown: a page holds a placeholder, the built page gets the fragment.

A stage's diff is some ten thousand elements and a page of inline SVG diagrams is thousands more.
Passed through Python-Markdown (which re-parses every raw HTML tag) and the search indexer, they
made a full build of an 18-stage site take most of a minute. So the generator keeps such HTML
aside, in memory, and puts a placeholder in the page; the MkDocs hook (on_post_page) swaps each
placeholder for its fragment in the final HTML. Code in the diffs is also kept out of the search
index that way, which is where it would only be noise.

A fragment can also be kept out of the page itself (Site.add_fragment's ``file``): a stage's diff
is up to 750 KB of HTML, more than the rest of its page; it is written as a file of its own and the
page loads it when the reader comes near it (``deferred``), so a stage page stays under 500 KB.
"""

from __future__ import annotations

import re

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_PLACEHOLDER_RE = re.compile(r'<div class="hd-slot" data-slot="([a-z0-9][a-z0-9_.-]*)"></div>')
# A hand-written page's image of a generated figure, as Python-Markdown writes it (alone in a paragraph).
_FIGURE_IMG_RE = re.compile(r'<p>\s*<img alt="[^"]*" src="(?:\.\./)*assets/generated/diagrams/([a-z0-9-]+)\.svg"'
                            r'\s*/?>\s*</p>')


class FragmentError(RuntimeError):
    """A page refers to a fragment that the generator did not make."""


def placeholder(name: str) -> str:
    if not _NAME_RE.match(name):
        raise ValueError(f"fragment names are lower-case letters, digits, '.', '_' and '-': {name!r}")
    return f'<div class="hd-slot" data-slot="{name}"></div>'


def deferred(url: str, what: str) -> str:
    """What stands in a page for a fragment kept in a file of its own (``url``, relative to the page):
    docs/assets/javascripts/figures.js loads it as the reader nears it; without JavaScript, a link."""
    return (f'<div class="hd-deferred" data-src="{url}"><p>Loading {what}… '
            f'(or <a href="{url}">open it on its own</a>)</p></div>')


def fill(html: str, fragments: dict[str, str], later: dict[str, tuple[str, str]] | None = None) -> str:
    """Replace every placeholder in ``html`` with its fragment, and every image of a generated figure
    that a hand-written page shows with the inline figure (site_gen/pages/docs_figures.py).
    ``later``: fragment name -> (URL of its file, what it is): those are loaded by the page instead."""
    later = later or {}

    def one(match: re.Match) -> str:
        name = match.group(1)
        if name in later:
            return deferred(*later[name])
        try:
            return fragments[name]
        except KeyError:
            raise FragmentError(f"no fragment '{name}' was generated for this page") from None

    def image(match: re.Match) -> str:
        return fragments.get(f"docfig-{match.group(1)}", match.group(0))

    return _FIGURE_IMG_RE.sub(image, _PLACEHOLDER_RE.sub(one, html))
