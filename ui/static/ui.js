// The status page's only script (no inline script: the page's
// Content-Security-Policy allows scripts from this origin's files only).
// A form with data-confirm asks before it is sent.
document.addEventListener('submit', function (e) {
  var msg = e.target.getAttribute('data-confirm');
  if (msg && !window.confirm(msg)) {
    e.preventDefault();
  }
});
