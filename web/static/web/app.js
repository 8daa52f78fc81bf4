// Small behaviours shared by every page; the pages work without them, only less smoothly.
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
