// The intake console's page: reads the console API (v1) every few seconds
// and draws routes, partitions, charts, the group's instances and the
// audit log; with the token, pauses and resumes routes and partitions (on
// every instance when the group shares its control log), and explores,
// replays and purges dead letters (a dry run first, then its confirm value).
//
// Hand-written, no framework, no build step. Every string that comes from
// the service (route, topic and stream names, positions, problems, audit
// entries) goes into the page through textContent or setAttribute, never
// as markup, so a hostile name cannot add an element or run a script; the
// CSP (no inline script or style) is the second wall.
'use strict';

(() => {
  const API = 'api/v1';
  const PAGE = 100;
  const SVG = 'http://www.w3.org/2000/svg';
  const state = {
    index: null,
    period: 2000,
    timer: 0,
    busy: false, // a refresh is under way
    again: false, // another was asked for meanwhile
    lastAt: 0,
    samples: new Map(), // route name -> samples, oldest first
    offsets: new Map(), // route name -> first partition shown
    sections: new Map(), // route name -> its section's parts
    pending: new Map(), // pause switch -> the side asked for, until the service agrees
    shared: false, // the group's status log is shared: a pause goes to every instance
    errorUntil: 0, // an action's error stays shown until then
    noticeUntil: 0, // and what the last pause or resume did, until then
  };
  const numbers = new Intl.NumberFormat('en', { maximumFractionDigits: 1 });

  const $ = (id) => document.getElementById(id);

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // A cell whose text may be long: cut by CSS, whole in its title.
  function clip(tag, text, cls) {
    const node = el(tag, cls ? `clip ${cls}` : 'clip', text);
    node.title = text === null || text === undefined ? '' : String(text);
    return node;
  }

  function badge(text, kind) {
    return el('span', `badge ${kind}`, text);
  }

  function count(value) {
    return value === null || value === undefined ? '—' : numbers.format(value);
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return '—';
    if (ms < 1000) return `${ms} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
    if (ms < 3600000) return `${Math.floor(ms / 60000)} min ${Math.floor((ms % 60000) / 1000)} s`;
    return `${Math.floor(ms / 3600000)} h ${Math.floor((ms % 3600000) / 60000)} min`;
  }

  function cell(row, label, content, cls) {
    const td = el('td', cls);
    td.setAttribute('data-label', label);
    if (content instanceof Node) td.append(content);
    else td.textContent = content;
    row.append(td);
    return td;
  }

  async function get(path) {
    const response = await fetch(path, {
      cache: 'no-store',
      credentials: 'same-origin',
      headers: { Accept: 'application/json' },
    });
    if (!response.ok) throw new Error(`${path} answered ${response.status}`);
    return response.json();
  }

  // ---- the routes table ----

  function routeRow(route, index) {
    const row = el('tr');
    row.setAttribute('data-route', route.name);
    if (route.stalled_partitions > 0) row.classList.add('stalled');
    const link = clip('a', route.name, 'route-name');
    link.href = `#route-${index}`;
    cell(row, 'Route', link);
    const run = el('span', null);
    run.append(badge(route.state, route.state));
    if (route.paused) run.append(' ', badge('paused', 'warn'));
    cell(row, 'State', run);
    cell(row, 'Ready', badge(route.ready ? 'ready' : 'not ready', route.ready ? 'yes' : 'no'));
    cell(row, 'Live', badge(route.live ? 'live' : 'not live', route.live ? 'yes' : 'no'));
    const parts = el('span', null, `${route.partitions} `);
    if (route.stalled_partitions > 0) {
      parts.append(badge(`${route.stalled_partitions} stalled`, 'stalled'));
    }
    cell(row, 'Partitions', parts, 'num');
    const lag = cell(row, 'Lag', count(route.broker_lag), 'num');
    lag.title = route.broker_lag === null ? 'no lag probe, or it did not answer' : `probed ${duration(route.lag_age_ms)} ago`;
    cell(row, 'In flight', count(route.in_flight), 'num');
    cell(row, 'Since last commit', duration(route.since_last_commit_ms), 'num');
    const problems = el('ul');
    for (const line of route.problems) problems.append(el('li', null, line));
    cell(row, 'Problems', route.problems.length ? problems : '—', 'problems');
    return row;
  }

  // ---- charts ----

  // An inline SVG line chart of `series` over `samples`; a null value
  // breaks its line. Labels live in the figcaption, not the SVG, which is
  // stretched to its box.
  function chart(name, title, unit, samples, series) {
    const width = 300;
    const height = 100;
    const figure = el('figure', 'chart');
    const caption = el('figcaption');
    const legend = el('span', 'legend');
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('class', 'chart');
    svg.setAttribute('data-chart', name);
    svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('role', 'img');
    svg.setAttribute('aria-label', title);
    let max = 0;
    for (const sample of samples) {
      for (const s of series) {
        const value = s.value(sample);
        if (value !== null && value !== undefined && value > max) max = value;
      }
    }
    const top = max > 0 ? max * 1.1 : 1;
    for (const fraction of [0.25, 0.5, 0.75]) {
      const line = document.createElementNS(SVG, 'line');
      line.setAttribute('class', 'grid');
      line.setAttribute('x1', '0');
      line.setAttribute('x2', String(width));
      line.setAttribute('y1', String(height * fraction));
      line.setAttribute('y2', String(height * fraction));
      svg.append(line);
    }
    const first = samples.length ? samples[0].at_unix_ms : 0;
    const span = samples.length > 1 ? samples[samples.length - 1].at_unix_ms - first : 1;
    series.forEach((s, n) => {
      let d = '';
      let drawing = false;
      let last = null;
      for (const sample of samples) {
        const value = s.value(sample);
        if (value === null || value === undefined) {
          drawing = false;
          continue;
        }
        const x = ((sample.at_unix_ms - first) / (span || 1)) * width;
        const y = height - (value / top) * height;
        d += `${drawing ? 'L' : 'M'}${x.toFixed(1)} ${y.toFixed(1)} `;
        drawing = true;
        last = value;
      }
      if (!d) return;
      const path = document.createElementNS(SVG, 'path');
      path.setAttribute('class', `series s${n + 1}`);
      path.setAttribute('d', d.trim());
      svg.append(path);
      legend.append(el('span', `s${n + 1}`, `${s.label} ${count(last)}`));
    });
    caption.append(el('span', null, `${title}, ${unit}`), legend);
    figure.append(caption, svg);
    const foot = el('figcaption');
    const minutes = samples.length > 1 ? duration(span) : 'no samples yet';
    foot.append(el('span', null, `last ${minutes}`), el('span', null, `max ${count(max)}`));
    figure.append(foot);
    return figure;
  }

  function charts(samples) {
    const box = el('div', 'charts');
    box.append(
      chart('throughput', 'Throughput', 'messages/s', samples, [
        { label: 'committed', value: (s) => s.committed_per_s },
        { label: 'handled', value: (s) => s.handled_per_s },
      ]),
      chart('lag', 'Lag', 'messages', samples, [
        { label: 'broker lag', value: (s) => s.broker_lag },
        { label: 'in flight', value: (s) => s.in_flight },
      ]),
    );
    return box;
  }

  // ---- partitions ----

  function liveness(partition) {
    const kind = partition.liveness;
    const text = kind === 'stalled' && partition.stalled_for_ms !== null
      ? `stalled ${duration(partition.stalled_for_ms)}`
      : kind;
    return badge(text, kind);
  }

  function pausable() {
    return Boolean(state.index && (state.index.actions || []).includes('routes.pause'));
  }

  function partitionRow(p, route) {
    const row = el('tr', 'partition');
    if (p.liveness === 'stalled') row.classList.add('stalled');
    row.setAttribute('data-partition', String(p.partition));
    cell(row, 'Partition', clip('span', `${p.source}/${p.partition}`));
    cell(row, 'Liveness', liveness(p));
    cell(row, 'Handled', clip('span', p.handled ?? '—', 'short'), 'num');
    cell(row, 'Committed', clip('span', p.committed ?? '—', 'short'), 'num');
    cell(row, 'Newest', clip('span', p.newest ?? '—', 'short'), 'num');
    cell(row, 'Lag', count(p.broker_lag), 'num');
    cell(row, 'In flight', count(p.in_flight), 'num');
    cell(row, 'Uncommitted', count(p.uncommitted), 'num');
    const oldest = el('span');
    if (p.oldest_unfinished !== null) {
      oldest.append(clip('span', p.oldest_unfinished, 'short'));
      oldest.append(el('span', 'dim', ` for ${duration(p.oldest_unfinished_age_ms)}`));
    } else {
      oldest.textContent = '—';
    }
    cell(row, 'Oldest unfinished', oldest);
    cell(row, 'Since last commit', duration(p.since_last_commit_ms), 'num');
    cell(row, 'Since progress', duration(p.since_progress_ms), 'num');
    cell(row, 'Assigned for', duration(p.assigned_for_ms), 'num');
    const paused = el('span', 'paused');
    if (pausable()) paused.append(pauseSwitch(route, p, p.paused));
    if (p.paused) paused.append(badge('paused', 'warn'));
    else if (!pausable()) paused.append('no');
    cell(row, 'Paused', paused);
    return row;
  }

  const PARTITION_COLUMNS = [
    'Partition', 'Liveness', 'Handled', 'Committed', 'Newest', 'Lag', 'In flight',
    'Uncommitted', 'Oldest unfinished', 'Since last commit', 'Since progress',
    'Assigned for', 'Paused',
  ];

  // A route's section, made once and kept (so a table scrolled sideways
  // stays where the operator left it); its parts are refilled each time.
  function section(name) {
    let parts = state.sections.get(name);
    if (parts) return parts;
    const root = el('section', 'route');
    root.setAttribute('data-route', name);
    const header = el('header');
    const charts = el('div');
    const scroll = el('div', 'scroll');
    const table = el('table', 'partitions');
    const head = el('tr');
    for (const column of PARTITION_COLUMNS) head.append(el('th', null, column));
    const thead = el('thead');
    thead.append(head);
    const tbody = el('tbody');
    table.append(thead, tbody);
    scroll.append(table);
    const pager = el('div', 'pager');
    root.append(header, charts, scroll, pager);
    if (state.index && (state.index.dead_letters || []).includes(name)) root.append(explorer(name));
    parts = { root, header, charts, tbody, pager };
    state.sections.set(name, parts);
    return parts;
  }

  function pager(parts, name, page) {
    const box = parts.pager;
    box.replaceChildren();
    if (!page) return;
    const shown = page.partitions.length;
    const from = shown ? page.offset + 1 : 0;
    box.append(el('span', 'dim', `partitions ${from}–${page.offset + shown} of ${page.total}`));
    if (page.offset === 0 && page.next_offset === null) return;
    const previous = el('button', null, 'previous');
    previous.type = 'button';
    previous.disabled = page.offset === 0;
    previous.addEventListener('click', () => {
      state.offsets.set(name, Math.max(0, page.offset - PAGE));
      refresh();
    });
    const next = el('button', null, 'next');
    next.type = 'button';
    next.disabled = page.next_offset === null;
    next.addEventListener('click', () => {
      state.offsets.set(name, page.next_offset);
      refresh();
    });
    box.append(previous, next);
  }

  // ` (1s: 3, next due in 2 s · 1m: 1)`: the parked backlog per tier, when
  // the backend tells more than a total.
  function parkedTiers(tiers) {
    if (!Array.isArray(tiers) || tiers.length === 0) return '';
    if (tiers.length === 1 && tiers[0].tier === 'all') return '';
    const parts = tiers.map((tier) => {
      let text = `${tier.tier}: ${count(tier.messages)}`;
      if (typeof tier.next_due_unix_ms === 'number') {
        const wait = tier.next_due_unix_ms - Date.now();
        text += wait > 0 ? `, next due in ${duration(wait)}` : ', next due now';
      }
      return text;
    });
    return ` (${parts.join(' · ')})`;
  }

  function renderRoute(route, index, page) {
    const parts = section(route.name);
    parts.root.id = `route-${index}`;
    const title = el('h3');
    title.append(clip('span', route.name, 'route-name'), badge(route.state, route.state));
    if (route.stalled_partitions > 0) {
      title.append(badge(`${route.stalled_partitions} stalled`, 'stalled'));
    }
    parts.header.replaceChildren(title, el('span', 'dim',
      `committed ${count(route.committed_messages)} · in flight ${count(route.in_flight)}` +
      ` · lag ${count(route.broker_lag)} · parked ${count(route.parked_backlog)}` +
      parkedTiers(route.parked_tiers)));
    if (pausable()) parts.header.append(pauseSwitch(route.name, null, route.paused));
    parts.charts.replaceChildren(charts(state.samples.get(route.name) || []));
    parts.tbody.replaceChildren(...(page ? page.partitions.map((p) => partitionRow(p, route.name)) : []));
    pager(parts, route.name, page);
    return parts.root;
  }

  // ---- the token and the calls that change something ----

  // The token lives in this tab's sessionStorage only: never in the URL,
  // a cookie or localStorage, and it goes out only as a bearer header.
  const TOKEN_KEY = 'intake-console-token';

  function token() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || '';
    } catch (_) {
      return '';
    }
  }

  function canMutate() {
    return token() !== '' && !(state.index && state.index.mutations === 'off');
  }

  // Every control that needs the token carries the class `needs-token`.
  function applyToken() {
    const able = canMutate();
    for (const node of document.querySelectorAll('.needs-token')) node.disabled = !able;
    let note = 'read-only without a token';
    if (state.index && state.index.mutations === 'off') note = 'read-only: the service has no token set';
    else if (able) note = 'token in use (this tab only)';
    $('token-note').textContent = note;
    $('token-note').classList.toggle('ok', able);
    document.body.classList.toggle('read-only', !able);
  }

  function guarded(node) {
    node.classList.add('needs-token');
    node.disabled = !canMutate();
    return node;
  }

  function button(text, cls, onClick) {
    const node = el('button', cls, text);
    node.type = 'button';
    node.addEventListener('click', onClick);
    return node;
  }

  // A POST with the token: its status and its JSON (or its text).
  async function post(path, body) {
    const response = await fetch(path, {
      method: 'POST',
      cache: 'no-store',
      credentials: 'same-origin',
      headers: {
        Accept: 'application/json',
        'Content-Type': 'application/json',
        Authorization: `Bearer ${token()}`,
      },
      body: body === undefined ? '' : JSON.stringify(body),
    });
    const text = await response.text();
    let answer = text;
    try {
      answer = JSON.parse(text);
    } catch (_) { /* plain text, as the listener's 408 and 413 are */ }
    return { status: response.status, answer };
  }

  function refusal(status, answer) {
    const why = answer && typeof answer === 'object' ? answer.error : answer;
    if (status === 401) return 'the token was refused (401)';
    return `refused (${status})${why ? `: ${why}` : ''}`;
  }

  function routePath(name) {
    return `${API}/routes/${encodeURIComponent(name)}`;
  }

  // ---- pause switches ----

  // A switch the operator flipped shows its new side until the service's
  // `paused` agrees (it shows from the next commit tick) or 10 s pass.
  function pausedShown(key, paused) {
    const pending = state.pending.get(key);
    if (!pending) return paused;
    if (pending.want === paused || Date.now() > pending.until) {
      state.pending.delete(key);
      return paused;
    }
    return pending.want;
  }

  // `tagged`: the switch says when its pause is the whole group's (the
  // group section says it once for all of its switches).
  function pauseSwitch(route, partition, paused, tagged = true) {
    const key = partition ? `${route}\u0000${partition.source}/${partition.partition}` : route;
    const label = el('label', 'switch');
    const input = guarded(el('input'));
    input.type = 'checkbox';
    input.setAttribute('role', 'switch');
    input.checked = pausedShown(key, paused);
    const where = state.shared ? ' on every instance of the group' : ' on this instance';
    label.title = partition
      ? `pause or resume partition ${partition.source}/${partition.partition}${where}`
      : `pause or resume every partition of this route${where}`;
    input.addEventListener('change', async () => {
      const want = input.checked;
      input.disabled = true;
      let query = '';
      if (partition) {
        query = `?partition=${partition.partition}&source=${encodeURIComponent(partition.source)}`;
      }
      const verb = want ? 'pause' : 'resume';
      try {
        const { status, answer } = await post(`${routePath(route)}/${verb}${query}`);
        if (status === 200) {
          state.pending.set(key, { want, until: Date.now() + 10000 });
          scoped(verb, partition ? `${partition.source}/${partition.partition}` : 'every partition', route, answer);
        } else {
          input.checked = !want;
          showError(`${verb}: ${refusal(status, answer)}`);
        }
      } catch (error) {
        input.checked = !want;
        showError(`${verb}: ${error.message}`);
      }
      refresh();
    });
    label.append(input, el('span', null, partition ? 'paused' : 'pause route'));
    // With a shared group the switch says so: it holds the partition on
    // whichever instance owns it, now or after a rebalance.
    if (state.shared && tagged) label.append(el('span', 'scope', 'whole group'));
    return label;
  }

  // What the service did with a pause or resume, by the answer's scope.
  function scoped(verb, what, route, answer) {
    const scope = answer && typeof answer === 'object' ? answer.scope : null;
    const text = scope === 'group'
      ? `${verb} of ${what} (route ${route}) sent to every instance of the group`
      : `${verb} of ${what} (route ${route}) applied on this instance`;
    const notice = $('notice');
    notice.textContent = text;
    notice.setAttribute('data-scope', scope || 'instance');
    notice.hidden = false;
    state.noticeUntil = Date.now() + 15000;
  }

  function showError(text) {
    $('error').textContent = text;
    $('error').hidden = false;
    state.errorUntil = Date.now() + 8000;
  }

  // ---- the dead-letter explorer ----

  const CLASSES = ['', 'retryable', 'permanent', 'ignore', 'interrupted'];

  function select(cls, label, options) {
    const node = el('select', cls);
    node.setAttribute('aria-label', label);
    for (const [value, text] of options) {
      const option = el('option', null, text);
      option.value = value;
      node.append(option);
    }
    return node;
  }

  function payloadText(payload) {
    if (!payload) return '—';
    if (payload.preview !== undefined) return payload.preview;
    if (payload.fingerprint) return `${payload.bytes} B, ${payload.fingerprint}`;
    return payload.shown ? `${payload.bytes} B (${payload.shown})` : `${payload.bytes} B`;
  }

  function letters(n) {
    return n === 1 ? '1 letter' : `${count(n)} letters`;
  }

  function when(ms) {
    return ms === null || ms === undefined ? '—' : new Date(ms).toLocaleString();
  }

  // The explorer of one route: made once with its section, refilled on a
  // search, a page turn or an action (not by the page's timer).
  function explorer(name) {
    const root = el('div', 'explorer');
    root.setAttribute('data-route', name);
    const q = el('input', 'q');
    q.type = 'search';
    q.placeholder = 'search errors and keys';
    q.setAttribute('aria-label', 'search the dead letters');
    const cls = select('class', 'error class',
      CLASSES.map((c) => [c, c || 'any class']));
    const target = guarded(select('target', 'replay to', [
      ['group', "to this group's way back in"],
      ['origin', 'to where they came from'],
    ]));
    const summary = el('p', 'summary dim');
    const tbody = el('tbody');
    const table = el('table', 'letters');
    const head = el('tr');
    for (const column of ['Failed at', 'Class', 'Key', 'Error', 'Payload']) head.append(el('th', null, column));
    const thead = el('thead');
    thead.append(head);
    table.append(thead, tbody);
    const scroll = el('div', 'scroll');
    scroll.append(table);
    const paging = el('div', 'pager');
    const letter = el('div', 'letter');
    letter.hidden = true;
    const result = el('div', 'result');
    result.hidden = true;
    const view = { cursors: [''], page: 0 };

    const base = `${routePath(name)}/dead_letters`;
    const filter = () => {
      const f = {};
      if (q.value) f.q = q.value;
      if (cls.value) f.class = cls.value;
      return f;
    };

    async function list() {
      const params = new URLSearchParams(filter());
      const cursor = view.cursors[view.page];
      if (cursor) params.set('cursor', cursor);
      try {
        const page = await get(`${base}?${params}`);
        if (page.summary) {
          const by = Object.entries(page.summary.by_class || {}).map(([k, v]) => `${k} ${v}`).join(', ');
          summary.textContent = `${letters(page.summary.total)}${by ? ` (${by})` : ''} in ${page.destination}` +
            `${q.value ? ', before the text search' : ''} · payloads: ${page.redaction}`;
        }
        tbody.replaceChildren(...page.letters.map(letterRow));
        if (!page.letters.length) {
          const row = el('tr');
          const td = el('td', 'dim', view.page ? 'no more letters here' : 'no letter matches');
          td.colSpan = 5;
          row.append(td);
          tbody.append(row);
        }
        paging.replaceChildren(el('span', 'dim', `page ${view.page + 1}`));
        const previous = button('previous', null, () => { view.page -= 1; list(); });
        previous.disabled = view.page === 0;
        const next = button('next', null, () => {
          view.cursors[view.page + 1] = page.next;
          view.page += 1;
          list();
        });
        next.disabled = !page.next;
        paging.append(previous, next);
      } catch (error) {
        summary.textContent = `Cannot list the letters: ${error.message}`;
      }
    }

    function search() {
      view.cursors = [''];
      view.page = 0;
      letter.hidden = true;
      list();
    }

    function letterRow(item) {
      const row = el('tr', 'dead-letter');
      row.setAttribute('data-id', item.id);
      row.tabIndex = 0;
      if (item.unreadable) {
        cell(row, 'Failed at', '—');
        cell(row, 'Class', badge('unreadable', 'no'));
        cell(row, 'Key', '—');
        cell(row, 'Error', clip('span', item.unreadable, 'letter-error'));
        cell(row, 'Payload', payloadText(item.payload));
      } else {
        cell(row, 'Failed at', when(item.failed_at_unix_ms));
        cell(row, 'Class', badge(item.class, item.class === 'permanent' ? 'no' : 'warn'));
        cell(row, 'Key', clip('span', item.key ?? '—', 'short'));
        cell(row, 'Error', clip('span', item.error, 'letter-error'));
        cell(row, 'Payload', clip('span', payloadText(item.payload), 'payload'));
      }
      const open = () => show(item.id, row);
      row.addEventListener('click', open);
      row.addEventListener('keydown', (event) => { if (event.key === 'Enter') open(); });
      return row;
    }

    async function show(id, row) {
      for (const other of tbody.querySelectorAll('tr.selected')) other.classList.remove('selected');
      row.classList.add('selected');
      try {
        const full = await get(`${base}/${encodeURIComponent(id)}`);
        const fields = el('dl');
        const field = (term, value) => {
          if (value === undefined || value === null) return;
          fields.append(el('dt', null, term), el('dd', null, value));
        };
        field('id', full.id);
        field('class', full.class);
        field('failed at', when(full.failed_at_unix_ms));
        field('first failed at', when(full.first_failed_at_unix_ms));
        field('attempts', full.attempts);
        field('replays', full.replays);
        field('key', full.key);
        if (full.origin) {
          const o = full.origin;
          field('from', `${o.broker} ${o.source}/${o.partition} at ${o.position} (group ${o.group})`);
        }
        field('error', full.error ?? full.unreadable);
        field('payload', payloadText(full.payload));
        if (full.payload && full.payload.bytes !== undefined) field('payload size', `${full.payload.bytes} B`);
        const headers = el('ul', 'headers');
        for (const h of full.headers || []) {
          headers.append(el('li', h.redacted ? 'dim' : null, `${h.name}: ${h.value}`));
        }
        const heading = el('h4', null, 'Letter ');
        heading.append(clip('span', full.id, 'short'));
        letter.replaceChildren(heading, fields);
        if (full.headers && full.headers.length) {
          letter.append(el('h4', null, `Headers (${full.headers_total})`), headers);
        }
        letter.append(button('close', null, () => {
          letter.hidden = true;
          row.classList.remove('selected');
        }));
        letter.hidden = false;
      } catch (error) {
        letter.replaceChildren(el('p', 'dim', `Cannot read the letter: ${error.message}`));
        letter.hidden = false;
      }
    }

    // Replay or purge: a dry run first, its result shown, and only then
    // the button that posts its confirm value (for a purge, two of them).
    async function dryRun(action) {
      const body = { filter: filter(), dry_run: true };
      if (action === 'replay') body.target = target.value;
      result.hidden = false;
      result.className = 'result';
      result.replaceChildren(el('p', 'dim', `${action}: dry run…`));
      let reply;
      try {
        reply = await post(`${base}/${action}`, body);
      } catch (error) {
        result.replaceChildren(el('p', 'bad', `${action}: ${error.message}`));
        return;
      }
      const { status, answer } = reply;
      if (status !== 200) {
        result.replaceChildren(el('p', 'bad', `${action} dry run ${refusal(status, answer)}`));
        return;
      }
      const verb = action === 'replay' ? 'replayed' : 'purged';
      const n = answer.done;
      const text = el('p', 'dry-run');
      text.setAttribute('data-done', String(n));
      text.textContent = `Dry run: ${n} of ${letters(answer.letters)} would be ${verb}` +
        `${answer.truncated ? ' (more matched: run again after)' : ''}; ` +
        `${answer.skipped_total} skipped.`;
      const skipped = el('ul', 'skipped');
      for (const s of answer.skipped) skipped.append(el('li', null, `${s.id}: ${s.reason}`));
      const cancel = button('cancel', null, () => { result.hidden = true; });
      const confirmText = action === 'replay' ? `Confirm replay (${letters(n)})` : `Purge ${letters(n)}…`;
      const confirm = guarded(button(confirmText, `confirm ${action}`, async () => {
        if (action === 'purge' && !confirm.classList.contains('armed')) {
          // The second confirm: a purge cannot be undone.
          confirm.classList.add('armed');
          confirm.textContent = `Really purge ${letters(n)} (cannot be undone)`;
          return;
        }
        // Used once: the page's token refresh must not enable it again.
        confirm.classList.remove('needs-token');
        confirm.disabled = true;
        await run(action, answer.confirm, verb);
      }));
      result.replaceChildren(text);
      if (answer.skipped.length) result.append(skipped);
      if (n === 0) result.append(el('p', 'dim', `Nothing to ${action}.`));
      else result.append(confirm);
      result.append(cancel);
    }

    async function run(action, value, verb) {
      let reply;
      try {
        reply = await post(`${base}/${action}`, { dry_run: false, confirm: value });
      } catch (error) {
        result.replaceChildren(el('p', 'bad', `${action}: ${error.message}`));
        return;
      }
      const { status, answer } = reply;
      const outcome = el('p', 'outcome');
      outcome.setAttribute('data-status', String(status));
      if (status === 200) {
        outcome.textContent = `Done: ${letters(answer.done)} ${verb}, ${answer.skipped_total} skipped.`;
      } else if (status === 202) {
        outcome.textContent = `Running: about ${duration(answer.estimated_ms)}; the audit log says how it ended.`;
      } else if (status === 409) {
        outcome.textContent = 'The dry run expired or was used: run it again.';
        outcome.classList.add('bad');
      } else if (status === 502) {
        outcome.textContent = `Failed part way after ${answer.done} letters: ${answer.error}`;
        outcome.classList.add('bad');
      } else {
        outcome.textContent = `${action} ${refusal(status, answer)}`;
        outcome.classList.add('bad');
      }
      result.replaceChildren(outcome, button('close', null, () => { result.hidden = true; }));
      letter.hidden = true;
      list();
      refresh();
    }

    q.addEventListener('keydown', (event) => { if (event.key === 'Enter') search(); });
    cls.addEventListener('change', search);
    const bar = el('div', 'bar');
    bar.append(q, cls, button('search', 'search', search));
    const acts = el('div', 'bar');
    acts.append(
      guarded(button('Replay…', 'replay', () => dryRun('replay'))), target,
      guarded(button('Purge…', 'purge', () => dryRun('purge'))),
      el('span', 'dim', 'what the filter selects; a dry run first'),
    );
    root.append(el('h4', null, 'Dead letters'), bar, acts, result, summary, scroll, paging, letter);
    list();
    return root;
  }

  // ---- the group ----

  // How long ago, in seconds while it is under a minute.
  function ago(ms) {
    if (ms === null || ms === undefined) return '—';
    return ms < 60000 ? `${(ms / 1000).toFixed(1)} s` : duration(ms);
  }

  const GROUP_COLUMNS = ['Route', 'Partition', 'Liveness', 'Handled', 'In flight', 'Paused'];

  // One partition of an instance, as its status record has it; a paused
  // one carries the class `partition-paused` and a badge, whoever owns it.
  function groupRow(route, p) {
    const row = el('tr', 'group-partition');
    row.setAttribute('data-route', route.name);
    row.setAttribute('data-source', p.source);
    row.setAttribute('data-partition', String(p.partition));
    if (p.paused) row.classList.add('partition-paused');
    if (p.liveness === 'stalled') row.classList.add('stalled');
    cell(row, 'Route', clip('span', route.name, 'group-route'));
    cell(row, 'Partition', clip('span', `${p.source}/${p.partition}`, 'short'));
    cell(row, 'Liveness', liveness(p), 'liveness');
    cell(row, 'Handled', clip('span', p.handled ?? '—', 'short handled'), 'num');
    cell(row, 'In flight', count(p.in_flight), 'num in-flight');
    const paused = el('span', 'paused');
    if (pausable()) paused.append(pauseSwitch(route.name, p, p.paused, false));
    if (p.paused) paused.append(badge('paused', 'warn'));
    else if (!pausable()) paused.append('no');
    cell(row, 'Paused', paused);
    return row;
  }

  // One instance: its name, when this console last heard it (stale after
  // three sample intervals: it may have stopped, its partitions about to
  // move), and its routes' partitions.
  function instanceCard(instance, here) {
    const interval = state.index ? state.index.sample_interval_ms : 5000;
    const card = el('article', 'instance');
    card.setAttribute('data-instance', instance.instance);
    const stale = !here && instance.heard_ms_ago > 3 * interval;
    if (stale) card.classList.add('stale');
    const title = el('h3');
    title.append(clip('span', instance.instance, 'instance-name'));
    if (here) title.append(badge('this instance', 'info'));
    if (stale) title.append(badge('stale', 'no'));
    const heard = el('span', 'dim heard', here ? 'heard now' : `heard ${ago(instance.heard_ms_ago)} ago`);
    const header = el('header');
    header.append(title, heard);
    card.append(header);
    const rows = [];
    for (const route of Array.isArray(instance.routes) ? instance.routes : []) {
      for (const p of Array.isArray(route.partition_list) ? route.partition_list : []) {
        rows.push(groupRow(route, p));
      }
    }
    if (!rows.length) {
      card.append(el('p', 'dim', 'no partitions assigned'));
      return card;
    }
    const table = el('table', 'group-partitions');
    const head = el('tr');
    for (const column of GROUP_COLUMNS) head.append(el('th', null, column));
    const thead = el('thead');
    thead.append(head);
    const tbody = el('tbody');
    tbody.append(...rows);
    table.append(thead, tbody);
    const scroll = el('div', 'scroll');
    scroll.append(table);
    card.append(scroll);
    return card;
  }

  // The group section shows when the instances share a status log (else
  // the routes above are the whole story).
  function renderGroup(group) {
    state.shared = Boolean(group && group.shared && Array.isArray(group.instances));
    $('group-section').hidden = !state.shared;
    if (!state.shared) {
      $('group').replaceChildren();
      return;
    }
    const cards = group.instances.map((i) => instanceCard(i, i.instance === group.instance));
    $('group').replaceChildren(...cards);
    const rows = $('group').querySelectorAll('tr.group-partition');
    const paused = $('group').querySelectorAll('tr.group-partition.partition-paused').length;
    const stale = $('group').querySelectorAll('article.instance.stale').length;
    const n = group.instances.length;
    $('group-summary').textContent = `${n} ${n === 1 ? 'instance' : 'instances'} · ` +
      `${rows.length} partitions · ${paused} paused${stale ? ` · ${stale} stale` : ''}` +
      ' · a pause or resume applies to the whole group';
  }

  // ---- the audit log ----

  function renderAudit(entries) {
    const rows = entries.slice().reverse().map((entry) => {
      const row = el('tr');
      cell(row, 'When', new Date(entry.at_unix_ms).toLocaleTimeString());
      cell(row, 'Who', clip('span', entry.actor, 'short'));
      cell(row, 'What', clip('span', entry.action));
      cell(row, 'On', clip('span', entry.target, 'short'));
      cell(row, 'Dry run', entry.dry_run ? 'yes' : 'no');
      cell(row, 'Count', count(entry.count), 'num');
      cell(row, 'Outcome', entry.outcome, 'wrap');
      return row;
    });
    document.querySelector('#audit tbody').replaceChildren(...rows);
    $('no-audit').hidden = rows.length > 0;
  }

  // ---- the loop ----

  function keep(history) {
    const capacity = state.index ? state.index.history_samples : 180;
    for (const { route, samples } of history.routes) {
      const before = state.samples.get(route) || [];
      const newest = before.length ? before[before.length - 1].at_unix_ms : 0;
      const kept = before.concat(samples.filter((sample) => sample.at_unix_ms > newest));
      state.samples.set(route, kept.slice(Math.max(0, kept.length - capacity)));
      for (const sample of samples) state.lastAt = Math.max(state.lastAt, sample.at_unix_ms);
    }
  }

  // Puts `nodes` in `box` in this order, moving only those out of place:
  // a node taken out of the document loses focus, and a refresh must not
  // take the cursor out of the search box someone is typing in.
  function placeInOrder(box, nodes) {
    nodes.forEach((node, i) => {
      if (box.children[i] !== node) box.insertBefore(node, box.children[i] || null);
    });
    while (box.children.length > nodes.length) box.lastElementChild.remove();
  }

  function render(routes, pages, audit) {
    const names = new Set(routes.map((route) => route.name));
    for (const name of state.sections.keys()) {
      if (!names.has(name)) {
        state.sections.get(name).root.remove();
        state.sections.delete(name);
        state.samples.delete(name);
      }
    }
    document.querySelector('#routes tbody').replaceChildren(...routes.map(routeRow));
    $('no-routes').hidden = routes.length > 0;
    placeInOrder($('details'), routes.map((route, i) => renderRoute(route, i, pages[i])));
    renderAudit(audit.entries);
  }

  // One refresh at a time (a pager click during one runs right after it),
  // so samples are never fetched twice.
  async function refresh() {
    clearTimeout(state.timer);
    if (state.busy) {
      state.again = true;
      return;
    }
    state.busy = true;
    try {
      if (!document.hidden) {
        if (!state.index) {
          state.index = await get(API);
          state.period = Math.min(5000, Math.max(1000, state.index.sample_interval_ms));
          $('instance').textContent = state.index.instance;
          $('instance').title = state.index.instance;
          $('interval').textContent = duration(state.index.sample_interval_ms);
        }
        const [routes, history, audit, group] = await Promise.all([
          get(`${API}/routes`),
          get(`${API}/history?since=${state.lastAt}`),
          get(`${API}/audit`),
          // A service before the group view answers 404: no section.
          get(`${API}/group`).catch(() => null),
        ]);
        const pages = await Promise.all(routes.routes.map((route) => {
          const offset = state.offsets.get(route.name) || 0;
          const path = `${API}/routes/${encodeURIComponent(route.name)}/partitions`;
          return get(`${path}?offset=${offset}&limit=${PAGE}`).catch(() => null);
        }));
        keep(history);
        // The group first: the switches below say their scope from it.
        renderGroup(group);
        render(routes.routes, pages, audit);
        applyToken();
        if (Date.now() > state.errorUntil) $('error').hidden = true;
        if (Date.now() > state.noticeUntil) $('notice').hidden = true;
        $('status').textContent = `updated ${new Date().toLocaleTimeString()}`;
        $('status').classList.remove('stale');
      }
    } catch (error) {
      $('error').textContent = `Cannot read the console API: ${error.message}`;
      $('error').hidden = false;
      $('status').textContent = 'stale';
      $('status').classList.add('stale');
    } finally {
      state.busy = false;
      clearTimeout(state.timer);
      if (state.again) {
        state.again = false;
        refresh();
      } else {
        state.timer = setTimeout(refresh, state.period);
      }
    }
  }

  $('token-use').addEventListener('click', () => {
    const value = $('token').value.trim();
    $('token').value = '';
    try {
      if (value) sessionStorage.setItem(TOKEN_KEY, value);
    } catch (_) { /* storage refused: the page stays read-only */ }
    applyToken();
  });
  $('token').addEventListener('keydown', (event) => {
    if (event.key === 'Enter') $('token-use').click();
  });
  $('token-forget').addEventListener('click', () => {
    try {
      sessionStorage.removeItem(TOKEN_KEY);
    } catch (_) { /* nothing kept */ }
    applyToken();
  });
  applyToken();

  document.addEventListener('visibilitychange', () => {
    if (!document.hidden) refresh();
  });
  refresh();
})();
