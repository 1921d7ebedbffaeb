#!/usr/bin/python3
"""Validates benchmark --json output against bench/bench_schema.json.

  validate_bench_json.py SCHEMA FILE...

Implements the JSON Schema keywords the schema uses (type, required, properties,
additionalProperties, items, minItems, minLength, enum, pattern, $ref to #/definitions), plus the
report's own rules that a schema cannot say: a target's peer is null exactly when it is a peer
target that was not measured; then met is false and reason is a non-empty string; otherwise met
agrees with compared and goal. Exits 1 naming every violation.
"""
import json
import re
import sys

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def is_type(v, t):
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, TYPES[t])


def check(v, s, root, path, errs):
    if "$ref" in s:
        s = root["definitions"][s["$ref"].split("/")[-1]]
    if "type" in s:
        ts = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(is_type(v, t) for t in ts):
            errs.append(f"{path}: {json.dumps(v)[:60]} is not of type {ts}")
            return
    if "enum" in s and v not in s["enum"]:
        errs.append(f"{path}: {v!r} not in {s['enum']}")
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0):
            errs.append(f"{path}: shorter than {s['minLength']}")
        if "pattern" in s and not re.search(s["pattern"], v):
            errs.append(f"{path}: {v!r} does not match {s['pattern']}")
    if isinstance(v, dict):
        for k in s.get("required", []):
            if k not in v:
                errs.append(f"{path}: missing required key {k!r}")
        props = s.get("properties", {})
        for k, x in v.items():
            if k in props:
                check(x, props[k], root, f"{path}.{k}", errs)
            elif s.get("additionalProperties", True) is False:
                errs.append(f"{path}: unexpected key {k!r}")
    if isinstance(v, list):
        if len(v) < s.get("minItems", 0):
            errs.append(f"{path}: fewer than {s['minItems']} items")
        if "items" in s:
            for i, x in enumerate(v):
                check(x, s["items"], root, f"{path}[{i}]", errs)


def check_targets(doc, errs):
    for i, t in enumerate(doc.get("targets", [])):
        p = f"targets[{i}] ({t.get('name')})"
        vs_peer = t.get("goal_applies_to") == "value/peer"
        if not vs_peer and t.get("peer") is not None:
            errs.append(f"{p}: an absolute target has a peer")
        if vs_peer and t.get("peer") is None:
            if t.get("met") is not False:
                errs.append(f"{p}: peer missing but met is not false")
            if not t.get("reason"):
                errs.append(f"{p}: peer missing but no reason")
            if not str(t.get("status", "")).startswith("not measured"):
                errs.append(f"{p}: peer missing but status is {t.get('status')!r}")
            continue
        if t.get("reason") is not None:
            errs.append(f"{p}: measured target carries a reason")
        c, g = t.get("compared"), t.get("goal")
        if c is None or t.get("value") is None:
            continue
        if not t["higher_is_better"] and (t["value"] <= 0 or c <= 0):
            # A lower-is-better value of 0 or less is a failed measurement (bench/report.h).
            if t.get("met") is not False or not str(t.get("status", "")).startswith("not measured"):
                errs.append(f"{p}: lower-is-better value {t['value']} counted as measured")
            continue
        want = t["value"] / t["peer"] if vs_peer else t["value"]
        if abs(want - c) > 1e-4 * max(1.0, abs(c)):
            errs.append(f"{p}: compared {c} != {want}")
        met = c >= g if t["higher_is_better"] else c <= g
        if met != t.get("met"):
            errs.append(f"{p}: met {t.get('met')} but compared {c} vs goal {g}")


def main():
    schema = json.load(open(sys.argv[1]))
    bad = 0
    for path in sys.argv[2:]:
        text = open(path).read()
        errs = []
        try:
            doc = json.loads(text)
        except ValueError as e:
            errs.append(f"not one JSON object: {e}")
        else:
            check(doc, schema, schema, "$", errs)
            if not errs:
                check_targets(doc, errs)
        for e in errs:
            print(f"{path}: {e}", file=sys.stderr)
        bad += bool(errs)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
