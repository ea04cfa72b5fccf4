// graphrun console: passkeys (WebAuthn), signed answers, and live run pages.
// Served from the package; no framework, no build step, no third-party code.
"use strict";

(function () {
  const body = document.body;
  const base = body.dataset.base || "";
  const csrf = body.dataset.csrf || "";

  function toB64url(buffer) {
    const bytes = new Uint8Array(buffer);
    let text = "";
    for (const b of bytes) text += String.fromCharCode(b);
    return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function fromB64url(text) {
    const padded = text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4);
    const raw = atob(padded);
    const out = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out.buffer;
  }

  async function post(path, data) {
    const response = await fetch(base + path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(data),
    });
    let payload = {};
    try { payload = await response.json(); } catch (e) { payload = {}; }
    if (!response.ok) {
      const message = payload.error || ("HTTP " + response.status);
      throw new Error(payload.hint ? message + " (" + payload.hint + ")" : message);
    }
    return payload;
  }

  function say(element, text, bad) {
    if (!element) return;
    element.textContent = text;  // text, never HTML
    element.classList.toggle("error", Boolean(bad));
  }

  // -- registration (an invitation link) -------------------------------------------
  const register = document.getElementById("register");
  if (register) {
    register.addEventListener("click", async function () {
      const result = document.getElementById("register-result");
      const token = register.dataset.token;
      try {
        const options = await post("/auth/register/options", { token: token });
        options.challenge = fromB64url(options.challenge);
        options.user.id = fromB64url(options.user.id);
        options.excludeCredentials = (options.excludeCredentials || []).map(function (c) {
          return { type: c.type, id: fromB64url(c.id) };
        });
        const credential = await navigator.credentials.create({ publicKey: options });
        const done = await post("/auth/register/verify", {
          token: token,
          credential: {
            id: credential.id,
            rawId: toB64url(credential.rawId),
            type: credential.type,
            response: {
              clientDataJSON: toB64url(credential.response.clientDataJSON),
              attestationObject: toB64url(credential.response.attestationObject),
              transports: credential.response.getTransports ? credential.response.getTransports() : [],
            },
            clientExtensionResults: {},
          },
        });
        say(result, "Registered as " + done.account + ".");
        window.location.assign(done.next);
      } catch (error) {
        say(result, "Registration failed: " + error.message, true);
      }
    });
  }

  // -- sign-in --------------------------------------------------------------------------
  function assertionJson(credential) {
    return {
      id: credential.id,
      rawId: toB64url(credential.rawId),
      type: credential.type,
      response: {
        clientDataJSON: toB64url(credential.response.clientDataJSON),
        authenticatorData: toB64url(credential.response.authenticatorData),
        signature: toB64url(credential.response.signature),
        userHandle: credential.response.userHandle ? toB64url(credential.response.userHandle) : null,
      },
      clientExtensionResults: {},
    };
  }

  const signin = document.getElementById("signin");
  if (signin) {
    signin.addEventListener("click", async function () {
      const result = document.getElementById("signin-result");
      try {
        const started = await post("/auth/signin/options", {});
        const options = started.options;
        options.challenge = fromB64url(options.challenge);
        options.allowCredentials = (options.allowCredentials || []).map(function (c) {
          return { type: c.type, id: fromB64url(c.id) };
        });
        const credential = await navigator.credentials.get({ publicKey: options });
        const done = await post("/auth/signin/verify", {
          key: started.key,
          credential: assertionJson(credential),
        });
        say(result, "Signed in as " + done.account + ".");
        window.location.assign(done.next);
      } catch (error) {
        say(result, "Sign-in failed: " + error.message, true);
      }
    });
  }

  // -- answers: the passkey signs the decision statement ----------------------------------
  let answering = false;
  document.querySelectorAll("form.answer").forEach(function (form) {
    form.addEventListener("submit", function (event) { event.preventDefault(); });
    form.querySelectorAll("button.choice").forEach(function (button) {
      button.addEventListener("click", async function () {
        const result = form.querySelector(".result");
        let answer = button.dataset.answer;
        let other = false;
        if (button.dataset.other) {
          answer = form.querySelector("input[name=other]").value;
          other = true;
        } else if (button.dataset.input) {
          answer = form.querySelector("input[name=text]").value;
        }
        const run = form.dataset.run;
        answering = true;
        form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
        try {
          const prepared = await post("/api/runs/" + encodeURIComponent(run) + "/statement", {
            node: form.dataset.node,
            visit: Number(form.dataset.visit),
            answer: answer,
            other: other,
          });
          say(result, "Sign with your passkey: " + prepared.statement);
          const credential = await navigator.credentials.get({
            publicKey: {
              challenge: fromB64url(prepared.challenge),
              allowCredentials: prepared.allow.map(function (id) {
                return { type: "public-key", id: fromB64url(id) };
              }),
              userVerification: "preferred",
              timeout: 120000,
            },
          });
          const done = await post("/api/runs/" + encodeURIComponent(run) + "/answer", {
            pending: prepared.pending,
            credential: assertionJson(credential),
          });
          say(result, "Recorded: " + done.answer + " by " + done.by + " (" + done.identity +
            "); the run is " + done.run + ".");
          form.classList.add("answered");
        } catch (error) {
          say(result, "Not recorded: " + error.message, true);
          form.querySelectorAll("button").forEach(function (b) { b.disabled = false; });
        } finally {
          answering = false;
        }
      });
    });
  });

  // -- a run page follows its run -----------------------------------------------------------
  const run = document.getElementById("run");
  if (run && window.EventSource) {
    const id = run.dataset.run;
    let seq = run.dataset.seq;
    const source = new EventSource(base + "/runs/" + encodeURIComponent(id) + "/live");
    source.addEventListener("run", function (event) {
      const data = JSON.parse(event.data);
      const status = document.getElementById("run-status");
      status.textContent = data.status;
      status.className = "st-" + data.status;
      document.getElementById("run-node").textContent = data.waiting_node || data.current_node || "";
      document.getElementById("run-seq").textContent = String(data.last_seq);
      if (String(data.last_seq) !== String(seq)) {
        seq = data.last_seq;
        const report = document.getElementById("run-report");
        report.src = base + "/runs/" + encodeURIComponent(id) + "/report?seq=" + seq;
        const graph = document.getElementById("run-graph");
        graph.src = base + "/runs/" + encodeURIComponent(id) + "/graph.svg?seq=" + seq;
        const wait = document.getElementById("wait");
        if (wait && data.status !== "waiting") wait.classList.add("over");
      }
      if (["completed", "failed", "cancelled"].indexOf(data.status) >= 0) source.close();
    });
  }

  // -- the inbox shows new questions as they come --------------------------------------------
  const inbox = document.getElementById("inbox");
  if (inbox) {
    const shown = new Set(Array.from(inbox.querySelectorAll("article.wait")).map(function (a) {
      return a.id.slice("wait-".length);
    }));
    setInterval(async function () {
      if (answering) return;
      try {
        const response = await fetch(base + "/api/waits", { credentials: "same-origin" });
        if (!response.ok) return;
        const data = await response.json();
        const now = data.waits.map(function (w) { return w.run_id; });
        if (now.some(function (runId) { return !shown.has(runId); })) window.location.reload();
      } catch (e) { /* the next look tries again */ }
    }, 2000);
  }
})();
