// aioqueue dashboard: refresh the page's main part while it is visible, confirm destructive
// forms, select every row. No framework, no build step, nothing fetched from elsewhere.
"use strict";

(function () {
  const seconds = parseFloat(document.body.dataset.refresh || "0");
  let busy = false;

  function interacting() {
    const main = document.getElementById("main");
    const active = document.activeElement;
    if (active && main.contains(active) && active.matches("input, select, textarea")) return true;
    if (main.querySelector("input[type=checkbox]:checked, details[open]")) return true;
    return false;
  }

  async function refresh() {
    if (busy || document.hidden || interacting()) return;
    busy = true;
    try {
      const response = await fetch(window.location.href, { headers: { "X-Requested-With": "fetch" } });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("main");
      if (fresh && !interacting()) {
        fresh.querySelectorAll(".notice").forEach((n) => n.remove());
        document.getElementById("main").replaceChildren(...fresh.childNodes);
      }
    } catch (err) {
      // The server is away (restarting, network): try again next tick, quietly.
    } finally {
      busy = false;
    }
  }

  if (seconds > 0) {
    window.setInterval(refresh, seconds * 1000);
    document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  }

  document.addEventListener("submit", (event) => {
    const form = event.target;
    const message = form.dataset.confirm;
    const button = event.submitter;
    const destructive = message || (button && ["cancel", "delete"].includes(button.value));
    if (!destructive) return;
    if (!window.confirm(message || "Are you sure?")) {
      event.preventDefault();
      return;
    }
    const confirmed = document.createElement("input");
    confirmed.type = "hidden";
    confirmed.name = "confirmed";
    confirmed.value = "1";
    form.appendChild(confirmed);
  });

  document.addEventListener("change", (event) => {
    const box = event.target;
    if (!box.matches(".select-all")) return;
    document.querySelectorAll("input[type=checkbox][name=ids]").forEach((b) => { b.checked = box.checked; });
  });
})();
