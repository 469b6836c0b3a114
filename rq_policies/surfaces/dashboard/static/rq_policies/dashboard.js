// rq-policies dashboard: reload the state fragment every few seconds (no framework, nothing fetched from elsewhere).
// The server renders the fragment with every value from Redis escaped; this only swaps it in.
(function () {
  'use strict';
  var box = document.getElementById('state');
  if (!box) { return; }
  var every = parseFloat(box.getAttribute('data-refresh')) * 1000;
  var live = document.getElementById('live');
  var stamp = document.getElementById('updated');
  var busy = false;

  function say(text, failed) {
    if (!stamp) { return; }
    stamp.textContent = text;
    stamp.className = failed ? 'failed' : 'muted';
  }

  function tick() {
    if (busy || (live && !live.checked) || document.hidden) { return; }
    busy = true;
    fetch(box.getAttribute('data-src'), {credentials: 'same-origin', headers: {'Accept': 'text/html'}})
      .then(function (response) {
        if (!response.ok) { throw new Error('HTTP ' + response.status); }
        return response.text();
      })
      .then(function (html) {
        box.innerHTML = html;
        box.classList.remove('stale');
        say('updated ' + new Date().toLocaleTimeString(), false);
      })
      .catch(function (error) {
        box.classList.add('stale');
        say('refresh failed (' + error.message + '): the figures below are old', true);
      })
      .then(function () { busy = false; });
  }

  if (every > 0) { window.setInterval(tick, every); }
}());
