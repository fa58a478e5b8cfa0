"""The trace audit: where every operand of every trace line comes from (`python -m lab puzzles audit SOLVED.csv`).

Built on the checker's grammar (`lab.puzzles.check`: `split_trace`, `TAG_RE`, `Replay`), not a second parser. For
each solved derivation trace, line by line: each operand's provenance (an earlier trace line, the prompt, a
one-character constant, or `hidden`: nowhere before), its distance in tokens from that source, the referential breaks
(a `hidden` operand of two or more characters: the command exits 1), the recalls and stated choices, and the shape
of each line per category. Compact traces are counted as computed or claimed lines. Provenance is literal text,
not data flow. Each measure defined: docs/internals.md, lab.puzzles.audit.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from pathlib import Path

from .categories import BY_NAME
from .check import TAG_RE, Fail, Replay, _same_class, split_trace
from .solve import replay

SHAPE_DIGITS = re.compile(r"\d+")


def _tokenizer(path):
    """A fast tokenizer (offsets needed) from a folder path or as given; None (characters) otherwise."""
    if path is None or not isinstance(path, (str, Path)):
        return path if getattr(path, "is_fast", False) else None
    from .solve import _TOKENIZERS, trace_tokens

    trace_tokens("", path)  # loads it once, in the same cache `solve` uses
    return _TOKENIZERS[str(path)]


def _nearest(text: str, end: int, v: str) -> int:
    """End offset of the last whole-value occurrence of v in text[:end], or -1."""
    i = text.rfind(v, 0, end)
    while i >= 0:
        before = text[i - 1] if i else " "
        after = text[i + len(v)] if i + len(v) < len(text) else " "
        if not (_same_class(before, v[0]) or _same_class(after, v[-1])):
            return i + len(v)
        i = text.rfind(v, 0, i + len(v) - 1) if i else -1
    return -1


def shape(line: str) -> str:
    m = TAG_RE.match(line)
    tag, body = (re.sub(r"\d", "", m.group(1)) + ": ", m.group(2)) if m else ("", line)
    words = body.split()
    if not words:
        return "empty"
    head = words[0] if words[0] != "note" or len(words) < 2 else f"note {words[1]}"
    return tag + SHAPE_DIGITS.sub("K", head)


def _recalled(body: str) -> str:
    """What a recall line recalls, in a few words."""
    head, _, rest = body.partition(" ")
    if head == "let":
        return "digit map"
    if head == "recall":
        return "mask" if re.fullmatch(r"[01]{8}", rest) else "word" if rest.isalpha() else "value"
    text = body.split("recall", 1)[1]
    for key, what in (("digit map", "digit map"), ("the rule", "rule"), ("how each output bit", "per-bit rule"),
                      ("each output bit is a function", "table copies"), ("meaning", "meanings")):
        if key in body:
            return what
    return " ".join(text.split()[:3])


def audit_trace(prompt: str, trace: str, tok=None, category: str = "") -> dict:
    """Per line of one derivation trace: shape, kind, operands with provenance and distance; plus recalls,
    choices, referential breaks and the first line that does not replay (with `category`'s own operations)."""
    lines, _ = split_trace(trace)
    visible, starts = prompt + "\n", []
    searchable = visible
    for ln in lines:
        starts.append(len(visible))
        visible += ln + "\n"
        body = (TAG_RE.match(ln).group(2) if TAG_RE.match(ln) else ln).strip()
        searchable += (" " * len(ln) if body.startswith("note") else ln) + "\n"
    if tok is not None:
        enc = tok(visible, add_special_tokens=False, return_offsets_mapping=True)
        tok_starts = [a for a, _ in enc["offset_mapping"]]
        pos = lambda c: bisect_right(tok_starts, c)  # noqa: E731 - tokens that start before char c
    else:
        pos = lambda c: c  # noqa: E731
    cat = BY_NAME.get(category)
    r = Replay(prompt, cat and cat.ops, cat and cat.branches)
    out = {"lines": [], "recalls": [], "choices": 0, "breaks": [], "replay_fail": 0}
    for i, ln in enumerate(lines):
        m = TAG_RE.match(ln)
        body = (m.group(2) if m else ln).strip()
        head, _, rest = body.partition(" ")
        kind, ops = "op", []
        if head == "note":
            kind = "note"
            if "recall" in rest:
                kind = "recall"
                out["recalls"].append(_recalled(body))
            elif rest.startswith("choose"):
                kind = "choice"
                out["choices"] += 1
        elif head in ("recall", "let"):
            kind = "recall"
            out["recalls"].append(_recalled(body))
        elif head == "copy":
            kind, ops = "copy", [rest]
        elif " = " in body:
            op, *args = body.rsplit(" = ", 1)[0].split()
            ops = list(args)
            if op == "read":
                ops += [f"{k}:{b}" for k in args for b in "01" if r.shown(k, b)][:len(args)]
            elif op == "table":
                ops += sorted(set(r.pairs))
            elif op == "scan":  # a bits anchor scan reads every example's input and output from the prompt
                ops += re.findall(r"\b[01]{8}\b", prompt.split("determine the output")[0])
        rec = []
        for v in ops:
            if len(v) == 1:
                rec.append(("constant", 0))
                continue
            end = _nearest(searchable, starts[i], v)
            if end < 0:
                rec.append(("hidden", None))
                out["breaks"].append((i + 1, v))
                continue
            rec.append(("line" if end > len(prompt) else "prompt", pos(starts[i]) - pos(end)))
        out["lines"].append({"shape": shape(ln), "kind": kind, "operands": rec})
        try:
            r.step(body, m and m.group(1))
        except Fail:
            out["replay_fail"] += 1
            if " = " in body:
                r.add(body.rsplit(" = ", 1)[1])
    return out


def _pct(vals, q):
    import numpy as np

    return int(np.percentile(vals, q)) if len(vals) else None


def audit_frame(df, tokenizer=None):
    """-> (summary per category, shapes per category [category, shape, traces_share, lines, operands, hidden,
    distance p50/p99/max], breaks [id, category, line, value]) for every solved row of a `solve` output."""
    import pandas as pd

    tok = _tokenizer(tokenizer)
    summary, shapes, breaks = [], [], []
    solved = df[df["status"] == "solved"]
    for cat, g in solved.groupby("category", sort=True):
        n, per_shape, prov, dists = len(g), {}, {"prompt": 0, "line": 0, "constant": 0, "hidden": 0}, []
        line_dists = []  # operands whose source is an earlier trace line (locality within the trace)
        recall_traces, choice_traces, what, lines_total, claims, broken, fails = 0, 0, {}, 0, 0, 0, 0
        for _, row in g.iterrows():
            style = row.get("trace_style", "compact") if "trace_style" in row else "compact"
            if style != "derivation":
                ok, _, _, c = replay("compact", cat, row["prompt"], row["trace"])
                nl = len(split_trace(row["trace"])[0])
                lines_total, claims = lines_total + nl, claims + c  # claims: lines the replay takes on trust
                per_shape.setdefault("compact line", [set(), 0, [], 0])
                per_shape["compact line"][0].add(row.name)
                per_shape["compact line"][1] += nl
                continue
            a = audit_trace(row["prompt"], row["trace"], tok, cat)
            lines_total += len(a["lines"])
            recall_traces += bool(a["recalls"])
            choice_traces += a["choices"] > 0
            fails += a["replay_fail"] > 0
            for w in set(a["recalls"]):
                what[w] = what.get(w, 0) + 1
            if a["breaks"]:
                broken += 1
                breaks += [{"id": row.get("id", row.name), "category": cat, "line": ln, "value": v}
                           for ln, v in a["breaks"]]
            for line in a["lines"]:
                s = per_shape.setdefault(line["shape"], [set(), 0, [], 0])
                s[0].add(row.name)
                s[1] += 1
                for p, d in line["operands"]:
                    prov[p] += 1
                    s[3] += p == "hidden"
                    if d is not None and p != "constant":
                        s[2].append(d)
                        dists.append(d)
                        if p == "line":
                            line_dists.append(d)
        n_ops = sum(prov.values())
        summary.append({
            "category": cat, "traces": n, "lines_mean": round(lines_total / n, 1), "operands": n_ops,
            **{f"{k}_share": round(v / n_ops, 4) if n_ops else None for k, v in prov.items()},
            "claim_lines": claims, "dist_p50": _pct(dists, 50), "dist_p99": _pct(dists, 99),
            "dist_max": max(dists) if dists else None, "line_dist_p99": _pct(line_dists, 99), "ref_breaks": broken,
            "recall_share": round(recall_traces / n, 4), "choice_share": round(choice_traces / n, 4),
            "replay_fail": fails,
            "recalled": ", ".join(f"{k} {v}" for k, v in sorted(what.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"})
        for sh, (rows, count, ds, hidden) in per_shape.items():
            shapes.append({"category": cat, "shape": sh, "traces_share": round(len(rows) / n, 4), "lines": count,
                           "hidden": hidden, "dist_p50": _pct(ds, 50), "dist_p99": _pct(ds, 99),
                           "dist_max": max(ds) if ds else None})
    shapes = pd.DataFrame(shapes, columns=["category", "shape", "traces_share", "lines", "hidden", "dist_p50",
                                           "dist_p99", "dist_max"])
    if len(shapes):
        shapes = shapes.sort_values(["category", "traces_share", "lines"], ascending=[True, False, False])
    return pd.DataFrame(summary), shapes, pd.DataFrame(breaks, columns=["id", "category", "line", "value"])


def audit_command(path: str, tokenizer=None, show: int = 20) -> int:
    """Prints the summary per category and one shape table per category; exit 1 on a referential break."""
    import pandas as pd

    from lab.competition.metric import read_table

    df = read_table(path, ["prompt", "category", "status", "trace"], "solve output")
    summary, shapes, breaks = audit_frame(df, tokenizer)
    unit = "tokens (real tokenizer)" if tokenizer else "characters (no --tokenizer given)"
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.max_colwidth", 60):
        print(f"operand provenance and distance (in {unit}) per category, solved traces:")
        print(summary.to_string(index=False) if len(summary) else "(no solved rows)")
        for cat, g in shapes.groupby("category", sort=True):
            print(f"\n{cat}: line shapes (share of traces they appear in; operand distance in {unit})")
            print(g.drop(columns="category").to_string(index=False))
    for _, b in breaks.head(show).iterrows():
        print(f"BREAK {b['id']} ({b['category']}) line {b['line']}: {b['value']!r} is cited before it appears")
    print(f"{len(breaks)} referential breaks in {breaks['id'].nunique() if len(breaks) else 0} traces")
    return 1 if len(breaks) else 0
