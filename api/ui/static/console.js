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
};

function reviewCard(review) {
  const what = review.target ? `${review.operation} ${review.target}` : review.operation;
  const card = el("article", {
    class: "card review", "data-review": review.id, "data-status": review.status,
    "aria-label": `Review: ${review.caller} wants to ${what}`,
  });
  card.append(el("h3", { text: `${review.caller} wants to ${what}` }));
  card.append(el("p", { class: "meta", text:
    `Agent ${review.caller} · operation ${review.operation}` +
    (review.target ? ` · target ${review.target}` : "") }));
  if (review.operation === "invoke" && review.preview) {
    card.append(el("p", { class: "preview", text: review.preview }));
  }
  card.append(el("div", { class: "body" }));
  fillReview(card, review);
  return card;
}

function fillReview(card, review) {
  card.dataset.status = review.status;
  const body = $(".body", card);
  body.replaceChildren();
  if (review.status !== "pending") {
    const who = review.decided_by && review.status !== "timed_out" ? ` by ${review.decided_by}` : "";
    body.append(el("p", { class: `outcome outcome-${review.status}`, role: "status",
      text: (OUTCOMES[review.status] || review.status) + who }));
    return;
  }
  if (review.deadline) {
    body.append(el("p", {}, "Times out in ", el("span", {
      class: "countdown", "data-deadline": review.deadline, "aria-live": "off" })));
  }
  const buttons = el("div", { class: "actions" });
  const deny = el("button", { type: "button", class: "danger", text: "Deny" });
  const once = el("button", { type: "button", text: "Allow once" });
  deny.addEventListener("click", () => decide(card, review, "deny"));
  once.addEventListener("click", () => decide(card, review, "allow_once"));
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
    always.addEventListener("click", () => decide(card, review, "always_allow", scope.value));
    buttons.append(always, el("label", { for: id, text: "Always allow for" }), scope);
  }
  body.append(buttons, el("p", { class: "error", role: "alert", hidden: true }));
  tick();
}

async function decide(card, review, decision, scope) {
  const error = $(".error", card);
  for (const b of card.querySelectorAll("button")) b.disabled = true;
  try {
    const settled = await api("POST", `/v1/reviews/${review.id}/decision`,
      scope ? { decision, scope } : { decision });
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
    span.textContent = left > 0
      ? `${Math.floor(left / 60)}:${String(left % 60).padStart(2, "0")}` : "now…";
  }
}
setInterval(tick, 500);

// --- the inbox ------------------------------------------------------------------------------

function renderList(box, items) {
  const keep = new Map([...box.children].map((c) => [c.dataset.review, c]));
  const next = items.map((r) => {
    const old = keep.get(r.id);
    if (old && old.dataset.status === r.status) return old;
    if (old) { fillReview(old, r); return old; }
    return reviewCard(r);
  });
  box.replaceChildren(...next);
}

function inboxPage() {
  const render = (state) => {
    renderList($("#pending"), state.pending);
    renderList($("#recent"), state.recent);
    $("#pending-count").textContent = String(state.pending.length);
  };
  render(JSON.parse($("#inbox-state").textContent));
  const source = new EventSource("/ui/inbox/stream");
  source.addEventListener("inbox", (e) => render(JSON.parse(e.data)));
}

// --- the session page -----------------------------------------------------------------------

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
      li = el("li", { class: `msg msg-${role}`, "data-msg": id },
        el("span", { class: "who", text: who }), el("span", { class: "text" }));
      messages.set(id, li); list.append(li);
    }
    return li;
  };
  const who = (d) => d.role === "user" ? "You" : d.role === "tool" ? `tool ${d.tool_name || ""}` :
    d.role === "error" ? "error" : agent;

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

  const delegation = (d) => {
    let card = cards.get(d.delegation_id);
    if (!card) {
      card = el("article", { class: "card delegation", "data-delegation": d.delegation_id,
        "aria-label": `Delegation to ${d.target_agent_id}` },
        el("h3", { text: `${d.supervisor_agent_id || agent} → ${d.target_agent_id}` }),
        el("p", { class: "meta task", text: d.task ? `Task: ${d.task}` : "" }),
        el("div", { class: "work" }),
        el("p", { class: "state", role: "status", text: "running" }));
      cards.set(d.delegation_id, card);
      list.append(el("li", {}, card));
    }
    return card;
  };

  const on = {
    message: (d) => {
      const li = bubble(d.message_id, d.role, who(d));
      const text = $(".text", li);
      // Events carry a summary; the streamed chunks may already hold the whole reply.
      if (d.text.length >= text.textContent.length) text.textContent = d.text;
      li.className = `msg msg-${d.role}`;
    },
    chunk: (d) => {
      const li = bubble(d.message_id, "assistant", agent);
      $(".text", li).textContent += d.text;
    },
    status: (d) => {
      const s = $("#session-status");
      s.textContent = d.status; s.className = `status status-${d.status}`;
    },
    review_requested: showReview,
    delegation_review_requested: showReview,
    review_resolved: (d) => {
      const card = reviewsShown.get(d.review_id);
      if (card) fillReview(card, { id: d.review_id, status: d.status, decided_by: d.decided_by });
    },
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
      $(".state", card).textContent = d.status === "completed"
        ? `completed: ${d.result_preview || ""}` : `${d.status}: ${d.error || ""}`;
      card.dataset.status = d.status;
    },
  };
  const source = new EventSource(`/v1/sessions/${sid}/events`);
  for (const [type, fn] of Object.entries(on)) {
    source.addEventListener(type, (e) => fn(JSON.parse(e.data)));
  }
  ambassadorPanel(sid);
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
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const data = new FormData(form);
    const body = { prompt: data.get("prompt"), disable_delegation: data.get("mode") === "solo" };
    if (data.get("what") === "team") body.team = data.get("team"); else body.agent = data.get("agent");
    const error = $("#launch-error");
    try {
      const started = await api("POST", "/v1/sessions", body);
      window.location.href = `/ui/sessions/${started.session_id}`;
    } catch (err) { error.textContent = err.message; error.hidden = false; }
  });
}

const PAGES = { inbox: inboxPage, session: sessionPage, home: homePage };
document.addEventListener("DOMContentLoaded", () => {
  const page = PAGES[document.body.dataset.page];
  if (page) page();
});
