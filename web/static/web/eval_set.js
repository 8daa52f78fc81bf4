// Attach or replace an adapter's eval set: the file goes to the registry's REST endpoint
// (PUT .../eval-set/, signed-in session + CSRF token), the same path the API documents;
// the page then reloads to show the new set and its audit record, or says why it was refused.
(function () {
  "use strict";
  const form = document.getElementById("eval-set-form");
  if (!form) return;
  const [file, button, error] = loraplex.byIds("eval-set-file", "eval-set-button", "eval-set-error");
  const maxBytes = Number(form.dataset.maxBytes);

  function showError(message) {
    error.textContent = message;
    error.hidden = !message;
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!file.files.length) return showError("Pick a JSONL file first.");
    if (file.files[0].size > maxBytes) {
      return showError(`${file.files[0].name} is ${file.files[0].size} bytes; eval sets may hold up to ${maxBytes}.`);
    }
    showError("");
    const body = new FormData();
    body.append("file", file.files[0]);
    button.disabled = true;
    try {
      const response = await fetch(form.dataset.apiUrl, {
        method: "PUT",
        body,
        headers: {
          "X-CSRFToken": loraplex.csrfToken(),
          "X-Loraplex-Tenant": form.dataset.tenant,
          Accept: "application/json",
        },
        credentials: "same-origin",
      });
      if (response.ok) {
        window.location.reload();
        return;
      }
      const text = await response.text();
      showError(`Eval set refused: ${loraplex.errorMessage(response.status, response.statusText, text)}`);
    } catch (_) {
      showError("The upload failed (network error); try again.");
    }
    button.disabled = false;
  });
})();
