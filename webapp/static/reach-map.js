// The reach map: the report on screen drawn as an inline SVG. No tiles, no external asset, no
// network: positions are projected from the report's own lat/lon.
//
// design:
//
//   position  a point has one when lat and lon are both numbers and not both 0 (0,0 is the
//             firmware's "no fix"; the server uses the same rule). Links and direct observers
//             without one are not drawn; the figure says how many.
//   projection  equirectangular, x = lon * cos(mean latitude), y = -lat (north up), fitted
//             with one scale for both axes (the map keeps its shape) into the figure's own pixel
//             box: the viewBox is in CSS pixels, so markers, hit areas and text keep their size
//             on any screen. A ResizeObserver redraws when the box changes width. A single
//             point, or points that span almost nothing, get a minimum span (about 2 km).
//             Points that land on one spot are spread on a small ring so each stays reachable.
//   elements  exactly one element carries data-pubkey per pubkey drawn: the node (a <g>, not a
//             link), and for each positioned neighbour an SVG <a href="?node=..."> - the page's
//             click handler opens its report, like the links in the table. A pubkey that is
//             both a link and a direct observer is one marker, drawn as an observer (a square)
//             on the link's line. A node without a position of its own is drawn, dashed, at the
//             middle of its neighbours so its lines still show who hears whom.
//   reading   no permanent labels except the node's own name (dozens of links stay legible):
//             pointing at any marker, or focusing a neighbour's, names it in a tooltip, and its
//             <title> and aria-label carry the same words. Enter or Space on a focused marker
//             opens it. The node's own marker is not a tab stop: its report is already open.
//   arrows    a one-way line runs from the node that is heard to the node that hears it, with
//             an arrow half-way pointing at the hearer (see lineTo).
//   layers    scale bar, then lines (weakest first), then markers (weakest first), then the
//             node on top.
"use strict";

(() => {
  const KM_PER_DEGREE = (6371.0 * Math.PI) / 180; // one degree of latitude, haversine's R
  const MIN_SPAN_DEG = 0.02; // about 2 km: a lone point or a tight cluster is not blown up
  const PAD_PX = 30; // room for a marker, its focus ring and the spread ring at the edges
  const SCALE_BAR_ROOM_PX = 16; // and below that, room for the scale bar
  const MIN_HEIGHT_PX = 240;
  const MAX_HEIGHT_PX = 560;
  const SPREAD_PX = 16; // radius of the ring that coincident points are spread on
  const SAME_SPOT_PX = 3;
  // A two-way line is LINE_MIN_PX wide plus LINE_RANGE_PX times log10(1 + bottleneck) / 3, so
  // widths mean the same on every map: 1 -> 2.2 px, 10 -> 3.9, 100 -> 6.2, 1,000 and more -> 8.5.
  // One-way lines (bottleneck 0) are LINE_MIN_PX.
  const LINE_MIN_PX = 1.5;
  const LINE_RANGE_PX = 7;
  const LINE_FULL_BOTTLENECK = 1000;
  const SCALE_BAR_MAX_PX = 120;

  const { fmtInt, fmtKm, fmtSnr, label: nameOf, plural, svgEl } = window.reachCommon;

  /** The server's rule: lat and lon both numbers, finite, and not both 0. */
  function hasPosition(item) {
    const { lat, lon } = item || {};
    if (typeof lat !== "number" || typeof lon !== "number") return false;
    if (!Number.isFinite(lat) || !Number.isFinite(lon)) return false;
    return !(lat === 0 && lon === 0);
  }

  // -- what to draw --------------------------------------------------------------------------

  /**
   * The report reduced to what the map shows: one entry per neighbour pubkey (a link, a
   * direct observer, or both), the positioned ones to draw and the counts of the others.
   */
  function neighboursOf(data) {
    const links = data.links || [];
    const observers = data.direct_observers || [];
    const self = data.node.pubkey;
    const byKey = new Map();
    for (const link of links) {
      if (link.pubkey === self || byKey.has(link.pubkey)) continue;
      byKey.set(link.pubkey, { pubkey: link.pubkey, link, observer: null, item: link });
    }
    for (const observer of observers) {
      if (observer.pubkey === self) continue;
      const entry = byKey.get(observer.pubkey);
      if (entry) entry.observer = observer;
      else byKey.set(observer.pubkey, { pubkey: observer.pubkey, link: null, observer, item: observer });
    }
    const all = [...byKey.values()];
    return {
      placed: all.filter((n) => hasPosition(n.item)),
      links: links.length,
      linksUnplaced: links.filter((l) => !hasPosition(l)).length,
      observers: observers.length,
      observersUnplaced: observers.filter((o) => !hasPosition(o)).length,
    };
  }

  /** "two-way" / "one-way" / "observer": how the neighbour's line is drawn. */
  function kindOf(neighbour) {
    if (!neighbour.link) return "observer";
    return neighbour.link.bidir ? "two-way" : "one-way";
  }

  /** Weakest first, so the strongest lines and markers are drawn last, on top. */
  function strength(neighbour) {
    const link = neighbour.link;
    if (!link) return [0, 0, neighbour.observer.count];
    return [link.bidir ? 1 : 0, link.bottleneck, link.we_hear + link.they_hear];
  }

  function byStrength(a, b) {
    const sa = strength(a);
    const sb = strength(b);
    for (let i = 0; i < sa.length; i += 1) if (sa[i] !== sb[i]) return sa[i] - sb[i];
    return a.pubkey < b.pubkey ? 1 : a.pubkey > b.pubkey ? -1 : 0;
  }

  // -- projection ----------------------------------------------------------------------------

  /**
   * Project `points` ({lat, lon}) for a box `width` px wide. Returns the box height and, per
   * point, [x, y] in px; also the px per projected degree (for the scale bar).
   */
  function project(points, width) {
    const lats = points.map((p) => p.lat);
    let lons = points.map((p) => p.lon);
    if (Math.max(...lons) - Math.min(...lons) > 180) {
      lons = lons.map((lon) => (lon < 0 ? lon + 360 : lon)); // across the antimeridian
    }
    const meanLat = lats.reduce((sum, lat) => sum + lat, 0) / lats.length;
    const k = Math.max(0.01, Math.cos((meanLat * Math.PI) / 180));
    const xs = lons.map((lon) => lon * k);
    const ys = lats.map((lat) => -lat);
    const [minX, maxX] = [Math.min(...xs), Math.max(...xs)];
    const [minY, maxY] = [Math.min(...ys), Math.max(...ys)];
    const spanX = Math.max(maxX - minX, MIN_SPAN_DEG);
    const spanY = Math.max(maxY - minY, MIN_SPAN_DEG);
    const padY = 2 * PAD_PX + SCALE_BAR_ROOM_PX;
    const inner = Math.max(40, width - 2 * PAD_PX);
    const wanted = Math.round(inner * (spanY / spanX)) + padY;
    const height = Math.max(MIN_HEIGHT_PX, Math.min(MAX_HEIGHT_PX, width * 1.1, wanted));
    const scale = Math.min(inner / spanX, (height - padY) / spanY);
    const midX = (minX + maxX) / 2;
    const midY = (minY + maxY) / 2;
    const centreY = PAD_PX + (height - padY) / 2;
    const xy = xs.map((x, i) => [width / 2 + (x - midX) * scale, centreY + (ys[i] - midY) * scale]);
    return { height, xy, pxPerDegree: scale };
  }

  /** Spread points that land on one spot around it; an `anchor` index stays in the middle. */
  function spread(xy, anchor) {
    const groups = new Map();
    xy.forEach(([x, y], i) => {
      const key = `${Math.round(x / SAME_SPOT_PX)},${Math.round(y / SAME_SPOT_PX)}`;
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(i);
    });
    const out = xy.map((p) => [...p]);
    for (const members of groups.values()) {
      if (members.length < 2) continue;
      const [cx, cy] = xy[members.includes(anchor) ? anchor : members[0]];
      const around = members.filter((i) => i !== anchor);
      const radius = SPREAD_PX + Math.max(0, around.length - 6) * 2;
      around.forEach((i, n) => {
        const angle = -Math.PI / 2 + (2 * Math.PI * n) / around.length;
        out[i] = [cx + radius * Math.cos(angle), cy + radius * Math.sin(angle)];
      });
    }
    return out;
  }

  /** A round distance (1, 2 or 5 times a power of ten km) no longer than `maxKm`. */
  function niceKm(maxKm) {
    const power = 10 ** Math.floor(Math.log10(maxKm));
    for (const step of [5, 2, 1]) if (step * power <= maxKm) return step * power;
    return power;
  }

  // -- words ---------------------------------------------------------------------------------

  function describe(neighbour) {
    const { link, observer, item } = neighbour;
    const parts = [];
    const role = link ? link.role : "";
    parts.push(role ? `${nameOf(item)} (${role})` : nameOf(item));
    if (link) {
      const how = link.bidir
        ? "two-way link"
        : link.we_hear > 0
          ? "one-way: this node hears it"
          : "one-way: it hears this node";
      parts.push(
        `${how}; we hear ${fmtInt(link.we_hear)}, they hear ${fmtInt(link.they_hear)}, ` +
          `bottleneck ${fmtInt(link.bottleneck)}`,
      );
    }
    if (observer) {
      const snr = observer.avg_snr == null ? "" : `, average SNR ${fmtSnr(observer.avg_snr)}`;
      parts.push(`direct observer: ${plural(observer.count, "packet")}${snr}`);
    }
    if (item.distance_km != null) parts.push(`${fmtKm(item.distance_km)} away`);
    return parts;
  }

  function describeNode(node, placed) {
    const role = node.role ? ` (${node.role})` : "";
    const where = placed ? "" : "; no position of its own, drawn at the middle of its neighbours";
    return [`${nameOf(node)}${role}`, `the node of this report${where}`];
  }

  // -- drawing -------------------------------------------------------------------------------

  function arrowDefs() {
    const arrow = (id) =>
      svgEl(
        "marker",
        {
          id,
          viewBox: "0 0 10 10",
          refX: "5",
          refY: "5",
          markerWidth: "7",
          markerHeight: "7",
          markerUnits: "userSpaceOnUse",
          orient: "auto",
        },
        svgEl("path", { d: "M0,0 L10,5 L0,10 z", className: "map-arrow" }),
      );
    return svgEl("defs", {}, arrow("reach-map-arrow"));
  }

  function lineWidth(link) {
    if (!link || !link.bidir) return LINE_MIN_PX;
    const share = Math.log10(1 + link.bottleneck) / Math.log10(LINE_FULL_BOTTLENECK);
    return LINE_MIN_PX + LINE_RANGE_PX * Math.min(1, share);
  }

  /**
   * The line between the node (at `nodeXY`) and a neighbour (at `neighbourXY`), with an arrow
   * half-way on a one-way link. The path runs with the packets, from the node that is heard to
   * the node that hears it, and the arrow follows the path: it points at the hearer. A one-way
   * link the node hears (we_hear > 0) runs from the neighbour to the node; every other line
   * from the node to the neighbour.
   */
  function lineTo(neighbour, nodeXY, neighbourXY) {
    const kind = kindOf(neighbour);
    const link = neighbour.link;
    const towardsNode = link && !link.bidir && link.we_hear > 0;
    const [a, b] = towardsNode ? [neighbourXY, nodeXY] : [nodeXY, neighbourXY];
    const mid = [(a[0] + b[0]) / 2, (a[1] + b[1]) / 2];
    const attrs = {
      className: `map-line ${kind}`,
      d: `M${a[0].toFixed(1)},${a[1].toFixed(1)} L${mid[0].toFixed(1)},${mid[1].toFixed(1)} ` +
        `L${b[0].toFixed(1)},${b[1].toFixed(1)}`,
      "stroke-width": lineWidth(link).toFixed(2),
      dataset: { for: neighbour.pubkey },
    };
    if (kind === "one-way") attrs["marker-mid"] = "url(#reach-map-arrow)";
    return svgEl("path", attrs);
  }

  function marker(neighbour, [x, y], days, words) {
    const kind = kindOf(neighbour);
    const shape = neighbour.observer
      ? svgEl("rect", { className: "map-dot", x: x - 6.5, y: y - 6.5, width: 13, height: 13, rx: 2 })
      : svgEl("circle", { className: "map-dot", cx: x, cy: y, r: 6.5 });
    const label = words.join("; ");
    return svgEl(
      "a",
      {
        className: `map-neighbour ${kind}${neighbour.observer ? " observer" : ""}`,
        href: `?node=${neighbour.pubkey}&days=${days}`,
        "aria-label": `${label}. Open its report.`,
        dataset: { pubkey: neighbour.pubkey, name: neighbour.item.name || "", x, y },
      },
      svgEl("title", {}, label),
      svgEl("circle", { className: "map-hit", cx: x, cy: y, r: 15 }),
      svgEl("circle", { className: "map-ring", cx: x, cy: y, r: 11 }),
      shape,
    );
  }

  function nodeMarker(node, [x, y], placed, width, words) {
    // Right of the marker when the name fits there (about 8.5 px a character), else left.
    const right = x + 15 + nameOf(node).length * 8.5 < width || x < width / 2;
    // Named when pointed at, like the others, but not a tab stop: its report is the one on
    // the page, so there is nothing to open. A graphic with a name for assistive technology.
    return svgEl(
      "g",
      {
        className: `map-self${placed ? "" : " unplaced"}`,
        role: "img",
        "aria-label": words.join("; "),
        dataset: { pubkey: node.pubkey, x, y },
      },
      svgEl("title", {}, words.join("; ")),
      svgEl("circle", { className: "map-ring", cx: x, cy: y, r: 15 }),
      svgEl("circle", { className: "map-self-halo", cx: x, cy: y, r: 11 }),
      svgEl("circle", { className: "map-self-dot", cx: x, cy: y, r: 6 }),
      svgEl(
        "text",
        {
          className: "map-label",
          x: right ? x + 15 : x - 15,
          y: y + 4,
          "text-anchor": right ? "start" : "end",
        },
        nameOf(node),
      ),
    );
  }

  function scaleBar(pxPerDegree, height) {
    const kmPerPx = KM_PER_DEGREE / pxPerDegree;
    const km = niceKm(kmPerPx * SCALE_BAR_MAX_PX);
    const length = km / kmPerPx;
    const x = 12;
    const y = height - 14;
    const text = km >= 1 ? `${fmtInt(km)} km` : `${fmtInt(km * 1000)} m`;
    return svgEl(
      "g",
      { className: "map-scale", "aria-hidden": "true" },
      svgEl("path", { d: `M${x},${y - 5} V${y} H${x + length} V${y - 5}` }),
      svgEl("text", { x: x + length + 6, y: y + 1 }, text),
    );
  }

  // -- the figure ----------------------------------------------------------------------------

  // The figure drawn into, the report and window on it, the width it was fitted to, and the
  // node's y on the map (the tooltip keeps to the other side).
  const state = { figure: null, data: null, days: 0, width: 0, selfY: 0, observer: null };

  function parts(figure) {
    const q = (selector) => figure.querySelector(selector);
    return {
      caption: q(".map-caption"),
      note: q(".map-note"),
      empty: q(".map-empty"),
      frame: q(".map-frame"),
      legend: q(".map-legend"),
      help: q(".map-help"),
      tip: q(".map-tip"),
    };
  }

  function emptyText(data, counts) {
    const name = nameOf(data.node);
    if (!counts.links && !counts.observers) {
      return `Nothing to map: ${name} has no links and no direct observers in this window.`;
    }
    const what = [];
    if (counts.links) what.push(plural(counts.links, "link"));
    if (counts.observers) what.push(plural(counts.observers, "direct observer"));
    return `Nothing to map: none of ${name}'s ${what.join(" and ")} has a known position.`;
  }

  function noteText(data, counts) {
    const sentences = [];
    const unplaced = [];
    if (counts.linksUnplaced) unplaced.push(`${counts.linksUnplaced} of ${plural(counts.links, "link")}`);
    if (counts.observersUnplaced) {
      unplaced.push(`${counts.observersUnplaced} of ${plural(counts.observers, "direct observer")}`);
    }
    sentences.push(
      unplaced.length
        ? `Not drawn, no known position: ${unplaced.join(" and ")}.`
        : "Every link and direct observer is drawn.",
    );
    if (!hasPosition(data.node)) {
      sentences.push(
        `${nameOf(data.node)} has no position of its own: it is drawn dashed, at the middle ` +
          "of its neighbours, so its lines show who hears whom but not how far.",
      );
    }
    return sentences.join(" ");
  }

  function draw() {
    const { figure, data, days } = state;
    if (!figure || !data) return;
    const p = parts(figure);
    hideTip();
    const counts = neighboursOf(data);
    const name = nameOf(data.node);
    p.caption.textContent = `Map of ${name}'s links and direct observers, last ${plural(days, "day")}`;
    const nothing = !counts.placed.length;
    for (const part of [p.frame, p.legend, p.help, p.note]) part.hidden = nothing;
    p.empty.hidden = !nothing;
    if (nothing) {
      p.frame.replaceChildren(p.tip); // words instead of an empty box
      p.empty.textContent = emptyText(data, counts);
      return;
    }
    p.note.textContent = noteText(data, counts);

    const width = Math.max(200, Math.floor(p.frame.clientWidth) || 600);
    state.width = width;
    const neighbours = [...counts.placed].sort(byStrength);
    const selfPlaced = hasPosition(data.node);
    const points = neighbours.map((n) => n.item);
    const projected = project(selfPlaced ? [...points, data.node] : points, width);
    let xy = projected.xy;
    let selfXY;
    if (selfPlaced) {
      selfXY = xy[xy.length - 1];
      xy = spread(xy, xy.length - 1);
      selfXY = xy.pop();
    } else {
      const n = xy.length;
      selfXY = [xy.reduce((s, q) => s + q[0], 0) / n, xy.reduce((s, q) => s + q[1], 0) / n];
      xy = spread([...xy, selfXY], n);
      selfXY = xy.pop();
    }
    state.selfY = selfXY[1];
    const { height, pxPerDegree } = projected;

    const svg = svgEl("svg", {
      className: "map",
      viewBox: `0 0 ${width} ${height}`,
      width,
      height,
      role: "group",
      "aria-label": `Map: ${name} and ${plural(neighbours.length, "neighbour")} with a known position`,
    });
    const lines = svgEl("g", { className: "map-lines", "aria-hidden": "true" });
    const markers = svgEl("g", { className: "map-markers" });
    neighbours.forEach((neighbour, i) => {
      lines.append(lineTo(neighbour, selfXY, xy[i]));
      markers.append(marker(neighbour, xy[i], days, describe(neighbour)));
    });
    svg.append(
      arrowDefs(),
      scaleBar(pxPerDegree, height),
      lines,
      markers,
      nodeMarker(data.node, selfXY, selfPlaced, width, describeNode(data.node, selfPlaced)),
    );
    p.frame.replaceChildren(svg, p.tip);
  }

  // -- pointing ------------------------------------------------------------------------------

  let hot = null; // the marker the tooltip names

  function hideTip() {
    if (!state.figure) return;
    const { tip, frame } = parts(state.figure);
    tip.hidden = true;
    for (const line of frame.querySelectorAll(".map-line.hot")) line.classList.remove("hot");
    hot = null;
  }

  function showTip(target) {
    const { tip, frame } = parts(state.figure);
    if (hot === target) return;
    hideTip();
    hot = target;
    const words = target.querySelector("title").textContent.split("; ");
    tip.replaceChildren(
      ...words.map((text, i) => {
        const line = document.createElement(i === 0 ? "strong" : "span");
        line.textContent = text;
        return line;
      }),
    );
    tip.hidden = false;
    const pubkey = target.dataset.pubkey;
    for (const line of frame.querySelectorAll(".map-line")) {
      if (line.dataset.for === pubkey) line.classList.add("hot");
    }
    // Place it above the marker, or below when there is no room; never outside the frame.
    const svg = frame.querySelector("svg");
    const box = svg.getBoundingClientRect();
    const frameBox = frame.getBoundingClientRect();
    const zoom = box.width / state.width || 1;
    const x = box.left - frameBox.left + Number(target.dataset.x) * zoom;
    const y = box.top - frameBox.top + Number(target.dataset.y) * zoom;
    const tipBox = tip.getBoundingClientRect();
    const left = Math.min(Math.max(4, x - tipBox.width / 2), frameBox.width - tipBox.width - 4);
    const above = y - 18 - tipBox.height;
    const below = y + 18;
    // On the far side from the node, so the line being read stays in sight.
    const farIsBelow = Number(target.dataset.y) > state.selfY;
    const roomBelow = below + tipBox.height <= frameBox.height - 4;
    const top = (farIsBelow && roomBelow) || above < 4 ? below : above;
    tip.style.left = `${Math.max(4, left)}px`;
    tip.style.top = `${top}px`;
  }

  function pointed(event) {
    return event.target instanceof Element ? event.target.closest("svg [data-pubkey]") : null;
  }

  function wire(figure) {
    const frame = figure.querySelector(".map-frame");
    frame.addEventListener("pointerover", (event) => {
      const target = pointed(event);
      if (target) showTip(target);
    });
    frame.addEventListener("pointerout", (event) => {
      const to = event.relatedTarget instanceof Element ? event.relatedTarget : null;
      if (hot && !(to && hot.contains(to)) && hot !== document.activeElement) hideTip();
    });
    frame.addEventListener("focusin", (event) => {
      const target = pointed(event);
      if (target) showTip(target);
    });
    frame.addEventListener("focusout", () => hideTip());
    frame.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        hideTip();
        return;
      }
      // Enter opens an SVG link by itself; Space does for buttons, so do it here too.
      if (event.key !== " ") return;
      const target = pointed(event);
      if (!target || target.tagName.toLowerCase() !== "a") return;
      event.preventDefault();
      target.dispatchEvent(new MouseEvent("click", { bubbles: true, cancelable: true, button: 0 }));
    });
    state.observer = new ResizeObserver(() => {
      const width = Math.floor(frame.clientWidth);
      if (state.data && width && Math.abs(width - state.width) >= 1) draw();
    });
    state.observer.observe(frame);
  }

  /** Draw report `data` (asked for with window `days`) into `figure`. */
  function render(figure, data, days) {
    if (state.figure !== figure) {
      state.figure = figure;
      wire(figure);
    }
    state.data = data;
    state.days = days;
    draw();
  }

  window.reachMap = Object.freeze({ render });
})();
