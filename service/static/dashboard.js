/* attnfuzz dashboard charts (uPlot). Data comes from <script type="application/json"> blocks. */
(function () {
  "use strict";
  function readJSON(id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }
  function hourlyChart() {
    var data = readJSON("hourly-data");
    var target = document.getElementById("hourly-chart");
    if (!data || !target || typeof uPlot === "undefined") { return; }
    var width = Math.max(target.clientWidth, 320);
    var opts = {
      width: width,
      height: 240,
      scales: { x: { time: true } },
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
      series: [
        {},
        { label: "cases", stroke: "#0969da", fill: "rgba(9,105,218,0.12)", width: 2 },
        { label: "results", stroke: "#8250df", width: 1, dash: [4, 4] }
      ],
      axes: [{}, { label: "per hour" }]
    };
    target.textContent = "";
    var plot = new uPlot(opts, [data.hours, data.cases, data.results], target);
    window.addEventListener("resize", function () {
      plot.setSize({ width: Math.max(target.clientWidth, 320), height: 240 });
    });
    target.dataset.rendered = "true";
  }
  document.addEventListener("DOMContentLoaded", hourlyChart);
})();
