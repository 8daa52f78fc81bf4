// The playground: stream a chat completion (OpenAI SSE: `data: {...}` lines, ending with
// `data: [DONE]`) from the chosen model, and the same conversation from the base model side
// by side. Signed in by the session; the CSRF token goes in X-CSRFToken.
(function () {
  "use strict";
  const form = document.getElementById("playground");
  if (!form) return;
  const csrf = loraplex.csrfToken();
  const [model, compare, message, system, send, stop] = loraplex.byIds(
    "model", "compare", "message", "system", "send", "stop",
  );
  const base = form.dataset.base;
  const panes = {
    main: { el: document.getElementById("pane-main"), history: [] },
    base: { el: document.getElementById("pane-base"), history: [] },
  };
  let controllers = [];

  function layout() {
    const same = model.value === base;
    panes.main.el.querySelector(".pane-title").textContent = model.value;
    panes.base.el.hidden = same || !compare.checked;
  }
  model.addEventListener("change", () => {
    clear();
    layout();
  });
  compare.addEventListener("change", layout);
  layout();

  function clear() {
    for (const pane of Object.values(panes)) {
      pane.history = [];
      pane.el.querySelector(".transcript").innerHTML = "";
      pane.el.querySelector(".stats").textContent = "";
    }
  }
  document.getElementById("clear").addEventListener("click", clear);
  stop.addEventListener("click", () => controllers.forEach((c) => c.abort()));

  function bubble(pane, role, text) {
    const div = document.createElement("div");
    div.className = `turn ${role}`;
    div.dataset.role = role;
    div.textContent = text;
    pane.el.querySelector(".transcript").append(div);
    return div;
  }

  // Yields each parsed `data:` payload of an SSE stream.
  async function* events(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        const data = block
          .split(/\r?\n/)
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).trimStart())
          .join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }

  async function run(pane, modelName, text) {
    pane.history.push({ role: "user", content: text });
    bubble(pane, "user", text);
    const out = bubble(pane, "assistant", "");
    out.classList.add("streaming");
    const stats = pane.el.querySelector(".stats");
    const messages = system.value.trim()
      ? [{ role: "system", content: system.value.trim() }, ...pane.history]
      : pane.history;
    const controller = new AbortController();
    controllers.push(controller);
    const started = performance.now();
    let first = null;
    let tokens = 0;
    let reply = "";
    try {
      const response = await fetch(form.dataset.endpoint, {
        method: "POST",
        credentials: "same-origin",
        signal: controller.signal,
        headers: {
          "Content-Type": "application/json",
          Accept: "text/event-stream",
          "X-CSRFToken": csrf,
          "X-Loraplex-Tenant": form.dataset.tenant,
        },
        body: JSON.stringify({
          model: modelName,
          messages,
          stream: true,
          max_tokens: Number(document.getElementById("max-tokens").value) || 128,
          temperature: Number(document.getElementById("temperature").value) || 0,
        }),
      });
      if (!response.ok) {
        const body = await response.text();
        throw new Error(loraplex.errorMessage(response.status, response.statusText, body));
      }
      for await (const chunk of events(response)) {
        if (chunk.error) throw new Error(chunk.error.message || "the stream failed");
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          if (first === null) first = performance.now();
          tokens += 1;
          reply += delta.content;
          out.textContent = reply;
        }
      }
      pane.history.push({ role: "assistant", content: reply });
      const total = (performance.now() - started) / 1000;
      const ttft = first === null ? "–" : `${Math.round(first - started)} ms`;
      stats.textContent = `${tokens} chunks in ${total.toFixed(2)} s · first token after ${ttft}`;
      out.dataset.done = "true";
    } catch (err) {
      pane.history.pop();
      out.classList.add("failed");
      out.textContent = reply + (reply ? "\n" : "") + `⚠ ${err.name === "AbortError" ? "stopped" : err.message}`;
      out.dataset.done = "error";
    } finally {
      out.classList.remove("streaming");
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = message.value.trim();
    if (!text) return;
    message.value = "";
    send.disabled = true;
    stop.hidden = false;
    controllers = [];
    const runs = [run(panes.main, model.value, text)];
    if (!panes.base.el.hidden) runs.push(run(panes.base, base, text));
    await Promise.allSettled(runs);
    send.disabled = false;
    stop.hidden = true;
  });
  message.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
})();
