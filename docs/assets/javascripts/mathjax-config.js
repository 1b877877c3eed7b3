// MathJax 3 typesets what pymdownx.arithmatex marks; site_gen/hook.py adds it to the site from its pip
// package (django-static-mathjax, Apache-2.0), so the site needs no network.
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
