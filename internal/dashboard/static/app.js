// lizard dashboard: a single page over the same HTTP API the SDKs use. The
// session cookie (HttpOnly) authenticates; every request that is not a GET
// carries the session's CSRF token. Views are functions of the hash route;
// each returns a cleanup that stops its timers, streams and sockets.
'use strict'

const state = { session: null, cleanup: null }

// ---- API ---------------------------------------------------------------

class APIError extends Error {
  constructor (status, code, message) {
    super(message)
    this.status = status
    this.code = code
  }
}

// api calls the HTTP API and returns its JSON (or null for 204). An error
// answer is thrown as an APIError with the server's code and message; a
// 401 of the session also returns the page to the sign-in.
async function api (method, path, body, opts = {}) {
  const headers = { Accept: 'application/json', ...(opts.headers || {}) }
  if (body !== undefined) headers['Content-Type'] = 'application/json'
  if (method !== 'GET' && state.session) headers['X-CSRF-Token'] = state.session.csrfToken
  let res
  try {
    res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: 'same-origin', signal: opts.signal })
  } catch (e) {
    if (e.name === 'AbortError') throw e
    throw new APIError(0, 'network_error', `${method} ${path}: the server did not answer (${e.message})`)
  }
  if (opts.raw && res.ok) return res
  if (res.status === 204) return null
  const text = await res.text()
  let data = null
  try { data = text ? JSON.parse(text) : null } catch { /* not JSON */ }
  if (!res.ok) {
    const err = new APIError(res.status, (data && data.code) || `http_${res.status}`,
      (data && (data.message || data.error)) || text || `${method} ${path}: HTTP ${res.status}`)
    if (res.status === 401 && !opts.noLogout) {
      // The browser drops the cookie when the session's lifetime is over.
      signedOut(err.code === 'missing_api_key' && state.session ? 'Your session has expired: sign in again.' : err.message)
    }
    throw err
  }
  return data
}

// ---- small DOM helpers --------------------------------------------------

function h (tag, attrs, ...kids) {
  const el = document.createElement(tag)
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v)
    else if (k === 'class') el.className = v
    else if (k === 'html') el.innerHTML = v
    else if (k in el && typeof v !== 'string') el[k] = v
    else el.setAttribute(k, v === true ? '' : v)
  }
  for (const kid of kids.flat()) {
    if (kid == null || kid === false) continue
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)))
  }
  return el
}

const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }
const esc = (s) => String(s ?? '').replace(/[&<>"']/g, (c) => ESC[c])

function toast (msg, ok = false, code = '') {
  const el = h('div', { class: 'toast' + (ok ? ' ok' : ''), role: ok ? 'status' : 'alert' },
    code ? h('span', { class: 'code' }, code) : null, msg,
    h('button', { title: 'dismiss', onclick: () => el.remove() }, '×'))
  document.getElementById('toasts').append(el)
  setTimeout(() => el.remove(), ok ? 4000 : 12000)
}

// report shows an error as the API said it; nothing is dropped.
function report (e) {
  if (e && e.name === 'AbortError') return
  if (e instanceof APIError) toast(e.message, false, `${e.status || ''} ${e.code}`.trim())
  else toast(String(e && e.message ? e.message : e))
  console.error(e)
}

// act runs an action of a button: disabled while it runs, errors reported.
async function act (btn, fn, okMsg) {
  if (btn) btn.disabled = true
  try {
    const r = await fn()
    if (okMsg) toast(typeof okMsg === 'function' ? okMsg(r) : okMsg, true)
    return r
  } catch (e) {
    report(e)
  } finally {
    if (btn) btn.disabled = false
  }
}

function fmtDur (ms) {
  if (ms == null || !isFinite(ms)) return '—'
  const s = Math.max(0, Math.round(ms / 1000))
  if (s < 60) return s + 's'
  if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's'
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm'
  return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h'
}

function fmtBytes (n) {
  if (n == null) return '—'
  const u = ['B', 'KB', 'MB', 'GB', 'TB']
  let i = 0
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++ }
  return (i ? n.toFixed(1) : n) + ' ' + u[i]
}

const fmtTime = (t) => t ? new Date(t).toLocaleString() : '—'

// parsePairs reads KEY=VALUE lines (envs, metadata).
function parsePairs (text, what) {
  const out = {}
  for (const line of text.split('\n')) {
    const l = line.trim()
    if (!l) continue
    const i = l.indexOf('=')
    if (i < 1) throw new Error(`${what}: "${l}" is not KEY=VALUE`)
    out[l.slice(0, i).trim()] = l.slice(i + 1)
  }
  return out
}

// fileBase64 reads a File (an upload, a build's context file) as base64.
function fileBase64 (file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader()
    r.onload = () => resolve(String(r.result).replace(/^data:[^,]*,/, ''))
    r.onerror = () => reject(r.error)
    r.readAsDataURL(file)
  })
}

// ---- session -------------------------------------------------------------

function signedOut (msg) {
  state.session = null
  route(msg)
}

async function loadSession () {
  try {
    state.session = await api('GET', '/dashboard/session', undefined, { noLogout: true })
  } catch (e) {
    state.session = null
    if (e.status !== 401) report(e)
  }
}

function viewLogin (main, msg) {
  document.getElementById('top').hidden = true
  const input = h('input', { type: 'password', id: 'apikey', placeholder: 'lz_…', autocomplete: 'off', autofocus: true })
  const note = h('div', { class: 'msg', id: 'login-msg', role: 'alert' }, msg || '')
  const form = h('form', {
    class: 'panel login',
    onsubmit: async (ev) => {
      ev.preventDefault()
      note.textContent = ''
      try {
        state.session = await api('POST', '/dashboard/login', { apiKey: input.value.trim() }, { noLogout: true })
        input.value = ''
        if (!location.hash || location.hash === '#/login') location.hash = '#/sandboxes'
        else route()
      } catch (e) {
        note.textContent = e.message
      }
    }
  },
  h('h1', null, h('span', { class: 'logo' }), 'lizard'),
  h('p', { class: 'dim' }, 'Sign in with an API key of your project. The key stays on the server; this browser gets a session cookie.'),
  h('label', { for: 'apikey', style: 'display:block' }, 'API key', input),
  note,
  h('button', { class: 'primary', type: 'submit', id: 'signin' }, 'Sign in'))
  main.append(form)
  setTimeout(() => input.focus(), 0)
}

// ---- router ----------------------------------------------------------------

const views = {
  sandboxes: viewSandboxes,
  sandbox: viewSandbox,
  snapshots: viewSnapshots,
  volumes: viewVolumes,
  templates: viewTemplates,
  events: viewEvents,
  keys: viewKeys
}

function route (msg) {
  if (state.cleanup) { try { state.cleanup() } catch (e) { console.error(e) } }
  state.cleanup = null
  const main = document.getElementById('app')
  main.replaceChildren()
  if (!state.session) return viewLogin(main, msg)
  const top = document.getElementById('top')
  top.hidden = false
  document.getElementById('project').textContent = `project ${state.session.project.slug}`
  const [name, ...args] = location.hash.replace(/^#\/?/, '').split('/')
  const view = views[name] || viewSandboxes
  for (const a of top.querySelectorAll('nav a')) a.classList.toggle('on', a.dataset.nav === (name === 'sandbox' ? 'sandboxes' : (views[name] ? name : 'sandboxes')))
  state.cleanup = view(main, ...args.map(decodeURIComponent)) || null
}

// poller calls fn now and every ms until stopped; a failure is reported
// once and polling goes on (the next success clears it).
function poller (fn, ms) {
  let stopped = false
  let timer = null
  let failing = false
  const tick = async () => {
    try {
      await fn()
      failing = false
    } catch (e) {
      if (!failing && !stopped) report(e)
      failing = true
    }
    if (!stopped) timer = setTimeout(tick, ms)
  }
  tick()
  return () => { stopped = true; clearTimeout(timer) }
}

// ---- sandboxes ---------------------------------------------------------

const SIZES = ['nano', 'mini', 'small', 'medium', 'large', 'big']

// sandboxActions are the buttons of a sandbox, by its status.
function sandboxActions (s) {
  const b = (a, label, cls) => `<button data-act="${a}" data-id="${esc(s.sandboxId)}"${cls ? ` class="${cls}"` : ''}>${label}</button>`
  const out = []
  if (s.status === 'running') out.push(b('pause', 'Pause'), b('snapshot', 'Snapshot'), b('fork', 'Fork'))
  if (s.status === 'paused') out.push(b('resume', 'Resume'))
  out.push(b('timeout', 'Timeout'), b('kill', 'Kill', 'danger'))
  return out.join(' ')
}

// renderSandboxRows is the table body for a list of sandboxes: one string
// of escaped HTML, set at once (fast for hundreds of rows).
function renderSandboxRows (list, now = Date.now()) {
  if (!list.length) return '<tr><td colspan="9" class="empty">No sandboxes match.</td></tr>'
  let out = ''
  for (const s of list) {
    const started = Date.parse(s.startedAt)
    const left = s.status === 'paused' ? (s.timeoutMs ? 'paused' : '—') : (s.endAt ? fmtDur(Date.parse(s.endAt) - now) : 'no limit')
    const meta = Object.entries(s.metadata || {}).map(([k, v]) => `<span>${esc(k)}=${esc(v)}</span>`).join('')
    out += `<tr data-id="${esc(s.sandboxId)}"><td class="mono"><a href="#/sandbox/${encodeURIComponent(s.sandboxId)}">${esc(s.sandboxId)}</a></td>` +
      `<td>${esc(s.template)}</td><td><span class="st ${esc(s.status)}">${esc(s.status)}</span>${s.pauseError ? ` <span class="dim" title="${esc(s.pauseError)}">⚠</span>` : ''}</td>` +
      `<td>${esc(s.size)} <span class="dim">${esc(s.cpus)} CPU · ${esc(s.memoryMb)} MB</span></td>` +
      `<td>${fmtDur(now - started)}</td><td>${left}</td><td class="meta">${meta}</td>` +
      `<td>${esc(s.node || s.region || 'local')}</td><td class="acts">${sandboxActions(s)}</td></tr>`
  }
  return out
}

// sandboxAction runs a table or header button of a sandbox.
async function sandboxAction (btn, after) {
  const id = btn.dataset.id
  const p = `/api/sandboxes/${encodeURIComponent(id)}`
  switch (btn.dataset.act) {
    case 'pause': return act(btn, () => api('POST', p + '/pause'), `Paused ${id}`).then(after)
    case 'resume': return act(btn, () => api('POST', p + '/resume'), `Resumed ${id}`).then(after)
    case 'snapshot': {
      const name = prompt('Snapshot name (optional)', '')
      if (name === null) return
      return act(btn, () => api('POST', p + '/snapshot', name ? { name } : {}), (r) => `Snapshot ${r.id || r.snapshotId} taken`).then(after)
    }
    case 'fork': {
      const n = prompt('How many copies?', '1')
      if (n === null) return
      return act(btn, async () => {
        const r = await api('POST', p + '/fork', { count: Number(n) })
        const failed = (r || []).filter((x) => x.error)
        for (const f of failed) toast(f.error, false, 'fork')
        return r
      }, (r) => `Forked ${(r || []).filter((x) => x.sandbox).length} of ${n}`).then(after)
    }
    case 'timeout': {
      const s = prompt('New time left, in seconds from now', '300')
      if (s === null) return
      return act(btn, () => api('POST', p + '/timeout', { timeoutMs: Math.round(Number(s) * 1000) }), `Timeout of ${id} set`).then(after)
    }
    case 'kill':
      if (!confirm(`Kill sandbox ${id}? Its files and processes are gone for good.`)) return
      return act(btn, () => api('DELETE', p), `Killed ${id}`).then(after)
  }
}

function viewSandboxes (main) {
  const ac = new AbortController()
  let list = []
  const q = h('input', { id: 'filter', placeholder: 'Filter by id, template or metadata', style: 'width:320px' })
  const status = h('select', { id: 'filter-status' }, h('option', { value: '' }, 'any status'),
    ...['running', 'paused', 'creating', 'pausing', 'resuming', 'failed'].map((s) => h('option', { value: s }, s)))
  const tmplFilter = h('select', { id: 'filter-template' }, h('option', { value: '' }, 'any template'))
  const count = h('span', { class: 'count' })
  const tbody = h('tbody', { id: 'sandbox-rows' })
  const table = h('table', { id: 'sandboxes' },
    h('thead', null, h('tr', null, ...['ID', 'Template', 'Status', 'Size', 'Age', 'Time left', 'Metadata', 'Node', ''].map((c) => h('th', null, c)))), tbody)

  const render = () => {
    const f = q.value.trim().toLowerCase()
    const shown = list.filter((s) => (!status.value || s.status === status.value) &&
      (!tmplFilter.value || s.template === tmplFilter.value) &&
      (!f || s.sandboxId.toLowerCase().includes(f) || s.template.toLowerCase().includes(f) ||
        Object.entries(s.metadata || {}).some(([k, v]) => `${k}=${v}`.toLowerCase().includes(f))))
    tbody.innerHTML = renderSandboxRows(shown)
    count.textContent = `${shown.length} of ${list.length}`
    const templates = [...new Set(list.map((s) => s.template))].sort()
    const have = [...tmplFilter.options].map((o) => o.value).slice(1)
    if (templates.join() !== have.join()) {
      const v = tmplFilter.value
      tmplFilter.replaceChildren(h('option', { value: '' }, 'any template'), ...templates.map((t) => h('option', { value: t }, t)))
      tmplFilter.value = v
    }
  }
  const refresh = async () => {
    list = await api('GET', '/api/sandboxes', undefined, { signal: ac.signal })
    list.sort((a, b) => (b.startedAt || '').localeCompare(a.startedAt || ''))
    render()
  }
  for (const el of [q, status, tmplFilter]) el.addEventListener('input', render)
  tbody.addEventListener('click', (ev) => {
    const btn = ev.target.closest('button[data-act]')
    if (btn) sandboxAction(btn, () => refresh().catch(report))
  })

  main.append(h('h1', null, 'Sandboxes'), createForm(() => refresh().catch(report)),
    h('div', { class: 'panel' }, h('div', { class: 'filters' }, q, status, tmplFilter, count), table))
  const stop = poller(refresh, 1500)
  return () => { stop(); ac.abort() }
}

function createForm (created) {
  const tmpl = h('select', { name: 'template', id: 'create-template' })
  const size = h('select', { name: 'size', id: 'create-size' }, ...SIZES.map((s) => h('option', { value: s, selected: s === 'small' }, s)))
  const timeout = h('input', { name: 'timeout', id: 'create-timeout', type: 'number', min: '0', value: '300', style: 'width:90px' })
  const envs = h('textarea', { name: 'envs', id: 'create-envs', rows: 2, placeholder: 'KEY=value per line', style: 'width:220px' })
  const meta = h('textarea', { name: 'metadata', id: 'create-metadata', rows: 2, placeholder: 'key=value per line', style: 'width:220px' })
  const vol = h('select', { name: 'volume', id: 'create-volume' }, h('option', { value: '' }, 'none'))
  const internet = h('input', { type: 'checkbox', id: 'create-internet', checked: true })
  const btn = h('button', { class: 'primary', type: 'submit', id: 'create' }, 'Create sandbox')
  Promise.all([api('GET', '/api/templates'), api('GET', `/api/projects/${state.session.project.id}/volumes`)]).then(([ts, vs]) => {
    tmpl.replaceChildren(...ts.map((t) => h('option', { value: t.name, selected: t.name === 'base' }, t.name)))
    vol.append(...vs.map((v) => h('option', { value: v.id, disabled: !!v.attachedTo }, `${v.name} (${v.sizeGb} GB)${v.attachedTo ? ' — in use' : ''}`)))
  }).catch(report)
  const form = h('form', {
    class: 'panel row',
    id: 'create-form',
    onsubmit: (ev) => {
      ev.preventDefault()
      act(btn, async () => {
        const body = { template: tmpl.value, size: size.value, timeoutMs: Math.round(Number(timeout.value) * 1000), internetAccess: internet.checked }
        const e = parsePairs(envs.value, 'envs')
        const m = parsePairs(meta.value, 'metadata')
        if (Object.keys(e).length) body.envs = e
        if (Object.keys(m).length) body.metadata = m
        if (vol.value) body.volumeId = vol.value
        const s = await api('POST', '/api/sandboxes', body)
        created()
        return s
      }, (s) => `Created ${s.sandboxId}`)
    }
  },
  h('label', null, 'Template', tmpl), h('label', null, 'Size', size), h('label', null, 'Timeout (s, 0 = none)', timeout),
  h('label', null, 'Envs', envs), h('label', null, 'Metadata', meta), h('label', null, 'Volume', vol),
  h('label', { class: 'check' }, internet, 'Internet access'), h('label', null, '\u00a0', btn))
  return form
}

// ---- one sandbox -------------------------------------------------------------

// internetOf says in a few words what a sandbox may reach (the Network
// tab has the whole configuration).
function internetOf (s) {
  const n = s.network || {}
  const denied = (n.denyOut || []).filter((d) => d !== '0.0.0.0/0')
  let out = s.internetAccess ? 'yes' : `restricted (${(s.allowedHosts || []).join(', ') || 'nothing'})`
  if (s.internetAccess && denied.length) out += `, but not ${denied.join(', ')}`
  if (n.rules && Object.keys(n.rules).length) out += `; transforms for ${Object.keys(n.rules).join(', ')}`
  if (n.egressProxy) out += `; through ${n.egressProxy.address}`
  return out
}

function viewSandbox (main, id) {
  const cleanups = []
  const p = `/api/sandboxes/${encodeURIComponent(id)}`
  let info = null
  const head = h('div', { class: 'panel', id: 'sandbox-info' })
  const tabs = h('div', { class: 'tabs' })
  const body = h('div')
  const sections = {}
  let current = null
  const tabNames = { terminal: 'Terminal', logs: 'Logs', files: 'Files', metrics: 'Metrics', ports: 'Ports', network: 'Network', desktop: 'Desktop', schedules: 'Schedules' }
  const makers = { terminal: terminalTab, logs: logsTab, files: filesTab, metrics: metricsTab, ports: portsTab, network: networkTab, desktop: desktopTab, schedules: schedulesTab }
  const show = (name) => {
    current = name
    for (const b of tabs.children) b.classList.toggle('on', b.dataset.tab === name)
    for (const [n, el] of Object.entries(sections)) el.hidden = n !== name
    if (!sections[name]) {
      const el = h('section', { id: 'tab-' + name })
      sections[name] = el
      body.append(el)
      const c = makers[name](el, id, p, () => info)
      if (c) cleanups.push(c)
    }
    sections[name].dispatchEvent(new Event('shown'))
  }
  for (const [n, label] of Object.entries(tabNames)) tabs.append(h('button', { 'data-tab': n, onclick: () => show(n) }, label))

  const renderHead = () => {
    const s = info
    head.replaceChildren(
      h('div', { class: 'row', style: 'justify-content:space-between' },
        h('h1', { class: 'mono', style: 'margin:0' }, s.sandboxId, ' ', h('span', { class: 'st ' + s.status, id: 'sandbox-status' }, s.status)),
        h('div', { class: 'acts', html: sandboxActions(s) })),
      h('dl', { class: 'kv' },
        h('dt', null, 'Template'), h('dd', null, s.template),
        h('dt', null, 'Size'), h('dd', null, `${s.size} (${s.cpus} CPU, ${s.memoryMb} MB)`),
        h('dt', null, 'Started'), h('dd', null, fmtTime(s.startedAt)),
        h('dt', null, 'Time left'), h('dd', null, s.endAt ? fmtDur(Date.parse(s.endAt) - Date.now()) : (s.status === 'paused' ? 'paused' : 'no limit')),
        h('dt', null, 'Internet'), h('dd', null, internetOf(s)),
        h('dt', null, 'Volume'), h('dd', null, s.volumeId || '—'),
        h('dt', null, 'Metadata'), h('dd', { class: 'meta', html: Object.entries(s.metadata || {}).map(([k, v]) => `<span>${esc(k)}=${esc(v)}</span>`).join('') || '—' })))
  }
  const refresh = async () => {
    try {
      info = await api('GET', p)
    } catch (e) {
      if (e.status === 404) {
        head.replaceChildren(h('p', null, `Sandbox ${id}: ${e.message}`), h('a', { href: '#/sandboxes' }, '← all sandboxes'))
        tabs.remove(); body.remove()
        stop()
        return
      }
      throw e
    }
    renderHead()
    if (!current) show('terminal')
  }
  head.addEventListener('click', (ev) => {
    const btn = ev.target.closest('button[data-act]')
    if (btn) sandboxAction(btn, () => { if (btn.dataset.act === 'kill') location.hash = '#/sandboxes'; else refresh().catch(report) })
  })
  main.append(h('a', { href: '#/sandboxes' }, '← all sandboxes'), head, tabs, body)
  const stop = poller(refresh, 2000)
  return () => { stop(); for (const c of cleanups) c() }
}

function terminalTab (el, id, p, getInfo) {
  const box = h('div', { class: 'term', id: 'terminal' })
  const status = h('span', { class: 'dim', id: 'terminal-status' }, 'connecting…')
  const copyBtn = h('button', { onclick: () => copySel() }, 'Copy selection')
  const pasteBtn = h('button', { onclick: () => navigator.clipboard.readText().then((t) => term.paste(t)).catch(report) }, 'Paste')
  const again = h('button', { onclick: () => connect(), hidden: true }, 'Reconnect')
  el.append(h('div', { class: 'row', style: 'margin-bottom:8px; gap:8px' }, status, again, copyBtn, pasteBtn,
    h('span', { class: 'dim' }, 'Ctrl+Shift+C / Ctrl+Shift+V copy and paste')), box)
  const term = new window.Terminal({ cursorBlink: true, fontSize: 13, fontFamily: 'ui-monospace, "DejaVu Sans Mono", monospace', scrollback: 5000, theme: { background: '#000000' } })
  const fit = new window.FitAddon.FitAddon()
  term.loadAddon(fit)
  term.open(box)
  const copySel = () => {
    const s = term.getSelection()
    if (s) navigator.clipboard.writeText(s).then(() => toast('Copied', true)).catch(report)
  }
  term.attachCustomKeyEventHandler((e) => {
    if (e.type === 'keydown' && e.ctrlKey && e.shiftKey && e.code === 'KeyC') { copySel(); return false }
    if (e.type === 'keydown' && e.ctrlKey && e.shiftKey && e.code === 'KeyV') return false // the browser's paste event follows
    return true
  })
  let ws = null
  const enc = new TextEncoder()
  const send = (d) => { if (ws && ws.readyState === 1) ws.send(enc.encode(d)) }
  term.onData(send)
  term.onBinary((d) => { if (ws && ws.readyState === 1) ws.send(Uint8Array.from(d, (c) => c.charCodeAt(0))) })
  term.onResize(({ cols, rows }) => { if (ws && ws.readyState === 1) ws.send(JSON.stringify({ type: 'resize', cols, rows })) })
  const connect = async () => {
    again.hidden = true
    try { fit.fit() } catch { /* not visible yet */ }
    // The WebSocket handshake cannot show the API's error: ask first.
    try {
      const s = await api('GET', p)
      if (s.status !== 'running') { status.textContent = `sandbox is ${s.status}: the terminal needs it running`; again.hidden = false; return }
    } catch (e) { status.textContent = e.message; again.hidden = false; return }
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:'
    ws = new WebSocket(`${proto}//${location.host}${p}/terminal?cols=${term.cols}&rows=${term.rows}`, ['lizard.terminal.v1'])
    ws.binaryType = 'arraybuffer'
    ws.onopen = () => { status.textContent = 'connected'; term.focus() }
    ws.onmessage = (m) => {
      if (typeof m.data === 'string') {
        const c = JSON.parse(m.data)
        if (c.type === 'exit') term.write(`\r\n\x1b[2m[process exited with ${c.exitCode}]\x1b[0m\r\n`)
      } else term.write(new Uint8Array(m.data))
    }
    ws.onclose = (e) => { status.textContent = `disconnected (${e.code}${e.reason ? ': ' + e.reason : ''})`; again.hidden = false }
  }
  const onResize = () => { if (!el.hidden) { try { fit.fit() } catch { /* hidden */ } } }
  window.addEventListener('resize', onResize)
  el.addEventListener('shown', () => setTimeout(() => { onResize(); term.focus() }, 0))
  connect()
  return () => { window.removeEventListener('resize', onResize); if (ws) ws.close(); term.dispose() }
}

function logsTab (el, id, p) {
  const box = h('div', { class: 'logs', id: 'logs' })
  const status = h('span', { class: 'dim' }, 'following…')
  el.append(h('div', { style: 'margin-bottom:8px' }, status), box)
  let n = 0
  let src = null
  const open = () => {
    src = new EventSource(`${p}/logs?tail=500`)
    src.onmessage = (m) => {
      const l = JSON.parse(m.data)
      const stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 4
      box.append(h('div', { class: l.type }, h('span', { class: 'ts' }, new Date(l.timestamp).toLocaleTimeString() + ' '), l.message))
      if (++n > 3000) { box.firstChild.remove(); n-- }
      if (stick) box.scrollTop = box.scrollHeight
    }
    src.onerror = () => {
      src.close()
      // EventSource hides the status: ask why the stream ended.
      api('GET', p).then((s) => { status.textContent = `stream ended (sandbox ${s.status}); reconnecting…`; setTimeout(() => { box.replaceChildren(); n = 0; open() }, 3000) })
        .catch((e) => { status.textContent = 'log stream ended: ' + e.message })
    }
  }
  open()
  return () => src && src.close()
}

// onFirstShow loads a tab the first time it is shown.
function onFirstShow (el, load) {
  el.addEventListener('shown', () => load().catch(report), { once: true })
}

const IMAGE = /\.(png|jpe?g|gif|webp|svg|bmp|ico)$/i

function filesTab (el, id, p) {
  let dir = '/'
  const crumbs = h('div', { class: 'crumbs', id: 'files-path' })
  const list = h('tbody', { id: 'files-list' })
  const viewer = h('div', { class: 'viewer', id: 'files-viewer' }, h('p', { class: 'dim' }, 'Pick a file to view it. Drop files on the list to upload them into this folder.'))
  const upload = h('input', { type: 'file', multiple: true, id: 'files-upload', onchange: () => uploadAll([...upload.files]) })
  const drop = h('div', { class: 'drop', id: 'files-drop' }, h('table', null, h('thead', null, h('tr', null, h('th', null, 'Name'), h('th', null, 'Size'), h('th', null, ''))), list))
  el.append(h('div', { class: 'row', style: 'gap:8px;margin-bottom:8px' }, crumbs, h('span', { style: 'flex:1' }),
    h('label', { class: 'check' }, 'Upload', upload), h('button', { onclick: () => load().catch(report) }, 'Refresh')),
  h('div', { class: 'files' }, drop, viewer))
  const join = (d, n) => (d.endsWith('/') ? d : d + '/') + n
  const q = (path) => `?path=${encodeURIComponent(path)}`
  const load = async () => {
    const entries = await api('GET', `${p}/files/list${q(dir)}`)
    entries.sort((a, b) => (a.type === 'dir' ? 0 : 1) - (b.type === 'dir' ? 0 : 1) || a.name.localeCompare(b.name))
    crumbs.replaceChildren()
    let acc = ''
    crumbs.append(h('a', { href: '#', onclick: (e) => { e.preventDefault(); cd('/') } }, '/'))
    for (const part of dir.split('/').filter(Boolean)) {
      acc += '/' + part
      const to = acc
      crumbs.append(h('a', { href: '#', onclick: (e) => { e.preventDefault(); cd(to) } }, part), '/')
    }
    list.replaceChildren(...(dir !== '/' ? [h('tr', null, h('td', { colspan: 3 }, h('a', { href: '#', onclick: (e) => { e.preventDefault(); cd(dir.replace(/\/[^/]+\/?$/, '') || '/') } }, '..')))] : []),
      ...entries.map((f) => {
        const path = f.path || join(dir, f.name)
        return h('tr', { 'data-name': f.name },
          h('td', { class: 'mono' }, h('a', { href: '#', onclick: (e) => { e.preventDefault(); f.type === 'dir' ? cd(path) : view(f, path) } }, f.name + (f.type === 'dir' ? '/' : ''))),
          h('td', null, f.type === 'dir' ? '' : fmtBytes(f.size)),
          h('td', { class: 'acts' }, f.type !== 'dir' ? h('button', { onclick: (e) => download(e.target, path, f.name) }, '↓') : null,
            h('button', { class: 'danger', title: 'delete', onclick: (e) => remove(e.target, path) }, '✕')))
      }))
    if (!entries.length) list.append(h('tr', null, h('td', { colspan: 3, class: 'empty' }, 'Empty folder')))
  }
  const cd = (d) => { dir = d; load().catch(report) }
  const fetchFile = async (path) => (await api('GET', `${p}/files${q(path)}`, undefined, { raw: true })).blob()
  const download = (btn, path, name) => act(btn, async () => {
    const url = URL.createObjectURL(await fetchFile(path))
    const a = h('a', { href: url, download: name })
    document.body.append(a); a.click(); a.remove()
    setTimeout(() => URL.revokeObjectURL(url), 10000)
  })
  const remove = (btn, path) => {
    if (!confirm(`Delete ${path}?`)) return
    act(btn, async () => { await api('DELETE', `${p}/files${q(path)}`, { path }); await load() }, `Deleted ${path}`)
  }
  const view = async (f, path) => {
    viewer.replaceChildren(h('p', { class: 'mono' }, path))
    try {
      if (IMAGE.test(f.name)) {
        const img = h('img', { alt: f.name, src: URL.createObjectURL(await fetchFile(path)) })
        viewer.append(img)
        return
      }
      if (f.size > 1 << 20) { viewer.append(h('p', { class: 'dim' }, `${fmtBytes(f.size)}: too large to view here; download it.`)); return }
      const text = await (await fetchFile(path)).text()
      const ta = h('textarea', { id: 'files-editor', spellcheck: false }, text)
      const editable = f.size <= 256 << 10
      ta.readOnly = !editable
      const save = h('button', { class: 'primary', hidden: !editable, onclick: () => act(save, async () => { await api('POST', `${p}/files`, { path, content: ta.value }); await load() }, `Saved ${path}`) }, 'Save')
      viewer.append(ta, save)
    } catch (e) { report(e) }
  }
  const uploadAll = async (files) => {
    for (const file of files) {
      const path = join(dir, file.name)
      await act(null, async () => {
        await api('POST', `${p}/files`, { path, content: await fileBase64(file), encoding: 'base64' })
      }, `Uploaded ${path}`)
    }
    upload.value = ''
    await load().catch(report)
  }
  drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over') })
  drop.addEventListener('dragleave', () => drop.classList.remove('over'))
  drop.addEventListener('drop', (e) => { e.preventDefault(); drop.classList.remove('over'); uploadAll([...e.dataTransfer.files]) })
  onFirstShow(el, load)
}

// drawChart draws one series on a canvas: a filled line scaled to max, the
// last value, and what the series' ceiling is (note).
function drawChart (canvas, points, max, label, fmt, note) {
  const dpr = window.devicePixelRatio || 1
  const w = canvas.clientWidth; const hgt = canvas.clientHeight
  canvas.width = w * dpr; canvas.height = hgt * dpr
  const c = canvas.getContext('2d')
  c.scale(dpr, dpr)
  c.clearRect(0, 0, w, hgt)
  c.strokeStyle = '#263040'; c.lineWidth = 1
  for (let i = 1; i < 4; i++) { const y = Math.round(hgt * i / 4) + 0.5; c.beginPath(); c.moveTo(0, y); c.lineTo(w, y); c.stroke() }
  c.fillStyle = '#8a94a6'; c.font = '12px system-ui'
  const last = points.length ? points[points.length - 1].v : null
  c.fillText(`${label}: ${last == null ? '—' : fmt(last)}  (${note})`, 8, 16)
  if (points.length < 2) return
  const t0 = points[0].t; const t1 = points[points.length - 1].t
  const x = (t) => (t1 === t0 ? w : (t - t0) / (t1 - t0) * w)
  const y = (v) => hgt - 4 - Math.min(1, v / (max || 1)) * (hgt - 28)
  c.beginPath(); c.moveTo(x(points[0].t), y(points[0].v))
  for (const pt of points) c.lineTo(x(pt.t), y(pt.v))
  c.strokeStyle = '#4fb37a'; c.lineWidth = 1.5; c.stroke()
  c.lineTo(x(t1), hgt); c.lineTo(x(t0), hgt); c.closePath(); c.fillStyle = '#4fb37a22'; c.fill()
}

function metricsTab (el, id, p) {
  const cpu = h('canvas', { class: 'chart', id: 'chart-cpu' })
  const mem = h('canvas', { class: 'chart', id: 'chart-mem' })
  const note = h('p', { class: 'dim' })
  el.append(h('div', { class: 'charts' }, cpu, mem), note)
  let samples = []
  const draw = () => {
    if (el.hidden) return
    // Samples are stamped to the second: of two in one second the later wins.
    const pts = (f) => samples.filter((s, i) => samples[i + 1]?.timestampUnix !== s.timestampUnix).map((s) => ({ t: s.timestampUnix, v: f(s) }))
    const l = samples[samples.length - 1]
    drawChart(cpu, pts((s) => s.cpuUsedPct), 100, 'CPU', (v) => v.toFixed(1) + ' %', `of ${l ? l.cpuCount : '?'} CPUs`)
    // Memory is scaled to its peak: a sandbox rarely comes near its limit.
    const peak = Math.max(1, ...samples.map((s) => s.memUsed))
    drawChart(mem, pts((s) => s.memUsed), peak * 1.25, 'Memory', fmtBytes, `limit ${l ? fmtBytes(l.memTotal) : '?'}`)
    note.textContent = l ? `disk ${fmtBytes(l.diskUsed)} of ${fmtBytes(l.diskTotal)} · network in ${fmtBytes(l.netRxBytes)}, out ${fmtBytes(l.netTxBytes)} · ${samples.length} samples` : 'no samples yet'
  }
  el.addEventListener('shown', () => setTimeout(draw, 0))
  return poller(async () => { samples = await api('GET', `${p}/metrics`); draw() }, 2000)
}

function portsTab (el, id, p, getInfo) {
  const list = h('ul', { id: 'ports' })
  const port = h('input', { type: 'number', min: '1', max: '65535', id: 'expose-port', placeholder: 'port', style: 'width:100px' })
  const btn = h('button', { class: 'primary', id: 'expose' }, 'Expose')
  el.append(h('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); act(btn, () => expose(port.value).then(load), `Port ${port.value} exposed`) } }, port, btn),
    h('p', { class: 'dim' }, 'Each link carries the port\'s access token once; the preview then keeps it in a cookie of its own host.'), list)
  const expose = (n) => api('POST', `${p}/expose/${encodeURIComponent(n)}`)
  const load = async () => {
    const info = await api('GET', p)
    const ports = info.exposedPorts || []
    if (!ports.length) { list.replaceChildren(h('li', { class: 'dim' }, 'No port exposed.')); return }
    // POST expose of a published port is idempotent: it answers its URL.
    const urls = await Promise.all(ports.map(expose))
    list.replaceChildren(...urls.map((u) => h('li', { 'data-port': u.port },
      h('a', { href: u.url, target: '_blank', rel: 'noopener noreferrer', class: 'preview-link' }, `${u.port} → http(s)://${u.hostname}`), ' ',
      h('button', { class: 'danger', onclick: (e) => act(e.target, () => api('DELETE', `${p}/expose/${u.port}`).then(load), `Port ${u.port} unexposed`) }, 'Unexpose'))))
  }
  onFirstShow(el, load)
}

// networkTab shows the sandbox's network configuration (GET …/network:
// placeholders as written, never a secret's value) and its egress log
// (GET …/network/log), refreshed every 3 s while it is shown.
function networkTab (el, id, p) {
  const conf = h('dl', { class: 'kv', id: 'network-config' })
  const rows = h('tbody', { id: 'egress-log' })
  const table = h('table', null, h('thead', null, h('tr', null, ...['Time', 'Host', 'Address', 'Decision', 'How', 'Rule', 'Out', 'In', 'Why'].map((c) => h('th', null, c)))), rows)
  el.append(h('h2', null, 'Configuration'), conf, h('h2', null, 'Egress log'),
    h('p', { class: 'dim' }, 'What the node\'s egress proxy decided for this sandbox\'s connections on ports 80 and 443 (every port with an egress proxy), newest first.'), table)
  const list = (xs) => (xs && xs.length) ? xs.join(', ') : '—'
  const load = async () => {
    const n = await api('GET', `${p}/network`)
    const rules = Object.entries(n.rules || {})
    conf.replaceChildren(
      h('dt', null, 'Allow out'), h('dd', { class: 'mono' }, list(n.allowOut)),
      h('dt', null, 'Deny out'), h('dd', { class: 'mono' }, list(n.denyOut)),
      h('dt', null, 'Rules'), h('dd', { class: 'mono' }, rules.length
        ? h('ul', { id: 'network-rules' }, ...rules.map(([host, rs]) => h('li', null, host, ' → ',
          rs.map((r) => Object.entries((r.transform && r.transform.headers) || {}).map(([k, v]) => `${k}: ${v}`).join('; ') || '(no transform)').join(' | '))))
        : '—'),
      h('dt', null, 'Egress proxy'), h('dd', { class: 'mono' }, n.egressProxy ? n.egressProxy.address + (n.egressProxy.username ? ` (as ${n.egressProxy.username})` : '') : 'direct'),
      h('dt', null, 'HTTPS ports'), h('dd', { class: 'mono' }, list((n.httpsPorts || []).map(String))))
    const log = (await api('GET', `${p}/network/log`)).entries.slice().reverse()
    if (!log.length) { rows.replaceChildren(h('tr', null, h('td', { colspan: 9, class: 'dim' }, 'Nothing yet.'))); return }
    rows.replaceChildren(...log.map((e) => h('tr', { class: e.decision === 'denied' ? 'denied' : '' },
      h('td', null, new Date(e.time).toLocaleTimeString()), h('td', { class: 'mono' }, e.host || '—'), h('td', { class: 'mono' }, `${e.addr}:${e.port}`),
      h('td', null, e.decision), h('td', null, e.via + (e.proxied ? ' (SOCKS5)' : '')), h('td', { class: 'mono' }, e.rule || '—'),
      h('td', null, fmtBytes(e.bytesOut)), h('td', null, fmtBytes(e.bytesIn)), h('td', { class: 'dim' }, e.reason || ''))))
  }
  let stop = null
  el.addEventListener('shown', () => { if (!stop) stop = poller(load, 3000) })
  return () => stop && stop()
}

// desktopTab links the desktop's noVNC pages rather than framing them: the
// preview proxy admits a browser by a SameSite=Lax cookie of the preview's
// host, which a frame inside this page (another site) may neither set nor
// send. A screenshot shows the screen here.
function desktopTab (el, id, p) {
  const box = h('div')
  el.append(box)
  const load = async () => {
    let d
    try {
      d = await api('GET', `${p}/desktop`)
    } catch (e) {
      if (e.code === 'desktop_not_supported') { box.replaceChildren(h('p', { class: 'dim' }, e.message + ' (use the desktop template).')); return }
      throw e
    }
    if (!d.running) {
      const start = h('button', { class: 'primary', id: 'desktop-start', onclick: () => act(start, () => api('POST', `${p}/desktop`, {}).then(load), 'Desktop started') }, 'Start desktop')
      box.replaceChildren(h('p', null, 'The desktop is not running. '), start)
      return
    }
    const img = h('img', { alt: 'the desktop', id: 'desktop-shot', style: 'max-width:100%;border:1px solid #263040;border-radius:6px' })
    const shoot = h('button', {
      onclick: () => act(shoot, async () => {
        const r = await api('POST', `${p}/exec`, { cmd: 'lizard-desktop screenshot', user: 'root' })
        if (r.exitCode !== 0) throw new Error(`lizard-desktop screenshot: exit ${r.exitCode}: ${r.stderr}`)
        const path = r.stdout.trim().split('\n').pop()
        const blob = await (await api('GET', `${p}/files?path=${encodeURIComponent(path)}`, undefined, { raw: true })).blob()
        if (img.src) URL.revokeObjectURL(img.src)
        img.src = URL.createObjectURL(blob)
        await api('DELETE', `${p}/files?path=${encodeURIComponent(path)}`, { path, user: 'root' })
      })
    }, 'Screenshot')
    const stop = h('button', { class: 'danger', onclick: () => act(stop, () => api('DELETE', `${p}/desktop`).then(load), 'Desktop stopped') }, 'Stop desktop')
    box.replaceChildren(h('div', { class: 'row', style: 'gap:12px;margin-bottom:8px' }, h('span', null, `running at ${d.width}×${d.height}`),
      h('a', { href: d.url, target: '_blank', rel: 'noopener noreferrer', id: 'desktop-link' }, 'Open the desktop (noVNC)'),
      h('a', { href: d.viewOnlyUrl, target: '_blank', rel: 'noopener noreferrer' }, 'view-only link'), shoot, stop), img)
    shoot.click()
  }
  onFirstShow(el, load)
}

// schedulesTab lists the sandbox's schedules (POST/GET
// /api/sandboxes/{id}/schedules, /api/sandbox-schedules/…): when each runs,
// its state and last run; a form adds one; each can be run now, switched
// on or off, removed, and its recent runs shown with their output.
function schedulesTab (el, id, p) {
  const tbody = h('tbody', { id: 'schedules-list' })
  const runsBox = h('div', { id: 'schedule-runs' })
  const when = h('input', { id: 'schedule-when', placeholder: '5m, 1h, or a cron: 0 9 * * mon-fri', style: 'width:260px' })
  const tz = h('input', { id: 'schedule-tz', placeholder: 'time zone (UTC)', style: 'width:150px' })
  const kind = h('select', { id: 'schedule-kind' }, h('option', { value: 'command' }, 'command'), h('option', { value: 'prompt' }, 'prompt'))
  const what = h('input', { id: 'schedule-what', placeholder: 'shell command, or the coding agent\'s prompt', style: 'flex:1;min-width:240px' })
  const add = h('button', { class: 'primary', id: 'schedule-add' }, 'Add schedule')
  el.append(h('form', {
    class: 'row',
    style: 'gap:8px;flex-wrap:wrap',
    onsubmit: (e) => {
      e.preventDefault()
      const w = when.value.trim()
      const body = { [kind.value]: what.value }
      if (w.split(/\s+/).length >= 5 || w.startsWith('@')) body.cron = w
      else body.every = w
      if (tz.value.trim()) body.timezone = tz.value.trim()
      act(add, () => api('POST', `${p}/schedules`, body).then(() => { what.value = ''; return load() }), 'Schedule added')
    }
  }, when, tz, kind, what, add),
  h('p', { class: 'dim' }, 'A run wakes a paused sandbox and puts it back to sleep after; a running one is left running. Commands run as root in /workspace (a volume) or root\'s home; prompts run the template\'s coding agent (claude or codex).'),
  h('table', null, h('thead', null, h('tr', null, ...['Name', 'When', 'Runs', 'State', 'Next', 'Last', ''].map((c) => h('th', null, c)))), tbody), runsBox)
  const sp = (sid) => `/api/sandbox-schedules/${encodeURIComponent(sid)}`
  const showRuns = async (s) => {
    const { runs } = await api('GET', `${sp(s.id)}/runs?limit=20`)
    runsBox.replaceChildren(h('h3', null, `Runs of ${s.name || s.id}`),
      runs.length ? h('table', null, h('thead', null, h('tr', null, ...['Started', 'Status', 'Took', 'Exit', 'Woke', 'Output'].map((c) => h('th', null, c)))),
        h('tbody', null, ...runs.map((r) => h('tr', { 'data-run': r.id },
          h('td', null, fmtTime(r.startedAt)), h('td', null, h('span', { class: 'st ' + r.status }, r.status)),
          h('td', null, r.durationMs == null ? '—' : fmtDur(r.durationMs)), h('td', null, r.exitCode ?? '—'),
          h('td', null, r.woke ? (r.slept ? 'woke, slept' : 'woke') : '—'),
          h('td', null, h('pre', { class: 'run-output' }, [r.output, r.error].filter(Boolean).join('\n'))))))) : h('p', { class: 'dim' }, 'No runs yet.'))
  }
  const load = async () => {
    const { schedules } = await api('GET', `${p}/schedules`)
    tbody.replaceChildren(...schedules.map((s) => h('tr', { 'data-schedule': s.id },
      h('td', null, s.name || h('span', { class: 'mono' }, s.id)),
      h('td', null, s.every ? `every ${s.every}` : `${s.cron} (${s.timezone})`),
      h('td', { class: 'mono' }, s.kind === 'prompt' ? `${s.agent}: ${s.prompt}` : s.command),
      h('td', null, s.running ? 'running' : s.enabled ? 'on' : 'off', s.disabledReason ? h('div', { class: 'dim' }, s.disabledReason) : null,
        s.consecutiveFailures ? h('div', { class: 'dim' }, `${s.consecutiveFailures} failed in a row`) : null,
        s.skippedCount ? h('div', { class: 'dim' }, `${s.skippedCount} skipped`) : null),
      h('td', null, s.nextRunAt ? fmtTime(s.nextRunAt) : '—'),
      h('td', null, s.lastRunAt ? `${fmtTime(s.lastRunAt)} ${s.lastStatus || ''}` : '—'),
      h('td', { class: 'acts' },
        h('button', { onclick: (e) => act(e.target, () => api('POST', `${sp(s.id)}/run`, {}).then(load), 'Run asked for') }, 'Run now'),
        h('button', { onclick: (e) => act(e.target, () => api('PATCH', sp(s.id), { enabled: !s.enabled }).then(load)) }, s.enabled ? 'Switch off' : 'Switch on'),
        h('button', { onclick: (e) => act(e.target, () => showRuns(s)) }, 'Runs'),
        h('button', { class: 'danger', onclick: (e) => act(e.target, () => api('DELETE', sp(s.id)).then(load), 'Schedule removed') }, 'Remove')))))
    if (!schedules.length) tbody.append(h('tr', null, h('td', { colspan: 7, class: 'empty' }, 'No schedule.')))
  }
  let stop = null
  el.addEventListener('shown', () => { if (!stop) stop = poller(load, 5000) })
  return () => stop && stop()
}

// ---- snapshots, volumes, templates, keys ------------------------------------

// listView is a page of one table, refreshed every few seconds.
function listView (main, title, extra, columns, load, rowOf, empty) {
  const tbody = h('tbody')
  const table = h('table', null, h('thead', null, h('tr', null, ...columns.map((c) => h('th', null, c)))), tbody)
  const refresh = async () => {
    const rows = await load()
    tbody.replaceChildren(...rows.map(rowOf))
    if (!rows.length) tbody.append(h('tr', null, h('td', { colspan: columns.length, class: 'empty' }, empty)))
  }
  main.append(h('h1', null, title), ...extra(() => refresh().catch(report)), h('div', { class: 'panel' }, table))
  return { stop: poller(refresh, 3000), refresh }
}

function viewSnapshots (main) {
  const v = listView(main, 'Snapshots', () => [], ['ID', 'Name', 'Template', 'From sandbox', 'Size', 'Warm pool', 'Created', ''],
    () => api('GET', '/api/sandbox-snapshots'),
    (s) => {
      const pool = h('input', { type: 'number', min: '0', value: String(s.poolSize), style: 'width:60px' })
      const setPool = h('button', { onclick: () => act(setPool, () => api('PATCH', `/api/sandbox-snapshots/${encodeURIComponent(s.id)}`, { poolSize: Number(pool.value) }).then(v.refresh), `Warm pool of ${s.id} set to ${pool.value}`) }, 'Set')
      const restore = h('button', { class: 'primary', onclick: () => act(restore, () => api('POST', '/api/sandboxes', { snapshotId: s.id }), (r) => `Restored as ${r.sandboxId}`) }, 'Restore')
      const del = h('button', { class: 'danger', onclick: () => confirm(`Delete snapshot ${s.id}?`) && act(del, () => api('DELETE', `/api/sandbox-snapshots/${encodeURIComponent(s.id)}`).then(v.refresh), `Deleted ${s.id}`) }, 'Delete')
      return h('tr', null, h('td', { class: 'mono' }, s.id), h('td', null, s.name || '—'), h('td', null, s.template),
        h('td', { class: 'mono' }, s.sourceSandboxId ? h('a', { href: '#/sandbox/' + encodeURIComponent(s.sourceSandboxId) }, s.sourceSandboxId) : '—'),
        h('td', null, s.size), h('td', null, pool, ' ', setPool, h('span', { class: 'dim' }, ` ${s.readyCount} ready${s.poolPaused ? ', paused' : ''}`)),
        h('td', null, fmtTime(s.createdAt)), h('td', { class: 'acts' }, restore, ' ', del))
    }, 'No snapshots. Take one from a running sandbox.')
  return v.stop
}

function viewVolumes (main) {
  const base = `/api/projects/${state.session.project.id}/volumes`
  const v = listView(main, 'Volumes', (refresh) => {
    const name = h('input', { id: 'volume-name', placeholder: 'name', required: true })
    const size = h('input', { id: 'volume-size', type: 'number', min: '1', value: '1', style: 'width:80px' })
    const btn = h('button', { class: 'primary', type: 'submit' }, 'Create volume')
    return [h('form', { class: 'panel row', onsubmit: (e) => { e.preventDefault(); act(btn, () => api('POST', base, { name: name.value, sizeGb: Number(size.value) }).then(refresh), `Volume ${name.value} created`) } },
      h('label', null, 'Name', name), h('label', null, 'Size (GB)', size), h('label', null, '\u00a0', btn))]
  }, ['ID', 'Name', 'Size', 'Status', 'Held by', 'Created', ''],
  () => api('GET', base),
  (vol) => {
    const size = h('input', { type: 'number', min: '1', value: String(vol.sizeGb), style: 'width:70px' })
    const resize = h('button', { onclick: () => act(resize, () => api('PATCH', `${base}/${encodeURIComponent(vol.id)}`, { sizeGb: Number(size.value) }).then(v.refresh), `${vol.name} resized to ${size.value} GB`) }, 'Resize')
    const del = h('button', { class: 'danger', onclick: () => confirm(`Delete volume ${vol.name} and its data?`) && act(del, () => api('DELETE', `${base}/${encodeURIComponent(vol.id)}`).then(v.refresh), `Deleted ${vol.name}`) }, 'Delete')
    return h('tr', null, h('td', { class: 'mono' }, vol.id), h('td', null, vol.name), h('td', null, size, ' GB ', resize), h('td', null, vol.status),
      h('td', { class: 'mono' }, vol.attachedTo ? h('a', { href: '#/sandbox/' + encodeURIComponent(vol.attachedTo) }, vol.attachedTo) : '—'),
      h('td', null, fmtTime(vol.createdAt)), h('td', { class: 'acts' }, del))
  }, 'No volumes.')
  return v.stop
}

function viewTemplates (main) {
  let ac = null
  const v = listView(main, 'Templates', (refresh) => {
    const name = h('input', { id: 'build-name', placeholder: 'my-template', required: true })
    const df = h('textarea', { id: 'build-dockerfile', rows: 8 }, 'FROM base\nRUN apt-get update && apt-get install -y --no-install-recommends curl\n')
    const files = h('input', { type: 'file', multiple: true, id: 'build-files' })
    const log = h('pre', { class: 'buildlog', id: 'build-log', hidden: true })
    const btn = h('button', { class: 'primary', type: 'submit', id: 'build' }, 'Build')
    const build = async () => {
      const ctx = {}
      for (const f of files.files) ctx[f.name] = await fileBase64(f)
      log.hidden = false
      log.textContent = ''
      ac = new AbortController()
      const res = await api('POST', '/api/templates', { name: name.value, dockerfile: df.value, files: ctx }, { raw: true, signal: ac.signal, headers: { Accept: 'text/event-stream' } })
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader()
      let buf = ''
      let result = null
      for (;;) {
        const { value, done } = await reader.read()
        if (done) break
        buf += value
        let i
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i); buf = buf.slice(i + 2)
          for (const line of ev.split('\n')) {
            if (!line.startsWith('data:')) continue
            const d = JSON.parse(line.slice(5))
            if (d.line != null) log.textContent += d.line + '\n'
            if (d.error) throw new APIError(0, d.code || 'build_failed', d.error.message || d.error)
            if (d.template) result = d.template
          }
          log.scrollTop = log.scrollHeight
        }
      }
      if (!result) throw new APIError(0, 'build_interrupted', 'the build stream ended without a result')
      refresh()
      return result
    }
    return [h('form', { class: 'panel', onsubmit: (e) => { e.preventDefault(); act(btn, build, (t) => `Built ${t.name} ${t.version || ''}`) } },
      h('div', { class: 'row' }, h('label', null, 'Name', name), h('label', null, 'Context files', files), h('label', null, '\u00a0', btn)),
      h('label', { style: 'display:flex' }, 'Dockerfile', df), log)]
  }, ['Name', 'Aliases', 'Version', 'Software', 'Size', 'Built', 'Status', ''],
  () => api('GET', '/api/templates'),
  (t) => {
    // Built-in templates are not the project's: the API refuses, and says why.
    const del = h('button', { class: 'danger', onclick: () => confirm(`Delete template ${t.name}? Sandboxes of it keep running.`) && act(del, () => api('DELETE', `/api/templates/${encodeURIComponent(t.name)}`).then(v.refresh), `Deleted template ${t.name}`) }, 'Delete')
    return h('tr', null, h('td', null, t.name), h('td', null, (t.aliases || []).join(', ')), h('td', { class: 'mono' }, t.version || '—'),
      h('td', { class: 'meta', html: Object.entries(t.versions || {}).map(([k, x]) => `<span>${esc(k)} ${esc(x)}</span>`).join('') }),
      h('td', null, fmtBytes(t.sizeBytes)), h('td', null, fmtTime(t.builtAt)), h('td', { title: t.progress || '' }, t.progress ? `${t.status}: ${t.progress}` : t.status), h('td', { class: 'acts' }, del))
  },
  'No templates.')
  return () => { v.stop(); if (ac) ac.abort() }
}

// mcpSnippets are what to paste into an agent's MCP configuration to give
// it this server's sandboxes: `lizard mcp` over stdio (Claude Desktop,
// Claude Code) and the Streamable HTTP URL, /mcp on this origin. key is a
// key just created, else a placeholder: the page never has an old key's
// secret.
function mcpSnippets (key) {
  const origin = location.origin
  const k = key || '<an API key of this project>'
  const stdio = JSON.stringify({ mcpServers: { lizard: { command: 'lizard', args: ['mcp'], env: { LIZARD_API_URL: origin, LIZARD_API_KEY: k } } } }, null, 2)
  const remote = JSON.stringify({ mcpServers: { lizard: { type: 'http', url: `${origin}/mcp`, headers: { Authorization: `Bearer ${k}` } } } }, null, 2)
  const code = `claude mcp add lizard -e LIZARD_API_URL=${origin} -e LIZARD_API_KEY=${k} -- lizard mcp\n` +
    `claude mcp add --transport http lizard ${origin}/mcp --header "Authorization: Bearer ${k}"`
  const snippet = (id, text) => h('div', { class: 'snippet-box' }, h('pre', { class: 'snippet', id }, text),
    h('button', { onclick: () => navigator.clipboard.writeText(text).then(() => toast('Copied', true)).catch(report) }, 'Copy'))
  return h('div', { class: 'panel', id: 'mcp' }, h('h2', null, 'Use it from an agent (MCP)'),
    h('p', null, 'Claude Desktop (claude_desktop_config.json) and other agents that start a server: ',
      h('code', null, 'lizard mcp'), ' (the lizard binary, copied to the agent\'s machine) with these variables:'),
    snippet('mcp-stdio', stdio),
    h('p', null, 'Over HTTP, nothing to install: ', h('code', null, `${origin}/mcp`), ' with the key as a bearer token:'),
    snippet('mcp-http', remote),
    h('p', null, 'Claude Code, either way:'),
    snippet('mcp-claude-code', code),
    key ? null : h('p', { class: 'dim' }, 'Create a key to see these with it filled in.'))
}

function viewKeys (main) {
  const shown = h('div', { id: 'new-key' })
  const mcp = h('div', null, mcpSnippets(null))
  const v = listView(main, 'API keys', (refresh) => {
    const btn = h('button', { class: 'primary', id: 'create-key' }, 'Create key')
    btn.addEventListener('click', () => act(btn, async () => {
      const k = await api('POST', '/api/keys', {})
      shown.replaceChildren(h('div', { class: 'panel' }, h('p', null, 'The new key, shown once (only its hash is kept):'),
        h('div', { class: 'secret', id: 'new-key-secret' }, k.key), ' ',
        h('button', { onclick: () => navigator.clipboard.writeText(k.key).then(() => toast('Copied', true)).catch(report) }, 'Copy')))
      mcp.replaceChildren(mcpSnippets(k.key))
      refresh()
    }, 'Key created'))
    return [h('div', { class: 'row', style: 'margin-bottom:12px' }, btn), shown]
  }, ['ID', 'Prefix', 'Created', 'Last used', 'Revoked', ''],
  () => api('GET', '/api/keys'),
  (k) => {
    const rev = h('button', { class: 'danger', 'data-key': k.id },
      'Revoke')
    rev.addEventListener('click', () => {
      if (!confirm(k.current ? 'Revoke the key this session signed in with? You will be signed out.' : `Revoke key ${k.prefix}…?`)) return
      act(rev, () => api('DELETE', `/api/keys/${encodeURIComponent(k.id)}`).then(v.refresh), `Revoked ${k.prefix}…`)
    })
    return h('tr', { 'data-key': k.id }, h('td', { class: 'mono' }, k.id, k.current ? h('span', { class: 'dim' }, ' (this session)') : null),
      h('td', { class: 'mono' }, k.prefix + '…'), h('td', null, fmtTime(k.createdAt)), h('td', null, fmtTime(k.lastUsedAt)),
      h('td', null, k.revokedAt ? fmtTime(k.revokedAt) : '—'), h('td', { class: 'acts' }, k.revokedAt ? null : rev))
  }, 'No keys.')
  main.append(mcp)
  return v.stop
}

// ---- start -------------------------------------------------------------------

window.lizardDashboard = { renderSandboxRows }

document.getElementById('signout').addEventListener('click', async () => {
  try { await api('POST', '/dashboard/logout', undefined, { noLogout: true }) } catch (e) { report(e) }
  signedOut('Signed out.')
})
// ---- events ---------------------------------------------------------------

// viewEvents follows the project's lifecycle events (GET /api/events, the
// last hour first), newest on top. A stream that ends is opened again after
// the last event seen (lastEventId), or from an hour back if that fails.
function viewEvents (main) {
  const tbody = h('tbody', { id: 'event-rows' })
  const status = h('span', { class: 'dim' }, 'following…')
  main.append(h('h1', null, 'Events'), h('div', { style: 'margin-bottom:8px' }, status),
    h('div', { class: 'panel' }, h('table', null,
      h('thead', null, h('tr', null, ...['Time', 'Event', 'Sandbox', 'By', 'Detail', 'Node'].map((c) => h('th', null, c)))), tbody)))
  let last = null
  let src = null
  let timer = null
  let rows = 0
  const open = () => {
    const q = last ? `lastEventId=${encodeURIComponent(last)}` : `since=${encodeURIComponent(new Date(Date.now() - 3600e3).toISOString())}`
    let opened = false
    src = new EventSource(`/api/events?${q}`)
    src.onopen = () => { opened = true; status.textContent = 'following…' }
    src.onmessage = (m) => {
      const e = JSON.parse(m.data)
      last = e.id
      const sb = e.sandboxId ? h('a', { href: '#/sandbox/' + encodeURIComponent(e.sandboxId) }, e.sandboxId) : '—'
      tbody.prepend(h('tr', { 'data-event': e.id, 'data-type': e.type, 'data-sandbox': e.sandboxId || '' },
        h('td', null, fmtTime(e.at)), h('td', null, e.type), h('td', { class: 'mono' }, sb), h('td', null, e.by || '—'),
        h('td', null, e.detail || (e.run ? `run ${e.run.status}` : '')), h('td', null, e.node || '—')))
      if (++rows > 1000) { tbody.lastChild.remove(); rows-- }
    }
    src.onerror = () => {
      src.close()
      if (!opened) last = null // refused: the event to resume after is gone; from an hour back
      status.textContent = 'stream ended; reconnecting…'
      timer = setTimeout(open, 3000)
    }
  }
  open()
  return () => { clearTimeout(timer); if (src) src.close() }
}

window.addEventListener('hashchange', () => route())
loadSession().then(() => route())
