// The reach page: search a node, pick a window, read its reach report.
//
// design:
//
//   search  input -> 250 ms debounce -> GET /api/nodes?q=   (older searches aborted, and a
//           response that is not the latest search's is dropped)
//   report  pick a node or a window -> cancelReport() -> fetchReport(0)
//             200 ............. render the report
//             429 / 503 ....... "busy — retrying in N s" countdown, then fetchReport(n + 1);
//                               N from Retry-After (whole seconds or an HTTP date; missing or
//                               invalid -> 2 s; at least 1 s, at most 30 s); after 5 refused
//                               retries: a final message and a "Retry now" button
//             other ........... the message in the JSON body's "error", or the status when
//                               the body is not JSON (a proxy's HTML error page, say)
//
// Every report request carries a sequence number (report.seq). cancelReport() bumps it, aborts
// the in-flight fetch (AbortController) and clears the pending retry and its countdown, so a
// stale response or timer finds its number out of date and does nothing: a newer choice is
// never overwritten by an older one.
//
// The map of the report is drawn by reach-map.js (window.reachMap); numbers and names are
// written, elements made and pubkeys recognised by reach-common.js (window.reachCommon); both
// are loaded before this file.
//
// The URL mirrors the choice (?node=<pubkey>&days=N): a report can be linked and reloaded, and
// the browser's back and forward buttons move between reports.
"use strict";

(() => {
  const DEFAULT_DAYS = 7;
  const MAX_RETRIES = 5;
  // Retry-After is a whole number of seconds; a missing or unreadable one means the server's
  // usual 2 s, and no answer makes us wait longer than 30 s between tries.
  const RETRY_FALLBACK_S = 2;
  const RETRY_MIN_S = 1;
  const RETRY_CAP_S = 30;
  const SEARCH_DEBOUNCE_MS = 250;
  const SEARCH_LIMIT = 20;
  // The countdown is redrawn this often; it only changes text when the whole second changes.
  const TICK_MS = 200;

  const $ = (id) => document.getElementById(id);
  const els = {
    form: $("picker"),
    search: $("node-search"),
    results: $("node-results"),
    searchInfo: $("search-info"),
    days: $("days"),
    statusBox: $("status-box"),
    status: $("status"),
    retry: $("retry"),
    report: $("report"),
    nodeName: $("node-name"),
    nodeRole: $("node-role"),
    nodePubkey: $("node-pubkey"),
    nodeWindow: $("node-window"),
    nodeTokens: $("node-tokens"),
    figNeighbours: $("fig-neighbours"),
    figRank: $("fig-rank"),
    figLinks: $("fig-links"),
    figBidir: $("fig-bidir"),
    figRelay: $("fig-relay"),
    figObservers: $("fig-observers"),
    links: $("links"),
    linksEmpty: $("links-empty"),
    observers: $("observers"),
    observersEmpty: $("observers-empty"),
    map: $("reach-map"),
  };

  const { fmtInt, fmtKm, fmtSnr, shortKey, label, plural, isPubkey, el } = window.reachCommon;

  // -- Retry-After ------------------------------------------------------------------------

  /** Seconds to wait before retrying, from a Retry-After header value (or null). */
  function retryDelaySeconds(header) {
    if (header == null) return RETRY_FALLBACK_S;
    const text = String(header).trim();
    let seconds;
    if (/^\d+$/.test(text)) {
      seconds = Number(text);
    } else {
      // The HTTP-date form ("Sun, 06 Nov 1994 08:49:37 GMT"). Date.parse alone would also
      // take "-3" or "1.5" as dates, so ask for a weekday and a time of day first.
      if (!/^[A-Za-z]{3}[a-z]*,? .*\d{1,2}:\d{2}:\d{2}/.test(text)) return RETRY_FALLBACK_S;
      const when = Date.parse(text);
      if (Number.isNaN(when)) return RETRY_FALLBACK_S;
      seconds = Math.ceil((when - Date.now()) / 1000);
    }
    // "0" or a date in the past: still wait a little, never a tight loop.
    return Math.min(RETRY_CAP_S, Math.max(RETRY_MIN_S, seconds));
  }

  function parseDays(value) {
    const n = Number.parseInt(value, 10);
    if (Number.isNaN(n)) return DEFAULT_DAYS; // the server's rule: a non-number means 7
    return Math.min(30, Math.max(1, n));
  }

  // -- answers ----------------------------------------------------------------------------

  /**
   * The JSON body of `response`, or null when it has none: the status line and Content-Type
   * are read before the body, so a proxy's HTML error page is never parsed as JSON. An abort
   * while the body is read is thrown on.
   */
  async function jsonOf(response) {
    if (!/^application\/(?:[\w.+-]+\+)?json\b/i.test(response.headers.get("Content-Type") || "")) {
      return null;
    }
    try {
      return await response.json();
    } catch (err) {
      if (err.name === "AbortError") throw err;
      return null; // says JSON, is not: reported by its status
    }
  }

  /** The sentence of a JSON error body ({"error": "..."}), or "" when it has none. */
  const errorOf = (body) => (body && typeof body.error === "string" ? body.error : "");

  /** "answered 502 Bad Gateway": what an answer whose body says nothing did. */
  const answerOf = (response) =>
    `answered ${response.status} ${response.statusText}`.trim() +
    (response.ok ? " but not with JSON" : "");

  const sentence = (text) => (text.endsWith(".") ? text : `${text}.`);

  // -- status line ------------------------------------------------------------------------

  function setStatus(state, text, { retryButton = false } = {}) {
    els.statusBox.dataset.state = state;
    if (els.status.textContent !== text) els.status.textContent = text;
    els.retry.hidden = !retryButton;
  }

  // -- URL --------------------------------------------------------------------------------

  function readUrl() {
    const params = new URLSearchParams(window.location.search);
    return {
      node: (params.get("node") || "").trim().toLowerCase(),
      days: parseDays(params.get("days")),
    };
  }

  function writeUrl(node, days, mode) {
    const url = new URL(window.location.href);
    url.searchParams.set("node", node);
    url.searchParams.set("days", String(days));
    if (url.href === window.location.href) return;
    window.history[mode]({ node, days }, "", url.pathname + url.search + url.hash);
  }

  function showDays(days) {
    const value = String(days);
    if (![...els.days.options].some((option) => option.value === value)) {
      // A linked window that the menu does not offer (say ?days=3): offer it too.
      const option = new Option(plural(days, "day"), value);
      const after = [...els.days.options].find((o) => Number(o.value) > days);
      els.days.add(option, after || null);
    }
    els.days.value = value;
  }

  // -- report -----------------------------------------------------------------------------

  const report = {
    seq: 0, // the current request's number; bumped by every new request and every cancel
    controller: null, // AbortController of the in-flight report fetch
    timer: 0, // the pending retry (setTimeout)
    ticker: 0, // the pending retry's countdown (setInterval)
    node: "", // the node and window asked for most recently
    days: DEFAULT_DAYS,
    shown: null, // {node, days} of the report on screen
  };

  /** Forget the in-flight request and any pending retry; their late answers are dropped. */
  function cancelReport() {
    report.seq += 1;
    if (report.controller) report.controller.abort();
    report.controller = null;
    clearTimeout(report.timer);
    clearInterval(report.ticker);
    report.timer = 0;
    report.ticker = 0;
  }

  function startReport(node, days) {
    cancelReport();
    report.node = node;
    report.days = days;
    if (report.shown) {
      // Keep the old report while the new one loads only if it is the same node (a window
      // change); another node's figures under this node's status would mislead.
      if (report.shown.node === node) {
        els.report.classList.add("stale");
        els.report.setAttribute("aria-busy", "true");
      } else {
        hideReport();
      }
    }
    fetchReport(0);
  }

  async function fetchReport(retriesUsed) {
    const seq = ++report.seq;
    const controller = new AbortController();
    report.controller = controller;
    const { node, days } = report;
    setStatus(
      "loading",
      retriesUsed
        ? `Retrying (retry ${retriesUsed} of ${MAX_RETRIES})…`
        : "Loading the report…",
    );
    const url = `/api/nodes/${encodeURIComponent(node)}/reach?days=${days}`;
    let response;
    let body = null;
    try {
      response = await fetch(url, {
        signal: controller.signal,
        cache: "no-store",
        headers: { Accept: "application/json" },
      });
      body = await jsonOf(response);
    } catch (err) {
      if (seq !== report.seq) return; // cancelled or superseded
      report.controller = null;
      setStatus("error", "Could not reach the server. Check the connection and try again.", {
        retryButton: true,
      });
      return;
    }
    if (seq !== report.seq) return; // a newer choice was made while this one was in flight
    report.controller = null;

    if (response.ok && body && body.node) {
      renderReport(body, node, days);
      const name = label(body.node);
      const { days: shownDays = days, since = "" } = body.window || {};
      const from = since ? ` since ${since}` : "";
      setStatus("ok", `Showing the ${shownDays}-day report for ${name}${from}.`);
      return;
    }
    if (response.status === 429 || response.status === 503) {
      if (retriesUsed >= MAX_RETRIES) {
        setStatus(
          "gave-up",
          `The server is still busy after ${MAX_RETRIES} retries. Please try again in a moment.`,
          { retryButton: true },
        );
        return;
      }
      scheduleRetry(seq, retriesUsed + 1, retryDelaySeconds(response.headers.get("Retry-After")));
      return;
    }
    hideReport();
    setStatus("error", sentence(errorOf(body) || `The server ${answerOf(response)}`), {
      retryButton: response.status >= 500,
    });
  }

  /** Show the countdown, then send retry number `retry` — unless `seq` is no longer current. */
  function scheduleRetry(seq, retry, seconds) {
    const due = performance.now() + seconds * 1000;
    const draw = () => {
      if (seq !== report.seq) return;
      const left = Math.max(1, Math.ceil((due - performance.now()) / 1000));
      setStatus(
        "busy",
        `Server busy — retrying in ${left} s (retry ${retry} of ${MAX_RETRIES}).`,
      );
    };
    draw();
    report.ticker = setInterval(draw, TICK_MS);
    report.timer = setTimeout(() => {
      if (seq !== report.seq) return;
      clearInterval(report.ticker);
      report.ticker = 0;
      report.timer = 0;
      fetchReport(retry);
    }, seconds * 1000);
  }

  function hideReport() {
    els.report.hidden = true;
    els.report.classList.remove("stale");
    els.report.removeAttribute("aria-busy");
    report.shown = null;
  }

  // -- rendering --------------------------------------------------------------------------

  const keyCode = (pubkey) => el("code", { className: "key" }, shortKey(pubkey));

  function nodeLink(item, days) {
    const name = item.name || "(unnamed)";
    // An observer that is not a node has no report of its own: no link.
    if (item.role === "observer" || !isPubkey(item.pubkey)) {
      return el("span", {}, name);
    }
    const href = `?node=${item.pubkey}&days=${days}`;
    return el("a", { href, dataset: { pubkey: item.pubkey, name: item.name || "" } }, name);
  }

  // Tiers of the links table: two-way links first, then by the order of magnitude of the
  // bottleneck (the weaker direction). The server already sorts; rows keep its order.
  const TIERS = [
    { id: 1, test: (l) => l.bidir && l.bottleneck >= 100, text: "Two-way, bottleneck 100 or more" },
    { id: 2, test: (l) => l.bidir && l.bottleneck >= 10, text: "Two-way, bottleneck 10 to 99" },
    { id: 3, test: (l) => l.bidir, text: "Two-way, bottleneck 1 to 9" },
    { id: 4, test: () => true, text: "One-way" },
  ];
  const tierOf = (link) => TIERS.find((tier) => tier.test(link));

  function renderLinks(links, days) {
    for (const old of els.links.querySelectorAll("tbody")) old.remove();
    const groups = new Map(TIERS.map((tier) => [tier.id, []]));
    for (const link of links) groups.get(tierOf(link).id).push(link);
    for (const tier of TIERS) {
      const rows = groups.get(tier.id);
      if (!rows.length) continue;
      const body = el("tbody", { dataset: { tier: tier.id } });
      const count = plural(rows.length, "link");
      body.append(
        el(
          "tr",
          { className: "tier-head" },
          el(
            "th",
            { scope: "rowgroup", colspan: "8" },
            `Tier ${tier.id} — ${tier.text} (${count})`,
          ),
        ),
      );
      for (const link of rows) {
        body.append(
          el(
            "tr",
            { dataset: { pubkey: link.pubkey, tier: tier.id } },
            el("td", { className: "tier" }, String(tier.id)),
            el("th", { scope: "row" }, nodeLink(link, days), " ", keyCode(link.pubkey)),
            el("td", {}, link.role || "—"),
            el("td", { className: "num" }, fmtInt(link.we_hear)),
            el("td", { className: "num" }, fmtInt(link.they_hear)),
            el("td", { className: "num" }, fmtInt(link.bottleneck)),
            el("td", {}, link.bidir ? "yes" : "no"),
            el("td", { className: "num" }, fmtKm(link.distance_km)),
          ),
        );
      }
      els.links.append(body);
    }
    els.links.parentElement.hidden = links.length === 0;
    els.linksEmpty.hidden = links.length !== 0;
  }

  function renderObservers(observers) {
    const body = els.observers.tBodies[0];
    body.replaceChildren(
      ...observers.map((o) =>
        el(
          "tr",
          { dataset: { pubkey: o.pubkey } },
          el("th", { scope: "row" }, o.name || "(unnamed observer)", " ", keyCode(o.pubkey)),
          el("td", { className: "num" }, fmtInt(o.count)),
          el("td", { className: "num" }, fmtSnr(o.avg_snr)),
          el("td", { className: "num" }, fmtKm(o.distance_km)),
        ),
      ),
    );
    els.observers.parentElement.hidden = observers.length === 0;
    els.observersEmpty.hidden = observers.length !== 0;
  }

  function renderReport(data, node, days) {
    const imp = data.importance || {};
    const links = data.links || [];
    const observers = data.direct_observers || [];
    els.nodeName.textContent = data.node.name || "(unnamed)";
    els.nodeRole.textContent = data.node.role || "";
    els.nodePubkey.textContent = data.node.pubkey;
    const { days: windowDays, since } = data.window;
    els.nodeWindow.textContent = `last ${plural(windowDays, "day")}, since ${since}`;
    const tokens = data.reliable_tokens || [];
    els.nodeTokens.textContent = tokens.length
      ? `Reliable path tokens: ${tokens.join(", ")}`
      : "No reliable path token: this node cannot be told apart in relay paths.";
    els.figNeighbours.textContent = fmtInt(imp.neighbor_degree || 0);
    els.figRank.textContent = imp.degree_rank
      ? `${fmtInt(imp.degree_rank)} of ${fmtInt(imp.nodes_with_edges)}`
      : "—";
    els.figLinks.textContent = fmtInt(links.length);
    els.figBidir.textContent = fmtInt(imp.bidirectional_links || 0);
    els.figRelay.textContent = fmtInt(imp.relay_observations || 0);
    els.figObservers.textContent = fmtInt(imp.direct_observers || 0);
    renderLinks(links, days);
    renderObservers(observers);
    els.report.dataset.node = node;
    els.report.dataset.days = String(days);
    els.report.classList.remove("stale");
    els.report.removeAttribute("aria-busy");
    els.report.hidden = false;
    // Drawn once the section is visible: the map is fitted to the width it is given.
    window.reachMap.render(els.map, data, days);
    report.shown = { node, days };
    // Opened from a link, the box shows the pubkey until the name is known.
    const untouched = !els.search.value || els.search.value === node;
    if (untouched && !els.search.matches(":focus")) {
      els.search.value = data.node.name || data.node.pubkey;
    }
  }

  // -- choosing ---------------------------------------------------------------------------

  function choose(node, days, name) {
    if (name !== undefined) els.search.value = name || node;
    writeUrl(node, days, "pushState");
    startReport(node, days);
  }

  els.days.addEventListener("change", () => {
    const days = parseDays(els.days.value);
    if (report.node) choose(report.node, days);
  });

  els.retry.addEventListener("click", () => {
    if (report.node) startReport(report.node, report.days);
  });

  els.report.addEventListener("click", (event) => {
    const link = event.target.closest("a[data-pubkey]");
    const modified = event.metaKey || event.ctrlKey || event.shiftKey || event.altKey;
    if (!link || event.button !== 0 || modified) return; // let the browser open a new tab
    event.preventDefault();
    choose(link.dataset.pubkey, report.days, link.dataset.name);
  });

  window.addEventListener("popstate", () => {
    const { node, days } = readUrl();
    showDays(days);
    if (node) {
      els.search.value = node;
      startReport(node, days);
    } else {
      cancelReport();
      hideReport();
      report.node = "";
      setStatus("idle", "Search for a node to read its reach report.");
    }
  });

  // -- search -----------------------------------------------------------------------------

  const search = {
    seq: 0,
    controller: null,
    timer: 0,
    items: [],
    active: -1,
  };

  function closeResults() {
    els.results.hidden = true;
    els.search.setAttribute("aria-expanded", "false");
    els.search.removeAttribute("aria-activedescendant");
    search.active = -1;
  }

  function openResults() {
    if (!search.items.length) return;
    els.results.hidden = false;
    els.search.setAttribute("aria-expanded", "true");
  }

  function setActive(index) {
    const options = els.results.querySelectorAll('[role="option"]');
    if (!options.length) return;
    search.active = (index + options.length) % options.length;
    options.forEach((option, i) => {
      option.setAttribute("aria-selected", String(i === search.active));
    });
    const current = options[search.active];
    els.search.setAttribute("aria-activedescendant", current.id);
    current.scrollIntoView({ block: "nearest" });
  }

  function renderResults(nodes, total) {
    search.items = nodes;
    search.active = -1;
    els.search.removeAttribute("aria-activedescendant");
    els.results.replaceChildren(
      ...nodes.map((n, i) =>
        el(
          "li",
          {
            id: `node-option-${i}`,
            role: "option",
            "aria-selected": "false",
            dataset: { pubkey: n.pubkey },
          },
          el("span", { className: "opt-name" }, n.name || "(unnamed)"),
          el("span", { className: "opt-role" }, n.role || ""),
          keyCode(n.pubkey),
        ),
      ),
    );
    if (nodes.length) {
      openResults();
      els.searchInfo.textContent =
        total > nodes.length
          ? `${nodes.length} of ${total} matching nodes`
          : `${plural(nodes.length, "matching node")}`;
    } else {
      closeResults();
      els.searchInfo.textContent = "No node matches.";
    }
  }

  async function runSearch(query) {
    const seq = ++search.seq;
    if (search.controller) search.controller.abort();
    search.controller = null;
    if (!query) {
      search.items = [];
      els.results.replaceChildren();
      closeResults();
      els.searchInfo.textContent = "";
      return;
    }
    const controller = new AbortController();
    search.controller = controller;
    const params = new URLSearchParams({ q: query, limit: String(SEARCH_LIMIT) });
    let response;
    let body;
    try {
      response = await fetch(`/api/nodes?${params}`, {
        signal: controller.signal,
        headers: { Accept: "application/json" },
      });
      body = await jsonOf(response);
    } catch (err) {
      if (seq !== search.seq) return; // cancelled or superseded
      els.searchInfo.textContent = "Search failed: could not reach the server.";
      return;
    }
    if (seq !== search.seq) return;
    if (!response.ok || !body) {
      const why = errorOf(body) || `the server ${answerOf(response)}`;
      els.searchInfo.textContent = `Search failed: ${sentence(why)}`;
      return;
    }
    renderResults(body.nodes || [], body.total || 0);
  }

  function pick(index) {
    const item = search.items[index];
    if (!item) return;
    closeResults();
    els.searchInfo.textContent = "";
    choose(item.pubkey, parseDays(els.days.value), item.name);
  }

  els.search.addEventListener("input", () => {
    clearTimeout(search.timer);
    const query = els.search.value.trim();
    search.timer = setTimeout(() => runSearch(query), SEARCH_DEBOUNCE_MS);
  });

  els.search.addEventListener("keydown", (event) => {
    switch (event.key) {
      case "ArrowDown":
        event.preventDefault();
        if (els.results.hidden) openResults();
        setActive(search.active + 1);
        break;
      case "ArrowUp":
        event.preventDefault();
        if (els.results.hidden) openResults();
        setActive(search.active < 0 ? -1 : search.active - 1);
        break;
      case "Home":
      case "End":
        if (!els.results.hidden && search.items.length) {
          event.preventDefault();
          setActive(event.key === "Home" ? 0 : search.items.length - 1);
        }
        break;
      case "Enter": {
        event.preventDefault();
        const query = els.search.value.trim().toLowerCase();
        if (!els.results.hidden && search.active >= 0) pick(search.active);
        else if (search.items.length === 1) pick(0);
        else if (isPubkey(query)) {
          closeResults();
          choose(query, parseDays(els.days.value));
        }
        break;
      }
      case "Escape":
        if (!els.results.hidden) {
          event.preventDefault();
          closeResults();
        }
        break;
      default:
        break;
    }
  });

  els.search.addEventListener("blur", () => closeResults());

  // mousedown would move the focus away (and close the list) before the click lands.
  els.results.addEventListener("mousedown", (event) => event.preventDefault());
  els.results.addEventListener("click", (event) => {
    const option = event.target.closest('[role="option"]');
    if (option) pick([...els.results.children].indexOf(option));
  });

  els.form.addEventListener("submit", (event) => event.preventDefault());

  // -- start ------------------------------------------------------------------------------

  const start = readUrl();
  showDays(start.days);
  if (start.node) {
    writeUrl(start.node, start.days, "replaceState"); // normalise (lower case, clamped days)
    els.search.value = start.node;
    startReport(start.node, start.days);
  }

  // For tests and the curious: how a Retry-After header is read.
  window.reachPage = Object.freeze({ retryDelaySeconds });
})();
