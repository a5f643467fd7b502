// The console's only script (the Content-Security-Policy allows no other): refreshes
// the page's live part in place, keeping the selection, and counts lease TTLs down.
(function () {
  "use strict";
  var refresh = parseInt(document.body.dataset.refresh || "0", 10);
  var live = document.getElementById("live");
  var base = performance.now();

  function human(ms) {
    if (ms < 0) ms = 0;
    if (ms < 1000) return Math.floor(ms) + "ms";
    if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
    var m = Math.floor(ms / 60000), s = Math.floor(ms / 1000) % 60;
    if (ms < 3600000) return m + "m" + (s < 10 ? "0" : "") + s + "s";
    var h = Math.floor(ms / 3600000); m = m % 60;
    return h + "h" + (m < 10 ? "0" : "") + m + "m";
  }

  function tick() {
    var el = performance.now() - base;
    document.querySelectorAll("[data-ttl-ms]").forEach(function (e) {
      e.textContent = human(parseInt(e.dataset.ttlMs, 10) - el);
    });
    document.querySelectorAll("[data-held-ms]").forEach(function (e) {
      e.textContent = human(parseInt(e.dataset.heldMs, 10) + el);
    });
  }

  // A page that is slow to render (a long timeline) is asked for less often: never
  // more than a third of the time is spent waiting for it.
  var wait = refresh;

  // An operator typing in a form of the live part (a reason to resume, to release)
  // keeps what they typed and the node they act on: no refresh while a text field of
  // it has the focus or holds text not sent yet.
  function editing() {
    var a = document.activeElement;
    var text = function (e) { return e.matches("textarea, select, input:not([type=hidden]):not([type=checkbox]):not([type=radio])"); };
    if (a && live.contains(a) && text(a)) return true;
    return Array.prototype.some.call(live.querySelectorAll("input, textarea"), function (e) {
      return text(e) && e.value !== e.defaultValue;
    });
  }

  function held() {
    var up = document.getElementById("updated");
    if (up) { up.textContent = "refresh held while you type"; up.className = "held"; }
    setTimeout(poll, wait);
  }

  function poll() {
    if (editing()) return held();
    var t0 = performance.now();
    var u = new URL(window.location.href);
    u.searchParams.set("fragment", "1");
    u.searchParams.delete("done");
    fetch(u.toString(), { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) throw new Error(r.status);
      return r.text();
    }).then(function (html) {
      if (editing()) return held(); // typing began while the page was asked for
      var checked = {};
      live.querySelectorAll("input[type=checkbox]:checked").forEach(function (e) { checked[e.value] = true; });
      var open = {};
      live.querySelectorAll("details[open]").forEach(function (e) { open[e.id] = true; });
      live.innerHTML = html;
      live.querySelectorAll("input[type=checkbox]").forEach(function (e) { if (checked[e.value]) e.checked = true; });
      live.querySelectorAll("details").forEach(function (e) { if (open[e.id]) e.open = true; });
      base = performance.now();
      wait = Math.max(refresh, 3 * (base - t0));
      tick();
      var up = document.getElementById("updated");
      if (up) { up.textContent = "updated " + new Date().toLocaleTimeString(); up.className = ""; }
      setTimeout(poll, wait);
    }).catch(function () {
      var up = document.getElementById("updated");
      if (up) { up.textContent = "refresh failed; retrying"; up.className = "stale"; }
      setTimeout(poll, wait);
    });
  }

  // A button with data-confirm asks first (purge).
  document.addEventListener("click", function (ev) {
    var b = ev.target.closest("button[data-confirm]");
    if (b && !window.confirm(b.dataset.confirm)) ev.preventDefault();
    var all = ev.target.closest("input.all");
    if (all) {
      document.querySelectorAll("input[name=id][form=dlq]").forEach(function (e) { e.checked = all.checked; });
    }
  });

  if (live && refresh > 0) setTimeout(poll, refresh);
  setInterval(tick, 250);
})();
