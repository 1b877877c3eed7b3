// tests/test_site_browser.py: every text of every inline figure (svg.hd-diagram) against what is
// painted under the centre of its box: the page's background, then each rect or circle drawn before
// it that holds that point, composited with its fill opacity; a halo (paint-order: stroke, two units
// or more) is what the glyphs sit on. Returns the texts below 4.5:1 as strings.
function parse(c) {
  const m = c && c.match(/rgba?\(([^)]+)\)/);
  if (!m) return null;
  const p = m[1].split(',').map(Number);
  return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
}
function lum(c) {
  const f = v => { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
}
function over(top, a, under) { return [0, 1, 2].map(i => top[i] * a + under[i] * (1 - a)); }
function ratio(a, b) { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); }
const out = [];
const page = parse(getComputedStyle(document.body).backgroundColor) || [255, 255, 255, 1];
for (const svg of document.querySelectorAll('.md-content figure.hd-figure svg.hd-diagram')) {
  if (svg.closest('[hidden]') || !svg.getClientRects().length) continue;
  const order = new Map([...svg.querySelectorAll('*')].map((e, i) => [e, i]));
  const shapes = [...svg.querySelectorAll('rect, circle, ellipse')].filter(s => !s.closest('pattern, marker'));
  for (const t of svg.querySelectorAll('text')) {
    if (!t.textContent.trim()) continue;
    const b = t.getBBox(), cx = b.x + b.width / 2, cy = b.y + b.height / 2, ti = order.get(t);
    let bg = page.slice(0, 3);
    for (const s of shapes) {
      if (order.get(s) > ti) break;
      const moved = s.closest('[transform]');
      if (moved && moved !== s && !moved.contains(t)) continue;
      const sb = s.getBBox();
      if (cx < sb.x || cx > sb.x + sb.width || cy < sb.y || cy > sb.y + sb.height) continue;
      const st = getComputedStyle(s), f = parse(st.fill);
      if (!f) continue;  // none, or a pattern (a hatched wait: its text is haloed)
      bg = over(f, f[3] * parseFloat(st.fillOpacity) * parseFloat(st.opacity), bg);
    }
    const st = getComputedStyle(t), ink = parse(st.fill);
    if (!ink) continue;
    const halo = st.stroke !== 'none' && st.paintOrder.startsWith('stroke') && parseFloat(st.strokeWidth) >= 2 &&
      parse(st.stroke);
    if (halo) bg = over(halo, halo[3] * parseFloat(st.strokeOpacity), bg);
    const r = ratio(over(ink, ink[3] * parseFloat(st.fillOpacity), bg), bg);
    if (r < 4.5) out.push(`${svg.id}: "${t.textContent.slice(0, 40)}" ${r.toFixed(2)}:1 (${st.fill} on rgb(${bg.map(Math.round)}))`);
  }
}
return out;
