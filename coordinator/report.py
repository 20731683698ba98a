"""`farm report`: one self-contained HTML file explaining the decisions of an archive.

Per fingerprint: a readable environment summary (device, cores and threads, driver, compiler, build; the raw
fingerprint folded away), problems, winners by candidate, median speedup over the reference, what the searches cost
(device and compile seconds). Per problem: its device and compile seconds, each candidate's
paired ratios (candidate/reference per pair) as points with the median, the noise band (median +- relative MAD)
and the min_speedup line, the verdict, and why the others lost. The page embeds its data as JSON and draws the
plots on demand, so it stays fast with thousands of problems (search, filters, paging); it needs no network.
"""

from __future__ import annotations

import html
import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from farm.atomicfile import write_atomic
from farm.environment import fingerprint_parts
from farm.identity import CacheKey
from farm.trials import TrialVerdict
from farm_archives.derived import decision_row
from farm_coordinator.catalog import workload_label
from farm_coordinator.feedback import run_origin
from farm_coordinator.heatmap import heat_maps
from farm_coordinator.partial import describe


def load(archive: Path) -> list[dict[str, Any]]:
    """Every fingerprint of an archive directory (one ``<digest>/`` folder or a folder of them), verified."""
    from farm_archives.operations import read_archives

    return [_fingerprint(a) for a in read_archives(archive)]


def _fingerprint(archive: Any) -> dict[str, Any]:
    problems = []
    min_speedup = 1.05
    for entry in archive.entries.values():
        record = entry.record
        if _family_index(record.cache_key):
            continue  # the in-process family record of a decision listed on its own: not a problem of its own
        meta = dict(record.meta)
        min_speedup = _min_speedup(str(meta.get("accuracy_key") or ""), min_speedup)
        candidates: dict[str, dict[str, Any]] = {}
        for c in meta.get("candidates", []):
            candidates[c["name"]] = {"name": c["name"], "ratio": c.get("ratio"), "mad": c.get("relative_mad"),
                                     "verified": c.get("verified"), "note": c.get("note", ""), "ratios": []}
        not_tried = 0
        for row in entry.trials:
            name = row.get("candidate")
            if row.get("role") == "candidate" and name is None:  # a group's own row: it never ran, or was lost
                not_tried += row.get("verdict") == TrialVerdict.NOT_TRIED.value
            if row.get("role") != "candidate" or name is None:
                continue
            found = candidates.setdefault(name, {"name": name, "ratio": None, "mad": None, "verified": None,
                                                 "note": row.get("note") or "", "ratios": []})
            if row.get("reference_seconds") and row.get("candidate_seconds"):
                found["ratios"].append(row["candidate_seconds"] / row["reference_seconds"])
        named = _named(entry)
        if not meta.get("candidates"):  # decided in process: its record keeps the winner's verdict only
            _in_process_candidates(candidates, named["reference"], record, meta)
        problems.append({
            **named,
            "winner": record.name,
            "ratio": record.ratio,
            "verified": record.verified,
            "confirmation": str(meta.get("confirmation") or ""),
            "origin": run_origin(str(meta.get("run") or "")),
            "candidates": list(candidates.values()),
            "not_tried": not_tried,
            "partial": describe(meta),  # a search the budget cut: what it left out, why, what changes it
            "spaces": heat_maps(record.cache_key, list(candidates.values())),
            "device_seconds": _seconds(meta.get("device_seconds")),
            "compile_seconds": _seconds(meta.get("compile_seconds")),
        })
        problems[-1]["ticks"] = ratio_ticks(*axis_range(list(candidates.values()), min_speedup))
    problems.sort(key=lambda p: (p["operation"], p["workload"]))
    speedups = [1.0 / p["ratio"] for p in problems if p["ratio"] > 0]
    return {
        "digest": archive.digest,
        "fingerprint": archive.fingerprint,
        "environment": environment_summary(archive.fingerprint),
        "problems": problems,
        "winners": Counter(p["winner"] for p in problems).most_common(),
        "median_speedup": statistics.median(speedups) if speedups else 1.0,
        "min_speedup": min_speedup,
        "device_seconds": sum(p["device_seconds"] or 0.0 for p in problems),
        "compile_seconds": sum(p["compile_seconds"] or 0.0 for p in problems),
        "retuned": [{"operation": p["operation"], "workload": p["workload"], "winner": p["winner"],
                     "reason": p["origin"]} for p in problems if p["origin"]],
    }


def _family_index(cache_key: str) -> bool:
    """Whether a key is an in-process search's family record (``farm.spacesearch.family_record``: each space named
    ``tiled[*]`` with its family's digest instead of its value lists), which indexes the decision it copies for a
    grown space's next search."""
    try:
        candidates = CacheKey.decode(cache_key).candidates
    except ValueError:
        return False
    return any(c.name.endswith("[*]") and len(c.revision) == 32 and all(ch in "0123456789abcdef" for ch in c.revision)
               for c in candidates)


def _named(entry: Any) -> dict[str, str]:
    """A decision's operation, workload and reference as `farm archive inspect` shows them: from the farm's meta, or,
    for a decision made in process (its meta holds its cost only), from its cache key (the adapter's operation name,
    the workload signature, the reference's name in the key's manifest)."""
    row = decision_row(entry.record, entry.problem_id, entry.text)
    operation = str(row["operation"])
    spec = json.loads(row["spec_json"]) if row["spec_json"] else None
    workload = workload_label(operation, spec) if isinstance(spec, dict) else str(row["workload"])
    return {"operation": operation, "workload": workload, "reference": str(row["reference"])}


def _in_process_candidates(candidates: dict[str, dict[str, Any]], reference: str, record: Any,
                           meta: dict[str, Any]) -> None:
    """The candidates a decision made in process can show: its winner, with the record's ratio, and the reference."""
    mad = meta.get("relative_mad")
    note = "selected: decided in process (the record keeps the winner's verdict only)"
    candidates.setdefault(record.name, {"name": record.name, "ratio": record.ratio,
                                        "mad": mad if isinstance(mad, (int, float)) else None,
                                        "verified": record.verified, "note": note, "ratios": []})
    candidates.setdefault(reference, {"name": reference, "ratio": 1.0, "mad": None, "verified": True,
                                      "note": "reference", "ratios": []})


def _seconds(value: Any) -> float | None:
    """A record's device or compile seconds; None for a record from before the farm counted them."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def environment_summary(fingerprint: str) -> list[tuple[str, str]]:
    """The fingerprint as (label, value) rows for people: device (model, cores), threads (the regime: CPU set and
    pool sizes), driver, compiler, build. A fingerprint that does not decode is shown as one raw row."""
    named = fingerprint_parts(fingerprint)
    if named is None:
        return [("fingerprint", fingerprint)]
    rows = [("device", f"{named['device kind']} ({named['backend']}): {named['device']}")]
    options = [o.strip() for o in named["runtime options"].split(";") if o.strip()]
    threads = [o for o in options if o.startswith(("cpus=", "blas=", "openmp=")) or "THREADS" in o]
    if threads:
        rows.append(("threads", ", ".join(threads)))
    rows += [("driver", named["driver"]), ("compiler", named["compiler"]),
             ("build", named["build"] + (f" (tag {named['build tag']})" if named["build tag"] else ""))]
    other = [o for o in options if o not in threads]
    if other:
        rows.append(("runtime options", "; ".join(other)))
    return rows


def _model(fingerprint: dict[str, Any]) -> str:
    device: str = dict(fingerprint["environment"]).get("device", "")
    text = device.split(": ", 1)[-1]
    pieces = [p.strip() for p in text.split(";")]
    # Host properties start with the machine architecture: the model is the next piece.
    return pieces[1] if len(pieces) > 1 and pieces[0] in ("x86_64", "aarch64", "arm64", "ppc64le") else pieces[0]


_NEAR = math.log(1.25)  # a pair this close to its candidate's quartiles is never an outlier


def axis_range(candidates: list[dict[str, Any]], min_speedup: float) -> tuple[float, float]:
    """The ratio range a problem's plot spans: 1, 1/min_speedup, every candidate's median and the bulk of each
    candidate's paired ratios. A pair beyond its candidate's Tukey fences (1.5 interquartile ranges past the
    quartiles, in log space, and never within 25% of them; candidates with 4 pairs or more) is an outlier: the
    page draws it at the axis edge instead of letting it stretch the axis for every other point."""
    plotted = [1.0, 1.0 / min_speedup]
    for c in candidates:
        if isinstance(c.get("ratio"), (int, float)) and c["ratio"] > 0:
            plotted.append(float(c["ratio"]))
        logs = sorted(math.log(r) for r in c.get("ratios", []) if r > 0)
        if len(logs) >= 4:
            q1, _, q3 = statistics.quantiles(logs, n=4, method="inclusive")
            fence = max(1.5 * (q3 - q1), _NEAR)
            logs = [v for v in logs if q1 - fence <= v <= q3 + fence]
        plotted += [math.exp(v) for v in logs]
    return min(plotted), max(plotted)


def ratio_ticks(low: float, high: float, most: int = 9) -> list[float]:
    """Axis labels for ratios from ``low`` to ``high`` (log scale): a 1-2-5 series over every decade the range
    spans, always including the range's own ends' neighbours so that every plotted ratio sits on a labelled scale."""
    low, high = min(low, high), max(low, high)
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    series = [float(f"{m * 10.0 ** e:.3g}") for e in range(first, last + 1) for m in (1, 2, 5)]
    below = [t for t in series if t <= low]
    above = [t for t in series if t >= high]
    chosen = [t for t in series if (below and t >= below[-1] or not below) and (above and t <= above[0] or not above)]
    step = max(1, math.ceil(len(chosen) / most))
    thinned = [t for i, t in enumerate(chosen) if i % step == 0 or t == 1.0]
    if thinned[-1] != chosen[-1]:
        thinned.append(chosen[-1])
    return thinned


def _min_speedup(accuracy_key: str, default: float) -> float:
    """The policy's min_speedup, read back from a record's accuracy key."""
    from farm.policy import AccuracyKey

    try:
        return AccuracyKey.decode(accuracy_key).min_speedup
    except ValueError:
        return default


def render(fingerprints: list[dict[str, Any]], title: str) -> str:
    data = json.dumps(fingerprints, separators=(",", ":")).replace("</", "<\\/")
    return _PAGE.replace("__TITLE__", html.escape(title)).replace("__DATA__", data)


def default_title(archive: Path, fingerprints: list[dict[str, Any]]) -> str:
    """``Tuning report: <archive folder> (<device models>, N fingerprints)``."""
    name = Path(archive).resolve().name or str(archive)
    models = sorted({_model(f) for f in fingerprints if _model(f)})
    count = len(fingerprints)
    return f"Tuning report: {name} ({', '.join(models) or 'no devices'}; {count} fingerprint{'s' * (count != 1)})"


def bought_card(problems: list[dict[str, Any]], weights: dict[str, float] | None = None) -> dict[str, Any]:
    """What a fingerprint's searches bought (``farm_coordinator.budget.bought``): the fleet time its decisions save
    per hour, each problem weighted by ``weights`` (``operation workload`` label -> weight: a catalog's; 1 each
    without), how many searches are complete (a partial one may save more once a rerun continues it), and the
    device seconds per problem, most first. ``lines``: the same as text (``farm report`` prints them)."""
    from farm_coordinator.budget import Standing, bought

    standings = [Standing(f"{p['operation']} {p['workload']}", i, (weights or {}).get(f"{p['operation']} {p['workload']}", 1.0),
                          ratio=p["ratio"], spent=p["device_seconds"] or 0.0, finished=not p["partial"])
                 for i, p in enumerate(problems)]
    b = bought(standings)
    complete = sum(s.finished for s in standings)
    how = "weighted by the catalog" if weights is not None else "weight 1 each: --catalog for its weights"
    lines = [f"fleet time saved {b.saved:,.4g} per hour ({how}); {complete} of {len(standings)} searches complete, "
             f"{b.spent:,.1f} device s"]
    lines += [f"  {seconds:,.1f} device s: {key} (saves {saved:,.4g} per hour)" for key, seconds, saved in b.problems[:5]]
    return {"saved": b.saved, "complete": complete, "weighted": weights is not None, "lines": lines,
            "problems": [{"problem": k, "device_seconds": s, "saved_per_hour": v} for k, s, v in b.problems]}


def catalog_weights(path: Path, kernels: tuple[str, ...] = ()) -> dict[str, float]:
    """A catalog's weights by ``operation workload`` label, as the report labels its problems."""
    from farm_coordinator.catalog import load_catalog

    catalog = load_catalog(path, kernels)
    return {f"{w.operation} {workload_label(w.operation, w.spec)}": w.weight for w in catalog.workloads}


def write_report(archive: Path, out: Path, title: str | None = None, kernels: tuple[str, ...] = (),
                 weights: dict[str, float] | None = None, bought: list[str] | None = None) -> int:
    """Render the report of ``archive`` to ``out`` atomically; return the number of problems. ``kernels``: modules
    of the archive's plugin operations, so their workloads are labelled in schema order as `farm tune` prints them
    (builtin and entry-point operations are always known; an unknown one shows its stored, sorted spec).
    ``weights``: each problem's weight (:func:`catalog_weights`) for what the searches bought (:func:`bought_card`),
    whose lines, per fingerprint, are appended to ``bought`` when given."""
    if kernels:
        from farm_kernels import registry

        registry.ensure_loaded(kernels)
    fingerprints = load(archive)
    for fp in fingerprints:
        fp["bought"] = bought_card(fp["problems"], weights)
        if bought is not None:
            bought += [f"{str(fp['digest'])[:8]}: {fp['bought']['lines'][0]}", *fp["bought"]["lines"][1:]]
    write_atomic(out, render(fingerprints, title or default_title(archive, fingerprints)).encode())
    return sum(len(f["problems"]) for f in fingerprints)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.5em}
table{border-collapse:collapse;width:100%;background:#fff} th,td{padding:4px 8px;border-bottom:1px solid #e3e3e3;text-align:left}
th{background:#f0f0f0;position:sticky;top:0} tr.p{cursor:pointer} tr.p:hover{background:#f5f8ff}
.num{text-align:right;font-variant-numeric:tabular-nums} .ref{color:#666} .win{color:#0a6d2c;font-weight:600}
.summary{display:flex;gap:2em;flex-wrap:wrap;align-items:flex-start} .card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.6em 1em}
.controls{margin:1em 0;display:flex;gap:1em;flex-wrap:wrap;align-items:center}
input,select{font:inherit;padding:3px 6px} .detail td{background:#fcfcfc} .note{color:#555;font-size:.92em}
.muted{color:#888} code{font-size:.85em;word-break:break-all}
table.env{width:auto;margin-bottom:.5em} table.env th{position:static;text-align:right;font-weight:600;width:9em}
</style></head><body>
<h1>__TITLE__</h1>
<div id="fps"></div>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const FPS = JSON.parse(document.getElementById("data").textContent);
const PAGE = 200;
function esc(s){return String(s).replace(/[&<>"]/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c]));}
function fmt(x,d){return (x===null||x===undefined)?"-":Number(x).toFixed(d===undefined?3:d);}
function median(a){if(!a.length)return null;const s=[...a].sort((x,y)=>x-y),m=s.length>>1;return s.length%2?s[m]:(s[m-1]+s[m])/2;}
function plot(p,minSpeedup){
  const W=680,row=26,left=190,right=70,top=22,H=top+row*Math.max(1,p.candidates.length)+40,base=H-34;
  // The axis spans the labelled ticks (Python's ratio_ticks over the bulk of the pairs, the medians, 1 and
  // 1/min_speedup): an outlier pair does not stretch it; it is drawn as a triangle at the edge it lies beyond.
  // A log axis: ratios 0.5 and 2 sit at the same distance from the reference.
  const all=[1,1/minSpeedup,...p.ticks];
  let lo=Math.log(Math.min(...all)),hi=Math.log(Math.max(...all));const pad=(hi-lo)*0.04||0.05;lo-=pad;hi+=pad;
  const x=v=>left+(Math.min(Math.max(Math.log(Math.max(v,1e-12)),lo),hi)-lo)/(hi-lo)*(W-left-right);
  const beyond=v=>Math.log(Math.max(v,1e-12))<lo?-1:(Math.log(v)>hi?1:0);
  let s=`<svg width="${W}" height="${H}" role="img" aria-label="paired ratios">`;
  s+=`<line x1="${x(1)}" y1="${top-8}" x2="${x(1)}" y2="${base+2}" stroke="#999" stroke-dasharray="4 3"/><text x="${x(1)+3}" y="${top-10}" font-size="10" fill="#666">reference 1.0</text>`;
  s+=`<line x1="${x(1/minSpeedup)}" y1="${top-8}" x2="${x(1/minSpeedup)}" y2="${base+2}" stroke="#c60" stroke-dasharray="2 2"/><text x="${x(1/minSpeedup)-3}" y="${top-10}" font-size="10" fill="#c60" text-anchor="end">1/min_speedup ${fmt(1/minSpeedup)}</text>`;
  p.candidates.forEach((c,i)=>{
    const y=top+i*row+row/2, m=c.ratio!==null?c.ratio:median(c.ratios);
    const col=c.name===p.winner?"#0a6d2c":(c.note.startsWith("rejected")||c.note.startsWith("skipped")?"#b00":"#336");
    s+=`<text x="${left-8}" y="${y+4}" font-size="11" text-anchor="end" fill="${col}">${esc(c.name)}</text>`;
    if(m!==null&&c.mad!==null&&c.mad!==undefined){const a=x(Math.max(lo,m*(1-c.mad))),b=x(Math.min(hi,m*(1+c.mad)));s+=`<rect x="${a}" y="${y-7}" width="${Math.max(1,b-a)}" height="14" fill="${col}" opacity="0.13"/>`;}
    c.ratios.forEach(r=>{const b=beyond(r),cx=x(r);s+=b?`<path class="outlier" d="M${cx+4*b} ${y}L${cx-2*b} ${y-4}L${cx-2*b} ${y+4}Z" fill="${col}"><title>${fmt(r)} (beyond the axis)</title></path>`:`<circle cx="${cx}" cy="${y}" r="3" fill="${col}" opacity="0.7"/>`;});
    if(m!==null)s+=`<line x1="${x(m)}" y1="${y-9}" x2="${x(m)}" y2="${y+9}" stroke="${col}" stroke-width="2"/>`;
    if(!c.ratios.length)s+=`<text x="${left+4}" y="${y+4}" font-size="10" fill="#b00">no timings</text>`;
  });
  s+=`<line x1="${left}" y1="${base}" x2="${W-right}" y2="${base}" stroke="#ddd"/>`;
  p.ticks.forEach(t=>{
    s+=`<line x1="${x(t)}" y1="${base}" x2="${x(t)}" y2="${base+4}" stroke="#bbb"/><text class="tick" x="${x(t)}" y="${base+14}" font-size="9" fill="#999" text-anchor="middle">${t}</text>`;});
  // The axis title has a line of its own, below the tick labels.
  s+=`<text class="axis-title" x="${(left+W-right)/2}" y="${H-4}" font-size="10" fill="#777" text-anchor="middle">candidate/reference time per pair (log scale)</text>`;
  return s+"</svg>";
}
function heat(h){
  // The explored configs of a space: rows and columns are the two parameters that matter most; a cell is coloured
  // by its best ratio (green faster than the reference, red slower), a cross marks a cell with failed configs, a
  // dashed outline and a dash a cell with configs the search planned but never ran (not tried: not explored).
  const cw=54,ch=24,left=110,top=40,W=Math.max(520,left+cw*h.xs.length+10),H=top+ch*h.ys.length+10;
  const col=r=>{if(r===null)return "#eee";const t=Math.max(-1,Math.min(1,Math.log(r)/Math.log(4)));
    return t<0?`rgb(${Math.round(255+t*200)},${Math.round(255+t*60)},${Math.round(255+t*200)})`:`rgb(255,${Math.round(255-t*190)},${Math.round(255-t*190)})`;};
  let s=`<svg class="heat" width="${W}" height="${H}" role="img" aria-label="explored configs of ${esc(h.space)}">`;
  const skipped=h.not_tried?` (${h.not_tried} not tried: the budget ran out)`:"";
  s+=`<text class="heat-title" x="4" y="12" font-size="11" fill="#444">${esc(h.space)}: ${h.explored} of ${h.size} configs explored${skipped}; rows ${esc(h.y)}${h.x?`, columns ${esc(h.x)}`:""}</text>`;
  h.xs.forEach((v,j)=>{s+=`<text x="${left+j*cw+cw/2}" y="${top-6}" font-size="10" text-anchor="middle" fill="#666">${esc(v)}</text>`;});
  h.ys.forEach((v,i)=>{s+=`<text x="${left-6}" y="${top+i*ch+ch/2+4}" font-size="10" text-anchor="end" fill="#666">${esc(v)}</text>`;
    h.xs.forEach((_,j)=>{const c=h.cells[i][j],x=left+j*cw,y=top+i*ch;
      const untried=c&&c.not_tried?`, ${c.not_tried} not tried`:"";
      s+=`<rect class="cell" x="${x}" y="${y}" width="${cw-2}" height="${ch-2}" fill="${c&&c.explored?col(c.best):"#f7f7f7"}"${c&&c.not_tried&&!c.explored?' stroke="#999" stroke-dasharray="3 2"':""}><title>${c?`${esc(c.name||(c.explored?"no ratio":"not tried"))}: best ${fmt(c.best)}, ${c.explored} explored, ${c.failed} failed${untried}`:"not explored"}</title></rect>`;
      if(c&&c.not_tried&&!c.explored)s+=`<text class="not-tried" x="${x+cw/2-1}" y="${y+ch/2+3}" font-size="10" text-anchor="middle" fill="#888">&#x2013;</text>`;
      if(c&&c.best!==null)s+=`<text x="${x+cw/2-1}" y="${y+ch/2+3}" font-size="9" text-anchor="middle">${fmt(c.best,2)}</text>`;
      if(c&&c.failed)s+=`<text class="failed" x="${x+cw-8}" y="${y+10}" font-size="10" fill="#b00">&#x2715;</text>`;});});
  return s+"</svg>";
}
function detail(p,minSpeedup){
  let t=`<div>${plot(p,minSpeedup)}</div>${(p.spaces||[]).map(h=>`<div>${heat(h)}</div>`).join("")}<table><tr><th>candidate</th><th class="num">ratio</th><th class="num">rel. MAD</th><th>verified</th><th>verdict</th></tr>`;
  p.candidates.forEach(c=>{t+=`<tr><td class="${c.name===p.winner?"win":""}">${esc(c.name)}</td><td class="num">${fmt(c.ratio)}</td><td class="num">${fmt(c.mad)}</td><td>${c.verified?"yes":"no"}</td><td class="note">${esc(c.note)}</td></tr>`;});
  const untried=p.not_tried?` · ${p.not_tried} candidate group${p.not_tried>1?"s":""} not tried: the budget ran out before ${p.not_tried>1?"their":"its"} turn`:"";
  const cut=p.partial?`<p class="note partial"><b>${esc(p.partial)}</b></p>`:"";
  return t+`</table>${cut}<p class="note">cost: <span class="cost">device ${fmt(p.device_seconds,2)} s, compile ${fmt(p.compile_seconds,2)} s</span> · confirmation: ${esc(p.confirmation||"-")}${p.origin?` · ${esc(p.origin)}`:""}${untried}</p>`;
}
FPS.forEach((fp,fi)=>{
  const root=document.createElement("section");
  const ops=[...new Set(fp.problems.map(p=>p.operation))].sort();
  const env=fp.environment.map(r=>`<tr><th>${esc(r[0])}</th><td>${esc(r[1])}</td></tr>`).join("");
  root.innerHTML=`<h2>Fingerprint ${esc(fp.digest)}</h2><table class="env"><tbody>${env}</tbody></table>
  <details><summary class="muted">raw fingerprint</summary><code>${esc(fp.fingerprint)}</code></details>
  <div class="summary"><div class="card"><b>${fp.problems.length}</b> problems</div>
  <div class="card">median speedup over the reference <b>${fmt(fp.median_speedup,2)}x</b></div>
  <div class="card">searches cost <b>${fmt(fp.device_seconds,1)} device s</b>, ${fmt(fp.compile_seconds,1)} compile s</div>
  ${fp.bought?`<div class="card bought">${fp.bought.lines.map(esc).join("<br>")}</div>`:""}
  <div class="card">winners by candidate:<br>${fp.winners.map(w=>`${esc(w[0])}: ${w[1]}`).join("<br>")}</div></div>
  ${fp.retuned.length?`<h3>Tuned from fleet reports</h3><ul>${fp.retuned.map(r=>`<li>${esc(r.operation)} ${esc(r.workload)} -> ${esc(r.winner)}: ${esc(r.reason)}</li>`).join("")}</ul>`:""}
  <div class="controls"><input type="search" placeholder="search operation, workload, winner" size="40" data-role="q">
  <select data-role="op"><option value="">every operation</option>${ops.map(o=>`<option>${esc(o)}</option>`).join("")}</select>
  <select data-role="v"><option value="">every verdict</option><option value="won">a candidate won</option><option value="ref">the reference kept</option></select>
  <span data-role="count" class="muted"></span> <button data-role="more">show more</button></div>
  <table class="problems"><thead><tr><th>operation</th><th>workload</th><th>winner</th><th class="num">ratio</th><th>verified</th><th>confirmation</th><th class="num">candidates</th></tr></thead><tbody></tbody></table>`;
  document.getElementById("fps").appendChild(root);
  const q=root.querySelector("[data-role=q]"),op=root.querySelector("[data-role=op]"),v=root.querySelector("[data-role=v]");
  const body=root.querySelector("table.problems tbody"),count=root.querySelector("[data-role=count]"),more=root.querySelector("[data-role=more]");
  let shown=PAGE;
  function draw(){
    const needle=q.value.toLowerCase();
    const rows=fp.problems.filter(p=>(!op.value||p.operation===op.value)&&(!v.value||(v.value==="ref")===(p.winner===p.reference))
      &&(!needle||(p.operation+" "+p.workload+" "+p.winner).toLowerCase().includes(needle)));
    count.textContent=`${Math.min(shown,rows.length)} of ${rows.length} shown`;more.hidden=rows.length<=shown;
    body.innerHTML=rows.slice(0,shown).map((p,i)=>`<tr class="p" data-i="${fp.problems.indexOf(p)}"><td>${esc(p.operation)}</td><td>${esc(p.workload)}</td><td class="${p.winner===p.reference?"ref":"win"}">${esc(p.winner)}</td><td class="num">${fmt(p.ratio)}</td><td>${p.verified?"yes":"no"}</td><td>${esc((p.confirmation||"-").split(":")[0])}</td><td class="num">${p.candidates.length}</td></tr>`).join("");
  }
  body.addEventListener("click",e=>{const tr=e.target.closest("tr.p");if(!tr)return;
    if(tr.nextSibling&&tr.nextSibling.classList&&tr.nextSibling.classList.contains("detail")){tr.nextSibling.remove();return;}
    const d=document.createElement("tr");d.className="detail";d.innerHTML=`<td colspan="7">${detail(fp.problems[+tr.dataset.i],fp.min_speedup)}</td>`;tr.after(d);});
  [q,op,v].forEach(el=>el.addEventListener("input",()=>{shown=PAGE;draw();}));
  more.addEventListener("click",()=>{shown+=PAGE;draw();});
  draw();
  if(location.hash==="#expand"){const first=body.querySelector("tr.p");if(first)first.click();}
});
</script>
<noscript><p>This report draws its tables with JavaScript; the data is embedded in the page source.</p></noscript>
</body></html>
"""
