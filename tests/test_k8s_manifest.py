"""The Kubernetes manifests in docs/multihost.md are valid Kubernetes objects.

Checked against the Kubernetes v1.33 API schema, strict: every object's fields must exist (a
misspelled ``serviceName`` or a ``volumeMount`` at the wrong level fails), with the types and
required fields the API server demands. Then what a schema cannot say: the StatefulSet's selector
picks its own pods, its serviceName is a headless Service given beside it, and the variable the
agent takes its rank from is set. Not run on a cluster: a schema-valid manifest can still meet a
cluster without GPUs, that image, or that namespace.

tests/k8s/k8s-schema.json holds the definitions the StatefulSet, Service and Secret reach, from
kubernetes-validate 1.37.0's ``v1.33.0-local-strict`` schemas (Apache-2.0, generated from the
Kubernetes OpenAPI spec; descriptions dropped). kubernetes-validate itself is 72 MB installed, so
the schema is kept here instead; _regenerate() below rebuilds it from an unpacked wheel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

jsonschema = pytest.importorskip("jsonschema", reason="pip install 'otpmesh[test]'")
yaml = pytest.importorskip("yaml", reason="pip install 'otpmesh[test]'")

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "tests/k8s/k8s-schema.json").read_text())
KINDS = {
    ("apps/v1", "StatefulSet"): "io.k8s.api.apps.v1.StatefulSet",
    ("v1", "Service"): "io.k8s.api.core.v1.Service",
    ("v1", "Secret"): "io.k8s.api.core.v1.Secret",
}


def _doc_manifests() -> list[dict[str, Any]]:
    text = (ROOT / "docs/multihost.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```$", text, flags=re.S | re.M)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc is not None]


def _validator(kind: str) -> Any:
    schema = dict(SCHEMA, **{"$ref": f"#/$defs/{kind}"})
    return jsonschema.Draft202012Validator(schema)


def _errors(manifest: dict[str, Any]) -> list[str]:
    kind = KINDS[(manifest["apiVersion"], manifest["kind"])]
    found = _validator(kind).iter_errors(manifest)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in found]


MANIFESTS = _doc_manifests()


def test_the_docs_give_a_statefulset_and_the_services_it_needs() -> None:
    assert [m["kind"] for m in MANIFESTS] == ["Service", "Service", "StatefulSet"]


def _name(manifest: dict[str, Any]) -> str:
    return f"{manifest['kind']}-{manifest['metadata']['name']}"


@pytest.mark.parametrize("manifest", MANIFESTS, ids=_name)
def test_each_manifest_in_the_docs_is_valid_against_the_kubernetes_schema(
    manifest: dict[str, Any],
) -> None:
    assert _errors(manifest) == []


def test_the_schema_check_catches_what_a_typo_would_break() -> None:
    statefulset = next(m for m in MANIFESTS if m["kind"] == "StatefulSet")
    misspelled = json.loads(json.dumps(statefulset))
    misspelled["spec"]["servicename"] = misspelled["spec"].pop("serviceName")
    container = misspelled["spec"]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")
    container["resources"]["limits"] = ["nvidia.com/gpu"]
    errors = _errors(misspelled)
    assert any("'servicename' was unexpected" in e for e in errors), errors
    assert any("'volumeMount' was unexpected" in e for e in errors), errors
    assert any(e.startswith("spec.template.spec.containers.0.resources.limits") for e in errors)
    del misspelled["spec"]["selector"]
    assert any("'selector' is a required property" in e for e in _errors(misspelled))


def test_the_statefulset_agrees_with_its_services_and_the_agent_command() -> None:
    statefulset = next(m for m in MANIFESTS if m["kind"] == "StatefulSet")
    spec, pod = statefulset["spec"], statefulset["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()  # the API server insists
    services = {m["metadata"]["name"]: m for m in MANIFESTS if m["kind"] == "Service"}
    headless = services[spec["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= labels.items()
    (agent,) = pod["spec"]["containers"]
    command = agent["command"]
    assert command[:2] == ["otpmesh", "agent"]
    rank_var = command[command.index("--rank-from-env") + 1]
    assert rank_var in {e["name"] for e in agent["env"]}
    host, port = command[command.index("--controller") + 1].removeprefix("tcp:").rsplit(":", 1)
    controller = services[host.split(".")[0]]
    assert int(port) in {p["port"] for p in controller["spec"]["ports"]}
    secret_file = next(e["value"] for e in agent["env"] if e["name"] == "OTPMESH_SECRET_FILE")
    (mount,) = agent["volumeMounts"]
    assert secret_file.startswith(mount["mountPath"] + "/")


def _regenerate(schemas_dir: Path) -> None:  # pragma: no cover - run by hand
    """Rebuild tests/k8s/k8s-schema.json from kubernetes-validate's unpacked
    ``kubernetes-json-schema/vX.Y.Z-local-strict`` folder."""
    defs = json.loads((schemas_dir / "_definitions.json").read_text())["$defs"]

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            own = [node["$ref"]] if "$ref" in node else []
            return own + [r for v in node.values() for r in refs(v)]
        return [r for v in node for r in refs(v)] if isinstance(node, list) else []

    def clean(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: ("#/$defs/" + v.split("#/$defs/")[1] if k == "$ref" else clean(v))
                for k, v in node.items()
                if k != "description" and not k.startswith("x-kubernetes-patch")
            }
        return [clean(v) for v in node] if isinstance(node, list) else node

    keep: dict[str, Any] = {}
    todo = list(KINDS.values())
    while todo:
        name = todo.pop()
        if name not in keep:
            keep[name] = defs[name]
            todo += [r.split("#/$defs/")[1] for r in refs(defs[name])]
    out = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": clean(dict(sorted(keep.items()))),
    }
    text = json.dumps(out, separators=(",", ":"), sort_keys=True)
    (ROOT / "tests/k8s/k8s-schema.json").write_text(text)
