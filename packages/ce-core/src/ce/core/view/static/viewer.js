// ce view: the page over the server's JSON API. Plain DOM, no framework, no build step.
// Session content is untrusted: it only ever reaches the page as text nodes (never as HTML).
"use strict";

const app = () => document.getElementById("app");

// h("tag.class", {attr: value}, child, ...): children are nodes, strings (as text) or arrays.
function h(spec, attrs, ...children) {
  const [tag, ...classes] = spec.split(".");
  const el = document.createElement(tag || "div");
  if (classes.length) el.className = classes.join(" ");
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "onclick" || name === "onsubmit") el[name] = value;
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

const enc = encodeURIComponent;
const num = (n) => (n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US"));
const when = (stamp) => (stamp ? stamp.replace("T", " ").replace(/\.\d+/, "") : "");

// Text with its redaction markers and evidence fences marked (still only text nodes).
const MARKS = /(\[REDACTED:[^\]\s]*\]|<\/?evidence\b[^>\n]*>)/;
function marked(text, spec = "pre.text") {
  const el = h(spec);
  for (const piece of String(text).split(MARKS)) {
    if (!piece) continue;
    if (piece.startsWith("[REDACTED:")) el.appendChild(h("span.redacted", { title: "redacted" }, piece));
    else if (piece.startsWith("<")) el.appendChild(h("span.fence", {}, piece));
    else el.appendChild(document.createTextNode(piece));
  }
  return el;
}

async function getJson(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  let body;
  try {
    body = await response.json();
  } catch (err) {
    throw new Error(`${path}: ${response.status} ${response.statusText}`);
  }
  if (!response.ok) throw new Error(body.error || `${path}: ${response.status}`);
  return body;
}

function crumbs(...links) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren();
  for (const [text, href] of links) {
    nav.appendChild(href ? h("a", { href }, text) : h("span", {}, text));
    nav.appendChild(document.createTextNode("/ "));
  }
}

function show(...nodes) {
  app().replaceChildren(...nodes.flat().filter(Boolean));
}

function table(id, headers, rows) {
  const head = h("tr", {}, headers.map(([text, cls]) => h(cls ? `th.${cls}` : "th", {}, text)));
  return h("table", { id }, h("thead", {}, head), h("tbody", {}, rows));
}

const cell = (content, cls) => h(cls ? `td.${cls}` : "td", {}, content);
const badge = (text, cls) => h(`span.badge${cls ? "." + cls : ""}`, {}, text);

// -- the sessions -------------------------------------------------------------------------

async function sessionsPage() {
  crumbs(["sessions", null]);
  const data = await getJson("/api/sessions");
  if (!data.sessions.length) return show(h("h1", {}, "Sessions"), h("p.muted", {}, "The store holds no sessions."));
  const rows = data.sessions.map((s) =>
    h("tr", { "data-session": s.session_id },
      cell(h("a.session-link", { href: `#/s/${enc(s.session_id)}` }, s.session_id)),
      cell(s.authors.join(", ")),
      cell(num(s.messages), "num"), cell(num(s.tool_calls), "num"), cell(num(s.evidences), "num"),
      cell(num(s.model_calls), "num"), cell(num(s.turns), "num"),
      cell(when(s.last_activity)), cell(s.run_status), cell(num(s.version), "num")));
  show(
    h("h1", {}, `Sessions (${data.sessions.length})`),
    table("sessions", [["session"], ["authors"], ["messages", "num"], ["tool calls", "num"],
      ["evidences", "num"], ["model calls", "num"], ["prepared inputs", "num"],
      ["last activity (UTC)"], ["run"], ["version", "num"]], rows));
}

// -- a session's timeline -------------------------------------------------------------------

function usageLine(u) {
  if (!u) return null;
  const first = u.first_token_latency_ms === null ? "" : `, first token ${num(u.first_token_latency_ms)} ms`;
  return h("span.usage", {},
    `${u.model} · ${num(u.prompt_tokens)} prompt + ${num(u.completion_tokens)} completion tokens · ${num(u.latency_ms)} ms${first}`,
    u.status !== "success" ? badge(`${u.status}: ${u.error}`, "error") : null);
}

function callStatus(call) {
  if (!call || call.status === null) return badge("no tool-call record");
  return [badge(call.status, call.status), `${num(call.duration_ms)} ms`];
}

function messageItem(m, sessionId, withUsage = true) {
  const who = m.role + (m.author ? ` · ${m.author.id}` : m.name ? ` · ${m.name}` : "");
  const calls = m.tool_calls.length
    ? h("ul.calls", {}, m.tool_calls.map((c) =>
        h("li.tool-request", {}, `→ ${c.name}(${c.arguments}) `, h("span.muted", {}, `[${c.tool_call_id}] `), callStatus(c.call))))
    : null;
  const result = m.tool_result
    ? h("div.tool-result", {}, `← ${m.tool_result.tool} [${m.tool_result.tool_call_id}] `, callStatus(m.tool_result),
        m.tool_result.evidence_ids.length ? h("span.muted", {}, ` evidence ${m.tool_result.evidence_ids.join(", ")}`) : null)
    : null;
  return h(`li.item.message.${m.role}`, { "data-index": m.index },
    h("div.head", {}, h("span.who", {}, who), h("span.when", {}, `#${m.index} ${when(m.at)}`),
      m.model ? h("span.muted", {}, m.model) : null,
      m.redactions ? badge(`${m.redactions} redacted`) : null,
      m.attachments ? badge(`${m.attachments} attachment(s)`) : null),
    m.content ? marked(m.content) : null, calls, result,
    m.refs.length ? h("div.muted", {}, `cites ${m.refs.join(", ")}`) : null,
    m.usage && withUsage ? h("div.model-usage", {}, usageLine(m.usage)) : null);
}

function actionsText(actions) {
  return ["kept", "degraded", "dropped"].filter((a) => actions[a].blocks)
    .map((a) => h(`span.${a}`, {}, `${a} ${actions[a].blocks} (${num(actions[a].tokens)} tok) `));
}

function modelCallItem(c, sessionId, replyUsage) {
  const href = `#/s/${enc(sessionId)}/t/${enc(c.turn_id)}`;
  return h("li.item.model-call", { "data-turn": c.turn_id },
    h("div.head", {}, h("span.who", {}, `model call ${c.turn} (${c.kind})`), h("span.when", {}, when(c.at)),
      h("a.call-link", { href }, "assembled input →")),
    h("div", {}, `input ${num(c.token_used)} of ${num(c.token_budget)} tokens · `, actionsText(c.actions),
      c.redactions ? badge(`${c.redactions} redaction(s)`) : null, c.errors ? badge(`${c.errors} error(s)`, "error") : null),
    replyUsage ? h("div.model-usage", {}, `reply #${c.reply_index}: `, usageLine(replyUsage)) : null);
}

function provenance(e) {
  const source = [e.source.kind, e.source.name].filter(Boolean).join(":") + (e.source.uri ? ` ${e.source.uri}` : "");
  return h("span.provenance", {}, badge(e.type), " ", source,
    e.score !== null && e.score !== undefined ? ` · score ${e.score}` : "",
    e.tool_call ? ` · from tool call ${e.tool_call.tool} [${e.tool_call.tool_call_id}] ${e.tool_call.status}`
      : e.tool_call_id ? ` · from tool call [${e.tool_call_id}]` : "",
    e.model_usage_id ? ` · from model call ${e.model_usage_id}` : "");
}

function evidenceItem(e) {
  const kind = e.type === "rag_doc" ? "retrieval" : "evidence";
  return h("li.item.evidence", { "data-evidence": e.evidence_id },
    h("div.head", {}, h("span.who", {}, kind), h("span.when", {}, when(e.created_at)), provenance(e),
      e.redactions ? badge(`${e.redactions} redacted`) : null),
    h("details", {}, h("summary", {}, e.evidence_id), marked(e.content)));
}

function toolCallItem(c) {
  return h("li.item.tool-call", {},
    h("div.head", {}, h("span.who", {}, `tool call ${c.tool}`), h("span.when", {}, when(c.called_at)),
      h("span.muted", {}, `[${c.tool_call_id}]`), callStatus(c)));
}

async function sessionPage(sessionId) {
  crumbs(["sessions", "#/"], [sessionId, null]);
  const s = await getJson(`/api/sessions/${enc(sessionId)}`);
  const byIndex = new Map(s.timeline.filter((i) => i.item === "message").map((m) => [m.index, m]));
  // a reply's usage shows on the model call that prepared its input (on the reply otherwise)
  const answered = new Set(s.timeline.filter((i) => i.item === "model_call" && i.reply_index !== null).map((c) => c.reply_index));
  const items = s.timeline.map((item) => {
    if (item.item === "message") return messageItem(item, sessionId, !answered.has(item.index));
    if (item.item === "model_call") {
      const reply = item.reply_index === null ? null : byIndex.get(item.reply_index);
      return modelCallItem(item, sessionId, reply && reply.usage);
    }
    if (item.item === "evidence") return evidenceItem(item);
    return toolCallItem(item);
  });
  const usageRows = s.model_usage.map((u) => h("tr", {},
    cell(u.model_usage_id), cell(u.model), cell(u.stage), cell(num(u.prompt_tokens), "num"),
    cell(num(u.completion_tokens), "num"), cell(num(u.total_tokens), "num"), cell(num(u.latency_ms), "num"),
    cell(u.status + (u.error ? `: ${u.error}` : "")), cell(u.message_index === null ? "-" : `#${u.message_index}`)));
  show(
    h("h1", { id: "session-title" }, `Session ${s.session_id}`),
    h("dl.facts", {}, h("dt", {}, "run"), h("dd", {}, s.run.status + (s.run.run_id ? ` (${s.run.run_id})` : "")),
      h("dt", {}, "version"), h("dd", {}, String(s.version)),
      h("dt", {}, "last activity"), h("dd", {}, when(s.last_activity)),
      s.run.last_error ? [h("dt", {}, "last error"), h("dd.error", {}, s.run.last_error)] : null,
      s.summary && s.summary.removed_by_app ? [h("dt", {}, "removed by the app"), h("dd", {}, `messages 0..${s.summary.removed_by_app - 1}`)] : null,
      s.summary && s.summary.source !== "app" ? [h("dt", {}, "summary"), h("dd", {}, `messages ${s.summary.from_index}..${s.summary.to_index}: ${s.summary.content}`)] : null),
    h("h2", {}, `Timeline (${s.timeline.length})`),
    h("ol.timeline", { id: "timeline" }, items),
    h("h2", {}, `Model usage (${s.model_usage.length})`),
    s.model_usage.length
      ? table("usage", [["id"], ["model"], ["stage"], ["prompt", "num"], ["completion", "num"], ["total", "num"],
          ["latency ms", "num"], ["status"], ["reply"]], usageRows)
      : h("p.muted", {}, "No model usage recorded."));
}

// -- one model call: its input, decisions, evidences, and a replay ----------------------------

function decisionRows(decisions) {
  return decisions.map((d) => h("tr", { "data-block": d.block_id, "data-action": d.action },
    cell(d.block_id), cell(h(`span.${d.action}`, {}, d.action)), cell(d.level || "-"), cell(d.reason),
    cell(num(d.tokens) + (d.saved_tokens ? ` (saved ${num(d.saved_tokens)})` : ""), "num"),
    cell(d.block_count > 1 ? String(d.block_count) : ""), cell(d.label)));
}

const DECISION_HEADERS = [["block"], ["action"], ["level"], ["reason"], ["tokens", "num"], ["blocks", "num"], ["what"]];

function inputSection(t) {
  const input = t.input;
  if (!input.available) return h("p.note.warn", { id: "input-note" }, `The input cannot be shown: ${input.problem}`);
  const note = input.matches_report
    ? "Reassembled from the stored history, summary, tool schemas and config (the turn record keeps the report, not the text); the reassembly made exactly the stored decisions, so this is the input as sent."
    : "Reassembled from the stored history and config (the turn record keeps the report, not the text), but the reassembly's decisions differ from the stored ones (a different token estimator or engine version here?): the text below may differ from what was sent.";
  const parts = input.parts.map((p, i) => h("div.part", { "data-role": p.role },
    h("div.head", {}, `${i + 1}. ${p.role}`, p.name ? ` name=${p.name}` : "", p.tool_call_id ? ` [${p.tool_call_id}]` : "",
      p.is_error ? " (error)" : ""),
    p.content ? marked(p.content) : null,
    p.tool_calls.length ? h("ul.calls", {}, p.tool_calls.map((c) => h("li", {}, `→ ${c.name}(${c.arguments}) [${c.tool_call_id}]`))) : null));
  return [h(`p.note${input.matches_report ? "" : ".warn"}`, { id: "input-note" }, note),
    h("p", {}, `${input.parts.length} message(s), ${num(input.total_tokens)} tokens`,
      input.redactions ? ` · ${input.redactions} redaction marker(s)` : ""),
    h("div", { id: "input" }, parts)];
}

function evidenceSection(t) {
  // the evidence blocks the pruner decided on, then the evidences the input carries inside
  // tool results (fenced with their id)
  const decided = t.decisions.filter((d) => d.evidence);
  const ids = new Set(decided.map((d) => d.evidence.evidence_id));
  const carried = t.input.evidences.filter((e) => !ids.has(e.evidence_id));
  if (!decided.length && !carried.length) return h("p.muted", {}, "No evidence in this call.");
  return h("ul", { id: "evidence-blocks" },
    decided.map((d) => h("li", { "data-evidence": d.evidence.evidence_id, "data-action": d.action },
      h(`span.${d.action}`, {}, d.action + (d.level ? ` @${d.level}` : "")), " ", provenance(d.evidence),
      h("div.muted", {}, `${d.evidence.evidence_id} · ${num(d.tokens)} tokens · ${d.reason}`))),
    carried.map((e) => h("li", { "data-evidence": e.evidence_id, "data-action": "in-tool-result" },
      h("span.kept", {}, `in message ${e.message}`), " ", provenance(e),
      h("div.muted", {}, e.evidence_id))));
}

function listSection(title, id, lines) {
  if (!lines.length) return null;
  return [h("h2", {}, `${title} (${lines.length})`), h("ul", { id }, lines.map((l) => h("li", {}, l)))];
}

async function turnPage(sessionId, turnId, replayBudget) {
  const sessionHref = `#/s/${enc(sessionId)}`;
  crumbs(["sessions", "#/"], [sessionId, sessionHref], [`turn ${turnId.slice(0, 8)}`, null]);
  const t = await getJson(`/api/sessions/${enc(sessionId)}/turns/${enc(turnId)}`);
  const turn = t.turn;
  const totals = ["kept", "degraded", "dropped"].map((a) =>
    h(`span.${a}`, { id: `total-${a}` }, `${a} ${t.totals[a].blocks} block(s) / ${num(t.totals[a].tokens)} tokens  `));
  const redactions = t.redactions.map((r) => `${r.evidence_id}: ${r.fields_redacted} field(s), ${r.rules_applied.join(", ")}`);
  const conflicts = t.conflicts.map((c) => `${c.field_path}: ${c.evidence_ids.join(", ")} → ${c.resolution}${c.detail ? ` (${c.detail})` : ""}`);
  const budgetInput = h("input", { id: "replay-budget", type: "number", min: "1", required: true,
    value: replayBudget || Math.max(1, Math.round((turn.max_input_tokens || turn.token_budget || 1000) / 2)) });
  const form = h("form", { id: "replay-form", onsubmit: (ev) => {
    ev.preventDefault();
    location.hash = `#/s/${enc(sessionId)}/t/${enc(turn.turn_id)}/replay/${enc(budgetInput.value)}`;
  } }, h("label", { for: "replay-budget" }, "max input tokens"), budgetInput,
    h("button", { id: "replay-run", type: "submit" }, "Replay"),
    h("span.muted", {}, `stored: ${num(turn.max_input_tokens)} (reply reserve ${num(turn.reserved_reply_tokens)})`));
  const reply = t.reply
    ? [h("h2", {}, "Reply"), h("ol.timeline", { id: "reply" }, messageItem(t.reply, sessionId))]
    : null;
  show(
    h("h1", { id: "turn-title" }, `Model call ${turn.turn} of ${t.turns} (${turn.kind}) · ${turn.turn_id}`),
    h("dl.facts", {}, h("dt", {}, "at"), h("dd", {}, when(turn.at)),
      h("dt", {}, "budget"), h("dd", { id: "turn-budget" }, `${num(turn.token_used)} of ${num(turn.token_budget)} input tokens used (model input ${num(turn.max_input_tokens)}, reply reserve ${num(turn.reserved_reply_tokens)}${turn.tool_schemas ? `, ${turn.tool_schemas} tool schema(s)` : ""})`),
      h("dt", {}, "model hint"), h("dd", {}, turn.model_hint || "-"),
      h("dt", {}, "history seen"), h("dd", {}, `${turn.message_count} message(s), ${turn.evidence_count} evidence(s)`)),
    h("h2", {}, `Decisions (${t.decisions.length})`),
    h("p", { id: "totals" }, totals),
    table("decisions", DECISION_HEADERS, decisionRows(t.decisions)),
    listSection("Redactions", "redactions", redactions),
    listSection("Degradations", "degradations", t.degradations),
    listSection("Errors", "errors", t.errors),
    listSection("Conflicts", "conflicts", conflicts),
    h("h2", {}, "Evidence blocks"), evidenceSection(t),
    h("h2", {}, "Assembled input"), inputSection(t),
    reply,
    h("h2", {}, "Replay under another budget"), form, h("div", { id: "replay-result" }));
  if (replayBudget) await showReplay(sessionId, turn.turn_id, replayBudget);
}

async function showReplay(sessionId, turnId, budget) {
  const target = document.getElementById("replay-result");
  target.replaceChildren(h("p.muted", {}, "Replaying…"));
  let r;
  try {
    r = await getJson(`/api/sessions/${enc(sessionId)}/turns/${enc(turnId)}/replay?budget=${enc(budget)}`);
  } catch (err) {
    target.replaceChildren(h("p.error", { id: "replay-error" }, String(err.message)));
    return;
  }
  const side = (label, s) => h("div", {},
    h("h3", {}, label),
    h("p", {}, `${num(s.total_tokens)} of ${num(s.token_budget)} tokens, ${s.messages} message(s)`),
    h("p", {}, ["kept", "degraded", "dropped"].map((a) => h(`span.${a}`, {}, `${a} ${s.totals[a].blocks} (${num(s.totals[a].tokens)} tok)  `))));
  const changes = r.changed.length
    ? table("replay-changes", [["block"], ["stored budget"], ["new budget"], ["what"]],
        r.changed.map((c) => h("tr", {}, cell(c.block_id), cell(c.before), cell(c.after), cell(c.label))))
    : h("p.muted", { id: "replay-changes" }, "No decision changed.");
  const kinds = { "+": "add", "-": "del", "@": "hunk", h: "head", " ": "ctx" };
  const diff = r.identical
    ? h("p.muted", { id: "replay-diff" }, "The two assembled inputs are identical.")
    : h("div.diff", { id: "replay-diff" }, r.diff.map((l) => h(`div.diff-line.${kinds[l.op] || "ctx"}`, {}, l.text)));
  target.replaceChildren(
    h("div.cols", { id: "replay-totals" }, side(r.labels[0], r.before), side(r.labels[1], r.after)),
    h("h3", {}, "Decisions that changed"), changes,
    h("h3", {}, "Diff of the assembled inputs"), diff);
}

// -- routing ------------------------------------------------------------------------------------

async function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter((p) => p !== "").map(decodeURIComponent);
  try {
    if (parts[0] === "s" && parts.length === 2) await sessionPage(parts[1]);
    else if (parts[0] === "s" && parts[2] === "t" && parts.length === 4) await turnPage(parts[1], parts[3], null);
    else if (parts[0] === "s" && parts[2] === "t" && parts[4] === "replay" && parts.length === 6) await turnPage(parts[1], parts[3], parts[5]);
    else await sessionsPage();
    document.body.dataset.ready = location.hash || "#/";
  } catch (err) {
    show(h("h1", {}, "Not available"), h("p.error", { id: "error" }, String(err.message)));
    document.body.dataset.ready = location.hash || "#/";
  }
}

window.addEventListener("hashchange", () => {
  delete document.body.dataset.ready;
  route();
});
route();
