
(function () {
  function key(row, i, numeric) {
    var c = row.cells[i];
    var v = c.hasAttribute('data-v') ? c.getAttribute('data-v') : c.textContent;
    return numeric ? (v === '' ? NaN : parseFloat(v)) : v;
  }
  function sortBy(table, i, th) {
    var numeric = th.hasAttribute('data-num');
    var asc = th.getAttribute('aria-sort') !== 'ascending';
    var heads = table.tHead.rows[0].cells;
    for (var j = 0; j < heads.length; j++) heads[j].removeAttribute('aria-sort');
    th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
    var body = table.tBodies[0];
    var rows = Array.prototype.map.call(body.rows, function (r, n) { return { r: r, k: key(r, i, numeric), n: n }; });
    rows.sort(function (a, b) {
      var d;
      if (numeric) {
        var an = isNaN(a.k), bn = isNaN(b.k);
        if (an || bn) return an === bn ? a.n - b.n : (an ? 1 : -1);
        d = a.k - b.k;
      } else {
        d = a.k.localeCompare(b.k, undefined, { numeric: true });
      }
      return d !== 0 ? (asc ? d : -d) : a.n - b.n;
    });
    var frag = document.createDocumentFragment();
    rows.forEach(function (x) { frag.appendChild(x.r); });
    body.appendChild(frag);
  }
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable'), function (t) {
    Array.prototype.forEach.call(t.tHead.rows[0].cells, function (th, i) {
      th.tabIndex = 0;
      th.addEventListener('click', function () { sortBy(t, i, th); });
      th.addEventListener('keydown', function (e) {
        if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); sortBy(t, i, th); }
      });
    });
  });
})();
