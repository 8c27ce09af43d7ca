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
  var note = document.getElementById("refresh-note");
  var noteText = note ? note.textContent : "";

  // Whether the person is using a form of the main content (typing a filter): replacing
  // it would wipe what they typed and take their focus away.
  function editing(main) {
    var active = document.activeElement;
    if (active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
      return true;
    }
    var fields = main.querySelectorAll("input, textarea");
    for (var i = 0; i < fields.length; i += 1) {
      if (fields[i].value !== fields[i].defaultValue) {
        return true;
      }
    }
    var options = main.querySelectorAll("option");
    for (var j = 0; j < options.length; j += 1) {
      if (options[j].selected !== options[j].defaultSelected) {
        return true;
      }
    }
    return false;
  }

  function refresh() {
    if (document.hidden) {
      return; // a background tab asks nothing of the database
    }
    var current = document.getElementById("main");
    if (current && editing(current)) {
      return; // the next tick, once the form is left as it was or submitted
    }
    fetch(window.location.href, { headers: { Accept: "text/html" }, cache: "no-store" })
      .then(function (response) {
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main && !editing(main)) {
          main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes));
          refreshes += 1;
          body.setAttribute("data-refreshes", String(refreshes));
        }
        if (note) {
          note.textContent = noteText; // answered again: no failure to show any more
        }
      })
      .catch(function () {
        if (note) {
          note.textContent = "could not refresh: the dashboard did not answer";
        }
      });
  }

  window.setInterval(refresh, seconds * 1000);
  refresh();
})();
