// Small behaviours shared by every page; the pages work without them, only less smoothly.

// Helpers for the page scripts (playground.js, upload.js), which run after this one.
window.loraplex = {
  // The elements with these ids, in that order.
  byIds: (...ids) => ids.map((id) => document.getElementById(id)),
  // The page's CSRF token, for the requests the scripts send themselves.
  csrfToken: () => document.querySelector('meta[name="csrf-token"]').content,
  // What an error answer says: OpenAI's `{"error": {"message"}}` when the body holds one.
  errorMessage(status, statusText, body) {
    try {
      const parsed = JSON.parse(body);
      if (parsed.error && parsed.error.message) return parsed.error.message;
    } catch (_) {
      /* not JSON: fall through */
    }
    return `The server answered ${status} ${statusText}.`;
  },
};

(function () {
  "use strict";
  // The tenant switcher submits on change.
  document.querySelectorAll("select[data-autosubmit]").forEach((select) =>
    select.addEventListener("change", () => select.form.submit()),
  );
  // Forms that destroy something ask first.
  document.querySelectorAll("form[data-confirm]").forEach((form) =>
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    }),
  );
  // Copy buttons: data-copy names the input whose value to copy.
  document.querySelectorAll("[data-copy]").forEach((button) =>
    button.addEventListener("click", async () => {
      const input = document.querySelector(button.dataset.copy);
      try {
        await navigator.clipboard.writeText(input.value);
      } catch (_) {
        input.select();
        document.execCommand("copy");
      }
      button.textContent = "Copied";
      setTimeout(() => (button.textContent = "Copy"), 2000);
    }),
  );
})();
