// MathJax 3 (vendored in assets/javascripts/mathjax/, Apache-2.0) typesets what pymdownx.arithmatex
// marks; the site needs no network.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
  svg: { fontCache: "global" },
};
