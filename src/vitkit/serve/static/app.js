// vitkit serve: the page. Plain JavaScript, no framework, nothing fetched from elsewhere.
// It reads /api/model, sends the chosen file to /api/predict and /api/explain, re-asks
// /api/explain (debounced) when a control moves, and shows the Figure 7 panels.
"use strict";

const FIGURE_TITLES = {
  attention_distance: "mean attention distance",
  position_similarity: "position embedding similarity",
  filters: "filter principal components",
};
const DEBOUNCE_MS = 200;
const TOPK = 5;

const state = {
  model: null, file: null, explainSeq: 0, explainTimer: null, explainAbort: null,
  predictSeq: 0, predictAbort: null,
};
const $ = (id) => document.getElementById(id);

// -- requests --------------------------------------------------------------------------

// A bearer token given as ?token=... goes with every API call.
const token = new URLSearchParams(window.location.search).get("token");

function authHeaders() {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

// fetch that throws an Error carrying the API's {"error": ...} message on a non-2xx answer.
async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { ...authHeaders(), ...(options.headers || {}) },
  });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body && body.error) message = `${response.status}: ${body.error}`;
    } catch (_) {
      // not JSON: keep the status line
    }
    throw new Error(message);
  }
  return response;
}

function showError(error) {
  if (error && error.name === "AbortError") return;
  const box = $("error");
  box.textContent = error instanceof Error ? error.message : String(error);
  box.hidden = false;
}

function clearError() {
  const box = $("error");
  box.textContent = "";
  box.hidden = true;
}

// -- the model -------------------------------------------------------------------------

async function loadModel() {
  const model = await (await api("api/model")).json();
  state.model = model;
  $("model-name").textContent = model.name;
  document.title = `${model.name} · vitkit serve`;
  $("model-task").textContent = model.task;
  $("model-inputs").textContent = model.inputs;
  $("model-precision").textContent =
    model.precision + (model.merge_tokens ? `, merging ${model.merge_tokens} tokens` : "") +
    (model.tta === "flip" ? ", flip TTA" : "");
  $("model-size").textContent = `${model.img_size[0]}×${model.img_size[1]}×${model.in_chans}`;
  $("model-grid").textContent = `${model.grid[0]}×${model.grid[1]}`;
  $("model-depth").textContent = `${model.depth} × ${model.num_heads}`;
  $("file-input").accept = model.inputs === "arrays" ? ".npy" : "image/*";

  const slider = $("layer-slider");
  slider.max = String(model.depth);
  slider.value = String(model.depth);
  $("layer-value").textContent = slider.value;
  const heads = $("head-select");
  for (let head = 0; head < model.num_heads; head += 1) {
    const option = document.createElement("option");
    option.value = String(head);
    option.textContent = `head ${head + 1} (raw)`;
    heads.append(option);
  }
  loadFigures(model.figures || Object.keys(FIGURE_TITLES));
}

// The figures come through fetch (not <img src=...>) so that the bearer token goes with them.
function loadFigures(names) {
  const box = $("figures");
  box.replaceChildren();
  for (const name of names) {
    const figure = document.createElement("figure");
    const image = document.createElement("img");
    image.id = `figure-${name}`;
    image.alt = FIGURE_TITLES[name] || name;
    const caption = document.createElement("figcaption");
    caption.textContent = FIGURE_TITLES[name] || name;
    figure.append(image, caption);
    box.append(figure);
    api(`api/figures/${name}.png`)
      .then((response) => response.blob())
      .then((blob) => { image.src = URL.createObjectURL(blob); })
      .catch(showError);
  }
}

// -- the file --------------------------------------------------------------------------

function useFile(file) {
  if (!file) return;
  state.file = file;
  clearError();
  $("file-name").textContent = file.name;
  clearAttention();  // the last file's map must not stand under this file's name
  predict();
  explain();
}

function clearAttention() {
  $("image").removeAttribute("src");
  $("overlay").removeAttribute("src");
  $("explain-caption").textContent = "";
}

function formData(extra) {
  const form = new FormData();
  form.append("file", state.file, state.file.name);
  for (const [key, value] of Object.entries(extra)) form.append(key, String(value));
  return form;
}

// Only the answer for the file chosen last is shown (an earlier, slower one is dropped), as
// explain() does for the overlay.
async function predict() {
  if (state.predictAbort) state.predictAbort.abort();
  const abort = new AbortController();
  state.predictAbort = abort;
  const seq = ++state.predictSeq;
  const box = $("predictions");
  box.setAttribute("aria-busy", "true");
  try {
    const response = await api("api/predict",
      { method: "POST", body: formData({ topk: TOPK }), signal: abort.signal });
    const { predictions } = await response.json();
    if (seq !== state.predictSeq) return;
    box.replaceChildren(...predictions.map(renderPrediction));
  } catch (error) {
    if (seq !== state.predictSeq) return;
    box.replaceChildren(hint("No prediction."));
    showError(error);
  } finally {
    if (seq === state.predictSeq) box.removeAttribute("aria-busy");
  }
}

function hint(text) {
  const p = document.createElement("p");
  p.className = "hint";
  p.textContent = text;
  return p;
}

// One prediction object (as `vitkit predict --json` prints it) as bars or values.
function renderPrediction(prediction) {
  const block = document.createElement("div");
  block.className = "prediction";
  const title = document.createElement("h3");
  title.textContent = prediction.path;
  block.append(title);
  if (prediction.error) {
    block.append(hint(`error: ${prediction.error}`));
  } else if (prediction.topk) {
    for (const row of prediction.topk) block.append(bar(row.label, row.prob));
  } else if (prediction.values) {
    const table = document.createElement("table");
    table.className = "values";
    prediction.values.forEach((value, index) => {
      const name = prediction.names && prediction.names[index] ? prediction.names[index]
        : `output ${index}`;
      const tr = document.createElement("tr");
      tr.className = "value";
      tr.dataset.label = name;
      tr.dataset.value = String(value);
      const th = document.createElement("th");
      th.textContent = name;
      const td = document.createElement("td");
      td.textContent = Number(value).toPrecision(4);
      tr.append(th, td);
      table.append(tr);
    });
    block.append(table);
  } else if (prediction.probs) {
    const chosen = new Set(prediction.labels);
    const labels = Object.keys(prediction.probs)
      .sort((a, b) => prediction.probs[b] - prediction.probs[a]);
    for (const label of labels) block.append(bar(label, prediction.probs[label], chosen.has(label)));
    if (!chosen.size) block.append(hint("no label at 50% or more"));
  }
  return block;
}

function bar(label, prob, marked = false) {
  const row = document.createElement("div");
  row.className = marked ? "bar marked" : "bar";
  row.dataset.label = label;
  row.dataset.prob = String(prob);
  const name = document.createElement("span");
  name.className = "bar-label";
  name.textContent = label;
  const track = document.createElement("span");
  track.className = "bar-track";
  track.setAttribute("role", "meter");
  track.setAttribute("aria-label", label);
  track.setAttribute("aria-valuemin", "0");
  track.setAttribute("aria-valuemax", "1");
  track.setAttribute("aria-valuenow", String(prob));
  const fill = document.createElement("span");
  fill.className = "bar-fill";
  fill.style.width = `${Math.max(0, Math.min(1, prob)) * 100}%`;
  track.append(fill);
  const value = document.createElement("span");
  value.className = "bar-value";
  value.textContent = `${(100 * prob).toFixed(1)}%`;
  row.append(name, track, value);
  return row;
}

// -- explain ---------------------------------------------------------------------------

function controls() {
  return {
    layer: $("layer-slider").value,
    head: $("head-select").value,
    discard_ratio: $("discard-slider").value,
    fusion: $("fusion-select").value,
  };
}

// Re-ask /api/explain DEBOUNCE_MS after the last change; an answer to an older request is
// dropped (and its request aborted), so the overlay always matches the controls.
function scheduleExplain() {
  const { layer, head, discard_ratio: discard } = controls();
  $("layer-value").textContent = layer;
  $("discard-value").textContent = Number(discard).toFixed(2);
  const rollout = head === "all";
  $("discard-slider").disabled = !rollout;
  $("fusion-select").disabled = !rollout;
  clearTimeout(state.explainTimer);
  if (state.file) state.explainTimer = setTimeout(explain, DEBOUNCE_MS);
}

async function explain() {
  if (!state.file) return;
  if (state.explainAbort) state.explainAbort.abort();
  const abort = new AbortController();
  state.explainAbort = abort;
  const seq = ++state.explainSeq;
  const asked = controls();
  const overlay = $("overlay");
  overlay.setAttribute("aria-busy", "true");
  try {
    const response = await api("api/explain",
      { method: "POST", body: formData(asked), signal: abort.signal });
    const answer = await response.json();
    if (seq !== state.explainSeq) return;
    $("image").src = answer.image_png;
    overlay.src = answer.overlay_png;
    overlay.dataset.layer = String(answer.layer);
    overlay.dataset.head = String(answer.head);
    overlay.removeAttribute("aria-busy");
    $("explain-caption").textContent = caption(answer);
  } catch (error) {
    if (seq === state.explainSeq) {
      overlay.removeAttribute("aria-busy");
      showError(error);  // (choosing a file cleared the last file's map: useFile)
    }
  }
}

function caption(answer) {
  const grid = `${answer.grid[0]}×${answer.grid[1]} patches`;
  if (answer.head === "all") {
    return `Rollout through layers 1–${answer.layer}, heads fused by ${answer.fusion}, ` +
      `weakest ${Math.round(100 * answer.discard_ratio)}% discarded; ${grid}, scaled 0–1.`;
  }
  return `Raw attention of head ${Number(answer.head) + 1} at layer ${answer.layer}; ` +
    `${grid}, scaled 0–1.`;
}

// -- wiring ----------------------------------------------------------------------------

function wire() {
  $("file-input").addEventListener("change", (event) => useFile(event.target.files[0]));
  const zone = $("drop-zone");
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    useFile(event.dataTransfer.files[0]);
  });
  for (const id of ["layer-slider", "discard-slider"]) {
    $(id).addEventListener("input", scheduleExplain);
  }
  for (const id of ["head-select", "fusion-select"]) {
    $(id).addEventListener("change", scheduleExplain);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  wire();
  loadModel().catch(showError);
});
