// Baton console: live parts of the server-rendered pages (no framework, no CDN).
// Every text from the API goes into the page through textContent, never as HTML.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs = {}, ...kids) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) node.append(kid);
  return node;
}

async function api(method, path, body) {
  const resp = await fetch(path, {
    method,
    credentials: "same-origin",
    headers: body ? { "content-type": "application/json" } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  let data = null;
  try { data = await resp.json(); } catch (_) { /* no body */ }
  if (!resp.ok) {
    const err = new Error((data && (data.detail || data.title)) || resp.statusText);
    err.status = resp.status; err.data = data;
    throw err;
  }
  return data;
}

// --- review cards (Gamut X-Agent Policies, 'The review flow') ------------------------------------------

const OUTCOMES = {
  allowed: "Allowed", denied: "Denied", timed_out: "Timed out — denied", cancelled: "Cancelled",
  withdrawn: "Withdrawn — a newer message interrupted the turn",
};

function reviewCard(review) {
  const what = review.target ? `${review.operation} ${review.target}` : review.operation;
  const card = el("article", {
    class: "card review", id: review.id, "data-review": review.id, "data-status": review.status,
    "aria-label": `Review: ${review.caller} wants to ${what}`,
  });
  card.append(el("h3", { text: `${review.caller} wants to ${what}` }));
  card.append(el("p", { class: "meta", text:
    `Agent ${review.caller} · operation ${review.operation}` +
    (review.target ? ` · target ${review.target}` : "") }));
  if (review.operation === "invoke" && review.preview) {
    card.append(el("p", { class: "preview", text: review.preview }));
  }
  card.append(el("p", { class: "meta context" }));
  if (review.last_messages && review.last_messages.length) {
    card.append(el("p", { class: "meta", text: "The calling session's last messages:" }),
      el("ol", { class: "last-messages" }, ...review.last_messages.map((m) => el("li", {
        text: `${m.role === "user" ? "user" : m.agent || "agent"}: ${m.text}` }))));
  }
  if (review.history) {
    const { allowed, denied } = review.history;
    card.append(el("p", { class: "meta history", text: allowed + denied === 0
      ? `First time ${review.caller} asks for this.`
      : `Before: allowed ${allowed} time${allowed === 1 ? "" : "s"}, denied ${denied} time${denied === 1 ? "" : "s"}.` }));
  }
  // Before deciding: this caller's earlier decisions on this target (a pending review has
  // no audit row of its own yet; a resolved card links that row below).
  const past = new URLSearchParams({ agent: review.caller, ...(review.target ? { target: review.target } : {}) });
  card.append(el("p", { class: "links" }, el("a", { href: `/ui/audit?${past}`,
    class: "history-link", text: "Past decisions in the audit log" })));
  card.append(el("div", { class: "body" }));
  fillReview(card, review);
  return card;
}

// The calling session and when the review opened (so two alike cards can be told apart).
function reviewContext(card, review) {
  const box = $(".context", card);
  if (!box || !review.session_id || box.dataset.filled) return;
  box.dataset.filled = "1";
  box.append("From ", el("a", { href: `/ui/sessions/${review.session_id}`, class: "session-link",
    text: `session ${review.session_id.slice(8, 16)}` }));
  if (review.created_at) {
    box.append(" · opened ", el("time", { datetime: review.created_at,
      text: new Date(review.created_at).toLocaleTimeString() }));
  }
}

const SAVED = { target: (r) => `policy saved: always allow for ${r.target}`,
  all: () => "policy saved: always allow for all agents" };

function fillReview(card, review) {
  card.dataset.status = review.status;
  card.classList.toggle("resolved", review.status !== "pending");
  reviewContext(card, review);
  const body = $(".body", card);
  // A pending card is filled again when its details arrive (the deadline): what the
  // reviewer already typed into an edit box, and the focus, carry over to the new box.
  const typed = new Map([...body.querySelectorAll(".edit")].map((e) => [e.id, e.value]));
  const focused = body.contains(document.activeElement) ? document.activeElement.id : null;
  body.replaceChildren();
  if (review.status !== "pending") {
    const who = review.decided_by && review.status !== "timed_out" ? ` by ${review.decided_by}` : "";
    body.append(el("p", { class: `outcome outcome-${review.status}`, role: "status",
      text: (OUTCOMES[review.status] || review.status) + who }));
    if (review.scope && SAVED[review.scope]) {
      body.append(el("p", { class: "saved", text: SAVED[review.scope](review) }));
    }
    body.append(el("p", { class: "links" }, el("a", { href: `/ui/audit?review_id=${review.id}`,
      class: "audit-link", text: "Find in the audit log" })));
    return;
  }
  if (review.deadline) {
    body.append(el("p", {}, "Times out in ", el("span", {
      class: "countdown", "data-deadline": review.deadline, "aria-live": "off" })));
  }
  const buttons = el("div", { class: "actions" });
  const deny = el("button", { type: "button", class: "danger", text: "Deny" });
  const once = el("button", { type: "button", text: "Allow once" });
  // What a reviewer may edit before allowing (docs/xagent.md, Reviews): an invoke's
  // message, a create's name and instructions, nothing of a list or read. A field left
  // empty keeps what the caller wrote.
  const fields = EDITS[review.operation] || [];
  const edits = fields.map(([field, label, tag, placeholder], i) => {
    const id = `edit-${review.id}-${i}`;
    const input = tag === "textarea"
      ? el("textarea", { id, class: "edit", rows: 3, placeholder })
      : el("input", { id, class: "edit", placeholder, maxlength: 200 });
    input.value = typed.get(id) || "";
    body.append(el("label", { for: id, text: label }), input);
    if (id === focused) input.focus();
    return [field, input];
  });
  const edited = () => Object.fromEntries(
    edits.filter(([, input]) => input.value.trim()).map(([field, input]) => [field, input.value]));
  deny.addEventListener("click", () => decide(card, review, "deny"));
  once.addEventListener("click", () => decide(card, review, "allow_once", undefined, edited()));
  buttons.append(deny, once);
  if (review.operation !== "create") {  // create is never remembered (Gamut X-Agent Policies)
    const id = `scope-${review.id}`;
    const scope = el("select", { id, name: "scope" });
    if (review.operation === "list") {
      scope.append(el("option", { value: "all", text: "listing agents" }));
    } else {
      const verb = review.operation === "read" ? "reading" : "messaging";
      scope.append(el("option", { value: "target", text: `${verb} ${review.target}` }));
      scope.append(el("option", { value: "all", text: `${verb} all agents` }));
    }
    const always = el("button", { type: "button", class: "primary", text: "Always allow" });
    always.addEventListener("click",
      () => decide(card, review, "always_allow", scope.value, edited()));
    buttons.append(always, el("label", { for: id, text: "Always allow for" }), scope);
  }
  body.append(buttons, el("p", { class: "error", role: "alert", hidden: true }));
  tick();
}

// The edits each operation's review card offers: [field, label, element, placeholder].
const EDITS = {
  invoke: [["edited_prompt", "Edit the message before allowing it", "textarea",
    "Leave empty to send the message as written"]],
  create: [
    ["edited_name", "Edit the new agent's name", "input", "Leave empty to keep the name"],
    ["edited_instructions", "Edit the new agent's instructions", "textarea",
      "Leave empty to keep the caller's instructions"],
  ],
};

async function decide(card, review, decision, scope, edits) {
  const error = $(".error", card);
  for (const b of card.querySelectorAll("button")) b.disabled = true;
  const body = { ...(scope ? { decision, scope } : { decision }), ...(edits || {}) };
  try {
    const settled = await api("POST", `/v1/reviews/${review.id}/decision`, body);
    if (settled.status !== "pending") fillReview(card, { ...review, ...settled });
  } catch (err) {
    try {
      const now = await api("GET", `/v1/reviews/${review.id}`);
      if (now.status !== "pending") { fillReview(card, { ...review, ...now }); return; }
    } catch (_) { /* keep the first error */ }
    error.textContent = err.message; error.hidden = false;
    for (const b of card.querySelectorAll("button")) b.disabled = false;
  }
}

function tick() {
  for (const span of document.querySelectorAll(".countdown[data-deadline]")) {
    const left = Math.max(0, Math.round((Date.parse(span.dataset.deadline) - Date.now()) / 1000));
    const hours = Math.floor(left / 3600);
    const mins = Math.floor((left % 3600) / 60);
    span.textContent = left <= 0 ? "now…" : hours
      ? `${hours}h ${String(mins).padStart(2, "0")}m` : `${mins}:${String(left % 60).padStart(2, "0")}`;
  }
}
setInterval(tick, 500);

// --- step handoff cards (POST /v1/steps/{id}/handoff, as `baton step approve|revise|reject`) -----

const STEP_OUTCOMES = {
  completed: "Approved — completed", rejected: "Rejected", failed: "Failed", running: "Running",
};
const DECIDED = { approve: "Approved", revise: "Sent back for revision", reject: "Rejected" };
const handoffKey = (step) => `${step.step_id}:${step.attempts}`;

function deliverableText(value) {
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

function handoffCard(step) {
  const card = el("article", {
    class: "card handoff", "data-step": step.step_id, "data-key": handoffKey(step),
    "aria-label": `Handoff: ${step.agent} step ${step.title}`,
  });
  card.append(el("h3", {}, el("a", { href: `/ui/steps/${step.step_id}`,
    text: `${step.agent}@${step.version} hands off: ${step.title}` })));
  card.append(el("p", { class: "meta", text: `Step handoff · attempt ${step.attempts}` +
    (step.max_attempts ? ` of ${step.max_attempts}` : "") }));
  if (step.deliverable !== null && step.deliverable !== undefined) {
    card.append(el("pre", { class: "preview", text: deliverableText(step.deliverable) }));
  }
  card.append(el("div", { class: "body" }));
  fillHandoff(card, step);
  return card;
}

// Fill a handoff's body: its controls while it waits, else the outcome. `decided` names the
// decision this page made; the text then says it and the status the server reported after it.
function fillHandoff(card, step, decided) {
  card.dataset.status = step.status;
  const body = $(".body", card);
  body.replaceChildren();
  if (decided || step.status !== "awaiting_handoff") {
    let text = decided ? `${DECIDED[decided]} — the step is ${step.status}` +
      (step.status === "running" || step.status === "awaiting_handoff"
        ? `, attempt ${step.attempts}` : "")
      : (STEP_OUTCOMES[step.status] || step.status);
    if (!decided && step.error) text += `: ${step.error}`;
    body.append(el("p", { class: `outcome outcome-step-${step.status}`, role: "status", text }));
    return;
  }
  if (step.deadline) {
    body.append(el("p", {}, "Time left to decide: ", el("span", {
      class: "countdown", "data-deadline": step.deadline, "aria-live": "off" })));
  }
  const id = `note-${step.step_id}`;
  const note = el("textarea", { id, name: "feedback", rows: "2", class: "note" });
  const approve = el("button", { type: "button", class: "primary", text: "Approve" });
  const revise = el("button", { type: "button", text: "Revise with note" });
  const reject = el("button", { type: "button", class: "danger", text: "Reject" });
  approve.addEventListener("click", () => handoff(card, step, "approve"));
  revise.addEventListener("click", () => handoff(card, step, "revise"));
  reject.addEventListener("click", () => handoff(card, step, "reject"));
  body.append(el("label", { for: id, text: "Note (sent with Revise or Reject)" }), note,
    el("div", { class: "actions" }, approve, revise, reject),
    el("p", { class: "error", role: "alert", hidden: true }));
  tick();
}

async function handoff(card, step, decision) {
  const error = $(".error", card);
  const note = $(".note", card).value.trim();
  if (decision === "revise" && !note) {
    error.textContent = "Write a note saying what to revise."; error.hidden = false;
    $(".note", card).focus();
    return;
  }
  const body = { decision };
  if (note && decision !== "approve") body.feedback = note;
  for (const b of card.querySelectorAll("button")) b.disabled = true;
  try {
    const settled = await api("POST", `/v1/steps/${step.step_id}/handoff`, body);
    card.dataset.decided = decision;
    fillHandoff(card, { ...step, ...settled }, decision);
    document.dispatchEvent(new CustomEvent("handoff-decided", { detail: card }));
  } catch (err) {
    try {
      const now = await api("GET", `/v1/steps/${step.step_id}`);
      if (now.status !== "awaiting_handoff" || now.attempts !== step.attempts) {
        fillHandoff(card, { ...step, ...now }); return;
      }
    } catch (_) { /* keep the first error */ }
    error.textContent = err.message; error.hidden = false;
    for (const b of card.querySelectorAll("button")) b.disabled = false;
  }
}

// --- the inbox ------------------------------------------------------------------------------

function renderHandoffs(box, items, skip) {
  const keep = new Map([...box.children].map((c) => [c.dataset.key, c]));
  const next = items.filter((s) => !skip.has(handoffKey(s))).map((s) => {
    const old = keep.get(handoffKey(s));
    if (old && old.dataset.status === s.status && !old.dataset.decided) return old;
    return handoffCard(s);
  });
  syncChildren(box, next);
}

// Make ``box``'s children ``next`` moving only the nodes out of place: a node taken out of
// the page loses the keyboard focus, so a refresh must leave the card a person is on alone.
function syncChildren(box, next) {
  next.forEach((node, i) => {
    if (box.children[i] !== node) box.insertBefore(node, box.children[i] || null);
  });
  while (box.children.length > next.length) box.lastElementChild.remove();
}

function renderList(box, items) {
  const keep = new Map([...box.children].map((c) => [c.dataset.review, c]));
  const next = items.map((r) => {
    const old = keep.get(r.id);
    if (old && old.dataset.status === r.status) return old;
    if (old) { fillReview(old, r); return old; }
    return reviewCard(r);
  });
  syncChildren(box, next);
}

function inboxPage() {
  // Handoffs decided on this page keep their outcome card at the top of the resolved list
  // (a revised step is running again, so it is in neither list of the server's state).
  const decided = new Map();
  let last = null;
  const render = (state) => {
    last = state;
    renderList($("#pending"), state.pending);
    renderList($("#recent"), state.recent);
    renderHandoffs($("#handoffs"), state.handoffs, new Set(decided.keys()));
    const recent = $("#recent-handoffs");
    renderHandoffs(recent, state.recent_handoffs, new Set(decided.keys()));
    recent.prepend(...decided.values());
    const waiting = state.pending.length + state.handoffs.filter((s) => !decided.has(handoffKey(s))).length;
    $("#pending-count").textContent = String(waiting);
    $("#pending-empty").hidden = waiting > 0;
    $("#recent-empty").hidden = state.recent.length + state.recent_handoffs.length + decided.size > 0;
  };
  document.addEventListener("handoff-decided", (e) => {
    decided.set(e.detail.dataset.key, e.detail);
    if (last) render(last);
  });
  render(JSON.parse($("#inbox-state").textContent));
  const source = new EventSource("/ui/inbox/stream");
  source.addEventListener("inbox", (e) => render(JSON.parse(e.data)));
}

// --- a step's page --------------------------------------------------------------------------

function stepPage() {
  const box = $("#handoff");
  if (box) fillHandoff(box, JSON.parse($("#step-state").textContent));
  const { step, status, attempts } = document.body.dataset;
  if (["completed", "failed", "rejected"].includes(status)) return;
  // Follow the step: when its status or attempt changes, show the page as it is now.
  const poll = async () => {
    try {
      const now = await api("GET", `/v1/steps/${step}`);
      if (now.status !== status || String(now.attempts) !== attempts) {
        window.setTimeout(() => window.location.reload(), box && box.dataset.decided ? 1500 : 0);
        return;
      }
    } catch (_) { /* try again */ }
    window.setTimeout(poll, 1000);
  };
  window.setTimeout(poll, 1000);
}

// --- the session page -----------------------------------------------------------------------

// --- exhibit cards (docs/exhibits.md, Rendering) ------------------------------------------------------
// Everything an exhibit carries is model content: it goes in through textContent only. Images
// are fetched from this API and shown as blob: URLs, and only of the safe raster types; SVG, HTML
// and everything else is a download link. A chart spec is shown as its JSON, never run.

const SAFE_IMAGES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
const OWN_CONTENT = /^\/v1\/sessions\/session-[0-9a-f-]{36}\/(exhibits|files)\/[^?#]+$/;

function exhibitImage(body, w) {
  const img = el("img", { class: "exhibit-image", alt: w.title });
  body.append(img);
  fetch(w.url, { credentials: "same-origin" }).then(async (resp) => {
    const type = (resp.headers.get("content-type") || "").split(";")[0].trim();
    if (!resp.ok || !SAFE_IMAGES.has(type)) throw new Error(`${resp.status} ${type}`);
    img.src = URL.createObjectURL(new Blob([await resp.blob()], { type }));
  }).catch((err) => {
    img.replaceWith(el("p", { class: "error", text: `The image could not be shown (${err.message}).` }));
  });
}

function exhibitTable(w) {
  const columns = Array.isArray(w.columns) ? w.columns : [];
  const cell = (v) => (v === null || v === undefined ? "" : String(v));
  return el("div", { class: "exhibit-table" }, el("table", {},
    el("thead", {}, el("tr", {}, ...columns.map((c) => el("th", { scope: "col", text: cell(c) })))),
    el("tbody", {}, ...(Array.isArray(w.rows) ? w.rows : []).map((row) =>
      el("tr", {}, ...(Array.isArray(row) ? row : []).map((v) => el("td", { text: cell(v) })))))));
}

function exhibitCard(w) {
  const kind = String(w.kind || "");
  const body = el("div", { class: "exhibit-body" });
  const card = el("article", { class: `card exhibit exhibit-${kind.replace(/[^a-z]/g, "")}`,
    "data-exhibit": w.id, "aria-label": `Exhibit: ${w.title}` },
    el("h3", { text: String(w.title || "") }),
    el("p", { class: "meta", text: `${kind}${w.agent ? ` · from ${w.agent}` : ""}` }), body);
  const url = typeof w.url === "string" && OWN_CONTENT.test(w.url) ? w.url : null;
  const image = kind === "image" || (kind === "file" && SAFE_IMAGES.has(w.media_type));
  if (image && url && SAFE_IMAGES.has(w.media_type)) {
    exhibitImage(body, w);
  } else if (kind === "table") {
    body.append(exhibitTable(w));
  } else if (kind === "chart") {
    body.append(el("p", { class: "hint", text: "Chart specification (Vega-Lite), shown as JSON:" }),
      el("pre", { class: "exhibit-spec", text: JSON.stringify(w.spec, null, 2) }));
  } else if (kind === "markdown") {
    body.append(el("pre", { class: "exhibit-text", text: String(w.text || "") }));
  }
  if (url && !image) {
    const name = String(w.filename || w.path || w.title || "download").split("/").pop();
    body.append(el("a", { class: "exhibit-download", href: url, download: name,
      text: `Download ${name}${w.size !== undefined ? ` (${w.size} bytes${w.media_type ? `, ${w.media_type}` : ""})` : ""}` }));
  }
  return card;
}

function sessionPage() {
  const sid = document.body.dataset.session;
  const agent = document.body.dataset.agent;
  const timeout = Number(document.body.dataset.reviewTimeout);
  const list = $("#transcript");
  const messages = new Map();
  const cards = new Map();
  const reviewsShown = new Map();

  const bubble = (id, role, who) => {
    let li = messages.get(id);
    if (!li) {
      // A tool's output is collapsed under its name (delegated results are on their card).
      li = role === "tool"
        ? el("li", { class: `msg msg-${role}`, "data-msg": id }, el("details", {},
          el("summary", { class: "who", text: who }), el("pre", { class: "text" })))
        : el("li", { class: `msg msg-${role}`, "data-msg": id },
          el("span", { class: "who", text: who }), el("span", { class: "text" }));
      li.append(forkButton(sid, id));
      messages.set(id, li); list.append(li);
    }
    return li;
  };
  // JSON tool output is shown indented (still as text, never as HTML).
  const pretty = (text) => {
    const t = text.trim();
    if (!t.startsWith("{") && !t.startsWith("[")) return text;
    try { return JSON.stringify(JSON.parse(t), null, 2); } catch (_) { return text; }
  };
  const who = (d) => d.role === "user" ? "You" : d.role === "tool" ? `tool ${d.tool_name || ""}` :
    d.role === "error" ? "error" : d.role === "attachment" ? "attached" : agent;
  const files = filesPanel(sid);

  const showReview = async (d) => {
    if (reviewsShown.has(d.review_id)) return;
    const card = reviewCard({ id: d.review_id, caller: d.caller, operation: d.operation,
      target: d.target, preview: d.preview, status: "pending" });
    reviewsShown.set(d.review_id, card);
    list.append(el("li", {}, card));
    try {
      const r = await api("GET", `/v1/reviews/${d.review_id}`);
      const deadline = new Date(Date.parse(r.created_at) + timeout * 1000).toISOString();
      fillReview(card, { ...r, deadline });
    } catch (_) { /* the stream's own fields stay */ }
  };

  // One card per exhibit, from the transcript (a reload) or the stream, under its delegation's
  // card when it was shown inside one.
  const exhibits = new Map();
  const placeExhibit = (li, w) => {
    const host = w.delegation_id && cards.get(w.delegation_id);
    if (host) $(".exhibits", host).append(li); else list.append(li);
  };
  const showExhibit = (w) => {
    if (!w || !w.id || exhibits.has(w.id)) return;
    const li = el("li", { class: "exhibit-item", "data-delegation": w.delegation_id || null },
      exhibitCard(w));
    exhibits.set(w.id, li);
    placeExhibit(li, w);
  };
  const delegation = (d) => {
    let card = cards.get(d.delegation_id);
    if (!card) {
      card = el("article", { class: "card delegation", "data-delegation": d.delegation_id,
        "aria-label": `Delegation to ${d.target_agent_id}` },
        el("h3", {}, d.session_id
          ? el("a", { href: `/ui/sessions/${d.session_id}`, class: "delegated-session",
            text: `${d.supervisor_agent_id || d.caller_agent_id || agent} → ${d.target_agent_id}` })
          : `${d.supervisor_agent_id || d.caller_agent_id || agent} → ${d.target_agent_id}`),
        el("p", { class: "meta task", text: d.task ? `Task: ${d.task}` : "" }),
        el("div", { class: "work" }),
        el("ol", { class: "exhibits", "aria-label": "Exhibits" }),
        el("p", { class: "state", role: "status", text: "running" }));
      cards.set(d.delegation_id, card);
      list.append(el("li", {}, card));
      // Cards a reload rebuilt from the transcript before this card existed move under it.
      for (const li of exhibits.values()) {
        if (li.dataset.delegation === d.delegation_id) $(".exhibits", card).append(li);
      }
    }
    return card;
  };

  const on = {
    message: (d) => {
      const li = bubble(d.message_id, d.role, who(d));
      const text = $(".text", li);
      // Events carry a summary; the streamed chunks may already hold the whole reply.
      if (d.role === "tool") text.textContent = pretty(d.text);
      else if (d.text.length >= text.textContent.length) text.textContent = d.text;
      li.className = `msg msg-${d.role}`;
      if (d.role === "tool" && WORKSPACE_TOOLS.has(d.tool_name)) files.refresh();
    },
    workspace_attached: () => files.refresh(),
    chunk: (d) => {
      const li = bubble(d.message_id, "assistant", agent);
      $(".text", li).textContent += d.text;
    },
    status: (d) => {
      const s = $("#session-status");
      s.textContent = d.status; s.className = `status status-${d.status}`;
      composerBusy(d.status);
    },
    review_requested: showReview,
    delegation_review_requested: showReview,
    review_resolved: async (d) => {
      const card = reviewsShown.get(d.review_id);
      if (!card) return;
      fillReview(card, { id: d.review_id, status: d.status, decided_by: d.decided_by });
      try {  // the settled review says whether a policy was saved
        fillReview(card, await api("GET", `/v1/reviews/${d.review_id}`));
      } catch (_) { /* the event's fields stay */ }
    },
    exhibit: showExhibit,
    delegation_start: (d) => { delegation(d); },
    delegation_chunk: (d) => { $(".work", delegation(d)).textContent += d.content || ""; },
    delegation_tool_call: (d) => {
      $(".work", delegation(d)).append(el("div", { class: "tool", text: `→ ${d.tool}` }));
    },
    delegation_tool_result: (d) => {
      $(".work", delegation(d)).append(el("div", { class: "tool",
        text: `← ${d.tool}: ${d.success ? "" : "failed: "}${d.content || ""}` }));
    },
    delegation_complete: (d) => {
      const card = delegation(d);
      // The result shows once: in the card's body (streamed there, or the preview).
      const work = $(".work", card);
      if (d.status === "completed" && !work.textContent.trim()) work.textContent = d.result_preview || "";
      $(".state", card).textContent = d.status === "completed" ? "completed" : `${d.status}: ${d.error || ""}`;
      card.dataset.status = d.status;
    },
  };
  const follow = () => {
    const source = new EventSource(`/v1/sessions/${sid}/events`);
    for (const [type, fn] of Object.entries(on)) {
      source.addEventListener(type, (e) => fn(JSON.parse(e.data)));
    }
  };
  // The transcript first: its present_exhibit turns rebuild every exhibit card (a reload), and a
  // fork's prefix is the original's (read by reference), in the transcript, not in this
  // session's event log; the log follows with the rest. The transcript is paged: follow
  // next_cursor until the last page.
  const forked = Boolean(document.body.dataset.forkedFrom);
  const transcript = async () => {
    let cursor = null;
    do {
      const q = cursor ? `&cursor=${encodeURIComponent(cursor)}` : "";
      const t = await api("GET", `/v1/sessions/${sid}/transcript?limit=500${q}`);
      for (const m of t.messages) {
        if (forked && !m.id.startsWith(`${sid}:`)) on.message({ ...m, message_id: m.id });
        if (m.exhibit) showExhibit(m.exhibit);
      }
      cursor = t.next_cursor;
    } while (cursor);
  };
  transcript().catch(() => { /* the log still shows the session's own messages */ }).finally(follow);
  ambassadorPanel(sid);
  composer(sid);
}

// --- the files panel: the session's workspace (docs/workspaces.md) -------------------------------------

const WORKSPACE_TOOLS = new Set(["write_file", "delete_file"]);

function fileUrl(sid, path) {
  return `/v1/sessions/${sid}/files/${path.split("/").map(encodeURIComponent).join("/")}`;
}

function sizeText(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

// Lists the workspace with download links (always attachments: the API never serves a file
// inline unless it is a raster image or plain text), refreshed when the agent writes or
// deletes a file or a file is attached; the form attaches one (PUT, as the session's owner).
function filesPanel(sid) {
  const box = $("#files");
  const empty = $("#no-files");
  let pending = null;
  const refresh = () => {
    if (pending) return pending;
    pending = api("GET", `/v1/sessions/${sid}/files`).then((page) => {
      box.replaceChildren(...page.data.map((f) => el("li", { "data-path": f.path },
        el("a", { href: fileUrl(sid, f.path), download: f.path.split("/").pop(), text: f.path }),
        el("span", { class: "meta", text: `${sizeText(f.size)} · ${f.content_type}` }))));
      empty.hidden = page.data.length > 0;
    }).catch(() => { /* the list stays as it was */ }).finally(() => { pending = null; });
    return pending;
  };
  const form = $("#attach");
  if (form) {
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const error = $("#attach-error");
      const file = $("#attach-file").files[0];
      if (!file) return;
      error.hidden = true;
      const resp = await fetch(fileUrl(sid, file.name), {
        method: "PUT", credentials: "same-origin", body: file,
        headers: { "content-type": file.type || "application/octet-stream" },
      });
      if (!resp.ok) {
        let detail = resp.statusText;
        try { detail = (await resp.json()).detail || detail; } catch (_) { /* no body */ }
        error.textContent = detail; error.hidden = false;
        return;
      }
      form.reset();
      refresh();
    });
  }
  refresh();
  return { refresh };
}

// The composer: a message to the session; while a turn runs it offers to queue the message
// (it runs next) or to interrupt the turn (docs/sessions.md, Messages while a turn runs).
const BUSY = new Set(["running", "awaiting_input"]);

function composerBusy(status) {
  const busy = $("#if-busy-box");
  if (busy) busy.hidden = !BUSY.has(status);
}

function composer(sid) {
  const form = $("#compose");
  if (!form) return;
  composerBusy($("#session-status").textContent.trim());
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const button = $("button", form); const error = $("#compose-error");
    const prompt = $("#prompt").value;
    if (!prompt.trim()) return;
    const body = { prompt };
    if (!$("#if-busy-box").hidden) body.if_busy = $("#if-busy").value;
    button.disabled = true; error.hidden = true;
    try {
      await api("POST", `/v1/sessions/${sid}/messages`, body);
      $("#prompt").value = "";
    } catch (err) { error.textContent = err.message; error.hidden = false; }
    button.disabled = false;
  });
}

// --- Fork from here (docs/change-safely.md, Fork a session) ------------------------------------------

function forkButton(sid, messageId) {
  const button = el("button", { type: "button", class: "fork-here", text: "Fork from here" });
  button.addEventListener("click", () => {
    const li = button.closest("li");
    if ($(".fork-form", li)) return;
    const error = el("p", { class: "error", role: "alert", hidden: true });
    const form = el("form", { class: "fork-form", "aria-label": "Fork from this message" },
      el("label", { text: "Next message (empty: the original's next one)" },
        el("textarea", { name: "prompt", rows: "2" })),
      el("label", { text: "Agent (slug@version or slug@draft; empty: this session's)" },
        el("input", { name: "agent" })),
      el("label", {}, el("input", { type: "checkbox", name: "sandbox" }),
        " Sandbox (needed for the draft)"),
      el("button", { type: "submit", text: "Fork" }), error);
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const body = { after_message_id: messageId, sandbox: form.sandbox.checked };
      if (form.prompt.value.trim()) body.prompt = form.prompt.value;
      if (form.agent.value.trim()) body.agent = form.agent.value.trim();
      try {
        const started = await api("POST", `/v1/sessions/${sid}/fork`, body);
        window.location.href = `/ui/sessions/${started.session_id}`;
      } catch (err) { error.textContent = err.message; error.hidden = false; }
    });
    li.append(form);
  });
  return button;
}

function ambassadorPanel(sid) {
  const thread = $("#thread");
  const entry = (inq) => {
    const li = el("li", { class: "card", "data-inquiry": inq.id },
      el("p", { class: "q", text: `You asked: ${inq.question}` }),
      el("p", { class: "a", text: inq.status === "failed"
        ? `The ambassador could not answer: ${inq.error || ""}` : `${inq.ambassador}: ${inq.answer || "…"}` }));
    if (document.body.dataset.voice === "on" && inq.status === "answered") {
      li.append(el("audio", { controls: true, preload: "none", "aria-label": "Listen to the answer",
        src: `/v1/sessions/${sid}/inquiries/${inq.id}/speech` }));
    }
    if (inq.draft) {
      li.append(el("p", { class: "meta", text: "Draft for you to send:" }),
        el("p", { class: "draft", text: inq.draft }));
      if (inq.sent_message_id) {
        li.append(el("p", { class: "sent", role: "status", text: "Sent." }));
      } else {
        const send = el("button", { type: "button", class: "primary", text: "Send draft" });
        const err = el("p", { class: "error", role: "alert", hidden: true });
        send.addEventListener("click", async () => {
          send.disabled = true;
          try {
            await api("POST", `/v1/sessions/${sid}/messages`, { from_draft: inq.id });
            send.replaceWith(el("p", { class: "sent", role: "status", text: "Sent." }));
          } catch (e) { err.textContent = e.message; err.hidden = false; send.disabled = false; }
        });
        li.append(send, err);
      }
    }
    return li;
  };
  for (const inq of JSON.parse($("#thread-state").textContent)) thread.append(entry(inq));
  const form = $("#ask");
  if (!form) return;  // no ambassador: the panel says how to add one
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const button = $("button", form); const error = $("#ask-error");
    const question = $("#question").value.trim();
    if (!question) return;
    const body = { question };
    const pick = $("#amb-pick").value;
    if (pick) body.ambassador = pick;
    button.disabled = true; button.textContent = "Asking…"; error.hidden = true;
    try {
      thread.append(entry(await api("POST", `/v1/sessions/${sid}/inquiries`, body)));
      $("#question").value = "";
    } catch (err) { error.textContent = err.message; error.hidden = false; }
    button.disabled = false; button.textContent = "Ask";
  });
}

// --- the launcher ---------------------------------------------------------------------------

function homePage() {
  const form = $("#launcher");
  if (!form) return;
  // Only the chosen kind's controls show: an agent (with or without delegation) or a team.
  const show = () => {
    const what = $('input[name="what"]:checked', form).value;
    for (const box of form.querySelectorAll(".mode")) box.hidden = box.dataset.mode !== what;
  };
  for (const radio of form.querySelectorAll('input[name="what"]')) radio.addEventListener("change", show);
  show();
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const data = new FormData(form);
    const body = { prompt: data.get("prompt") };
    if (data.get("what") === "team") body.team = data.get("team");
    else { body.disable_delegation = data.get("mode") === "solo"; body.agent = data.get("agent"); }
    const error = $("#launch-error");
    try {
      const started = await api("POST", "/v1/sessions", body);
      window.location.href = `/ui/sessions/${started.session_id}`;
    } catch (err) { error.textContent = err.message; error.hidden = false; }
  });
}

// --- an agent's cross-agent permissions (PUT /v1/agents/{slug}/policies) -----------------------

function policiesPage() {
  const form = $("#policies");
  const slug = document.body.dataset.agent;
  const search = $("#policy-search");
  search.addEventListener("input", () => {
    const q = search.value.trim().toLowerCase();
    let shown = 0;
    for (const row of form.querySelectorAll("tr[data-target]")) {
      row.hidden = q !== "" && !row.dataset.search.includes(q);
      if (!row.hidden) shown += 1;
    }
    $("#policy-nomatch").hidden = shown > 0 || !form.querySelector("tr[data-target]");
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const pick = (name) => $(`input[name="${name}"]:checked`, form).value;
    const body = { global: { list: pick("global.list"), read: pick("global.read"),
      invoke: pick("global.invoke") }, targets: {} };
    for (const row of form.querySelectorAll("tr[data-target]")) {
      const read = $('select[name="read"]', row).value;
      const invoke = $('select[name="invoke"]', row).value;
      if (read !== "review" || invoke !== "review") body.targets[row.dataset.target] = { read, invoke };
    }
    const error = $("#policy-error"); const saved = $("#policy-saved");
    error.hidden = true; saved.textContent = "";
    try {
      await api("PUT", `/v1/agents/${slug}/policies`, body);
      saved.textContent = "Saved. The next call follows these permissions.";
    } catch (err) { error.textContent = err.message; error.hidden = false; }
  });
}

// --- an agent: draft, publish, restore, roll back, retire (the API's own calls) ----------------

// The line of the editor's text where the last named key of an error's path is (1-based).
function lineOf(text, path) {
  const keys = String(path || "").split(/[.[\]]/).filter((k) => k && !/^\d+$/.test(k));
  if (!keys.length) return null;
  const key = keys[keys.length - 1].replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const re = new RegExp(`^\\s*(- )?"?${key}"?\\s*:`);
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i += 1) if (re.test(lines[i])) return i + 1;
  return null;
}

function agentPage() {
  const slug = document.body.dataset.agent;
  const done = $("#agent-done"); const error = $("#agent-error");
  const told = sessionStorage.getItem("baton-agent-done");
  if (told) { done.textContent = told; sessionStorage.removeItem("baton-agent-done"); }
  const finish = (text) => {
    sessionStorage.setItem("baton-agent-done", text);
    window.location.reload();
  };
  const fail = (err) => { error.textContent = err.message; error.hidden = false; };
  const form = $("#draft-form");
  const text = $("#draft-text");
  const errors = $("#draft-errors");
  const format = () => $('input[name="format"]:checked', form).value;
  for (const radio of form.querySelectorAll('input[name="format"]')) {
    radio.addEventListener("change", () => {
      window.location.search = `?fmt=${radio.value}`;
    });
  }
  // Parse the editor's text, then store it with PUT /v1/agents/{slug}/draft. False (and
  // the errors listed at their fields) when either refuses it.
  const save = async () => {
    errors.replaceChildren(); text.removeAttribute("aria-invalid");
    try {
      const parsed = await api("POST", "/ui/spec/parse", { text: text.value, format: format() });
      await api("PUT", `/v1/agents/${slug}/draft`, parsed.spec);
      return true;
    } catch (err) {
      const data = err.data || {};
      const list = data.errors && data.errors.length ? data.errors
        : [{ path: data.path || "", message: data.detail || err.message, line: data.line }];
      for (const e of list) {
        const line = e.line || lineOf(text.value, e.path);
        errors.append(el("li", { class: "field-error", "data-path": e.path || "",
          text: `${e.path ? `${e.path}: ` : ""}${e.message}${line ? ` (line ${line})` : ""}` }));
      }
      text.setAttribute("aria-invalid", "true");
      return false;
    }
  };
  if (form) {
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      if (await save()) finish("Draft saved.");
    });
  }
  const acts = {
    publish: async () => {
      if (!(await save())) return;
      const rev = await api("POST", `/v1/agents/${slug}/publish`);
      finish(`Published v${rev.version} (${rev.digest.slice(0, 19)}…); it is live.`);
    },
    rollback: async (v) => {
      await api("POST", `/v1/agents/${slug}/rollback`, { version: Number(v) });
      finish(`Rolled back: v${v} is live; new sessions run it.`);
    },
    restore: async (v) => {
      await api("POST", `/v1/agents/${slug}/restore`, { version: Number(v) });
      finish(`v${v} restored into the draft (nothing published).`);
    },
    retire: async () => {
      await api("POST", `/v1/agents/${slug}/retire`);
      finish("Retired: new launches are refused until you publish or roll back.");
    },
  };
  for (const button of document.querySelectorAll("button[data-act]")) {
    button.addEventListener("click", async () => {
      error.hidden = true; done.textContent = "";
      button.disabled = true;
      try { await acts[button.dataset.act](button.dataset.version); } catch (err) { fail(err); }
      button.disabled = false;
    });
  }
}

// --- a team: members, lead and routes, saved with PUT /v1/teams/{id} ---------------------------

function teamPage() {
  const form = $("#team-form");
  const done = $("#team-done");
  const told = sessionStorage.getItem("baton-team-done");
  if (told) { done.textContent = told; sessionStorage.removeItem("baton-team-done"); }
  if (!form) return;
  const members = $("#team-members"); const routes = $("#team-routes");
  const errors = $("#team-errors");
  // Every control says which row it is in (the rows are added and removed).
  const label = () => {
    members.querySelectorAll("tr").forEach((row, i) => {
      const n = i + 1;
      $(".m-agent", row).setAttribute("aria-label", `Member ${n} agent`);
      $(".m-lead", row).setAttribute("aria-label", `Member ${n} is the lead`);
      $(".m-hint", row).setAttribute("aria-label", `Member ${n} delegation hint`);
      $(".m-remove", row).setAttribute("aria-label", `Remove member ${n}`);
    });
    routes.querySelectorAll("tr").forEach((row, i) => {
      const n = i + 1;
      $(".r-when", row).setAttribute("aria-label", `Route ${n} when`);
      $(".r-to", row).setAttribute("aria-label", `Route ${n} to`);
      $(".r-remove", row).setAttribute("aria-label", `Remove route ${n}`);
    });
  };
  const add = (body, template) => {
    body.append($(template).content.cloneNode(true));
    label();
    $("input", body.lastElementChild).focus();
  };
  $("#add-member").addEventListener("click", () => add(members, "#member-row"));
  $("#add-route").addEventListener("click", () => add(routes, "#route-row"));
  form.addEventListener("click", (e) => {
    const remove = e.target.closest(".m-remove, .r-remove");
    if (!remove) return;
    remove.closest("tr").remove();
    label();
  });
  label();
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    errors.replaceChildren();
    const rows = [...members.querySelectorAll("tr")];
    const lead = rows.find((row) => $(".m-lead", row).checked);
    const body = {
      id: form.dataset.team,
      name: form.dataset.name,
      description: form.dataset.description,
      shared_channel: form.dataset.channel,
      supervisor_agent_id: lead ? $(".m-agent", lead).value.trim() : "",
      members: rows.map((row) => {
        const hint = $(".m-hint", row).value.trim();
        return { agent_id: $(".m-agent", row).value.trim(),
          role: row === lead ? "supervisor" : "specialist", ...(hint ? { delegation_hint: hint } : {}) };
      }),
      routes: [...routes.querySelectorAll("tr")].map((row) => (
        { when: $(".r-when", row).value, to: $(".r-to", row).value.trim() })),
    };
    const button = $('button[type="submit"]', form);
    button.disabled = true;
    try {
      await api("PUT", `/v1/teams/${form.dataset.team}`, body);
      sessionStorage.setItem("baton-team-done", "Saved. New runs of the team use it.");
      window.location.reload();
    } catch (err) {
      const data = err.data || {};
      const list = data.errors && data.errors.length ? data.errors
        : [{ path: data.path || "", message: data.detail || err.message }];
      for (const item of list) {
        errors.append(el("li", { class: "field-error", "data-path": item.path || "",
          text: `${item.path ? `${item.path}: ` : ""}${item.message}` }));
      }
      button.disabled = false;
    }
  });
}

// --- an eval's page -------------------------------------------------------------------------

function evalPage() {
  const { agent, eval: evalId, status, done } = document.body.dataset;
  if (status !== "running") return;
  // Follow the eval: show its progress; when a replay finishes or the eval ends, show the
  // page as it is now (the server renders the report, escaped).
  const poll = async () => {
    try {
      const now = await api("GET", `/v1/agents/${agent}/evals/${evalId}`);
      $("#eval-progress").max = Math.max(now.total, 1);
      $("#eval-progress").value = now.done;
      $("#eval-done").textContent = `${now.done} of ${now.total} sessions`;
      if (now.status !== status || String(now.done) !== done) {
        window.location.reload();
        return;
      }
    } catch (_) { /* try again */ }
    window.setTimeout(poll, 1000);
  };
  window.setTimeout(poll, 1000);
}

const PAGES = { inbox: inboxPage, session: sessionPage, home: homePage, step: stepPage, policies: policiesPage, agent: agentPage, eval: evalPage, team: teamPage };
document.addEventListener("DOMContentLoaded", () => {
  const page = PAGES[document.body.dataset.page];
  if (page) page();
});
