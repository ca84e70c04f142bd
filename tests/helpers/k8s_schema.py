"""Kubernetes manifests checked against the Kubernetes API schema, as the `kubernetes` client's
models carry it (field names, nesting, types, required fields): a typo in a shipped or generated
manifest is a problem naming where it is, without a cluster."""

from __future__ import annotations

import re
from typing import Any

# (apiVersion, kind) -> the client's model of that object.
MODELS = {
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("batch/v1", "Job"): "V1Job",
}
_SCALARS = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "datetime": (str,),
    "date": (str,),
}


def schema_problems(document: dict[str, Any]) -> list[str]:
    """Where `document` (one parsed YAML object) differs from its kind's schema."""
    kind = (document.get("apiVersion"), document.get("kind"))
    if kind not in MODELS:
        return [f"apiVersion/kind {kind}: not one of {sorted(MODELS)}"]
    return _problems(document, MODELS[kind], document.get("kind", ""))


def _problems(value: Any, type_name: str, path: str) -> list[str]:
    listed = re.fullmatch(r"list\[(.+)\]", type_name)
    if listed:
        if not isinstance(value, list):
            return [f"{path}: expected a list, received {value!r}"]
        return [p for i, v in enumerate(value) for p in _problems(v, listed[1], f"{path}[{i}]")]
    mapped = re.fullmatch(r"dict\((\w+), (.+)\)", type_name)
    if mapped:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, received {value!r}"]
        return [p for k, v in value.items() for p in _problems(v, mapped[2], f"{path}.{k}")]
    if type_name == "object":  # int-or-string and free-form fields
        return []
    if type_name in _SCALARS:
        fits = isinstance(value, _SCALARS[type_name]) and not (
            type_name != "bool" and isinstance(value, bool)
        )
        return [] if fits else [f"{path}: expected {type_name}, received {value!r}"]
    return _model_problems(value, type_name, path)


def _model_problems(value: Any, type_name: str, path: str) -> list[str]:
    from kubernetes import client

    model = getattr(client, type_name)
    if not isinstance(value, dict):
        return [f"{path}: expected a {type_name} mapping, received {value!r}"]
    fields = {json: name for name, json in model.attribute_map.items()}
    problems = [f"{path}.{key}: no such field of {type_name}" for key in value if key not in fields]
    for key, item in value.items():
        if key in fields:
            problems += _problems(item, model.openapi_types[fields[key]], f"{path}.{key}")
    try:  # required fields and allowed values, as the client checks them
        model(**{fields[k]: v for k, v in value.items() if k in fields})
    except ValueError as error:
        problems.append(f"{path}: {error}")
    return problems
