// Draws every chart of the page: each <script type="application/json" data-chart="ID"> holds a plotly
// figure for the element ID-plot.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll('script[type="application/json"][data-chart]').forEach(function (el) {
    var fig = JSON.parse(el.textContent);
    var target = document.getElementById(el.dataset.chart + "-plot");
    Plotly.newPlot(target, fig.data, fig.layout, {responsive: true, displaylogo: false});
  });
  var refresh = document.body.dataset.refresh;
  if (refresh) {
    setTimeout(function () { window.location.reload(); }, 1000 * Number(refresh));
  }
  var upload = document.getElementById("sim-upload");
  if (upload) {
    upload.addEventListener("change", function () {
      var file = upload.files[0];
      if (!file) { return; }
      file.text().then(function (text) {
        return fetch("/api/simulations/render", {method: "POST", headers: {"Content-Type": "application/json"}, body: text});
      }).then(function (r) { return r.json(); }).then(function (d) {
        var out = document.getElementById("sim-result");
        out.textContent = "";
        if (d.detail) { out.textContent = d.detail; return; }
        var table = document.createElement("table");
        var head = table.insertRow();
        ["policy"].concat(d.metrics.map(function (m) { return m.label; })).forEach(function (h) {
          var th = document.createElement("th"); th.textContent = h; head.appendChild(th);
        });
        d.rows.forEach(function (row) {
          var tr = table.insertRow();
          tr.insertCell().textContent = row.policy;
          d.metrics.forEach(function (m) {
            var v = row.values[m.key];
            tr.insertCell().textContent = v === null || v === undefined ? "–" : Number(v).toPrecision(4);
          });
        });
        out.appendChild(table);
        Object.keys(d.charts).forEach(function (id) {
          var sec = document.createElement("section"); sec.className = "chart"; sec.id = id;
          var div = document.createElement("div"); div.id = id + "-plot"; sec.appendChild(div);
          out.appendChild(sec);
          var fig = JSON.parse(d.charts[id]);
          Plotly.newPlot(div, fig.data, fig.layout, {responsive: true, displaylogo: false});
        });
      });
    });
  }
});
