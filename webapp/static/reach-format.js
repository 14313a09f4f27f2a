// How the page writes numbers, distances and names; shared by reach-map.js and reach.js
// (loaded before both, as window.reachFormat).
"use strict";

(() => {
  const numberFormat = new Intl.NumberFormat("en");
  const fmtInt = (n) => numberFormat.format(n);
  const fmtKm = (km) => (km == null ? "—" : `${km.toFixed(1)} km`);
  const fmtSnr = (snr) => (snr == null ? "—" : `${snr.toFixed(1)} dB`);
  const shortKey = (pubkey) => (pubkey ? `${pubkey.slice(0, 8)}…` : "");
  const label = (item) => item.name || shortKey(item.pubkey) || "(unnamed)";
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  window.reachFormat = Object.freeze({ fmtInt, fmtKm, fmtSnr, shortKey, label, plural });
})();
