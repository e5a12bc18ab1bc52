"""A small, offline stand-in for ``kubectl kustomize``: only what deploy/k8s uses.

Supported: ``resources`` (files and kustomization directories), ``configMapGenerator``
(``files`` as ``key=path`` or ``path``, ``literals``, ``options.disableNameSuffixHash``) with
kustomize-style name hash suffixes and the rewriting of references to them, and ``patches``
(strategic merge patches, containers and the like merged by name; JSON 6902 patches with a
``target``). Any other kustomization field is refused rather than silently ignored, and files
outside a kustomization's directory are refused as kustomize's default load restrictor does.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

KNOWN_FIELDS = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions", "patches"}

# Strategic-merge keys of the lists deploy/k8s patches (Kubernetes' patchMergeKey); lists
# not named here are replaced whole, as in Kubernetes.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


class KustomizeError(Exception):
    pass


def render(directory: Path) -> list[dict[str, Any]]:
    """Every resource of the kustomization in ``directory``, patched, in order."""
    directory = directory.resolve()
    kustomization = _load_kustomization(directory)
    unknown = set(kustomization) - KNOWN_FIELDS
    if unknown:
        raise KustomizeError(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    resources: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            resources += render(path)
        else:
            resources += _load_docs(_inside(directory, entry))
    renames: dict[str, str] = {}
    defaults = kustomization.get("generatorOptions", {})
    for generator in kustomization.get("configMapGenerator", []):
        config_map = _config_map(directory, generator)
        options = {**defaults, **generator.get("options", {})}
        if not options.get("disableNameSuffixHash", False):
            name = config_map["metadata"]["name"]
            config_map["metadata"]["name"] = renames[name] = f"{name}-{_suffix(config_map)}"
        resources.append(config_map)
    for patch in kustomization.get("patches", []):
        _apply_patch(directory, resources, patch)
    for resource in resources:
        _rename_config_map_refs(resource, renames)
    return resources


def _load_kustomization(directory: Path) -> dict[str, Any]:
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        if (directory / name).is_file():
            doc = yaml.safe_load((directory / name).read_text(encoding="utf-8"))
            if not isinstance(doc, dict):
                raise KustomizeError(f"{directory / name}: not a mapping")
            return doc
    raise KustomizeError(f"{directory}: no kustomization file")


def _inside(directory: Path, relative: str) -> Path:
    path = (directory / relative).resolve()
    if not path.is_relative_to(directory):
        raise KustomizeError(f"{relative}: outside {directory} (kustomize's load restrictor refuses it)")
    if not path.is_file():
        raise KustomizeError(f"{path}: no such file")
    return path


def _load_docs(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "metadata" not in doc:
            raise KustomizeError(f"{path}: not a Kubernetes resource: {str(doc)[:80]}")
    return docs


def _config_map(directory: Path, generator: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, str] = {}
    for entry in generator.get("files", []):
        key, _, source = entry.rpartition("=")
        path = _inside(directory, source)
        data[key or path.name] = path.read_text(encoding="utf-8")
    for literal in generator.get("literals", []):
        key, sep, value = literal.partition("=")
        if not sep:
            raise KustomizeError(f"literal {literal!r}: expected KEY=VALUE")
        data[key] = value
    duplicates = len(generator.get("files", [])) + len(generator.get("literals", [])) - len(data)
    if duplicates:
        raise KustomizeError(f"configMapGenerator {generator['name']}: duplicate keys")
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}


def _suffix(config_map: dict[str, Any]) -> str:
    """A content hash in kustomize's alphabet (10 characters, no vowels or ambiguous digits)."""
    encoded = json.dumps(
        {"kind": "ConfigMap", "name": config_map["metadata"]["name"], "data": config_map["data"]},
        sort_keys=True,
    )
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _matches(resource: dict[str, Any], target: dict[str, Any]) -> bool:
    group, _, version = resource["apiVersion"].rpartition("/")
    wanted = {"group": group, "version": version, "kind": resource["kind"]}
    wanted["name"] = resource["metadata"]["name"]
    return all(wanted[k] == v for k, v in target.items())


def _apply_patch(directory: Path, resources: list[dict[str, Any]], entry: dict[str, Any]) -> None:
    if "patch" in entry:
        body = yaml.safe_load(entry["patch"])
    else:
        body = yaml.safe_load(_inside(directory, entry["path"]).read_text(encoding="utf-8"))
    if isinstance(body, list):  # JSON 6902
        if "target" not in entry:
            raise KustomizeError(f"{entry}: a JSON 6902 patch needs a target")
        target = entry["target"]
    else:
        group, _, version = body["apiVersion"].rpartition("/")
        target = entry.get(
            "target",
            {"group": group, "version": version, "kind": body["kind"], "name": body["metadata"]["name"]},
        )
    hits = [i for i, r in enumerate(resources) if _matches(r, target)]
    if not hits:
        raise KustomizeError(f"patch {entry}: no resource matches {target}")
    for i in hits:
        if isinstance(body, list):
            resources[i] = json_patch(resources[i], body)
        else:
            resources[i] = strategic_merge(resources[i], {k: v for k, v in body.items() if k != "metadata"})


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """Kubernetes' strategic merge for the cases deploy/k8s needs: maps merge, ``null`` deletes
    a key, lists in ``MERGE_KEYS`` merge item by item (``$patch: delete`` removes one), other
    lists and scalars are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = _strip_directives(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        merged_list = copy.deepcopy(base)
        for item in patch:
            index = next((i for i, old in enumerate(merged_list) if old.get(key) == item.get(key)), None)
            if item.get("$patch") == "delete":
                if index is not None:
                    del merged_list[index]
            elif index is None:
                merged_list.append(_strip_directives(item))
            else:
                merged_list[index] = strategic_merge(merged_list[index], item, field)
        return merged_list
    return _strip_directives(patch)


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        if any(k.startswith("$") for k in value):
            raise KustomizeError(f"unsupported patch directive in {value}")
        return {k: _strip_directives(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return copy.deepcopy(value)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"{path!r}: a JSON pointer starts with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def _get(doc: Any, path: str) -> Any:
    node, last = _parent(doc, _pointer(path))
    return node[int(last)] if isinstance(node, list) else node[last]


def _remove(doc: Any, path: str) -> Any:
    node, last = _parent(doc, _pointer(path))
    return node.pop(int(last)) if isinstance(node, list) else node.pop(last)


def _add(doc: Any, path: str, value: Any) -> None:
    node, last = _parent(doc, _pointer(path))
    if isinstance(node, list):
        node.insert(len(node) if last == "-" else int(last), value)
    else:
        node[last] = value


def json_patch(doc: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 (add, remove, replace, move, copy, test) on a copy of ``doc``."""
    doc = copy.deepcopy(doc)
    for op in operations:
        try:
            kind, path = op["op"], op["path"]
            if kind == "test":
                if _get(doc, path) != op["value"]:
                    raise KustomizeError(f"test failed: {path} is {_get(doc, path)!r}, not {op['value']!r}")
            elif kind == "remove":
                _remove(doc, path)
            elif kind == "add":
                _add(doc, path, copy.deepcopy(op["value"]))
            elif kind == "replace":
                _remove(doc, path)
                _add(doc, path, copy.deepcopy(op["value"]))
            elif kind == "move":
                _add(doc, path, _remove(doc, op["from"]))
            elif kind == "copy":
                _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
            else:
                raise KustomizeError(f"unknown op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise KustomizeError(f"{op}: {exc!r}") from exc
    return doc


def pod_spec(resource: dict[str, Any]) -> dict[str, Any] | None:
    if resource["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}:
        spec: dict[str, Any] = resource["spec"]["template"]["spec"]
        return spec
    return None


def _rename_config_map_refs(resource: dict[str, Any], renames: dict[str, str]) -> None:
    """Point pod specs at the suffixed names (what kustomize's name reference transformer does)."""
    spec = pod_spec(resource)
    if spec is None or not renames:
        return

    def fix(ref: dict[str, Any] | None) -> None:
        if ref is not None and ref.get("name") in renames:
            ref["name"] = renames[ref["name"]]

    for volume in spec.get("volumes", []):
        fix(volume.get("configMap"))
        for source in volume.get("projected", {}).get("sources", []):
            fix(source.get("configMap"))
    for container in spec.get("initContainers", []) + spec.get("containers", []):
        for env in container.get("env", []):
            fix(env.get("valueFrom", {}).get("configMapKeyRef"))
        for env_from in container.get("envFrom", []):
            fix(env_from.get("configMapRef"))
