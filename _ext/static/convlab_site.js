/* The site's small fixes to the theme's behaviour (loaded on every page by _ext/convlab_site.py).

   1. The buttons that open the chapter list and the page contents. pydata-sphinx-theme binds its
      handler to the first .primary-toggle / .secondary-toggle of the page, which in
      sphinx-book-theme is the one in the hidden top navbar; the buttons a reader sees (in the
      article's header) have none. A click on a visible one is handed to the bound one, which
      opens the panel as a dialog below 992 px and folds the chapter list away above it.
   2. A table or output wider than its column scrolls inside its container; the container gets
      the class "scrolls" (and "at-end" once scrolled to the right) so the stylesheet can show a
      cue that there is more to the right.
   3. Printed, a page keeps every value: each folded dropdown opens (before printing, and whenever
      the page is shown as print, as a print preview or an emulated print does), a display formula
      wider than the paper is scaled to fit, and both go back after. */
(function () {
  "use strict";

  function forwardToggles() {
    [".primary-toggle", ".secondary-toggle"].forEach(function (selector) {
      var bound = document.querySelector(selector);
      document.querySelectorAll(selector).forEach(function (button) {
        if (button === bound) return;
        button.addEventListener("click", function (event) {
          event.preventDefault();
          event.stopPropagation();
          bound.click();
        });
      });
    });
  }

  var SCROLLERS = ".pst-scrollable-table-container, div.table-wrap, .cell_output .output.text_html";

  function markScrollers() {
    document.querySelectorAll(SCROLLERS).forEach(function (box) {
      var update = function () {
        var scrolls = box.scrollWidth > box.clientWidth + 1;
        box.classList.toggle("scrolls", scrolls);
        box.classList.toggle("at-end", scrolls && box.scrollLeft + box.clientWidth >= box.scrollWidth - 1);
      };
      update();
      box.addEventListener("scroll", update, { passive: true });
      window.addEventListener("resize", update);
    });
  }

  function openForPrint() {
    var closed = [];
    // a display formula wider than the paper cannot scroll there: it is scaled down to fit
    function fitMath() {
      document.querySelectorAll('mjx-container[display="true"]').forEach(function (m) {
        m.style.zoom = "";
        var room = m.parentElement.clientWidth;     // the formula's box, which would clip it
        if (m.scrollWidth > room + 1) m.style.zoom = (0.98 * room / m.scrollWidth).toFixed(3);
      });
    }
    function open() {
      document.querySelectorAll("details:not([open])").forEach(function (d) {
        d.open = true;
        closed.push(d);
      });
      afterTypeset(fitMath);
    }
    // MathJax typesets after the page has loaded: measure the formulas once it has
    function afterTypeset(f) {
      var go = function () {
        if (window.MathJax && MathJax.startup && MathJax.startup.promise) MathJax.startup.promise.then(f);
        else f();
      };
      if (document.readyState === "complete") go();
      else window.addEventListener("load", go);
    }
    function restore() {
      closed.forEach(function (d) { d.open = false; });
      closed = [];
      document.querySelectorAll('mjx-container[display="true"]').forEach(function (m) { m.style.zoom = ""; });
    }
    window.addEventListener("beforeprint", open);
    window.addEventListener("afterprint", restore);
    var print = window.matchMedia("print");
    var onChange = function (e) { if (e.matches) open(); else restore(); };
    if (print.addEventListener) print.addEventListener("change", onChange);
    else if (print.addListener) print.addListener(onChange);
    if (print.matches) open();
  }

  function init() {
    forwardToggles();
    markScrollers();
    openForPrint();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
