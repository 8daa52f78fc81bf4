// Upload a version with a real progress bar: XMLHttpRequest's upload.onprogress while the
// bytes go to the registry's REST endpoint (signed-in session + CSRF token), then the
// version's status partial, which htmx polls until the version is ready or rejected.
(function () {
  "use strict";
  const form = document.getElementById("upload-form");
  if (!form) return;
  const [config, weights, button, bar, percent, error, status, dropzone] = loraplex.byIds(
    "config-file", "weights-file", "upload-button", "upload-progress",
    "upload-percent", "upload-error", "upload-status", "dropzone",
  );
  const csrf = loraplex.csrfToken();
  const maxWeights = Number(form.dataset.maxWeights);
  const maxConfig = Number(form.dataset.maxConfig);

  function showError(message) {
    error.textContent = message;
    error.hidden = !message;
  }

  function put(input, file) {
    const list = new DataTransfer();
    list.items.add(file);
    input.files = list.files;
  }

  // Dropped files go to the input their name says they belong to.
  ["dragenter", "dragover"].forEach((type) =>
    dropzone.addEventListener(type, (event) => {
      event.preventDefault();
      dropzone.classList.add("over");
    }),
  );
  ["dragleave", "drop"].forEach((type) =>
    dropzone.addEventListener(type, () => dropzone.classList.remove("over")),
  );
  dropzone.addEventListener("drop", (event) => {
    event.preventDefault();
    const refused = [];
    for (const file of event.dataTransfer.files) {
      if (file.name.endsWith(".json")) put(config, file);
      else if (file.name.endsWith(".safetensors")) put(weights, file);
      else refused.push(file.name);
    }
    showError(
      refused.length
        ? `Not an adapter file: ${refused.join(", ")}. Drop adapter_config.json and adapter_model.safetensors.`
        : "",
    );
  });

  function check() {
    if (!config.files.length || !weights.files.length) {
      return "Pick both files: adapter_config.json and adapter_model.safetensors.";
    }
    if (config.files[0].size > maxConfig) {
      return `${config.files[0].name} is larger than the ${maxConfig}-byte limit for a config.`;
    }
    if (weights.files[0].size > maxWeights) {
      return `${weights.files[0].name} is ${weights.files[0].size} bytes; this deployment accepts up to ${maxWeights}.`;
    }
    return "";
  }

  function progress(fraction) {
    const value = Math.round(fraction * 100);
    bar.value = value;
    percent.textContent = `${value}%`;
  }

  function watch(number, created) {
    const url = form.dataset.statusUrl.replace(/\/0\/status\/$/, `/${number}/status/`);
    status.innerHTML = "";
    const note = document.createElement("p");
    note.className = "muted";
    note.textContent = created
      ? `Uploaded as v${number}.`
      : `These exact files were uploaded before, as v${number}.`;
    const live = document.createElement("div");
    live.setAttribute("hx-get", url);
    live.setAttribute("hx-trigger", "load");
    live.setAttribute("hx-swap", "outerHTML");
    status.append(note, live);
    htmx.process(live);
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const problem = check();
    showError(problem);
    if (problem) return;

    const body = new FormData();
    body.append("config", config.files[0]);
    body.append("weights", weights.files[0]);
    const xhr = new XMLHttpRequest();
    xhr.open("POST", form.dataset.apiUrl);
    xhr.setRequestHeader("X-CSRFToken", csrf);
    xhr.setRequestHeader("X-Loraplex-Tenant", form.dataset.tenant);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.addEventListener("progress", (e) => {
      if (e.lengthComputable) progress(e.loaded / e.total);
    });
    xhr.upload.addEventListener("load", () => progress(1));
    xhr.addEventListener("load", () => {
      button.disabled = false;
      if (xhr.status === 200 || xhr.status === 202) {
        const version = JSON.parse(xhr.responseText);
        form.reset();
        watch(version.number, xhr.status === 202);
      } else {
        // The files stay picked, so trying again needs no new choice.
        const why = loraplex.errorMessage(xhr.status, xhr.statusText, xhr.responseText);
        showError(`Upload refused: ${why}`);
      }
    });
    xhr.addEventListener("error", () => {
      button.disabled = false;
      showError("The upload failed (network error). Your files are still selected; try again.");
    });
    button.disabled = true;
    bar.hidden = false;
    progress(0);
    xhr.send(body);
  });
})();
