// pgsolo dashboard: refresh the page's main content in place every few seconds (the
// interval is the body's data-refresh), without reloading the page or losing the scroll.
// Without this script the page refreshes itself whole (a <noscript> meta refresh).
(function () {
  "use strict";
  var body = document.body;
  var seconds = parseFloat(body.getAttribute("data-refresh")) || 5;
  body.setAttribute("data-js", "on");
  if (body.getAttribute("data-live") === "no") {
    return; // a confirmation page: nothing changes under a person deciding
  }
  var refreshes = 0;

  function refresh() {
    if (document.hidden) {
      return; // a background tab asks nothing of the database
    }
    fetch(window.location.href, { headers: { Accept: "text/html" }, cache: "no-store" })
      .then(function (response) {
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) {
          main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes));
          refreshes += 1;
          body.setAttribute("data-refreshes", String(refreshes));
        }
      })
      .catch(function () {
        var note = document.getElementById("refresh-note");
        if (note) {
          note.textContent = "could not refresh: the dashboard did not answer";
        }
      });
  }

  window.setInterval(refresh, seconds * 1000);
  refresh();
})();
