// Keyboard shortcuts of the review console: progressive, the pages work without it.
"use strict";
(function () {
  function typing(event) {
    var tag = event.target && event.target.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT";
  }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event)) {
      return;
    }
    var rows = Array.prototype.slice.call(document.querySelectorAll("tr.item"));
    if (rows.length && (event.key === "j" || event.key === "k" || event.key === "Enter")) {
      var at = rows.findIndex(function (row) { return row.classList.contains("current"); });
      if (event.key === "Enter") {
        if (at >= 0) { window.location.assign(rows[at].getAttribute("data-href")); }
        return;
      }
      if (at >= 0) { rows[at].classList.remove("current"); }
      at = event.key === "j" ? Math.min(at + 1, rows.length - 1) : Math.max(at - 1, 0);
      rows[at].classList.add("current");
      rows[at].scrollIntoView({ block: "nearest" });
      return;
    }
    if (event.key === "n") {
      var note = document.getElementById("note");
      if (note) { event.preventDefault(); note.focus(); }
      return;
    }
    if (event.key === "[" || event.key === "]") {
      var link = document.getElementById(event.key === "[" ? "previous" : "next");
      if (link) { link.click(); }
      return;
    }
    var button = /^[a-zA-Z]$/.test(event.key) && document.querySelector("button[data-key='" + event.key + "']");
    if (button && /^[a-zA-Z]$/.test(event.key)) {
      event.preventDefault();
      button.click();
    }
  });
})();
