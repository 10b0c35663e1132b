// shardq web console. Reads the admin API (/api/v1/) every two seconds and
// renders with DOM calls only: every string that comes from the node (queue
// and group names, keys, topics, properties, payloads) becomes a text node
// through h() below, never HTML. Nothing here uses innerHTML.
'use strict';

const POLL_MS = 2000;
const TOKEN_KEY = 'shardq.admin_token';
// Paths are relative to the page (/ui/), so that the console also works
// behind a proxy that mounts the node under a path of its own.
const API = '../api/v1/';
const PEEK_LIMIT = 50; // dead letters read per partition
const PREVIEW_CHARS = 80;
const PREVIEW_BYTES = 24;

const state = {
  tokenRequired: false,
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  samples: new Map(), // queue name -> {t, counts}: the previous poll
  rates: new Map(), // queue name -> {enqueued, delivered, acked} per second
  cluster: undefined, // undefined: not asked yet; null: no cluster; else GET /api/v1/cluster
  self: null, // a single node's GET /api/v1/cluster (clustered false): its own figures
  generation: 0, // bumped by every refresh; a stale answer is dropped
  timer: 0,
  openGroups: new Set(), // groups whose per-partition table is open
  dlq: null, // the dead-letter browser of the queue page
  peek: null, // the queue page's peeked messages
  search: null, // the queue page's search and what it found
  publish: null, // the queue page's publish form, while open
  declare: null, // the form declaring a queue or changing its settings, while open
  replayed: new Set(), // "queue\x00dlq msg-id" replayed from this tab
};

// ---- DOM helpers ----

function $(sel) { return document.querySelector(sel); }

// h builds an element. Attributes are set with setAttribute (checked,
// disabled and open as properties too); on* are event handlers, kept in
// el.handlers so that fill can move them to an equal element already
// shown. Children that are not nodes become text nodes.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) {
      const type = k.slice(2);
      el.handlers = el.handlers || {};
      el.handlers[type] = v;
      el.addEventListener(type, (ev) => el.handlers[type](ev));
    } else if (k === 'checked' || k === 'disabled' || k === 'open') {
      el[k] = true;
      el.setAttribute(k, '');
    } else el.setAttribute(k, v === true ? '' : String(v));
  }
  el.append(...nodes(children));
  return el;
}

// s is h for SVG elements.
const SVGNS = 'http://www.w3.org/2000/svg';
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  }
  el.append(...nodes(children));
  return el;
}

// nodes turns children into nodes: nested arrays are flattened, null,
// undefined and false left out, anything else not a node made a text node.
function nodes(children) {
  const out = [];
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    out.push(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return out;
}

// fill makes the children of el the ones given. What is shown already
// and equal (tag, attributes, text) stays, with the new handlers: a poll
// that changed a figure replaces that figure's text only, so a button is
// never replaced under the pointer (a click would be lost), and the focus
// and what the user typed or ticked stay.
function fill(el, ...children) { patch(el, nodes(children)); }

function patch(el, next) {
  const old = Array.from(el.childNodes);
  if (old.length !== next.length) {
    el.replaceChildren(...next);
    return;
  }
  next.forEach((n, i) => {
    const o = old[i];
    if (o.nodeType === Node.TEXT_NODE && n.nodeType === Node.TEXT_NODE) {
      if (o.data !== n.data) o.data = n.data;
    } else if (o.nodeType === Node.ELEMENT_NODE && n.nodeType === Node.ELEMENT_NODE && sameElement(o, n)) {
      o.handlers = n.handlers;
      patch(o, Array.from(n.childNodes));
    } else {
      el.replaceChild(n, o);
    }
  });
}

// sameElement reports whether two elements have the same tag, attributes
// and kinds of event handled (the handlers themselves may differ).
function sameElement(a, b) {
  const types = (x) => Object.keys(x.handlers || {}).sort().join(' ');
  if (a.tagName !== b.tagName || a.attributes.length !== b.attributes.length || types(a) !== types(b)) return false;
  for (const at of b.attributes) {
    if (a.getAttribute(at.name) !== at.value) return false;
  }
  return true;
}

// table builds a table; a column whose first cell is a number (class num)
// has its header aligned with it.
function table(cls, headers, rows, empty) {
  if (!rows.length && empty) return h('p', { class: 'empty ' + cls }, empty);
  const body = h('tbody', null, rows);
  const first = body.querySelector('tr');
  const numeric = (i) => first && first.children[i] && first.children[i].classList.contains('num');
  return h('table', { class: cls },
    h('thead', null, h('tr', null, headers.map((x, i) => h('th', { class: numeric(i) ? 'num' : null }, x)))),
    body);
}

function card(label, value, cls) {
  return h('div', { class: 'card ' + (cls || '') }, h('div', { class: 'label' }, label), h('div', { class: 'value' }, value));
}

// ---- formatting ----

function num(n) { return n === undefined || n === null ? '—' : Number(n).toLocaleString('en-US'); }

function rate(r) {
  if (r === undefined || r === null) return '—';
  return r < 10 ? r.toFixed(1) : Math.round(r).toLocaleString('en-US');
}

function age(seconds) {
  if (!seconds) return '—';
  if (seconds < 60) return seconds.toFixed(1) + ' s';
  const m = Math.floor(seconds / 60);
  if (m < 60) return m + ' min ' + Math.floor(seconds % 60) + ' s';
  const hrs = Math.floor(m / 60);
  if (hrs < 48) return hrs + ' h ' + (m % 60) + ' min';
  return Math.floor(hrs / 24) + ' d ' + (hrs % 24) + ' h';
}

function pad(n, w) { return String(n).padStart(w || 2, '0'); }

function when(iso) {
  const d = new Date(iso);
  if (isNaN(d)) return String(iso);
  return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + ' ' +
    pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds());
}

function plural(n, one, many) { return num(n) + ' ' + (n === 1 ? one : (many || one + 's')); }

// ---- payloads ----

function bytesOf(b64) {
  const s = atob(b64 || '');
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

// textOf returns the bytes as text when they are UTF-8 without control
// characters other than tab and line breaks, else null (binary).
function textOf(bytes) {
  let s;
  try { s = utf8.decode(bytes); } catch (_) { return null; }
  return /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/.test(s) ? null : s;
}

function hexOf(bytes, max) {
  const part = Array.from(bytes.subarray(0, max), (b) => pad(b.toString(16)));
  return part.join(' ') + (bytes.length > max ? ' …' : '');
}

function hexDump(bytes) {
  const lines = [];
  for (let off = 0; off < bytes.length; off += 16) {
    const row = bytes.subarray(off, off + 16);
    const hex = Array.from(row, (b) => pad(b.toString(16))).join(' ').padEnd(47, ' ');
    const ascii = Array.from(row, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : '.')).join('');
    lines.push(pad(off.toString(16), 8) + '  ' + hex + '  |' + ascii + '|');
  }
  return lines.join('\n');
}

// ---- the admin API ----

class APIError extends Error {
  constructor(status, message, doc) {
    super(message);
    this.status = status;
    this.doc = doc;
  }
}

async function api(method, path, body) {
  // X-Requested-With: the node then leaves out its Basic challenge, which
  // would make the browser open its own login dialog over the page.
  const headers = { Accept: 'application/json', 'X-Requested-With': 'XMLHttpRequest' };
  if (state.token) headers.Authorization = 'Bearer ' + state.token;
  const init = { method, headers, cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new APIError(0, 'the node does not answer (' + e.message + ')');
  }
  let doc = null;
  try { doc = await res.json(); } catch (_) { /* not JSON */ }
  if (!res.ok) throw new APIError(res.status, (doc && doc.error) || res.status + ' ' + res.statusText, doc);
  return doc;
}

const enc = encodeURIComponent;

async function ready() {
  try {
    const res = await fetch('../readyz', { cache: 'no-store' });
    return res.ok;
  } catch (_) {
    return false;
  }
}

// cluster returns the cluster map, null where the node has none (a single
// node: clustered false, or no /api/v1/cluster), or undefined when it could
// not tell (asked again at the next poll). A single node's own document
// goes to state.self.
async function cluster() {
  try {
    const c = await api('GET', API + 'cluster');
    state.self = c && c.clustered === false ? c : null;
    return state.self ? null : c;
  } catch (e) {
    return e.status === 404 ? null : undefined;
  }
}

// ---- login ----

async function checkToken(token) {
  const res = await fetch('auth', { cache: 'no-store', headers: token ? { Authorization: 'Bearer ' + token } : {} });
  let doc = null;
  try { doc = await res.json(); } catch (_) { /* not JSON */ }
  return { ok: res.ok, doc };
}

async function loadAuth() {
  try {
    const { ok, doc } = await checkToken(state.token);
    if (doc && typeof doc.token_required === 'boolean') state.tokenRequired = doc.token_required;
    if (!ok && state.token) {
      forgetToken();
      showLogin('The admin token kept in this tab is no longer accepted: log in again.');
    }
  } catch (_) {
    // The node does not answer; the first refresh says so.
  }
  renderSession();
}

function forgetToken() {
  state.token = '';
  sessionStorage.removeItem(TOKEN_KEY);
  renderSession();
}

function showLogin(why) {
  const login = $('#login');
  login.hidden = false;
  if (why) $('#login-why').textContent = why;
  $('#login-token').focus();
}

function showLoginError(msg) {
  const el = $('#login-error');
  el.textContent = msg;
  el.hidden = false;
}

async function login(ev) {
  ev.preventDefault();
  const input = $('#login-token');
  const token = input.value.trim();
  $('#login-error').hidden = true;
  if (!token) {
    showLoginError('Enter the admin token (http.admin_token of the node).');
    return;
  }
  let res;
  try {
    res = await checkToken(token);
  } catch (e) {
    showLoginError('The node does not answer: ' + e.message);
    return;
  }
  if (!res.ok) {
    showLoginError('Wrong token: the node refused it. Nothing was changed.');
    input.select();
    return;
  }
  state.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  input.value = '';
  $('#login').hidden = true;
  renderSession();
  notice('Logged in: changes are sent with the admin token.', 'ok');
  refresh();
}

function logout() {
  forgetToken();
  notice('Logged out: the token is forgotten by this tab.', 'ok');
}

function renderSession() {
  const el = $('#session');
  if (!state.tokenRequired) {
    fill(el, h('span', { class: 'muted', title: 'http.admin_token is not set' }, 'no admin token'));
    $('#login').hidden = true;
    return;
  }
  if (state.token) {
    fill(el, h('span', { class: 'ok' }, 'logged in'), ' ',
      h('button', { id: 'logout', class: 'link', onclick: logout }, 'Log out'));
    $('#login').hidden = true;
  } else {
    fill(el, h('button', { id: 'login-open', onclick: () => showLogin() }, 'Log in'));
    $('#login').hidden = false;
  }
}

// explain turns a failed call into a sentence; a refused token opens the
// login.
function explain(err) {
  if (err.status === 401 || err.status === 403) {
    if (state.token) {
      forgetToken();
      showLogin('The node refused the admin token: log in again.');
      return 'Refused: the node did not accept the admin token (' + err.message + '). Log in again; nothing was changed.';
    }
    showLogin('This node has an admin token: log in to replay, purge or delete.');
    return 'Refused: this node needs the admin token for changes (' + err.message + '). Log in above; nothing was changed.';
  }
  return err.message;
}

// ---- notices and confirmations ----

let noticeTimer = 0;
let noticeRoute = ''; // the location.hash a notice was raised on

function notice(text, kind) {
  const el = $('#notice');
  clearTimeout(noticeTimer);
  noticeRoute = location.hash;
  el.className = 'notice ' + kind;
  el.setAttribute('role', kind === 'error' ? 'alert' : 'status');
  fill(el, h('span', { class: 'text' }, text),
    h('button', { class: 'link close', title: 'dismiss', onclick: () => { el.hidden = true; } }, '×'));
  el.hidden = false;
  if (kind === 'ok') noticeTimer = setTimeout(() => { el.hidden = true; }, 8000);
}

// confirmAction asks in a modal dialog; it resolves to true when confirmed.
// confirmAction asks in the dialog; with field ({label, value}), for a
// value too, which the answer carries (null: cancelled).
function confirmAction(title, text, okLabel, field) {
  const d = $('#confirm');
  $('#confirm-title').textContent = title;
  $('#confirm-text').textContent = text;
  $('#confirm-ok').textContent = okLabel;
  $('#confirm-field').hidden = !field;
  if (field) {
    $('#confirm-label').textContent = field.label;
    $('#confirm-input').value = field.value || '';
  }
  d.returnValue = '';
  d.showModal();
  (field ? $('#confirm-input') : $('#confirm-cancel')).focus();
  return new Promise((resolve) => d.addEventListener('close', () => {
    const ok = d.returnValue === 'ok';
    resolve(field ? (ok ? $('#confirm-input').value.trim() : null) : ok);
  }, { once: true }));
}

// act runs a confirmed change and reports it. With field, call gets the
// value typed. It resolves to {res} once done, {error} when refused (the
// message shown), or null when cancelled.
async function act(button, title, text, okLabel, call, done, field) {
  const answer = await confirmAction(title, text, okLabel, field);
  if (field ? answer === null : !answer) return null;
  if (button) button.disabled = true;
  let out;
  try {
    const res = await call(answer);
    notice(done(res), 'ok');
    out = { res };
  } catch (e) {
    let msg = explain(e);
    const partial = e.doc && e.doc.replay;
    if (partial) msg += ' (' + plural(partial.replayed, 'dead letter') + ' replayed before it failed)';
    notice(msg, 'error');
    out = { error: msg };
  } finally {
    if (button) button.disabled = false;
  }
  if (state.dlq) state.dlq.stale = true;
  refresh();
  return out;
}

// ---- polling and routes ----

function route() {
  const m = location.hash.match(/^#\/queues\/([^/]+)$/);
  if (m) {
    try {
      return { page: 'queue', name: decodeURIComponent(m[1]) };
    } catch (_) { /* malformed: the overview */ }
  }
  return { page: 'overview' };
}

async function refresh() {
  clearTimeout(state.timer);
  const gen = ++state.generation;
  const r = route();
  let again = true;
  try {
    if (r.page === 'queue') await refreshQueue(r.name, gen);
    else await refreshOverview(gen);
    if (gen === state.generation) setRefreshed(null);
  } catch (e) {
    if (gen !== state.generation) return;
    if (e.status === 401 || e.status === 403) {
      again = false; // until a login
      if (state.token) forgetToken();
      showLogin('This node needs the admin token to show its queues: log in.');
      delete $('#main').dataset.view;
      fill($('#main'), h('p', { class: 'empty', id: 'need-login' }, 'Log in with the admin token to see the queues.'));
    }
    setRefreshed(e);
  }
  if (again && gen === state.generation) state.timer = setTimeout(refresh, POLL_MS);
}

function setRefreshed(err) {
  const el = $('#refreshed');
  if (err) {
    el.className = 'refreshed error';
    el.textContent = 'update failed: ' + err.message;
  } else {
    el.className = 'refreshed';
    el.textContent = 'updated ' + when(new Date().toISOString()).slice(11);
  }
}

function setNode(node, isReady) {
  $('#node').textContent = 'node ' + node;
  const r = $('#ready');
  r.className = 'ready ' + (isReady ? 'ok' : 'bad');
  r.textContent = isReady ? 'ready' : 'not ready';
}

// updateRates computes per-second rates from two polls of the counters.
function updateRates(queues) {
  const now = performance.now();
  for (const qv of queues) {
    const prev = state.samples.get(qv.name);
    if (prev && now - prev.t < 500) continue; // too close to measure
    state.samples.set(qv.name, { t: now, counts: qv.counts });
    if (!prev) continue;
    const dt = (now - prev.t) / 1000;
    const per = (k) => {
      const d = qv.counts[k] - prev.counts[k];
      return d >= 0 ? d / dt : null; // counters restart with the node
    };
    state.rates.set(qv.name, { enqueued: per('enqueued'), delivered: per('delivered'), acked: per('acked') });
  }
}

function ratesOf(name) { return state.rates.get(name) || {}; }

// dlqWaiting is how many dead letters wait: the most any group of the
// dead-letter queue has not settled, or every stored one with no group.
function dlqWaiting(qv) {
  const d = qv.dlq;
  if (!d) return 0;
  if (!d.groups.length) return d.depth;
  return Math.max(...d.groups.map((g) => g.lag));
}

function queueLink(name) { return h('a', { href: '#/queues/' + enc(name), class: 'queue-link' }, name); }

// ---- overview ----

async function refreshOverview(gen) {
  const [list, isReady] = await Promise.all([api('GET', API + 'queues'), ready()]);
  if (state.cluster === undefined) state.cluster = await cluster();
  else if (state.cluster) state.cluster = (await cluster()) || state.cluster;
  else if (state.self) await cluster(); // a single node's own figures, again
  if (gen !== state.generation) return;
  updateRates(list.queues);
  setNode(list.node, isReady);
  const main = $('#main');
  if (main.dataset.view !== 'overview') {
    main.dataset.view = 'overview';
    state.declare = null;
    fill(main, h('div', { id: 'overview' }), h('section', { id: 'declare' }));
    renderDeclare();
  }
  renderOverview(list, isReady);
}

function renderOverview(list, isReady) {
  const qs = list.queues;
  const sum = (f) => qs.reduce((n, x) => n + f(x), 0);
  const consumers = (x) => x.groups.reduce((n, g) => n + g.consumers, 0);
  const queueRows = qs.map((x) => {
    const r = ratesOf(x.name);
    return h('tr', { 'data-queue': x.name },
      h('td', { class: 'name' }, queueLink(x.name)),
      h('td', { class: 'num partitions' }, num(x.settings.partitions)),
      h('td', { class: 'num depth' }, num(x.depth)),
      h('td', { class: 'num rate-in' }, rate(r.enqueued)),
      h('td', { class: 'num rate-delivered' }, rate(r.delivered)),
      h('td', { class: 'num rate-acked' }, rate(r.acked)),
      h('td', { class: 'num groups' }, num(x.groups.length)),
      h('td', { class: 'num consumers' }, num(consumers(x))),
      h('td', { class: 'num lag' }, num(x.groups.reduce((n, g) => Math.max(n, g.lag), 0))),
      h('td', { class: 'num dlq' + (dlqWaiting(x) ? ' warn' : '') }, num(dlqWaiting(x))));
  });
  const groupRows = [];
  for (const x of qs) {
    for (const g of x.groups) {
      groupRows.push(h('tr', { 'data-queue': x.name, 'data-group': g.name },
        h('td', { class: 'name' }, queueLink(x.name)),
        h('td', { class: 'group' }, g.name),
        h('td', { class: 'num consumers' + (g.consumers ? '' : ' muted') }, num(g.consumers)),
        h('td', { class: 'num lag' }, num(g.lag)),
        h('td', { class: 'num leased' }, num(g.leased)),
        h('td', { class: 'num oldest' }, age(g.oldest_unsettled_age_seconds))));
    }
  }
  fill($('#overview'),
    h('section', { class: 'cards', id: 'summary' },
      card('Queues', num(qs.length)),
      card('Messages held', num(sum((x) => x.depth))),
      card('Consumers', num(sum(consumers))),
      card('Dead letters waiting', num(sum(dlqWaiting)), sum(dlqWaiting) ? 'warn' : '')),
    h('section', { id: 'queues' },
      h('h2', null, 'Queues', ' ', h('button', { id: 'new-queue', class: 'small', onclick: () => openDeclare(null, qs.map((x) => x.name)) }, 'New queue…')),
      table('queues', ['Queue', 'Partitions', 'Depth', 'In /s', 'Delivered /s', 'Acked /s', 'Groups', 'Consumers', 'Max lag', 'Dead letters'],
        queueRows, 'No queues yet: a publish to $queue/NAME creates one.')),
    h('section', { id: 'groups' },
      h('h2', null, 'Consumer groups'),
      table('groups', ['Queue', 'Group', 'Consumers', 'Lag', 'Leased', 'Oldest unsettled'],
        groupRows, 'No consumer group yet: a subscription to $share/GROUP/$queue/NAME creates one.')),
    clusterSection(state.cluster) || nodePanel(state.self, isReady));
}

// nodePanel is a single node's own figures, where a cluster has its map.
function nodePanel(c, isReady) {
  const n = c && Array.isArray(c.nodes) && c.nodes.find((x) => x.id === c.node);
  if (!n) return null;
  return h('section', { id: 'node-panel' },
    h('h2', null, 'Node'),
    h('div', { class: 'cards' },
      card('Node', n.id),
      card('State', isReady ? 'ready' : 'not ready', isReady ? '' : 'warn'),
      card('Partitions led', num(n.leads)),
      card('MQTT', n.mqtt || '—', 'address'),
      card('HTTP', n.http || '—', 'address')),
    h('p', { class: 'muted' }, 'This node runs alone: it serves every partition. Draining and placement need a cluster (start nodes with --etcd).'));
}

// clusterSection is the cluster map; nothing on a single node.
function clusterSection(c) {
  if (!c || !Array.isArray(c.nodes)) return null;
  const parts = Array.isArray(c.partitions) ? c.partitions : [];
  const max = 500;
  return h('section', { id: 'cluster' },
    h('h2', null, 'Cluster'),
    table('nodes', ['Node', 'State', 'MQTT', 'HTTP', 'Cluster address', 'Replicas', 'Leads', ''],
      c.nodes.map((n) => h('tr', { 'data-node': n.id },
        h('td', { class: 'name' }, n.id, n.id === c.node ? [' ', h('span', { class: 'badge this-node', title: 'the node this console talks to' }, 'this node')] : null),
        h('td', { class: 'node-state ' + nodeStateClass(n.state) }, n.state),
        h('td', null, n.mqtt), h('td', null, n.http), h('td', null, n.cluster_addr),
        h('td', { class: 'num replicas' }, num(n.replicas)),
        h('td', { class: 'num leads' }, num(n.leads)),
        h('td', { class: 'actions' }, n.drained ?
          h('button', { class: 'small undrain-node', onclick: (ev) => undrainNode(ev.target, n) }, 'Undrain…') :
          h('button', { class: 'danger small drain-node', onclick: (ev) => drainNode(ev.target, n) }, 'Drain…'))))),
    h('details', { class: 'partition-map', open: parts.length <= 64 },
      h('summary', null, 'Partition owners (' + num(parts.length) + ')'),
      table('owners', ['Queue', 'Partition', 'Owner', 'Epoch', 'Replicas', 'In sync', 'Learners'],
        parts.slice(0, max).map((p) => h('tr', null,
          h('td', null, queueLink(p.queue)), h('td', { class: 'num' }, p.partition), h('td', null, p.owner),
          h('td', { class: 'num' }, num(p.epoch)), h('td', null, (p.replicas || []).join(', ')),
          h('td', null, (p.in_sync || []).join(', ')),
          h('td', { class: 'learners' }, (p.learners || []).join(', ')))), 'No partition has an owner yet.'),
      parts.length > max ? h('p', { class: 'muted' }, 'The first ' + max + ' are shown.') : null));
}

// nodeStateClass colours a node's state: serving, on its way out,
// drained of everything (by choice), gone.
function nodeStateClass(s) {
  if (s === 'up') return 'ok';
  if (s === 'draining' || s === 'leaving') return 'warn';
  if (s === 'drained') return 'muted';
  return 'bad';
}

function drainNode(button, n) {
  act(button, 'Drain ' + n.id + '?',
    n.id + ' is given no partition, replica or leadership, and the ' + plural(n.replicas || 0, 'replica') +
      ' it holds move to the other nodes, a few at a time. Once its state is drained it holds nothing and can be stopped.' +
      ' It stays drained, across restarts, until it is undrained.',
    'Drain node',
    () => api('POST', API + 'cluster/nodes/' + enc(n.id) + '/drain'),
    (res) => 'Drained ' + res.node + ': its partitions move to the other nodes.');
}

function undrainNode(button, n) {
  act(button, 'Undrain ' + n.id + '?',
    n.id + ' takes its share of partitions, replicas and leaderships again, a few at a time.',
    'Undrain node',
    () => api('POST', API + 'cluster/nodes/' + enc(n.id) + '/undrain'),
    (res) => 'Undrained ' + res.node + ': it takes its share of partitions again.');
}

// ---- a queue ----

async function refreshQueue(name, gen) {
  let qv;
  let isReady;
  try {
    [qv, isReady] = await Promise.all([api('GET', API + 'queues/' + enc(name)), ready()]);
    // Charts and consumers are extras: a node that cannot answer them
    // still shows the queue.
    [qv.history, qv.consumerList] = await Promise.all([
      api('GET', API + 'queues/' + enc(name) + '/history').catch(() => null),
      api('GET', API + 'queues/' + enc(name) + '/consumers').catch(() => null)]);
  } catch (e) {
    if (e.status !== 404) throw e;
    if (gen !== state.generation) return;
    delete $('#main').dataset.view;
    fill($('#main'), h('p', { class: 'empty', id: 'no-queue' }, 'No queue named ', h('code', null, name), ' on this node. ',
      h('a', { href: '#/' }, 'Back to the overview')));
    return;
  }
  if (state.cluster === undefined) state.cluster = await cluster();
  if (gen !== state.generation) return;
  updateRates([qv]);
  setNode(qv.node, isReady);
  const main = $('#main');
  if (main.dataset.view !== 'queue:' + name) {
    main.dataset.view = 'queue:' + name;
    state.dlq = { queue: name, messages: [], selected: new Set(), open: new Set(), views: new Map(), key: '', stale: true, error: null };
    state.peek = null;
    state.search = null;
    state.publish = null;
    state.declare = null;
    fill(main, h('div', { id: 'figures' }), h('section', { id: 'declare' }), h('section', { id: 'search' }), h('section', { id: 'publish' }),
      h('section', { id: 'activity' }), h('section', { id: 'dlq' }), h('section', { id: 'peek' }), h('section', { id: 'settings', class: 'two' }));
    renderPeek(name);
    renderSearch(name);
    renderPublish(name);
  }
  renderFigures(qv);
  renderActivity(qv);
  const d = state.dlq;
  d.qv = qv;
  // Read the dead letters again when their figures changed, unless the
  // operator is in the middle of choosing some. The list is drawn again
  // only then, so that it stays put while nothing changes.
  const key = JSON.stringify(qv.dlq && [qv.dlq.partitions, qv.dlq.groups.map((g) => [g.name, g.partitions])]);
  if (d.stale || (key !== d.key && !d.selected.size && !d.open.size)) {
    d.key = key;
    d.stale = false;
    await loadDLQ(name, qv);
    if (gen === state.generation) renderDLQ();
  }
}

function renderFigures(qv) {
  const r = ratesOf(qv.name);
  const owners = new Map();
  const clustered = state.cluster && Array.isArray(state.cluster.partitions);
  if (clustered) {
    for (const p of state.cluster.partitions) if (p.queue === qv.name) owners.set(p.partition, p);
  }
  const parts = (qv.partitions || []).map((p) => {
    const o = owners.get(p.partition);
    return h('tr', { 'data-partition': p.partition },
      h('td', { class: 'num' }, p.partition), h('td', { class: 'num' }, p.shard),
      h('td', { class: 'num first' }, num(p.first)), h('td', { class: 'num next' }, num(p.next)),
      h('td', { class: 'num committed' }, num(p.committed)), h('td', { class: 'num depth' }, num(p.depth)),
      clustered ? [h('td', null, o ? o.owner : '—'), h('td', { class: 'num' }, o ? num(o.epoch) : '—'),
        h('td', null, o ? (o.replicas || []).join(', ') : '—')] : null);
  });
  const groups = qv.groups.map((g) => {
    const open = state.openGroups.has(qv.name + '\x00' + g.name);
    return [
      h('tr', { 'data-group': g.name },
        h('td', { class: 'group' }, g.name),
        h('td', { class: 'num consumers' + (g.consumers ? '' : ' muted') }, num(g.consumers)),
        h('td', { class: 'num lag' }, num(g.lag)),
        h('td', { class: 'num leased' }, num(g.leased)),
        h('td', { class: 'num oldest' }, age(g.oldest_unsettled_age_seconds)),
        h('td', { class: 'actions' },
          h('button', { class: 'link toggle', onclick: () => toggleGroup(qv.name, g.name) }, open ? 'hide partitions' : 'per partition'),
          ' ',
          h('button', { class: 'small seek-group', onclick: (ev) => seekGroup(ev.target, qv.name, g.name, g.consumers) }, 'Seek…'),
          ' ',
          h('button', { class: 'danger small delete-group', onclick: (ev) => deleteGroup(ev.target, qv.name, g.name, g.consumers) }, 'Delete…'))),
      open ? h('tr', { class: 'detail' }, h('td', { colspan: 6 },
        table('group-partitions', ['Partition', 'Floor', 'Settled above floor', 'Lag', 'Leased', 'Oldest unsettled'],
          (g.partitions || []).map((p) => h('tr', { 'data-partition': p.partition },
            h('td', { class: 'num' }, p.partition), h('td', { class: 'num' }, num(p.floor)),
            h('td', { class: 'num' }, num(p.settled_above_floor)), h('td', { class: 'num lag' }, num(p.lag)),
            h('td', { class: 'num leased' }, num(p.leased)), h('td', { class: 'num' }, age(p.oldest_unsettled_age_seconds))))))) : null,
    ];
  });
  const s = qv.settings;
  const c = qv.counts;
  fill($('#figures'),
    h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Queues'), ' / '),
    h('h1', null, h('span', { id: 'queue-name' }, qv.name),
      h('span', { class: 'badge', title: 'where the settings come from' }, 'settings: ' + (qv.source || 'defaults')),
      h('span', { class: 'spacer' }),
      h('button', { id: 'edit-settings', onclick: () => openDeclare(qv) }, 'Edit settings…'),
      h('button', { id: 'purge-queue', class: 'danger', onclick: (ev) => purgeQueue(ev.target, qv) }, 'Purge queue…'),
      h('button', { id: 'delete-queue', class: 'danger', onclick: (ev) => deleteQueue(ev.target, qv) }, 'Delete queue…')),
    h('section', { class: 'cards', id: 'summary' },
      card('Depth', num(qv.depth)),
      card('In /s', rate(r.enqueued)), card('Delivered /s', rate(r.delivered)), card('Acked /s', rate(r.acked)),
      card('Leases held', num(qv.groups.reduce((n, g) => n + g.leased, 0))),
      card('Dead letters waiting', num(dlqWaiting(qv)), dlqWaiting(qv) ? 'warn' : '')),
    h('section', { id: 'groups' },
      h('h2', null, 'Consumer groups'),
      table('groups', ['Group', 'Consumers', 'Lag', 'Leased', 'Oldest unsettled', ''], groups,
        'No consumer group yet: a subscription to $share/GROUP/$queue/' + qv.name + ' creates one.')),
    h('section', { id: 'partitions' },
      h('h2', null, 'Partitions'),
      table('partitions', ['Partition', 'Shard', 'First', 'Next', 'Committed', 'Depth'].concat(clustered ? ['Owner', 'Epoch', 'Replicas'] : []), parts)));
  fill($('#settings'),
    h('div', null, h('h2', null, 'Settings'),
      h('dl', { class: 'kv' }, Object.entries(s).map(([k, v]) => [h('dt', null, k), h('dd', null, String(v))]))),
    h('div', null, h('h2', null, 'Totals since the node started'),
      h('dl', { class: 'kv' }, Object.entries(c).map(([k, v]) => [h('dt', null, k.replace(/_/g, ' ')), h('dd', null, num(v))]))));
}

// renderActivity draws the queue's rates and depth over the last hour
// (this node's samples, every 5 s) and the consumers connected.
function renderActivity(qv) {
  const samples = (qv.history && qv.history.samples) || [];
  const t = (x) => Date.parse(x);
  // A sample's rates are since the one before (none for the first); a
  // sample that stands for an idle stretch (until after at) adds its end
  // at 0.
  const rates = (field) => samples.flatMap((x) => [[t(x.at), x[field] || 0]].concat(x.until !== x.at ? [[t(x.until), 0]] : []));
  const depth = samples.flatMap((x) => x.until !== x.at ? [[t(x.at), x.depth], [t(x.until), x.depth]] : [[t(x.at), x.depth]]);
  const rows = [];
  for (const c of (qv.consumerList && qv.consumerList.clients) || []) {
    for (const cv of c.consumers || []) {
      if (cv.queue !== qv.name) continue;
      rows.push(h('tr', { 'data-client': c.id },
        h('td', { class: 'client' }, c.id), h('td', null, c.node), h('td', null, cv.group),
        h('td', { class: 'num' }, cv.qos), h('td', { class: 'num' }, num(cv.prefetch)), h('td', { class: 'num held' }, num(cv.leased)),
        h('td', null, cv.partitions && cv.partitions.length ? cv.partitions.join(', ') : 'shared'), h('td', null, cv.ack)));
    }
  }
  fill($('#activity'),
    h('h2', null, 'Activity', state.cluster && Array.isArray(state.cluster.partitions) ? h('span', { class: 'muted' }, ' (this node\'s partitions)') : null),
    h('div', { class: 'charts' },
      chart('chart-rates', 'Messages per second', [
        { name: 'in', cls: 'in', points: rates('enqueued_per_second') },
        { name: 'acked', cls: 'acked', points: rates('acked_per_second') }], '/s'),
      chart('chart-depth', 'Depth', [{ name: 'messages', cls: 'depth', points: depth }], '')),
    h('h2', null, 'Consumers'),
    table('consumers', ['Client', 'Node', 'Group', 'QoS', 'Prefetch', 'Held', 'Partitions', 'Ack'], rows,
      'No consumer connected to ' + qv.name + '.'));
}

// chart draws series ({name, cls, points: [[ms, value]]}) as lines over
// the time they span, from 0 to their highest value, both written below.
function chart(id, title, series, unit) {
  const all = series.flatMap((x) => x.points);
  const caption = h('figcaption', null, title, ' ', series.map((x) => h('span', { class: 'legend ' + x.cls }, x.name)));
  if (all.length < 2) {
    return h('figure', { class: 'chart', id }, caption, h('p', { class: 'muted' }, 'Not enough samples yet: one every 5 s.'));
  }
  const W = 600, H = 140, P = 4;
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  const top = Math.max(1, ...all.map((p) => p[1]));
  const sx = (ms) => (P + (W - 2 * P) * (ms - t0) / Math.max(1, t1 - t0)).toFixed(1);
  const sy = (v) => (H - P - (H - 2 * P) * v / top).toFixed(1);
  return h('figure', { class: 'chart', id }, caption,
    s('svg', { viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none', role: 'img', 'aria-label': title },
      s('line', { class: 'axis', x1: P, y1: H - P, x2: W - P, y2: H - P }),
      series.filter((x) => x.points.length).map((x) => s('polyline', { class: 'series ' + x.cls, fill: 'none',
        points: x.points.map((p) => sx(p[0]) + ',' + sy(p[1])).join(' ') }))),
    h('p', { class: 'scale muted' }, 'top ' + num(Math.round(top)) + unit + ' · the last ' + age((t1 - t0) / 1000)));
}

function toggleGroup(queue, group) {
  const k = queue + '\x00' + group;
  if (state.openGroups.has(k)) state.openGroups.delete(k);
  else state.openGroups.add(k);
  refresh();
}

function deleteGroup(button, queue, group, consumers) {
  act(button, 'Delete group ' + group + '?',
    'The group ' + group + ' of ' + queue + ' and its positions are deleted; a consumer that subscribes again starts at the oldest message.' +
    (consumers ? ' It has ' + plural(consumers, 'consumer') + ' connected: the node refuses while they are.' : ''),
    'Delete group',
    () => api('DELETE', API + 'queues/' + enc(queue) + '/groups/' + enc(group)),
    (res) => 'Deleted group ' + res.group + ' of ' + res.queue + '.');
}

// seekPoint reads what the seek dialog was given: earliest, latest, an
// RFC 3339 time, or PARTITION:OFFSET.
function seekPoint(v) {
  const m = v.match(/^(\d+):(\d+)$/);
  return m ? { partition: Number(m[1]), offset: Number(m[2]) } : v;
}

function seekGroup(button, queue, group, consumers) {
  act(button, 'Move group ' + group + '?',
    'Messages before the point count as settled for ' + group + '; the ones ' + queue + ' still holds from it on are delivered to it again. ' +
    'The point: earliest, latest, a time (2026-11-27T08:00:00Z) or PARTITION:OFFSET.' +
    (consumers ? ' It has ' + plural(consumers, 'consumer') + ' connected: the node refuses while they are.' : ''),
    'Move group',
    (to) => api('POST', API + 'queues/' + enc(queue) + '/groups/' + enc(group) + '/seek', { to: seekPoint(to) }),
    (res) => 'Moved group ' + res.group + ' of ' + res.queue + ' to ' + res.to + ' (' + plural(res.partitions.length, 'partition') + ').',
    { label: 'Point', value: 'earliest' });
}

function purgeQueue(button, qv) {
  act(button, 'Purge ' + qv.name + '?',
    'Every message of ' + qv.name + ' (' + plural(qv.depth, 'message') + ') is deleted for every group, leased ones included. This cannot be undone.',
    'Purge queue',
    () => api('POST', API + 'queues/' + enc(qv.name) + '/purge'),
    (res) => 'Purged ' + plural(res.purged, 'message') + ' from ' + res.queue + '.');
}

function deleteQueue(button, qv) {
  act(button, 'Delete ' + qv.name + '?',
    qv.name + ', its groups and its dead-letter queue are deleted with every message they hold (' +
      plural(qv.depth, 'message') + '); its consumers are cut off. A publish to it afterwards creates it anew, empty. This cannot be undone.',
    'Delete queue',
    async () => {
      const res = await api('DELETE', API + 'queues/' + enc(qv.name));
      location.hash = '#/';
      return res;
    },
    (res) => 'Deleted ' + res.queue + ' with ' + plural(res.messages, 'message') + ' and ' + plural(res.dead_letters, 'dead letter') + '.' +
      (res.pending && res.pending.length ? ' Not yet forgotten by ' + res.pending.join(', ') + ' (a node down forgets it as it starts).' : ''));
}

// ---- dead letters ----

function floorOf(g, partition) {
  const p = (g.partitions || []).find((x) => x.partition === partition);
  return p ? p.floor : 0;
}

// loadDLQ reads the dead letters of each partition from the lowest floor
// of the dead-letter queue's groups: those below it are settled.
async function loadDLQ(name, qv) {
  const d = state.dlq;
  const view = qv.dlq;
  if (!view) {
    d.messages = [];
    return;
  }
  const reads = [];
  for (const p of view.partitions || []) {
    if (!p.depth) continue;
    let from = p.first;
    if (view.groups.length) from = Math.max(from, Math.min(...view.groups.map((g) => floorOf(g, p.partition))));
    if (from >= p.committed) continue;
    reads.push(api('GET', API + 'queues/' + enc(name) + '/dlq/messages?partition=' + p.partition + '&from=' + from + '&limit=' + PEEK_LIMIT)
      .then((list) => ({ p, list })));
  }
  try {
    const got = await Promise.all(reads);
    d.more = got.filter((x) => x.list.messages.length === PEEK_LIMIT).map((x) => x.p.partition);
    d.messages = got.flatMap((x) => x.list.messages).sort((a, b) =>
      a.enqueued_at < b.enqueued_at ? -1 : a.enqueued_at > b.enqueued_at ? 1 : a.partition - b.partition || a.offset - b.offset);
    d.error = null;
    const ids = new Set(d.messages.map((m) => m.msg_id));
    for (const id of d.selected) if (!ids.has(id)) d.selected.delete(id);
  } catch (e) {
    d.error = e;
  }
}

// letterState says whether a dead letter still waits.
function letterState(queue, view, m) {
  if (state.replayed.has(queue + '\x00' + m.msg_id)) return 'replayed';
  if (view && view.groups.length && view.groups.every((g) => m.offset < floorOf(g, m.partition))) return 'settled';
  return 'waiting';
}

function renderDLQ() {
  const d = state.dlq;
  const qv = d.qv;
  const view = qv.dlq;
  const waiting = dlqWaiting(qv);
  const rows = [];
  for (const m of d.messages) {
    const st = letterState(qv.name, view, m);
    const dl = m.dead_letter || {};
    const open = d.open.has(m.msg_id);
    rows.push(h('tr', { 'data-msg-id': m.msg_id, class: 'letter ' + st + (open ? ' open' : '') },
      h('td', { class: 'check' }, h('input', {
        type: 'checkbox', class: 'select', 'aria-label': 'select ' + m.msg_id, disabled: st !== 'waiting', checked: d.selected.has(m.msg_id),
        onchange: (ev) => { if (ev.target.checked) d.selected.add(m.msg_id); else d.selected.delete(m.msg_id); renderDLQ(); },
      })),
      h('td', { class: 'id' }, m.msg_id),
      h('td', { class: 'reason' }, dl.reason || '—'),
      h('td', { class: 'origin' }, dl.original_msg_id || '—', dl.original_topic ? h('div', { class: 'muted small' }, dl.original_topic) : null),
      h('td', { class: 'num' }, num(dl.original_delivery_count)),
      h('td', { class: 'group' }, dl.group || '—'),
      h('td', { class: 'key' }, m.key || '—'),
      h('td', { class: 'when' }, when(m.enqueued_at)),
      h('td', { class: 'payload' }, preview(m), ' ',
        h('button', { class: 'link show', onclick: () => { if (open) d.open.delete(m.msg_id); else d.open.add(m.msg_id); renderDLQ(); } }, open ? 'less' : 'more')),
      h('td', { class: 'state' }, st)));
    if (open) rows.push(h('tr', { class: 'detail', 'data-detail-of': m.msg_id }, h('td', { colspan: 10 }, messageDetail(m, d.views, renderDLQ))));
  }
  const selectable = d.messages.filter((m) => letterState(qv.name, view, m) === 'waiting');
  const all = selectable.length > 0 && selectable.every((m) => d.selected.has(m.msg_id));
  const n = d.selected.size;
  fill($('#dlq'),
    h('h2', null, 'Dead letters'),
    h('p', { class: 'muted', id: 'dlq-summary' },
      plural(waiting, 'dead letter') + ' waiting in ' + qv.name + '/$dlq, ' + num(view ? view.depth : 0) + ' stored.' +
      (d.more && d.more.length ? ' Only the oldest ' + PEEK_LIMIT + ' of partition ' + d.more.join(', ') + ' are shown.' : '')),
    h('div', { class: 'toolbar' },
      h('button', { id: 'dlq-refresh', onclick: () => { d.stale = true; refresh(); } }, 'Refresh'),
      h('button', { id: 'replay-selected', disabled: n === 0, onclick: (ev) => replay(ev.target, qv.name, [...d.selected]) },
        'Replay selected' + (n ? ' (' + n + ')' : '') + '…'),
      h('button', { id: 'replay-all', disabled: waiting === 0, onclick: (ev) => replay(ev.target, qv.name, null, waiting) }, 'Replay all…'),
      h('button', { id: 'purge-dlq', class: 'danger', disabled: !view || view.depth === 0, onclick: (ev) => purgeDLQ(ev.target, qv) }, 'Purge dead letters…')),
    d.error ? h('p', { class: 'error', role: 'alert' }, 'Reading the dead letters failed: ' + d.error.message) : null,
    table('letters', [
      h('input', { type: 'checkbox', id: 'select-all', 'aria-label': 'select every waiting dead letter', checked: all, disabled: !selectable.length,
        onchange: (ev) => { for (const m of selectable) { if (ev.target.checked) d.selected.add(m.msg_id); else d.selected.delete(m.msg_id); } renderDLQ(); } }),
      'msg-id', 'Reason', 'Original', 'Deliveries', 'Group', 'Key', 'Enqueued', 'Payload', 'State'], rows, 'No dead letters.'));
}

// preview is a short view of a payload: text, or hex for binary.
function preview(m) {
  const bytes = bytesOf(m.payload);
  const text = textOf(bytes);
  if (!bytes.length) return h('span', { class: 'muted' }, 'empty');
  if (text !== null) {
    const short = text.length > PREVIEW_CHARS ? text.slice(0, PREVIEW_CHARS) + '…' : text;
    return h('span', { class: 'text-preview' }, short);
  }
  return h('span', { class: 'hex-preview' }, h('span', { class: 'badge' }, 'binary ' + num(bytes.length) + ' B'), ' ', hexOf(bytes, PREVIEW_BYTES));
}

function messageDetail(m, views, rerender) {
  const bytes = bytesOf(m.payload);
  const text = textOf(bytes);
  const mode = views.get(m.msg_id) || (text === null ? 'hex' : 'text');
  const dl = m.dead_letter;
  const props = [
    ['topic', m.topic], ['key', m.key], ['partition / offset', m.partition + ' / ' + m.offset], ['enqueued', when(m.enqueued_at)],
    m.not_before ? ['not before', when(m.not_before)] : null, m.expires_at ? ['expires', when(m.expires_at)] : null,
    m.content_type ? ['content type', m.content_type] : null, m.response_topic ? ['response topic', m.response_topic] : null,
    m.correlation_data ? ['correlation data', hexOf(bytesOf(m.correlation_data), 64)] : null,
  ].filter(Boolean);
  for (const u of m.user_properties || []) props.push(['property ' + u.name, u.value]);
  if (dl) {
    props.push(['dead-letter reason', dl.reason], ['original msg-id', dl.original_msg_id], ['original topic', dl.original_topic],
      ['original delivery count', String(dl.original_delivery_count)]);
    if (dl.group) props.push(['dead-lettered by group', dl.group]);
  }
  const setMode = (x) => { views.set(m.msg_id, x); rerender(); };
  return h('div', { class: 'message-detail' },
    h('dl', { class: 'kv props' }, props.map(([k, v]) => [h('dt', null, k), h('dd', null, v)])),
    h('div', { class: 'payload-view' },
      h('div', { class: 'tabs' },
        h('button', { class: 'tab' + (mode === 'text' ? ' on' : ''), disabled: text === null, onclick: () => setMode('text') }, 'Text'),
        h('button', { class: 'tab' + (mode === 'hex' ? ' on' : ''), onclick: () => setMode('hex') }, 'Hex'),
        h('span', { class: 'muted' }, ' ' + plural(bytes.length, 'byte'))),
      h('pre', { class: 'payload-' + mode }, mode === 'text' ? text : hexDump(bytes))));
}

function replay(button, queue, ids, waiting) {
  const n = ids ? ids.length : waiting;
  act(button, ids ? 'Replay ' + plural(n, 'dead letter') + '?' : 'Replay every dead letter?',
    (ids ? 'The dead letters ' + ids.join(', ') : 'Every dead letter waiting in ' + queue + '/$dlq (' + num(n) + ')') +
    ' go back into ' + queue + ' as new messages, delivered to the group that dead-lettered each.',
    'Replay',
    () => api('POST', API + 'queues/' + enc(queue) + '/dlq/replay', ids ? { ids } : undefined),
    (res) => {
      for (const x of res.messages) state.replayed.add(queue + '\x00' + x.dlq_msg_id);
      if (state.dlq) state.dlq.selected.clear();
      return 'Replayed ' + plural(res.replayed, 'dead letter') + ' into ' + res.queue + ': ' +
        res.messages.map((x) => x.dlq_msg_id + ' → ' + x.msg_id).join(', ') + '.';
    });
}

function purgeDLQ(button, qv) {
  act(button, 'Purge the dead letters of ' + qv.name + '?',
    'Every dead letter of ' + qv.name + ' (' + plural(qv.dlq ? qv.dlq.depth : 0, 'message') + ' stored) is deleted. This cannot be undone.',
    'Purge dead letters',
    () => api('POST', API + 'queues/' + enc(qv.name) + '/dlq/purge'),
    (res) => 'Purged ' + plural(res.purged, 'dead letter') + ' of ' + qv.name + '.');
}

// ---- peeking at a queue's messages ----

async function peek(name) {
  state.peek = { queue: name, messages: [], open: new Set(), views: new Map(), error: null };
  try {
    state.peek.messages = (await api('GET', API + 'queues/' + enc(name) + '/messages?limit=20')).messages;
  } catch (e) {
    state.peek.error = e;
  }
  renderPeek(name);
}

function renderPeek(name) {
  const p = state.peek;
  const el = $('#peek');
  if (!el) return;
  if (!p || p.queue !== name) {
    fill(el, h('h2', null, 'Messages'),
      h('p', null, h('button', { id: 'peek-open', onclick: () => peek(name) }, 'Peek at the oldest messages'),
        h('span', { class: 'muted' }, ' Nothing is delivered or settled.')));
    return;
  }
  const rows = [];
  for (const m of p.messages) {
    const open = p.open.has(m.msg_id);
    rows.push(h('tr', { 'data-msg-id': m.msg_id },
      h('td', { class: 'id' }, m.msg_id), h('td', { class: 'key' }, m.key || '—'), h('td', null, m.topic),
      h('td', { class: 'when' }, when(m.enqueued_at)),
      h('td', { class: 'payload' }, preview(m), ' ',
        h('button', { class: 'link show', onclick: () => { if (open) p.open.delete(m.msg_id); else p.open.add(m.msg_id); renderPeek(name); } }, open ? 'less' : 'more'))));
    if (open) rows.push(h('tr', { class: 'detail' }, h('td', { colspan: 5 }, messageDetail(m, p.views, () => renderPeek(name)))));
  }
  fill(el, h('h2', null, 'Messages'),
    h('p', null, h('button', { id: 'peek-again', onclick: () => peek(name) }, 'Peek again'),
      h('button', { class: 'link', onclick: () => { state.peek = null; renderPeek(name); } }, 'close'),
      h('span', { class: 'muted' }, ' The oldest stored messages; nothing is delivered or settled.')),
    p.error ? h('p', { class: 'error', role: 'alert' }, 'Peeking failed: ' + p.error.message) : null,
    table('messages', ['msg-id', 'Key', 'Topic', 'Enqueued', 'Payload'], rows, 'No messages.'));
}

// ---- finding messages ----

const SEARCH_LIMIT = 100; // matches per search (the API's default)

// renderSearch draws the search box of the queue page and what it found.
// The form is drawn once; what is typed stays as the results change.
function renderSearch(name) {
  const el = $('#search');
  if (!el) return;
  const st = state.search;
  if (!el.querySelector('#search-form')) {
    fill(el, h('h2', null, 'Find messages'),
      h('form', { id: 'search-form', class: 'inline-form', onsubmit: (ev) => { ev.preventDefault(); runSearch(name, false); } },
        h('select', { id: 'search-by', 'aria-label': 'find by' }, h('option', { value: 'key' }, 'Key'), h('option', { value: 'id' }, 'msg-id')),
        h('input', { id: 'search-input', type: 'search', placeholder: 'a key, or a msg-id such as 2-17', autocomplete: 'off', 'aria-label': 'key or msg-id' }),
        h('label', { class: 'check' }, h('input', { type: 'checkbox', id: 'search-dlq' }), ' dead letters'),
        h('button', { id: 'search-submit', type: 'submit' }, 'Find')),
      h('div', { id: 'search-out' }));
  }
  const out = $('#search-out');
  if (!st) {
    fill(out, h('p', { class: 'muted' }, 'A key\'s messages are in one partition: the newest ' + SEARCH_LIMIT + ' are shown. Nothing is delivered or settled.'));
    return;
  }
  if (st.error) {
    fill(out, h('p', { class: 'error', id: 'search-error', role: 'alert' }, st.error));
    return;
  }
  const r = st.result;
  const what = st.by === 'id' ? 'msg-id ' + st.value : st.value === '' ? 'the empty key' : 'key ' + st.value;
  const where = (st.dlq ? name + '/$dlq' : name) + ', partition ' + r.partition;
  const rows = [];
  for (const m of st.messages.slice().reverse()) {
    const open = st.open.has(m.msg_id);
    const props = (m.user_properties || []).map((u) => u.name + '=' + u.value);
    rows.push(h('tr', { 'data-msg-id': m.msg_id },
      h('td', { class: 'id' }, m.msg_id),
      h('td', { class: 'num partition' }, m.partition), h('td', { class: 'num offset' }, m.offset),
      h('td', { class: 'key' }, m.key || '—'), h('td', { class: 'when' }, when(m.enqueued_at)),
      h('td', { class: 'props' }, props.length ? props.slice(0, 3).join(', ') + (props.length > 3 ? ', …' : '') : '—'),
      h('td', { class: 'payload' }, preview(m), ' ',
        h('button', { class: 'link show', onclick: () => { if (open) st.open.delete(m.msg_id); else st.open.add(m.msg_id); renderSearch(name); } }, open ? 'less' : 'more'))));
    if (open) rows.push(h('tr', { class: 'detail', 'data-detail-of': m.msg_id }, h('td', { colspan: 7 }, messageDetail(m, st.views, () => renderSearch(name)))));
  }
  fill(out,
    h('p', { id: 'search-summary' },
      plural(st.messages.length, 'message') + ' with ' + what + ' in ' + where,
      h('span', { class: 'muted' }, ' (' + plural(st.scanned, 'message') + ' read' + (state.cluster ? ' by node ' + r.node : '') +
        (st.by === 'id' ? '' : ', newest first') + ').')),
    table('search-results', ['msg-id', 'Partition', 'Offset', 'Key', 'Enqueued', 'Properties', 'Payload'], rows, 'No message with ' + what + '.'),
    r.truncated ? h('p', { id: 'search-more' }, h('span', { class: 'muted' }, 'Older messages of partition ' + r.partition + ' were not read. '),
      h('button', { id: 'search-older', onclick: () => runSearch(name, true) }, 'Search older')) : null);
}

// runSearch asks the API; older goes on with the last search, below where
// it stopped.
async function runSearch(name, older) {
  const prev = state.search;
  const q = older && prev ? { by: prev.by, value: prev.value, dlq: prev.dlq } :
    { by: $('#search-by').value, value: $('#search-input').value, dlq: $('#search-dlq').checked };
  if (q.by === 'id') q.value = q.value.trim();
  let path = API + 'queues/' + enc(name) + (q.dlq ? '/dlq' : '') + '/messages?';
  if (q.by === 'id') path += 'id=' + enc(q.value);
  else path += 'key=' + enc(q.value) + '&limit=' + SEARCH_LIMIT + (older && prev && prev.result ? '&before=' + enc(prev.result.next_before) : '');
  const button = $(older ? '#search-older' : '#search-submit');
  if (button) button.disabled = true;
  const st = { ...q, messages: [], scanned: 0, open: new Set(), views: new Map(), result: null, error: null };
  try {
    st.result = await api('GET', path);
    st.messages = st.result.messages;
    st.scanned = st.result.scanned;
    if (older && prev && prev.result) {
      st.messages = st.messages.concat(prev.messages);
      st.scanned += prev.scanned;
      st.open = prev.open;
      st.views = prev.views;
    }
  } catch (e) {
    st.error = 'Finding failed: ' + explain(e);
  } finally {
    if (button) button.disabled = false;
  }
  if (route().name !== name) return; // the page changed meanwhile
  state.search = st;
  renderSearch(name);
}

// ---- publishing ----

// renderPublish draws the publish form of the queue page, drawn once when
// opened: what is typed stays until it is closed.
function renderPublish(name) {
  const el = $('#publish');
  if (!el) return;
  if (!state.publish) {
    fill(el, h('h2', null, 'Publish'),
      h('p', null, h('button', { id: 'publish-open', onclick: () => { state.publish = { queue: name }; renderPublish(name); } }, 'Publish a message…'),
        h('span', { class: 'muted' }, ' Stored and delivered as any producer\'s message.')));
    return;
  }
  fill(el, h('h2', null, 'Publish'),
    h('form', { id: 'publish-form', class: 'form-grid', onsubmit: (ev) => { ev.preventDefault(); publishMessage(name); } },
      h('label', { class: 'wide' }, h('span', null, 'Topic'),
        h('span', { class: 'topic' }, h('code', null, '$queue/' + name + '/'),
          h('input', { id: 'publish-subject', placeholder: 'subject (optional)', autocomplete: 'off' }))),
      h('label', null, h('span', null, 'Key'), h('input', { id: 'publish-key', placeholder: 'the subject, or none', autocomplete: 'off' })),
      h('label', null, h('span', null, 'Content type'), h('input', { id: 'publish-content-type', placeholder: 'optional', autocomplete: 'off' })),
      h('label', { class: 'wide' }, h('span', null, 'Payload (text)'), h('textarea', { id: 'publish-payload', rows: 4 })),
      h('fieldset', { class: 'wide', id: 'publish-props' }, h('legend', null, 'User properties'), h('div', { id: 'publish-prop-rows' }),
        h('button', { type: 'button', id: 'publish-add-prop', class: 'small', onclick: () => addPropRow() }, 'Add property')),
      h('div', { class: 'wide buttons' },
        h('button', { type: 'submit', id: 'publish-submit' }, 'Publish…'),
        h('button', { type: 'button', id: 'publish-close', class: 'link', onclick: () => { state.publish = null; renderPublish(name); } }, 'close')),
      h('p', { class: 'wide error', id: 'publish-error', role: 'alert', hidden: true }),
      h('p', { class: 'wide', id: 'publish-result', hidden: true })));
}

function addPropRow() {
  const row = h('div', { class: 'prop-row' },
    h('input', { class: 'prop-name', placeholder: 'name', 'aria-label': 'property name', autocomplete: 'off' }),
    h('input', { class: 'prop-value', placeholder: 'value', 'aria-label': 'property value', autocomplete: 'off' }),
    h('button', { type: 'button', class: 'link prop-remove', title: 'remove', onclick: () => row.remove() }, '×'));
  $('#publish-prop-rows').append(row);
  row.querySelector('.prop-name').focus();
}

async function publishMessage(name) {
  const err = $('#publish-error');
  const result = $('#publish-result');
  err.hidden = true;
  const body = {};
  const subject = $('#publish-subject').value.trim();
  const key = $('#publish-key').value;
  const contentType = $('#publish-content-type').value.trim();
  const payload = $('#publish-payload').value;
  if (subject) body.subject = subject;
  if (key) body.key = key;
  if (contentType) body.content_type = contentType;
  body.payload = payload;
  const props = [];
  for (const row of document.querySelectorAll('#publish-prop-rows .prop-row')) {
    const n = row.querySelector('.prop-name').value;
    const v = row.querySelector('.prop-value').value;
    if (n === '' && v === '') continue;
    if (n === '') {
      fill(err, 'A user property has a value and no name.');
      err.hidden = false;
      return;
    }
    props.push({ name: n, value: v });
  }
  if (props.length) body.properties = props;
  const topic = '$queue/' + name + (subject ? '/' + subject : '');
  const keyText = key ? 'key ' + key : subject ? 'key ' + subject + ' (its subject)' : 'the empty key';
  const out = await act($('#publish-submit'), 'Publish to ' + name + '?',
    'A message of ' + plural(new TextEncoder().encode(payload).length, 'byte') + ' with ' + keyText +
      (props.length ? ' and ' + plural(props.length, 'user property', 'user properties') : '') + ' is stored in ' + topic +
      ' and delivered to the groups of ' + name + ' as any producer\'s message. Only a purge takes it back.',
    'Publish',
    () => api('POST', API + 'queues/' + enc(name) + '/messages', body),
    (res) => res.msg_id ? 'Published ' + res.msg_id + ' to ' + res.topic + ' (partition ' + res.partition + ', offset ' + res.offset + ').' :
      'Published to ' + res.topic + '; the node could not tell its msg-id.');
  if (!out || !$('#publish-result')) return;
  if (out.error) {
    fill(err, out.error);
    err.hidden = false;
    return;
  }
  const id = out.res.msg_id;
  fill(result, 'Published ', h('code', { id: 'published-id' }, id || '?'), ' ',
    id ? h('button', { type: 'button', class: 'link', id: 'published-find', onclick: () => findID(name, id) }, 'find it') : null);
  result.hidden = false;
}

// findID searches the queue page for one msg-id.
function findID(name, id) {
  $('#search-by').value = 'id';
  $('#search-input').value = id;
  $('#search-dlq').checked = false;
  runSearch(name, false);
  $('#search').scrollIntoView();
}

// ---- declaring a queue and changing its settings ----

// The settings a form edits, named as the API names them: a list of
// choices, or the kind of input.
const SETTINGS = [
  ['partitions', 'number'], ['ordering', ['key', 'partition', 'none']], ['ack_timeout', 'duration'],
  ['max_deliveries', 'number'], ['prefetch', 'number'], ['key_inflight', 'number'],
  ['start', 'text'], ['durability', ['fsync', 'async']], ['qos0', ['allow', 'refuse']],
  ['retention', ['acked', 'time']], ['max_age', 'duration'], ['max_messages', 'number'], ['max_bytes', 'number'],
  ['overflow', ['reject', 'drop-oldest']], ['retry_backoff', 'duration'], ['retry_backoff_max', 'duration'],
  ['dedup_window', 'duration'], ['replication_factor', 'number'], ['ack_policy', ['quorum', 'leader']],
];

// openDeclare opens the form: for qv's settings, or (qv null) for a new
// queue, names being those that exist.
function openDeclare(qv, names) {
  state.declare = { queue: qv ? qv.name : null, settings: qv ? { ...qv.settings } : null, names: names || [] };
  renderDeclare();
  $('#declare').scrollIntoView();
}

function renderDeclare() {
  const el = $('#declare');
  if (!el) return;
  const d = state.declare;
  if (!d) {
    fill(el);
    return;
  }
  const cur = d.settings;
  const field = ([k, kind]) => {
    const id = 'declare-' + k;
    const now = cur ? cur[k] : undefined;
    let input;
    if (Array.isArray(kind)) {
      const choices = [''].concat(kind);
      if (now !== undefined && !choices.includes(String(now))) choices.push(String(now));
      input = h('select', { id, name: k }, choices.map((c) => h('option', { value: c, selected: cur ? String(now) === c : c === '' },
        c === '' ? (k === 'ack_policy' ? 'the cluster\'s default' : 'default') : c)));
    } else {
      input = h('input', { id, name: k, type: kind === 'number' ? 'number' : 'text', min: kind === 'number' ? 0 : null,
        value: cur ? String(now) : null, placeholder: cur ? null : 'default',
        list: k === 'start' ? 'declare-starts' : null, autocomplete: 'off' });
    }
    return h('label', null, h('span', null, k), input);
  };
  fill(el, h('h2', null, d.queue ? 'Settings of ' + d.queue : 'New queue'),
    h('form', { id: 'declare-form', class: 'form-grid', onsubmit: (ev) => { ev.preventDefault(); declare(); } },
      d.queue ? null : h('label', { class: 'wide' }, h('span', null, 'Name'),
        h('input', { id: 'declare-name', required: true, placeholder: 'A-Z a-z 0-9 _ . - (up to 128)', autocomplete: 'off' })),
      SETTINGS.map(field),
      h('datalist', { id: 'declare-starts' }, h('option', { value: 'earliest' }), h('option', { value: 'latest' })),
      h('p', { class: 'wide muted' }, d.queue ?
        'A change applies at once; partitions can grow, never shrink. Durations as 30s, 5m or 1h.' :
        'Left empty, a setting takes the config\'s default for the name. Durations as 30s, 5m or 1h.'),
      h('div', { class: 'wide buttons' },
        h('button', { type: 'submit', id: 'declare-submit' }, d.queue ? 'Apply…' : 'Declare…'),
        h('button', { type: 'button', id: 'declare-close', class: 'link', onclick: () => { state.declare = null; renderDeclare(); } }, 'close')),
      h('p', { class: 'wide error', id: 'declare-error', role: 'alert', hidden: true })));
  (d.queue ? $('#declare-ack_timeout') : $('#declare-name')).focus();
}

// declareBody reads the form: the settings changed (a new queue: those
// given), as the API takes them.
function declareBody(d) {
  const body = {};
  for (const [k, kind] of SETTINGS) {
    const v = $('#declare-' + k).value.trim();
    const now = d.settings ? String(d.settings[k]) : '';
    if (v === now || (v === '' && !(Array.isArray(kind) && d.settings))) continue;
    body[k] = kind === 'number' ? Number(v) : v;
  }
  return body;
}

async function declare() {
  const d = state.declare;
  const err = $('#declare-error');
  err.hidden = true;
  const name = d.queue || $('#declare-name').value.trim();
  const body = declareBody(d);
  const list = Object.entries(body).map(([k, v]) => k + ' ' + (d.settings ? String(d.settings[k]) + ' → ' : '') + (v === '' ? 'default' : String(v)));
  if (d.queue && !list.length) {
    fill(err, 'Nothing changed: edit a setting first.');
    err.hidden = false;
    return;
  }
  const exists = !d.queue && d.names.includes(name);
  const out = await act($('#declare-submit'),
    d.queue ? 'Change the settings of ' + name + '?' : exists ? 'Change the settings of ' + name + '?' : 'Declare ' + name + '?',
    (d.queue ? 'The settings of ' + name + ' change at once: ' + list.join(', ') + '.' :
      (exists ? name + ' exists: its settings change: ' : 'The queue ' + name + ' is created with ') +
      (list.length ? list.join(', ') : 'the config\'s defaults') + (list.length && !exists ? ', the config\'s defaults for the rest' : '') + '.') +
      ' They are kept across restarts, over the config file\'s.',
    d.queue ? 'Apply' : 'Declare',
    async () => {
      const res = await api('PUT', API + 'queues/' + enc(name), body);
      if (!d.queue) location.hash = '#/queues/' + enc(res.name);
      return res;
    },
    (res) => (d.queue || exists ? 'Changed the settings of ' + res.name : 'Declared ' + res.name) +
      (list.length ? ': ' + list.join(', ') : '') + '.');
  if (!out || state.declare !== d) return;
  if (out.error) {
    fill(err, out.error);
    err.hidden = false;
    return;
  }
  state.declare = null;
  renderDeclare();
}

// ---- start ----

function navigate() {
  const main = $('#main');
  delete main.dataset.view;
  state.dlq = null;
  state.peek = null;
  state.search = null;
  state.publish = null;
  state.declare = null;
  // What was said on another page is not about this one; a notice the
  // change that led here raised (a queue declared, one deleted) stays.
  if (noticeRoute !== location.hash) $('#notice').hidden = true;
  fill(main, h('p', { class: 'muted' }, 'Loading…'));
  refresh();
}

document.addEventListener('DOMContentLoaded', async () => {
  $('#login-form').addEventListener('submit', login);
  window.addEventListener('hashchange', navigate);
  await loadAuth();
  navigate();
});
