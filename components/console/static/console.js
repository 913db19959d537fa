// Keyboard navigation (o l a r: pages; /: the first filter; j k: next and previous row; Enter: open
// it) and the overview's live rows: htmx swaps the rows it already shows; a row it does not show yet
// (a new object) is appended here.
(function () {
  const pages = { o: "/", l: "/layers", a: "/approvals", r: "/rollouts" };
  function rows() { return Array.from(document.querySelectorAll("main table tbody tr")); }
  function select(step) {
    const all = rows();
    if (!all.length) return;
    const current = all.indexOf(document.activeElement.closest ? document.activeElement.closest("tr") : null);
    const next = all[Math.max(0, Math.min(all.length - 1, current + step))];
    const link = next.querySelector("a");
    if (!next.hasAttribute("tabindex")) next.setAttribute("tabindex", "-1");
    (link || next).focus();
    next.scrollIntoView({ block: "nearest" });
  }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const typing = /^(INPUT|SELECT|TEXTAREA)$/.test(event.target.tagName);
    if (typing) return;
    if (pages[event.key]) { window.location.href = pages[event.key]; event.preventDefault(); }
    else if (event.key === "/") { const first = document.querySelector(".filters select"); if (first) { first.focus(); event.preventDefault(); } }
    else if (event.key === "j") { select(1); event.preventDefault(); }
    else if (event.key === "k") { select(-1); event.preventDefault(); }
  });
  document.addEventListener("htmx:oobErrorNoTarget", function (event) {
    const row = event.detail.content;
    const body = document.getElementById("rows");
    if (body && row && row.tagName === "TR") {
      row.removeAttribute("hx-swap-oob");
      body.appendChild(row);
      const empty = document.getElementById("empty");
      if (empty) empty.remove();
    }
  });
})();
