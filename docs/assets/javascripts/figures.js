// Figures of the generated site (site_gen): the full-screen view of any figure, pictures and diffs
// loaded when the reader comes near them, and the gallery's filters and stage-beside-stage
// comparison. Plain DOM, no dependency.
//
// Full screen: the figure's <svg> (wherever it sits inside .hd-figure-svg: a wide figure wraps it in
// a scroller) moves into an overlay at a size where its smallest text is at least MIN_TEXT_PX on
// screen (or wider, to fill the window); the overlay scrolls both ways (pan), "−" and "+" zoom,
// Escape or "Close" puts the picture back where it was.
//
// Deferred (.hd-deferred[data-src]): a figure's SVG file or a stage's diff, kept out of the page to
// keep it light (site_gen/fragments.py); fetched when it nears the screen or is asked for, and put
// in the placeholder's place (an SVG inline, so it follows the theme).
//
// Wide figures (.hd-figure-scroll) keep their text legible by scrolling sideways; while one is
// wider than its column it gets .hd-overflowing, which shows the hint above it.
(function () {
  "use strict";
  var MIN_TEXT_PX = 11;
  var viewer = null;
  var current = null; // {svg, home, next, figure, zoom, minZoom}

  function smallestFont(svg) {
    var min = Infinity;
    svg.querySelectorAll("text").forEach(function (t) {
      var size = parseFloat(t.getAttribute("font-size") || svg.getAttribute("font-size") || "12");
      if (size < min) min = size;
    });
    return min === Infinity ? 12 : min;
  }

  function viewBoxWidth(svg) {
    var vb = svg.viewBox && svg.viewBox.baseVal;
    return vb && vb.width ? vb.width : svg.getBoundingClientRect().width;
  }

  // The zoom (screen px per viewBox unit) at which the smallest text reads at MIN_TEXT_PX.
  function legibleZoom(svg) {
    return MIN_TEXT_PX / smallestFont(svg);
  }

  function pictureOf(figure) {
    var pic = figure.querySelector(".hd-figure-svg");
    return pic && pic.querySelector("svg");
  }

  // --- loading on demand ------------------------------------------------------------------------
  var loading = new WeakMap();

  function load(el) {
    if (loading.has(el)) return loading.get(el);
    var src = el.getAttribute("data-src");
    var done = fetch(src).then(function (r) {
      if (!r.ok) throw new Error(src + ": " + r.status);
      return r.text();
    }).then(function (text) {
      if (!el.parentNode) return null;
      var nodes;
      if (/\.svg(?:$|[?#])/.test(src)) {
        var doc = new DOMParser().parseFromString(text, "image/svg+xml");
        var svg = doc.documentElement;
        if (svg.nodeName.toLowerCase() !== "svg") throw new Error(src + ": not an SVG");
        svg.removeAttribute("width");  // the file's explicit size and opaque background: the page's
        svg.removeAttribute("height"); // column and theme take over
        svg.querySelectorAll(".hd-file-bg").forEach(function (r) { r.remove(); });
        nodes = [document.importNode(svg, true)];
      } else {
        var t = document.createElement("template");
        t.innerHTML = text;
        t.content.querySelectorAll("meta").forEach(function (m) { m.remove(); });
        nodes = Array.prototype.slice.call(t.content.childNodes);
      }
      var parent = el.parentNode;
      nodes.forEach(function (n) { parent.insertBefore(n, el); });
      el.remove();
      init();
      return nodes[0];
    }).catch(function (err) {
      el.classList.add("hd-deferred-failed");
      if (window.console) console.warn("figures.js: " + err);
      loading.delete(el);
      return null;
    });
    loading.set(el, done);
    return done;
  }

  var observer = null;
  function wireDeferred(root) {
    var waiting = root.querySelectorAll(".hd-deferred[data-src]");
    if (!waiting.length) return;
    if (!observer && "IntersectionObserver" in window) {
      observer = new IntersectionObserver(function (entries) {
        entries.forEach(function (e) {
          if (e.isIntersecting) { observer.unobserve(e.target); load(e.target); }
        });
      }, { rootMargin: "800px 0px" });
    }
    waiting.forEach(function (el) {
      if (el.dataset.hdWired) return;
      el.dataset.hdWired = "1";
      if (observer) observer.observe(el);
      else load(el);
    });
    // A link to a place at or inside what is not loaded yet (#diff): load the next such part now.
    if (!wireDeferred.hashDone && location.hash) {
      wireDeferred.hashDone = true;
      var target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
      var next = target && Array.prototype.filter.call(waiting, function (el) {
        return target.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING;
      })[0];
      if (next) load(next).then(function () { target.scrollIntoView(); });
    }
  }

  // --- full screen ------------------------------------------------------------------------------
  function build() {
    viewer = document.createElement("div");
    viewer.className = "hd-viewer";
    viewer.hidden = true;
    viewer.setAttribute("role", "dialog");
    viewer.setAttribute("aria-modal", "true");
    viewer.innerHTML =
      '<div class="hd-viewer-bar"><span class="hd-viewer-title"></span>' +
      '<button type="button" data-zoom="out" aria-label="Zoom out">−</button>' +
      '<button type="button" data-zoom="in" aria-label="Zoom in">+</button>' +
      '<button type="button" data-zoom="close">Close</button></div>' +
      '<div class="hd-viewer-stage"></div>';
    document.body.appendChild(viewer);
    viewer.addEventListener("click", function (e) {
      var b = e.target.closest("button[data-zoom]");
      if (!b) return;
      var what = b.getAttribute("data-zoom");
      if (what === "close") close();
      else zoomBy(what === "in" ? 1.25 : 0.8);
    });
    document.addEventListener("keydown", function (e) {
      if (!current) return;
      if (e.key === "Escape") close();
      else if (e.key === "+" || e.key === "=") zoomBy(1.25);
      else if (e.key === "-") zoomBy(0.8);
    });
  }

  function setZoom(z) {
    var svg = current.svg;
    current.zoom = Math.max(current.minZoom, Math.min(z, 6));
    svg.style.width = Math.round(viewBoxWidth(svg) * current.zoom) + "px";
    svg.style.height = "auto";
  }

  function zoomBy(f) {
    setZoom(current.zoom * f);
  }

  function open(figure) {
    var svg = pictureOf(figure);
    if (!svg) {  // not loaded yet: load it, then open
      var later = figure.querySelector(".hd-figure-svg .hd-deferred[data-src]");
      if (later) load(later).then(function (el) { if (el) open(figure); });
      return;
    }
    if (!viewer) build();
    if (current) close();
    current = { svg: svg, home: svg.parentNode, next: svg.nextSibling, figure: figure };
    var stage = viewer.querySelector(".hd-viewer-stage");
    viewer.querySelector(".hd-viewer-title").textContent = figure.getAttribute("aria-label") || "";
    stage.appendChild(svg);
    viewer.hidden = false;
    document.documentElement.style.overflow = "hidden";
    var fit = (stage.clientWidth - 16) / viewBoxWidth(svg);
    current.minZoom = legibleZoom(svg);
    setZoom(Math.max(current.minZoom, Math.min(fit, 2)));
    stage.scrollTop = 0;
    stage.scrollLeft = 0;
    viewer.querySelector('button[data-zoom="close"]').focus();
  }

  function close() {
    if (!current) return;
    var svg = current.svg;
    svg.style.width = "";
    svg.style.height = "";
    current.home.insertBefore(svg, current.next);
    var button = current.figure.querySelector(".hd-zoom");
    current = null;
    viewer.hidden = true;
    document.documentElement.style.overflow = "";
    if (button) button.focus();
    overflowing();
  }

  // --- wide figures -----------------------------------------------------------------------------
  function overflowing() {
    document.querySelectorAll("figure.hd-figure-scroll").forEach(function (fig) {
      var pic = fig.querySelector(".hd-figure-svg");
      if (pic) fig.classList.toggle("hd-overflowing", pic.scrollWidth > pic.clientWidth + 1);
    });
  }
  var resizing = null;
  window.addEventListener("resize", function () {
    if (resizing) cancelAnimationFrame(resizing);
    resizing = requestAnimationFrame(overflowing);
  });

  function wireFigures(root) {
    root.querySelectorAll("figure.hd-figure").forEach(function (fig) {
      if (fig.dataset.hdWired) return;
      fig.dataset.hdWired = "1";
      var button = fig.querySelector(".hd-zoom");
      if (button) button.addEventListener("click", function () { open(fig); });
      var pic = fig.querySelector(".hd-figure-svg");
      if (pic) pic.addEventListener("click", function (e) {
        if (!e.target.closest("a")) open(fig);
      });
    });
    overflowing();
  }

  // --- the gallery ------------------------------------------------------------------------------
  function wireGallery(root) {
    var gallery = root.querySelector(".hd-gallery");
    if (!gallery || gallery.dataset.hdWired) return;
    gallery.dataset.hdWired = "1";
    var cards = Array.prototype.slice.call(gallery.querySelectorAll(".hd-thumb"));
    var kindButtons = gallery.querySelectorAll(".hd-kinds button");
    var stageSelect = gallery.querySelector(".hd-stage-filter");
    var compare = gallery.querySelector(".hd-compare");
    var count = gallery.querySelector(".hd-gallery-count");
    var state = { kind: "", stage: "", compare: false };
    var order = ["memory", "roles", "timeline", "concept"];

    function readHash() {
      var h = new URLSearchParams(location.hash.replace(/^#/, ""));
      state.kind = h.get("kind") || "";
      state.stage = h.get("stage") || "";
      state.compare = h.has("compare");
    }

    function writeHash() {
      var h = new URLSearchParams();
      if (state.kind) h.set("kind", state.kind);
      if (state.stage) h.set("stage", state.stage);
      if (state.compare) h.set("compare", "");
      var s = h.toString().replace(/=(&|$)/g, "$1");
      history.replaceState(null, "", s ? "#" + s : location.pathname);
    }

    function previous(stage) {
      var n = parseInt(stage, 10) - 1;
      return n < 1 ? "" : (n < 10 ? "0" : "") + n;
    }

    function apply() {
      var comparing = state.compare && state.stage !== "";
      var before = comparing ? previous(state.stage) : "";
      gallery.classList.toggle("hd-comparing", comparing);
      gallery.classList.toggle("hd-one-stage", state.stage !== "");
      var shown = 0, conceptRow = order.length;
      cards.forEach(function (card) {
        var kind = card.dataset.kind, stage = card.dataset.stage;
        var ok = (!state.kind || kind === state.kind);
        if (comparing) ok = ok && (stage === state.stage || (stage === before && kind !== "concept"));
        else ok = ok && (!state.stage || stage === state.stage);
        card.hidden = !ok;
        card.style.gridColumn = "";
        card.style.gridRow = "";
        if (ok && comparing) {
          var row = kind === "concept" ? conceptRow++ : order.indexOf(kind);
          card.style.gridColumn = stage === before ? "1" : "2";
          card.style.gridRow = String(row + 1);
        }
        if (ok && !card.classList.contains("hd-thumb-same")) shown++;
      });
      kindButtons.forEach(function (b) {
        b.setAttribute("aria-pressed", String((b.dataset.kind || "") === state.kind));
      });
      stageSelect.value = state.stage;
      compare.checked = state.compare;
      compare.disabled = state.stage === "";
      count.textContent = shown + " of " + gallery.dataset.total + " shown" +
        (comparing ? (before ? ": stage " + before + " left, stage " + state.stage + " right" :
                      ": stage " + state.stage + " has no predecessor") : "");
    }

    kindButtons.forEach(function (b) {
      b.addEventListener("click", function () { state.kind = b.dataset.kind || ""; writeHash(); apply(); });
    });
    stageSelect.addEventListener("change", function () { state.stage = stageSelect.value; writeHash(); apply(); });
    compare.addEventListener("change", function () { state.compare = compare.checked; writeHash(); apply(); });
    readHash();
    apply();
  }

  function init() {
    wireFigures(document);
    wireDeferred(document);
    wireGallery(document);
  }

  if (window.document$ && window.document$.subscribe) window.document$.subscribe(init);
  else if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
