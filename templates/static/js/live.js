/* Controls that act on change: <select data-submit-on-change> submits its form (the language
   switch). A listener here, not an onchange= attribute, since the Content-Security-Policy allows
   no inline script. */
(function () {
  "use strict";
  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el && el.hasAttribute && el.hasAttribute("data-submit-on-change") && el.form) el.form.submit();
  });
})();

/* Menus of the header (<details class="menu">) open and close without script; this only closes
   an open one when the user clicks elsewhere, opens another, or presses Escape, as menus do. */
(function () {
  "use strict";
  function closeAll(except) {
    document.querySelectorAll("details.menu[open]").forEach(function (menu) {
      if (menu !== except) menu.removeAttribute("open");
    });
  }
  document.addEventListener("click", function (event) {
    closeAll(event.target.closest ? event.target.closest("details.menu") : null);
  });
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") closeAll(null);
  });
})();

/* Live figures without losing what the user types (docs/architecture.md, Web UI).

   A page that is still changing names a refresh period in
     <meta name="live-refresh" content="SECONDS" data-src="URL">
   Every period this script fetches that URL (default: the page's own address) and swaps in each
   region marked [data-live="NAME"] from the answer, so only the figures change: forms stay as the
   user left them. A region that holds a field one can type in or choose from is never replaced.
   When the answer no longer names a refresh period (the report is ready, the month is closed, the
   session ended) the page stops refreshing. Without JavaScript nothing here runs: pages that only
   watch a job keep a <noscript> meta refresh, the others say to reload.

   For tests and for people: <html data-live-refreshes="N"> counts the swaps; data-live-stale is
   set while the last fetch failed (it retries every period). */
(function () {
  "use strict";
  var meta = document.querySelector('meta[name="live-refresh"]');
  if (!meta || !window.fetch || !window.DOMParser) return;
  var seconds = parseFloat(meta.getAttribute("content"));
  if (!(seconds > 0)) return;
  var src = meta.getAttribute("data-src") || window.location.href;
  var root = document.documentElement;
  var ENTRY = 'input:not([type="hidden"]):not([type="submit"]):not([type="button"]), select, textarea';
  var refreshes = 0;

  function revealNotes() {
    document.querySelectorAll("[data-live-note]").forEach(function (el) { el.hidden = false; });
  }

  function swap(fresh) {
    document.querySelectorAll("[data-live]").forEach(function (region) {
      if (region.querySelector(ENTRY)) return;
      var next = fresh.querySelector('[data-live="' + CSS.escape(region.getAttribute("data-live")) + '"]');
      if (next) region.replaceWith(document.importNode(next, true));
    });
    revealNotes();
  }

  function schedule() { window.setTimeout(tick, seconds * 1000); }

  function tick() {
    if (document.hidden) { schedule(); return; }  // nobody is looking: ask again later
    fetch(src, {credentials: "same-origin", cache: "no-store", headers: {"X-Live-Refresh": "1"}})
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        swap(fresh);
        refreshes += 1;
        root.setAttribute("data-live-refreshes", String(refreshes));
        root.removeAttribute("data-live-stale");
        if (fresh.querySelector('meta[name="live-refresh"]')) schedule();
        else root.setAttribute("data-live-done", "");
      })
      .catch(function () {
        root.setAttribute("data-live-stale", "");
        schedule();
      });
  }

  revealNotes();
  schedule();
})();
