// The console's only script: chat with streamed replies, its earlier messages and the ones sent on
// their own (server-sent events), a picture with a message, approval and resend buttons.
// Text from the server is always set with textContent, never parsed as HTML.
"use strict";

(() => {
  const words = JSON.parse(document.body.dataset.words || "{}"); // the page's language (words.py)

  const post = (url, body) =>
    fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });

  const element = (tag, className, text) => {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  };

  // -- chat -----------------------------------------------------------------------------------

  const log = document.getElementById("log");
  const form = document.getElementById("chat");

  const conversationId = (fresh) => {
    let id = fresh ? null : sessionStorage.getItem("hermes-console-conversation");
    if (!id) {
      id = "c-" + Math.random().toString(36).slice(2, 10);
      sessionStorage.setItem("hermes-console-conversation", id);
    }
    document.getElementById("conversation").textContent = id;
    return id;
  };

  const bubble = (who, text, proactive) => {
    const box = element("div", "msg " + who);
    box.append(element("div", "text", text || ""), element("div", "meta"));
    if (proactive) {
      box.classList.add("proactive");
      box.querySelector(".meta").textContent = words.proactive;
    }
    log.append(box);
    box.scrollIntoView({ block: "end" });
    return box;
  };

  const showApproval = (box, approval) => {
    const panel = element("div", "approval");
    panel.append(element("div", "", words.approval_needed + " " + approval.tool + " " + approval.arguments));
    for (const decision of ["approve", "reject"]) {
      const button = element("button", decision, words[decision]);
      button.type = "button";
      button.addEventListener("click", () => {
        panel.querySelectorAll("button").forEach((b) => (b.disabled = true));
        const url = "/console/api/approvals/" + encodeURIComponent(approval.id);
        stream(url, { decision, stream: true }, bubble("agent streaming"));
      });
      panel.append(button);
    }
    box.append(panel);
  };

  const handle = (box, event) => {
    const text = box.querySelector(".text");
    const meta = box.querySelector(".meta");
    if (event.type === "accepted") {
      box.dataset.task = event.task_id;
      if (event.status) meta.append(element("span", "decided", event.status + " · "));
      const link = element("a", "trace", "trace");
      link.href = event.trace;
      meta.append(link);
    } else if (event.type === "text") {
      text.textContent = event.text;
    } else if (event.type === "reply") {
      text.textContent = event.text;
      box.classList.remove("streaming");
      if (event.approval) showApproval(box, event.approval);
    } else if (event.type === "timeout") {
      box.classList.remove("streaming");
      meta.prepend(element("span", "error", event.text + " "));
    }
    box.scrollIntoView({ block: "end" });
  };

  const stream = async (url, body, box) => {
    try {
      const response = await post(url, body);
      const type = response.headers.get("Content-Type") || "";
      if (!type.startsWith("application/x-ndjson")) {
        const answer = await response.json();
        box.classList.remove("streaming");
        box.querySelector(".text").textContent = answer.error ? words.error + ": " + answer.error : answer.status;
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, { stream: true });
        const lines = buffered.split("\n");
        buffered = lines.pop();
        for (const line of lines) if (line.trim()) handle(box, JSON.parse(line));
      }
    } catch (error) {
      box.classList.remove("streaming");
      box.querySelector(".text").textContent = words.error + ": " + error;
    }
  };

  // The conversation's earlier messages (from the server's session store), then every reply sent
  // on its own (a scheduled job's, a post) as it is sent, for as long as the page is open.
  let feed = null;
  const follow = (conversation) => {
    if (feed) feed.close();
    const query = "?conversation=" + encodeURIComponent(conversation);
    delete log.dataset.loaded;
    const mine = (feed = new EventSource("/console/api/events" + query));
    feed.onmessage = (event) => {
      const reply = JSON.parse(event.data);
      const box = bubble("agent", reply.text, true);
      if (reply.approval) showApproval(box, reply.approval);
    };
    fetch("/console/api/history" + query, { credentials: "same-origin" })
      .then((response) => response.json())
      .then((answer) => {
        if (feed !== mine) return; // another conversation was started meanwhile
        const earlier = (answer.messages || []).map((m) => bubble(m.role, m.text, m.proactive));
        log.prepend(...earlier); // before anything the feed brought meanwhile
        log.scrollTop = log.scrollHeight;
        log.dataset.loaded = "true"; // the history is in (tests wait for it)
      });
  };

  const readPicture = (file) =>
    new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });

  if (form) {
    let conversation = conversationId(false);
    const input = document.getElementById("message");
    const send = document.getElementById("send");
    const picture = document.getElementById("picture");
    const pictureError = document.getElementById("picture-error");
    follow(conversation);
    picture.addEventListener("change", () => {
      const file = picture.files[0];
      const tooLarge = file && file.size > Number(form.dataset.maxImage);
      pictureError.textContent = tooLarge ? words.too_large.replace("{limit}", form.dataset.maxImageText) : "";
      if (tooLarge) picture.value = "";
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const message = input.value.trim();
      const file = picture.files[0];
      if (!message && !file) return;
      const body = { message, conversation };
      if (file) body.image = await readPicture(file);
      input.value = "";
      picture.value = "";
      send.disabled = true;
      bubble("user", file ? (message + "\n[" + file.name + "]").trim() : message);
      await stream("/console/api/chat", body, bubble("agent streaming"));
      send.disabled = false;
      input.focus();
    });
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    document.getElementById("new-conversation").addEventListener("click", () => {
      conversation = conversationId(true);
      log.replaceChildren();
      follow(conversation);
    });
  }

  // -- approvals page -------------------------------------------------------------------------

  document.querySelectorAll("button.decide").forEach((button) => {
    button.addEventListener("click", async () => {
      const row = button.closest("tr");
      row.querySelectorAll("button").forEach((b) => (b.disabled = true));
      const url = "/console/api/approvals/" + encodeURIComponent(button.dataset.approval);
      const response = await post(url, { decision: button.dataset.decision });
      const answer = await response.json();
      if (response.ok) {
        window.location.reload();
      } else {
        row.lastElementChild.textContent = words.error + ": " + answer.error;
      }
    });
  });

  // -- dead letters page ----------------------------------------------------------------------

  document.querySelectorAll("button.resend").forEach((button) => {
    button.addEventListener("click", async () => {
      button.disabled = true;
      const url = "/console/api/deadletters/" + encodeURIComponent(button.dataset.deadletter) + "/resend";
      const response = await post(url, {});
      const answer = await response.json();
      button.parentElement.textContent = response.ok ? words.resent : words.error + ": " + answer.error;
    });
  });

  // -- schedule page --------------------------------------------------------------------------

  document.querySelectorAll("button.cancel-job").forEach((button) => {
    button.addEventListener("click", async () => {
      button.disabled = true;
      const url = "/console/api/schedule/" + encodeURIComponent(button.dataset.job) + "/cancel";
      const response = await post(url, {});
      const answer = await response.json();
      button.parentElement.textContent = response.ok ? words.cancelled : words.error + ": " + answer.error;
    });
  });
})();
