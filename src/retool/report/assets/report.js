(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("viewer-data").textContent);
  var stepSel = document.getElementById("step-select");
  var questionSel = document.getElementById("question-select");
  var output = document.getElementById("viewer-output");
  var notes = document.getElementById("viewer-notes");

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function num(x, signed) {
    if (typeof x !== "number" || !isFinite(x)) { return "-"; }
    var s = (Math.round(x * 1000) / 1000).toString();
    return signed && x > 0 ? "+" + s : s;
  }
  function yesno(x) { return x === true ? "\u2713" : x === false ? "\u2717" : "-"; }
  function badge(parent, text, cls) {
    parent.appendChild(el("span", "badge " + (cls || ""), text));
  }
  function findStep(n) {
    for (var i = 0; i < DATA.steps.length; i++) {
      if (DATA.steps[i].step === n) { return DATA.steps[i]; }
    }
    return null;
  }
  function findQuestion(step, slot) {
    for (var i = 0; i < step.questions.length; i++) {
      if (step.questions[i].slot === slot) { return step.questions[i]; }
    }
    return null;
  }
  function meanReward(q) {
    var sum = 0, n = 0;
    q.members.forEach(function (m) { if (typeof m.reward === "number") { sum += m.reward; n++; } });
    return n ? sum / n : null;
  }

  function renderTurn(turn, member, index) {
    var cls = "turn turn-" + turn.kind;
    if (turn.kind === "assistant") { cls += member.trains ? " loss" : " noloss"; }
    if (turn.kind === "observation" && turn.sandbox && turn.sandbox.ok === false) {
      cls += " failed";
    }
    var box = el("div", cls);
    box.setAttribute("data-kind", turn.kind);
    var label = turn.kind === "system" ? "system prompt" : turn.kind;
    if (turn.kind === "assistant") {
      label = "assistant turn " + index.assistant;
      if (turn.parse) { label += " \u00b7 " + turn.parse; }
      if (turn.parseError) { label += " (" + turn.parseError + ")"; }
    } else if (turn.kind === "observation") {
      label = "observation " + index.observation + " (" + turn.role + " message)";
      var sb = turn.sandbox;
      if (sb) {
        label += sb.ok ? " \u00b7 ok" : " \u00b7 " + (sb.error_kind || "failed");
        if (typeof sb.latency_s === "number") { label += " \u00b7 " + num(sb.latency_s) + " s"; }
        if (sb.truncated) { label += " \u00b7 truncated"; }
        if (sb.shared) { label += " \u00b7 shared result"; }
      }
    }
    box.appendChild(el("div", "label", label));
    if (turn.kind === "system") {
      var fold = el("details");
      fold.appendChild(el("summary", "muted", "show (" + turn.text.length + " characters)"));
      fold.appendChild(el("pre", "text", turn.text));
      box.appendChild(fold);
    } else {
      if (turn.text) { box.appendChild(el("pre", "text", turn.text)); }
      if (turn.code) { box.appendChild(el("pre", "code", turn.code)); }
    }
    return box;
  }

  function addPieces(container, cls, pieces, from, to) {
    for (var i = from; i < to; i++) {
      container.appendChild(el("span", cls + (i % 2 ? " alt" : ""), DATA.pieces[pieces[i]]));
    }
  }

  function renderTokens(member) {
    var wrap = el("details", "tokens");
    wrap.open = true;
    var stream = el("div", "tokstream");
    var total = 0, lossTokens = 0;
    member.segs.forEach(function (seg, index) {
      var role = seg[0], loss = seg[1], pieces = DATA.segments[seg[2]] || [];
      var cls = "tok " + (role === "assistant" ? (loss ? "loss" : "noloss") : "ctx");
      var from = 0;
      if (index === 0 && role === "context" && pieces.length > 48) {
        from = pieces.length - 16;  // the long first prompt starts folded
        var folded = el("span");
        var button = el("button", "unfold", "\u2026 show the " + from + " earlier prompt tokens");
        button.type = "button";
        button.addEventListener("click", function () {
          addPieces(folded, cls, pieces, 0, from);
          button.remove();
        });
        stream.appendChild(button);
        stream.appendChild(folded);
      }
      addPieces(stream, cls, pieces, from, pieces.length);
      total += pieces.length;
      if (loss) { lossTokens += pieces.length; }
    });
    wrap.appendChild(el("summary", "muted", "token view: " + total + " tokens, " + lossTokens +
      " carry loss (decoded one by one with the run's tokenizer; shading alternates per token)"));
    wrap.appendChild(stream);
    return wrap;
  }

  function renderMember(member, open) {
    var card = el("details", "member");
    card.id = "member-" + member.g;
    card.setAttribute("data-member", String(member.g));
    card.open = open;
    var head = el("summary", null, member.sft ? "conversation" : "member " + member.g);
    if (!member.sft) {
      var tone = member.reward > 0 ? "good" : member.reward < 0 ? "bad" : "";
      badge(head, "reward " + num(member.reward, true), tone);
      badge(head, "advantage " + num(member.advantage, true));
      badge(head, "stop: " + member.stop);
      badge(head, "correct " + yesno(member.correct), member.correct ? "good" : "");
      badge(head, "format " + yesno(member.format));
      badge(head, member.turnsCount + " turns, " + member.codeCalls + " code calls");
      if (member.tokens && typeof member.tokens.total === "number") {
        badge(head, member.tokens.total + " tokens");
      }
      if (member.answer !== null && member.answer !== undefined) {
        badge(head, "answer: " + member.answer);
      }
    }
    badge(head, member.trains ? "trains" : "no loss", member.trains ? "good" : "");
    card.appendChild(head);
    if (member.error) { card.appendChild(el("p", "warn", "error: " + member.error)); }
    var turns = el("div", "turns");
    var index = { assistant: 0, observation: 0 };
    member.turns.forEach(function (turn) {
      if (turn.kind === "assistant") { index.assistant++; }
      if (turn.kind === "observation") { index.observation++; }
      turns.appendChild(renderTurn(turn, member, index));
    });
    card.appendChild(turns);
    if (member.segs) { card.appendChild(renderTokens(member)); }
    return card;
  }

  function render(step, question, memberIndex) {
    output.textContent = "";
    var box = el("div", "question");
    var dot = " \u00b7 ";
    var title = "step " + step.step + dot + "question " + question.slot + dot + question.id;
    box.appendChild(el("h3", null, title));
    if (question.context && question.context.length) {  // the turns every member shares
      question.context.forEach(function (turn) { box.appendChild(renderTurn(turn, null, null)); });
    } else {
      box.appendChild(el("pre", "text", question.question));
    }
    if (question.reference !== null && question.reference !== undefined) {
      box.appendChild(el("div", "muted", "reference answer: " + question.reference));
    }
    output.appendChild(box);
    if (!question.members[0].sft && question.members.length > 1) {
      var table = el("table", "grid members");
      var head = el("tr");
      ["member", "reward", "advantage", "stop", "correct", "format", "turns", "code calls",
       "tokens", "loss"].forEach(function (h) { head.appendChild(el("th", null, h)); });
      table.appendChild(head);
      question.members.forEach(function (m) {
        var row = el("tr");
        [m.g, num(m.reward, true), num(m.advantage, true), m.stop, yesno(m.correct),
         yesno(m.format), m.turnsCount, m.codeCalls, m.tokens ? m.tokens.total : "-",
         m.trains ? "yes" : "no"].forEach(function (v) {
          row.appendChild(el("td", null, v === undefined || v === null ? "-" : v));
        });
        row.addEventListener("click", function () { select(step.step, question.slot, m.g, true); });
        table.appendChild(row);
      });
      output.appendChild(table);
    }
    question.members.forEach(function (m, i) {
      var open = memberIndex === null ? i < 4 : m.g === memberIndex;
      output.appendChild(renderMember(m, open));
    });
    document.body.setAttribute("data-viewer", "step-" + step.step + "-question-" + question.slot);
  }

  function fillQuestions(step) {
    questionSel.textContent = "";
    step.questions.forEach(function (q) {
      var label = "q" + q.slot + " \u00b7 " + q.id;
      var mean = meanReward(q);
      if (mean !== null) { label += " \u00b7 mean reward " + num(mean, true); }
      var option = el("option", null, label);
      option.value = String(q.slot);
      questionSel.appendChild(option);
    });
  }

  function select(stepNo, slot, member, scroll) {
    var step = findStep(stepNo) || DATA.steps[DATA.steps.length - 1];
    stepSel.value = String(step.step);
    fillQuestions(step);
    var question = findQuestion(step, slot) || step.questions[0];
    if (!question) { output.textContent = "This step has no trajectories."; return; }
    questionSel.value = String(question.slot);
    render(step, question, member);
    var hash = "#step=" + step.step + "&question=" + question.slot;
    if (member !== null) { hash += "&member=" + member; }
    try {
      if (location.hash !== hash) { history.replaceState(null, "", hash); }
    } catch (e) { /* some browsers refuse it for file: URLs; the fragment is a convenience */ }
    if (scroll) {
      var target = document.getElementById(member === null ? "viewer" : "member-" + member);
      if (target) { target.scrollIntoView(); }
    }
  }

  function fromHash(scroll) {
    var params = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (pair) {
      var kv = pair.split("=");
      if (kv.length === 2) {
        params[decodeURIComponent(kv[0])] = parseInt(decodeURIComponent(kv[1]), 10);
      }
    });
    var hasTarget = !isNaN(params.step) || !isNaN(params.question);
    var member = isNaN(params.member) || params.member === undefined ? null : params.member;
    select(params.step, params.question, member, scroll && hasTarget);
  }

  DATA.notes.forEach(function (n) { notes.appendChild(el("li", null, n)); });
  if (!DATA.steps.length) {
    output.textContent = "No trajectories to show.";
    stepSel.disabled = questionSel.disabled = true;
    return;
  }
  DATA.steps.forEach(function (s) {
    var option = el("option", null, "step " + s.step + " (" + s.questions.length + " questions)");
    option.value = String(s.step);
    stepSel.appendChild(option);
  });
  stepSel.addEventListener("change", function () {
    select(parseInt(stepSel.value, 10), null, null, false);
  });
  questionSel.addEventListener("change", function () {
    select(parseInt(stepSel.value, 10), parseInt(questionSel.value, 10), null, false);
  });
  function shift(delta) {
    var i = questionSel.selectedIndex + delta;
    if (i >= 0 && i < questionSel.options.length) {
      select(parseInt(stepSel.value, 10), parseInt(questionSel.options[i].value, 10), null, false);
    }
  }
  document.getElementById("prev-question").addEventListener("click", function () { shift(-1); });
  document.getElementById("next-question").addEventListener("click", function () { shift(1); });
  window.addEventListener("hashchange", function () { fromHash(true); });
  fromHash(true);
})();
