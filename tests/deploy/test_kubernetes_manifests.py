"""deploy/kubernetes: every manifest valid against Kubernetes' own schemas (kubernetes-validate,
strict: an unknown field is an error) for the oldest and newest versions we support, the
InferencePool against its CRD's schema (vendored in schemas/), and the settings that must
agree across files kept in step: GPUs and tensor-parallel ranks, probes, drain and grace
period, the ConfigMap/Secret and .env.example, the pool and the engine pods, and the metric
names the endpoint picker reads."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from .tools import DEPLOY, ROOT, tool_unavailable

KUBERNETES = DEPLOY / "kubernetes"
CRD_SCHEMA = Path(__file__).parent / "schemas" / "inferencepool-v1.json"
VERSIONS = ("1.30.0", "1.37.0")  # the oldest still supported upstream when written, the newest
CUSTOM = {"inference.networking.k8s.io/v1": "InferencePool"}
# A secret's name, word by word: LORAPLEX_OPERATOR_TOKEN is one, LORAPLEX_MAX_TOKENS_CAP and
# LORAPLEX_MAX_CHARS_PER_TOKEN (a ratio) are not.
SECRET_LIKE = re.compile(r"(^|(?<!_PER)_)(SECRET|TOKEN|PASSWORD|ACCESS_KEY)(_|$)|DATABASE_URL")
COMPOSE_ONLY = {"POSTGRES_PASSWORD", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"}


def manifests() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def one(kind: str, name: str) -> dict:
    (doc,) = [d for _, d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container(doc: dict, name: str) -> dict:
    (found,) = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


def env_value(c: dict, name: str) -> str:
    (value,) = [e["value"] for e in c.get("env", []) if e["name"] == name]
    return value


def config() -> dict[str, str]:
    return one("ConfigMap", "loraplex-config")["data"]


def validate_builtin(doc: dict, version: str) -> None:
    try:
        from kubernetes_validate import utils  # type: ignore[import-untyped]
    except ImportError:
        tool_unavailable("kubernetes-validate is not installed (requirements-dev.txt)")
    utils.validate(doc, version, strict=True)


def closed(schema):
    """Unknown fields become errors, as kubeconform -strict does for CRDs (the API server
    would prune them silently). `metadata` stays open: the CRD gives it no properties."""
    if isinstance(schema, dict):
        schema = {k: closed(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [closed(v) for v in schema]
    return schema


def validate_inference_pool(doc: dict) -> None:
    schema = closed(json.loads(CRD_SCHEMA.read_text())["openAPIV3Schema"])
    jsonschema.validate(doc, schema)
    ref = doc["spec"].get("endpointPickerRef")
    if ref is not None and ref.get("kind", "Service") == "Service":
        # the CRD's CEL rule, which jsonschema does not read
        assert "port" in ref, "endpointPickerRef: port is required when kind is 'Service'"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_builtin_manifest_is_valid_for_kubernetes(version):
    checked = 0
    for filename, doc in manifests():
        if CUSTOM.get(doc["apiVersion"]) == doc["kind"]:
            continue
        try:
            validate_builtin(doc, version)
        except Exception as exc:  # name the manifest in the failure
            pytest.fail(f"{filename}: {doc['kind']}/{doc['metadata']['name']}: {exc}")
        checked += 1
    assert checked >= 15


def test_the_inference_pool_is_valid_for_its_crd():
    validate_inference_pool(one("InferencePool", "engine"))


def test_a_misspelt_field_is_caught_by_both_validators():
    deployment = copy.deepcopy(one("Deployment", "web"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(Exception, match="readinesProbe"):
        validate_builtin(deployment, VERSIONS[-1])
    pool = copy.deepcopy(one("InferencePool", "engine"))
    pool["spec"]["targetPortNumber"] = 8000  # the v1alpha2 field
    with pytest.raises(jsonschema.ValidationError, match="targetPortNumber"):
        validate_inference_pool(pool)
    del pool["spec"]["targetPortNumber"]
    del pool["spec"]["endpointPickerRef"]["port"]
    with pytest.raises(AssertionError, match="port is required"):
        validate_inference_pool(pool)


def test_the_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    files = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    assert kustomization["namespace"] == "loraplex"


def test_the_engine_requests_one_gpu_per_tensor_parallel_rank():
    engine = container(one("StatefulSet", "engine"), "engine")
    ranks = int(env_value(engine, "LORAPLEX_TENSOR_PARALLEL_SIZE"))
    resources = engine["resources"]
    assert int(resources["limits"]["nvidia.com/gpu"]) == ranks
    assert int(resources["requests"]["nvidia.com/gpu"]) == ranks
    assert env_value(engine, "LORAPLEX_ENGINE") == "on"


@pytest.mark.parametrize(("kind", "name"), [("Deployment", "web"), ("StatefulSet", "engine")])
def test_probes_and_drain_match_the_server(kind, name):
    """/readyz takes the pod out of traffic, /healthz restarts a hung one; the grace period
    covers the preStop pause, uvicorn's drain and the engine's shutdown (each up to
    LORAPLEX_DRAIN_SECONDS: inference/management/commands/serve.py)."""
    doc = one(kind, name)
    c = container(doc, name)
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["ports"] == [{"name": "http", "containerPort": 8000}]
    pause = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = int(config()["LORAPLEX_DRAIN_SECONDS"])
    grace = doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= pause + 2 * drain, (grace, pause, drain)
    # probes and scrapers send the pod's IP as Host: Django must allow it
    assert env_value(c, "ALLOWED_HOSTS") == "$(ALLOWED_HOSTS),$(POD_IP)"
    names = [e["name"] for e in c["env"]]
    assert names.index("POD_IP") < names.index("ALLOWED_HOSTS")


def test_the_configmap_and_secret_hold_the_env_example_settings():
    """Every active .env.example setting is in the ConfigMap or the Secret, or set on the one
    workload it concerns (the engine's LORAPLEX_TENSOR_PARALLEL_SIZE, next to its GPUs)."""
    text = (ROOT / ".env.example").read_text()
    documented = set(re.findall(r"^#? ?([A-Z][A-Z0-9_]*)=", text, re.M))
    active = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", text, re.M)) - COMPOSE_ONLY
    plain = set(config())
    secret = set(one("Secret", "loraplex-secrets")["stringData"])
    workloads = (
        one("Deployment", "web"),
        one("Deployment", "worker"),
        one("StatefulSet", "engine"),
    )
    containers = [doc["spec"]["template"]["spec"]["containers"][0] for doc in workloads]
    own = {e["name"] for c in containers for e in c.get("env", []) if "value" in e} - plain
    assert not plain & secret
    assert (plain | secret) <= documented, sorted((plain | secret) - documented)
    assert active <= plain | secret | own, sorted(active - plain - secret - own)
    assert {k for k in plain | secret if SECRET_LIKE.search(k)} == secret
    assert not {k for k in own if SECRET_LIKE.search(k)}  # secrets only in the Secret
    for doc in workloads:
        (c,) = doc["spec"]["template"]["spec"]["containers"]
        assert c["envFrom"] == [
            {"configMapRef": {"name": "loraplex-config"}},
            {"secretRef": {"name": "loraplex-secrets"}},
        ]


def test_the_engine_urls_name_every_replica():
    engine = one("StatefulSet", "engine")
    service = engine["spec"]["serviceName"]
    urls = config()["LORAPLEX_ENGINE_URLS"].split(",")
    assert urls == [f"http://engine-{i}.{service}:8000" for i in range(engine["spec"]["replicas"])]
    headless = one("Service", service)
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]


def test_the_pool_selects_the_engine_pods_on_their_port():
    pool = one("InferencePool", "engine")
    engine = one("StatefulSet", "engine")
    labels = engine["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    web_labels = one("Deployment", "web")["spec"]["template"]["metadata"]["labels"]
    assert not pool["spec"]["selector"]["matchLabels"].items() <= web_labels.items()
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    picker = pool["spec"]["endpointPickerRef"]
    service = one("Service", picker["name"])
    assert picker["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]


def picker_config() -> dict:
    return yaml.safe_load(one("ConfigMap", "engine-epp")["data"]["loraplex-plugins.yaml"])


def test_the_picker_reads_metrics_our_engines_export(exported_samples):
    engine_labels = one("StatefulSet", "engine")["spec"]["template"]["metadata"]["labels"]
    (extractor,) = [p for p in picker_config()["plugins"] if p["type"] == "core-metrics-extractor"]
    (engine,) = extractor["parameters"]["engineConfigs"]
    assert engine_labels["inference.networking.k8s.io/engine-type"] == engine["name"]
    assert extractor["parameters"]["defaultEngine"] == engine["name"]
    specs = {k: v for k, v in engine.items() if k.endswith("Spec") and v}
    assert set(specs) == {"queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec"}
    for key, metric in specs.items():
        assert metric in exported_samples, f"{key}: {metric} is not exported"
    assert set(specs.values()) == {
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
    }


def test_the_picker_config_refers_only_to_its_plugins():
    cfg = picker_config()
    types = {p["type"] for p in cfg["plugins"]}
    refs = {p["pluginRef"] for profile in cfg["schedulingProfiles"] for p in profile["plugins"]}
    for source in cfg["dataLayer"]["sources"]:
        refs |= {source["pluginRef"], *(e["pluginRef"] for e in source["extractors"])}
    assert refs <= types
    deployment = one("Deployment", "engine-epp")
    args = container(deployment, "epp")["args"]
    assert "--pool-name=engine" in args
    assert "--config-file=/config/loraplex-plugins.yaml" in args
