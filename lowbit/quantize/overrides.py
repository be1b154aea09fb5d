"""``--set part.field=value`` overrides on a scheme (ablations and the outlier-count sweep)."""

from __future__ import annotations

import json

from lowbit.formats.scheme import Scheme, SchemeError


def apply_overrides(scheme: Scheme, items: list[str], name: str | None = None) -> Scheme:
    d = scheme.to_dict()
    for item in items:
        key, eq, raw = item.partition("=")
        part, dot, fld = key.partition(".")
        if not eq or not dot or part not in d or not isinstance(d[part], dict):
            raise SchemeError(f"override {item!r} must look like part.field=value (parts: {', '.join(k for k in d if k != 'name')})")
        if fld not in d[part]:
            raise SchemeError(f"unknown field {fld!r} in {part}; known: {sorted(d[part])}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        d[part][fld] = value
    if name or items:
        d["name"] = name or f"{scheme.name}+" + ",".join(items)
    return Scheme.from_dict(d)
