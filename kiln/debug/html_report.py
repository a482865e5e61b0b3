"""``DIR/index.html`` of a trace directory: one self-contained page (no script, no
network resource) that a browser opens from disk.

Top to bottom: a summary (graphs, breaks, recompiles, fallbacks, compile time, time
per stage), every graph break (ID, reason, user ``file:line`` and source line), every
recompile (each failed guard, old and new value), then the tree of frames: each
frame's compiles, each compile's artefacts one click away (an inline ``<details>``
and a link to the file), and under a compile the frames its code calls (resume
functions after a break, callees compiled as their own frames).
"""
from __future__ import annotations

import html
import os
import re
import time

_INLINE_LIMIT = 400_000   # characters of an artefact shown inline; larger: link only
_FIRST_KERNEL = re.compile(r"\n(//|#) kernel ?\d+:")   # C++ "// kernel 0:", Triton "# kernel0:"

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.5em 2em;
 color:#1d2330;background:#fbfbfd}
h1{font-size:1.5em;margin:0 0 .2em}
h2{font-size:1.15em;margin:1.4em 0 .5em;border-bottom:1px solid #d8dbe3}
.meta{color:#667}
table{border-collapse:collapse;margin:.3em 0}
td,th{padding:.15em .8em .15em 0;text-align:left;vertical-align:top}
th{color:#556;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:.8em;flex-wrap:wrap;margin:.6em 0}
.card{background:#fff;border:1px solid #d8dbe3;border-radius:6px;padding:.5em 1em;min-width:7em}
.card b{display:block;font-size:1.5em} .card.bad b{color:#b3261e} .card.warn b{color:#9a6700}
pre{background:#f3f4f8;border:1px solid #e1e3ea;border-radius:4px;padding:.6em;overflow:auto;
 max-height:36em;font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
details{margin:.25em 0} summary{cursor:pointer}
.frame{border-left:3px solid #8aa4d6;padding-left:.8em;margin:.5em 0}
.compile{border-left:2px solid #d8dbe3;padding-left:.8em;margin:.4em 0 .4em .3em}
.break{border-left:3px solid #b3261e;background:#fff;padding:.3em .7em;margin:.4em 0}
.recompile{border-left:3px solid #9a6700;background:#fff;padding:.3em .7em;margin:.4em 0}
.fallback{color:#9a6700} .loc{font-weight:600} .src{color:#333}
.id{background:#eef;border-radius:3px;padding:0 .3em}
.ok{color:#1a7f37} .bad{color:#b3261e} .small{font-size:.92em;color:#556}
"""


def render(session) -> str:
    compiles = session.compiles
    loose = session.loose
    breaks = [(c, b) for c in compiles for b in c.breaks]
    recompiles = [c for c in compiles if c.recompile]
    fallbacks = [(c, f) for c in compiles + [loose] for f in c.fallbacks]
    total = sum(c.seconds for c in compiles)
    stages: dict = {}
    for c in compiles + [loose]:
        for k, v in c.stages.items():
            stages[k] = stages.get(k, 0.0) + v
    out = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
           "<title>kiln trace</title><style>", _CSS, "</style></head><body>",
           "<h1>kiln trace</h1>",
           f"<p class=meta>process {os.getpid()} · started {_time(session.started)} · "
           f"written {_time(time.time())} · {_e(session.root)}</p>",
           "<h2 id=summary>Summary</h2><div class=cards>",
           _card("frames", len({id(c.frame) for c in compiles})),
           _card("compiles", len(compiles)),
           _card("graphs", sum(c.graphs for c in compiles)),
           _card("graph breaks", len(breaks), "bad" if breaks else ""),
           _card("recompiles", len(recompiles), "warn" if recompiles else ""),
           _card("fallbacks", len(fallbacks), "warn" if fallbacks else ""),
           _card("cache hits / misses", f"{_count(compiles + [loose], ' hit')} / "
                                        f"{_count(compiles + [loose], ' miss')}"),
           _card("compile time", f"{total:.3f} s"),
           "</div>"]
    if stages:
        out.append("<details><summary>time per stage (nested stages are included in the "
                   "enclosing ones)</summary>" + _stage_table(stages) + "</details>")
    places: dict = {}     # the same break met again by a recompile: listed once
    for c, b in breaks:
        places.setdefault(((b.get("stack") or [""])[-1], b.get("reason")), []).append((c, b))
    out.append(f"<h2 id=breaks>Graph breaks ({len(breaks)} in {len(places)} place(s))</h2>")
    out += [_break(met[0][0], met[0][1], [c for c, _ in met]) for met in places.values()] \
        or ["<p class=small>none</p>"]
    out.append(f"<h2 id=recompiles>Recompiles ({len(recompiles)})</h2>")
    out += [_recompile(c) for c in recompiles] or ["<p class=small>none</p>"]
    if fallbacks:
        out.append(f"<h2 id=fallbacks>Fallbacks ({len(fallbacks)})</h2><ul>")
        out += [f"<li class=fallback>{_e(f)} <a href='#c{c.id}'>compile #{c.id}</a></li>"
                for c, f in fallbacks]
        out.append("</ul>")
    out.append("<h2 id=frames>Frames and compiles</h2>")
    roots = []
    for c in compiles:
        if c.frame.parent is None and c.frame not in roots:
            roots.append(c.frame)
    children: dict = {}
    for c in compiles:
        p = c.frame.parent
        if p is not None and c.frame not in children.setdefault(p.id, []):
            children[p.id].append(c.frame)
    out += [_frame(fr, children) for fr in roots]
    if loose.artefacts or loose.log:
        out.append("<h2>Outside any frame compile</h2>" + _compile(loose, children, "outside"))
    out.append("</body></html>\n")
    return "\n".join(out)


def _count(compiles, word: str) -> int:
    return sum(1 for c in compiles for line in c.cache if word in line)


def _card(label, value, cls="") -> str:
    return f"<div class='card {cls}'><b>{_e(value)}</b>{_e(label)}</div>"


def _stage_table(stages: dict) -> str:
    rows = "".join(f"<tr><td>{_e(k)}</td><td class=num>{v:.4f} s</td></tr>"
                   for k, v in sorted(stages.items(), key=lambda kv: -kv[1]))
    return f"<table><tr><th>stage</th><th>seconds</th></tr>{rows}</table>"


def _where(stack_line: str) -> tuple[str, str]:
    """``file:line in fn: text`` -> (``file:line``, ``fn: text``)."""
    loc, _, rest = stack_line.partition(" in ")
    return loc, rest


def _break(c, b, all_compiles=None) -> str:
    stack = b.get("stack") or []
    loc, rest = _where(stack[-1]) if stack else ("(unknown)", "")
    fn, _, src = rest.partition(": ")
    bid = b.get("break_id")
    idtag = f"<span class=id>{_e(bid)}</span> " if bid else ""
    outer = ""
    if len(stack) > 1:
        outer = "<details><summary class=small>user stack</summary><pre>" + \
                _e("\n".join(stack)) + "</pre></details>"
    links = " ".join(f"<a class=small href='#c{k.id}'>compile #{k.id} ({_e(k.frame.name)})</a>"
                     for k in (all_compiles or [c]))
    return (f"<div class=break>{idtag}<span class=loc>{_e(loc)}</span> in <code>{_e(fn)}</code>: "
            f"<code class=src>{_e(src)}</code><br>{_e(b.get('reason', ''))} {links}{outer}</div>")


def _recompile(c) -> str:
    r = c.recompile
    entries = r.get("entries") or []
    parts = []
    for i, lines in enumerate(entries):
        head = f"<div class=small>against entry {i}:</div>" if len(entries) > 1 else ""
        items = "".join(f"<li><code>{_e(w)}</code></li>" for w in lines) \
            or "<li>(no guard fails now)</li>"
        parts.append(f"{head}<ul>{items}</ul>")
    return (f"<div class=recompile><span class=loc>{_e(r.get('where', c.frame.name))}</span> "
            f"recompiled (compile {c.index} of this frame, "
            f"<a class=small href='#c{c.id}'>#{c.id}</a>) — failed guards:{''.join(parts)}</div>")


def _frame(fr, children) -> str:
    head = (f"<b>{_e(fr.name)}</b> <span class=small>{_e(fr.file)}:{fr.line} · "
            f"{len(fr.compiles)} compile(s)</span>")
    body = "".join(_compile(c, children) for c in fr.compiles)
    return f"<details open class=frame><summary>{head}</summary>{body}</details>"


def _compile(c, children, anchor=None) -> str:
    cls = "bad" if c.outcome.startswith(("raised", "failed")) else (
        "fallback" if c.outcome.startswith("runs eagerly") else "ok")
    head = (f"compile #{c.id}{' (recompile)' if c.index else ''} · {c.seconds:.3f} s · "
            f"<span class={cls}>{_e(c.outcome)}</span>")
    body = []
    if c.recompile:
        body.append(_recompile(c))
    body += [_break(c, b) for b in c.breaks]
    body += [f"<div class=fallback>{_e(f)}</div>" for f in c.fallbacks]
    if c.stages:
        body.append("<details><summary>time per stage</summary>" + _stage_table(c.stages) +
                    "</details>")
    for title, rel, text in c.artefacts:
        link = f"<a href='{_e(rel)}'>{_e(os.path.basename(rel))}</a>"
        shown = _inline(text)
        body.append(f"<details class=artefact><summary>{_e(title)} · {link}</summary>"
                    f"<pre>{_e(shown)}</pre></details>")
    if c.cache:
        body.append("<details><summary>cache (" + str(len(c.cache)) + ")</summary><pre>" +
                    _e("\n".join(c.cache)) + "</pre></details>")
    if c.notes:
        body.append("<details><summary>notes (" + str(len(c.notes)) + ")</summary><pre>" +
                    _e("\n".join(c.notes)) + "</pre></details>")
    if c.log:
        heads = "\n".join((r.splitlines() or [""])[0] for r in c.log)   # full text: log.txt
        body.append(f"<details><summary>log ({len(c.log)} records) · "
                    f"<a href='{_e(os.path.join(c.dir, 'log.txt'))}'>log.txt</a></summary><pre>"
                    + _e(heads) + "</pre></details>")
    body += [_frame(fr, children) for fr in children.get(c.id, [])]
    anchor = anchor or f"c{c.id}"
    return (f"<details open class=compile id='{anchor}'><summary>{head}</summary>"
            f"{''.join(body)}</details>")


def _inline(text: str) -> str:
    """What an artefact shows inline: C++ kernels from their first kernel on (the shared
    helper functions above it are in the file), and at most ``_INLINE_LIMIT`` chars."""
    m = _FIRST_KERNEL.search(text)
    if m is not None and m.start() > 0:
        text = f"{m.group(1)} … helper functions: see the file\n" + text[m.start() + 1:]
    return text if len(text) <= _INLINE_LIMIT else text[:_INLINE_LIMIT] + "\n… (see the file)"


def _time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _e(x) -> str:
    return html.escape(str(x), quote=True)
