// What the page's two scripts share, reach-map.js and reach.js: how numbers, distances and names
// are written, how elements are made, and what a pubkey looks like. Loaded before both (no
// bundler: index.html lists the three files in order), as window.reachCommon.
"use strict";

(() => {
  const numberFormat = new Intl.NumberFormat("en");
  const fmtInt = (n) => numberFormat.format(n);
  const fmtKm = (km) => (km == null ? "—" : `${km.toFixed(1)} km`);
  const fmtSnr = (snr) => (snr == null ? "—" : `${snr.toFixed(1)} dB`);
  const shortKey = (pubkey) => (pubkey ? `${pubkey.slice(0, 8)}…` : "");
  const label = (item) => item.name || shortKey(item.pubkey) || "(unnamed)";
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  // The server's rule: a node's pubkey is 64 hex chars, lower case in its answers.
  const PUBKEY = /^[0-9a-f]{64}$/;
  const isPubkey = (text) => PUBKEY.test(text || "");

  /**
   * A maker of elements in one XML namespace: make(tag, props, ...children). `className` sets
   * the class, `dataset` the data-* attributes, any other prop the attribute of that name;
   * children are nodes or text.
   */
  function elementsOf(namespace) {
    return (tag, props = {}, ...children) => {
      const node = document.createElementNS(namespace, tag);
      for (const [key, value] of Object.entries(props)) {
        if (key === "className") node.setAttribute("class", value);
        else if (key === "dataset") Object.assign(node.dataset, value);
        else node.setAttribute(key, String(value));
      }
      for (const child of children) {
        node.append(child instanceof Node ? child : document.createTextNode(String(child)));
      }
      return node;
    };
  }
  const el = elementsOf("http://www.w3.org/1999/xhtml");
  const svgEl = elementsOf("http://www.w3.org/2000/svg");

  window.reachCommon = Object.freeze({
    fmtInt, fmtKm, fmtSnr, shortKey, label, plural, isPubkey, el, svgEl,
  });
})();
