// Bucket page: "Copy as issue" puts the bucket's Markdown issue report
// (GET /api/buckets/{id}/issue.md, built from stored data) on the clipboard.
(function () {
  const button = document.getElementById("copy-issue");
  if (!button) return;
  const status = document.getElementById("copy-issue-status");
  button.addEventListener("click", async function () {
    try {
      const response = await fetch(button.dataset.src, { credentials: "same-origin" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const text = await response.text();
      await navigator.clipboard.writeText(text);
      status.textContent = "copied (" + text.length + " characters): paste it into the library's issue tracker";
    } catch (err) {
      status.textContent = "could not copy (" + err.message + "): open the Markdown link instead";
    }
  });
})();
