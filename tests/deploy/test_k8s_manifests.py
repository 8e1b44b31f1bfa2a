"""The Kubernetes manifests (deploy/k8s, applied by deploy/kustomization.yaml) against the code they deploy.

No cluster runs here, so each essential field is checked against its source of truth: env names against the
gateway's settings classes, container args against the real CLI parser, ports against the settings those args and
env produce, probe paths against the control-plane app built in-process, the routes ConfigMap against the config
loader, the Kamailio config against the shipped deploy/kamailio/dispatcher.cfg.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from gateway.cli import COMMANDS, build_parser
from gateway.commands import worker_args
from gateway.control.config import load_config
from gateway.control.settings import ControlSettings
from gateway.worker.settings import CapacitySettings, WorkerSettings
from tests.deploy import support as s
from tests.support.peers import unavailable

GATEWAY_IMAGE = "voice-gateway"
KAMAILIO_IMAGE = "kamailio/kamailio:5.6-bookworm"
REDIS_IMAGE = "redis:7-alpine"
NAME_LABEL = {"app.kubernetes.io/name": "voice-gateway"}
# Variables of the manifests that are not gateway settings: downward-API values the others are built from, and
# the dispatcher-sync script's own (deploy/k8s/dispatcher-sync.sh).
HELPER_ENV = frozenset({"NODE_IP", "POD_NAME"})
SYNC_ENV = frozenset({"WORKER_SERVICE", "WORKER_SIP_PORT", "DS_LIST_FILE", "CTL_SOCKET", "SYNC_INTERVAL_S"})
DEFAULT_DRAIN_DEADLINE_S = 300.0


def workloads() -> list[dict[str, Any]]:
    return [r.doc for r in s.resources() if r.kind == "Deployment"]


def all_containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for workload in workloads():
        for spec in s.containers(workload):
            yield workload, spec


def gateway_containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for workload, spec in all_containers():
        if spec["image"] == GATEWAY_IMAGE:
            yield workload, spec


def parse_gateway_args(spec: dict[str, Any]) -> argparse.Namespace:
    argv = s.container_argv(spec)
    assert "command" not in spec, "gateway containers keep the image's entrypoint (gateway) and pass args"
    return build_parser().parse_args(argv)


def worker() -> dict[str, Any]:
    return s.find("Deployment", "gateway-worker")


def control() -> dict[str, Any]:
    return s.find("Deployment", "gateway-control")


def kamailio() -> dict[str, Any]:
    return s.find("Deployment", "gateway-kamailio")


def worker_settings(monkeypatch: pytest.MonkeyPatch) -> tuple[argparse.Namespace, WorkerSettings]:
    spec = s.container(worker(), "worker")
    for name, value in s.container_env(spec).items():
        monkeypatch.setenv(name, value)
    args = parse_gateway_args(spec)
    return args, worker_args.worker_settings(args)


def control_settings(monkeypatch: pytest.MonkeyPatch) -> ControlSettings:
    for name, value in s.container_env(s.container(control(), "control")).items():
        monkeypatch.setenv(name, value)
    return ControlSettings()


def port_numbers(spec: dict[str, Any], protocol: str = "TCP") -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in spec.get("ports", []) if p.get("protocol", "TCP") == protocol}


def resolve_port(spec: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in spec.get("ports", [])}
    return int(named[port])


# --------------------------------------------------------------------------------------------- the set as a whole


def test_the_kustomization_applies_every_manifest_but_the_secret_template() -> None:
    listed = {path.name for path in s.manifest_files()}
    on_disk = {path.name for path in s.K8S.glob("*.yaml")}
    assert on_disk - listed == {s.SECRET_TEMPLATE.name}, "every manifest but the Secret template is applied"
    assert not s.kustomization().get("namespace"), "namespace-agnostic: the user picks it (-n, or an overlay)"


def test_resources_are_namespace_agnostic_and_consistently_labelled() -> None:
    kinds = [(r.kind, r.name) for r in s.resources()]
    assert len(kinds) == len(set(kinds)), "no resource defined twice"
    for resource in s.resources():
        metadata = resource.doc["metadata"]
        assert "namespace" not in metadata, f"{resource.kind} {resource.name} names a namespace"
        assert s.selects(NAME_LABEL, metadata.get("labels", {})), f"{resource.kind} {resource.name} lacks the label"
        assert resource.name.startswith("gateway-"), resource.name
        component = metadata["labels"].get("app.kubernetes.io/component")
        if resource.kind == "Deployment":
            pod_labels = resource.doc["spec"]["template"]["metadata"]["labels"]
            selector = resource.doc["spec"]["selector"]["matchLabels"]
            assert selector == {**NAME_LABEL, "app.kubernetes.io/component": component}
            assert s.selects(selector, pod_labels)


def test_each_selector_picks_the_pods_of_one_component() -> None:
    pods = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"] for w in workloads()}
    selectors: list[tuple[str, dict[str, str]]] = []
    for resource in s.resources():
        if resource.kind == "Service":
            selectors.append((f"Service {resource.name}", resource.doc["spec"]["selector"]))
        elif resource.kind == "PodDisruptionBudget":
            selectors.append((f"PDB {resource.name}", resource.doc["spec"]["selector"]["matchLabels"]))
        elif resource.kind == "NetworkPolicy":
            selectors.append((f"NetworkPolicy {resource.name}", resource.doc["spec"]["podSelector"]["matchLabels"]))
    for what, selector in selectors:
        picked = [name for name, labels in pods.items() if s.selects(selector, labels)]
        component = selector.get("app.kubernetes.io/component")
        assert picked == [f"gateway-{component}"], f"{what} selects {picked}"


def test_pod_disruption_budgets_keep_a_control_plane_and_drain_workers_one_at_a_time() -> None:
    control_pdb = s.find("PodDisruptionBudget", "gateway-control")["spec"]
    assert control_pdb["minAvailable"] == 1 and control()["spec"]["replicas"] == 2
    assert s.find("PodDisruptionBudget", "gateway-worker")["spec"]["maxUnavailable"] == 1


def test_images_are_one_placeholder_for_the_gateway_and_the_peers_of_docker_compose() -> None:
    images = {spec["image"] for _, spec in all_containers()}
    assert images == {GATEWAY_IMAGE, KAMAILIO_IMAGE, REDIS_IMAGE}
    mapped = {entry["name"]: entry for entry in s.kustomization()["images"]}
    assert set(mapped) == {GATEWAY_IMAGE}, "the kustomization says where the gateway image is, in one place"
    compose_images = {
        svc["image"] for svc in s.load_yaml_documents(s.COMPOSE)[0]["services"].values() if "image" in svc
    }
    assert {KAMAILIO_IMAGE, REDIS_IMAGE} <= compose_images, "the same Kamailio and Redis as docker-compose.yml"


def test_every_container_runs_as_non_root_without_privileges() -> None:
    for workload, spec in all_containers():
        pod = s.pod_spec(workload)["securityContext"]
        where = f"{workload['metadata']['name']}/{spec['name']}"
        assert pod["runAsNonRoot"] is True, where
        assert int(pod["runAsUser"]) > 0 and int(pod["runAsGroup"]) > 0, where
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", where
        container = spec["securityContext"]
        assert container["allowPrivilegeEscalation"] is False, where
        assert container["capabilities"]["drop"] == ["ALL"] and "add" not in container["capabilities"], where
        assert container["readOnlyRootFilesystem"] is True, where
        assert "privileged" not in container, where
    for workload, _spec in gateway_containers():
        assert s.pod_spec(workload)["securityContext"]["runAsUser"] == 10001, "the image's gateway user"


def test_no_service_environment_links_reach_the_gateway_settings() -> None:
    # Kubernetes puts <SERVICE>_PORT=tcp://... and friends into every pod for each Service of the namespace;
    # a Service named like gateway-sip would set GATEWAY_SIP_PORT and stop the workers.
    for workload in workloads():
        assert s.pod_spec(workload)["enableServiceLinks"] is False, workload["metadata"]["name"]
    known = s.gateway_env_names() | s.PENDING_SETTINGS
    for resource in s.resources():
        if resource.kind == "Service":
            prefix = resource.name.upper().replace("-", "_")
            linked = {f"{prefix}_SERVICE_HOST", f"{prefix}_SERVICE_PORT", f"{prefix}_PORT"}
            assert not linked & known, f"Service {resource.name} would collide with {linked & known}"


# ------------------------------------------------------------------------------------------- settings and flags


def test_env_names_in_the_manifests_are_settings_the_gateway_reads() -> None:
    known = s.gateway_env_names() | s.PENDING_SETTINGS
    for workload, spec in all_containers():
        names = {item["name"] for item in spec.get("env", [])}
        allowed = known | HELPER_ENV
        if spec["image"] == KAMAILIO_IMAGE:
            allowed = HELPER_ENV | SYNC_ENV
        unknown = names - allowed
        assert not unknown, f"{workload['metadata']['name']}/{spec['name']}: {sorted(unknown)} are not settings"


def test_gateway_args_parse_with_the_real_cli() -> None:
    roles = {}
    for workload, spec in gateway_containers():
        args = parse_gateway_args(spec)
        roles[workload["metadata"]["name"]] = args.command
    assert roles == {"gateway-control": "control", "gateway-worker": "worker"}


def test_control_plane_runs_two_replicas_on_redis_with_the_routes_configmap(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = control_settings(monkeypatch)
    assert control()["spec"]["replicas"] == 2
    assert settings.redis_url is not None
    match = re.fullmatch(r"redis://([a-z0-9-]+):(\d+)/\d+", settings.redis_url)
    assert match, settings.redis_url
    redis_service = s.find("Service", match.group(1))
    assert int(match.group(2)) == redis_service["spec"]["ports"][0]["port"]
    assert settings.token, "the control plane binds 0.0.0.0, which needs GATEWAY_API_TOKEN"
    assert settings.http_host == "0.0.0.0"
    spec = s.container(control(), "control")
    assert port_numbers(spec) == {"http": settings.http_port}

    # GATEWAY_CONFIG is the routes ConfigMap's file, and that file is a valid routes config.
    assert settings.config is not None
    mounts = {m["name"]: m for m in spec["volumeMounts"]}
    volumes = {v["name"]: v for v in s.pod_spec(control())["volumes"]}
    routes_mount = next(m for m in mounts.values() if settings.config.startswith(m["mountPath"] + "/"))
    configmap = volumes[routes_mount["name"]]["configMap"]["name"]
    key = settings.config.removeprefix(routes_mount["mountPath"] + "/")
    generated = {g["name"]: g for g in s.kustomization()["configMapGenerator"]}
    sources = dict(entry.split("=", 1) for entry in generated[configmap]["files"])
    config = load_config(str(s.DEPLOY / sources[key]))
    assert [route.name for route in config.routes] == ["support", "default"]
    worker_capacity = float(s.container_env(s.container(worker(), "worker"))["GATEWAY_CAPACITY"])
    assert config.limits.max_calls <= worker()["spec"]["replicas"] * worker_capacity


def test_control_probes_hit_paths_the_app_serves_without_a_token() -> None:
    spec = s.container(control(), "control")
    client = TestClient(s.control_app())
    live = spec["livenessProbe"]["httpGet"]
    ready = spec["readinessProbe"]["httpGet"]
    assert (live["path"], ready["path"]) == ("/healthz", "/readyz")
    # Probes send no bearer token: the path must answer without one (200; /readyz 503 while no worker is up).
    assert client.get(live["path"]).status_code == 200
    assert client.get(ready["path"]).status_code in (200, 503)
    assert client.get(ready["path"]).json()["workers_up"] == 0
    for probe in (live, ready):
        assert resolve_port(spec, probe["port"]) == ControlSettings().http_port


def test_workers_register_through_a_service_that_lists_unready_control_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    args, _ = worker_settings(monkeypatch)
    match = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", args.control)
    assert match, args.control
    service = s.find("Service", match.group(1))
    # A control pod is ready only once a worker is up: the workers' way in must not wait for readiness.
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert s.selects(service["spec"]["selector"], control()["spec"]["template"]["metadata"]["labels"])
    (port,) = service["spec"]["ports"]
    assert int(match.group(2)) == port["port"]
    assert resolve_port(s.container(control(), "control"), port["targetPort"]) == 8080
    ops = s.find("Service", "gateway-control")
    assert "publishNotReadyAddresses" not in ops["spec"], "the ops Service sends traffic to ready pods only"


def test_worker_ports_match_its_settings_and_stay_clear_of_kernel_and_nodeport_ranges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args, settings = worker_settings(monkeypatch)
    spec = s.container(worker(), "worker")
    pod = s.pod_spec(worker())
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert settings.sip.sip_host == s.FIELD_VALUES["status.hostIP"] and args.api_host == settings.sip.sip_host
    assert settings.worker_id == s.FIELD_VALUES["metadata.name"], "one id per pod"
    assert port_numbers(spec, "UDP") == {"sip-udp": settings.sip.sip_port}
    assert port_numbers(spec, "TCP") == {"sip-tcp": settings.sip.sip_port, "api": args.api_port}
    assert set(settings.sip.sip_transports) == {"udp", "tcp"}
    for port in spec["ports"]:
        assert port["hostPort"] == port["containerPort"], "host network: the declared ports are the node's"
    low, high = settings.media.rtp_port_bounds
    assert (high - low + 1) // 2 >= 2 * settings.costs.capacity, "two RTP ports per call, with room to spare"
    assert high < 30000, "below the NodePort range (30000-32767) and the kernel's ephemeral ports (32768-)"
    kamailio_ports = {p["containerPort"] for spec in s.containers(kamailio()) for p in spec.get("ports", [])}
    assert settings.sip.sip_port not in kamailio_ports and args.api_port not in kamailio_ports, "may share a node"
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert resolve_port(spec, spec[probe]["httpGet"]["port"]) == args.api_port
        paths[probe] = spec[probe]["httpGet"]["path"]
        assert paths[probe] in s.worker_paths()
    assert paths == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    assert pod["nodeSelector"] == {"voice-gateway/media": "true"}


def test_worker_resources_are_one_guaranteed_core_for_its_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    _, settings = worker_settings(monkeypatch)
    resources = s.container(worker(), "worker")["resources"]
    assert resources["requests"] == resources["limits"], "Guaranteed QoS: a whole core with the static CPU manager"
    assert resources["requests"]["cpu"] == "1"
    assert settings.costs.capacity == CapacitySettings.model_fields["capacity"].default == 150


def test_workers_drain_before_they_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    args, _ = worker_settings(monkeypatch)
    spec = s.container(worker(), "worker")
    command = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"], command
    script = command[2].replace('"', "")
    env = s.container_env(spec)
    drain = re.fullmatch(r"exec (gateway drain --wait --api (\S+))", script.replace("${NODE_IP}", env["NODE_IP"]))
    assert drain, script
    assert drain.group(2) == f"http://{args.api_host}:{args.api_port}", "the drain asks this worker's own API"
    if "drain" in COMMANDS:
        build_parser().parse_args(drain.group(1).split()[1:])
    else:
        assert "drain" in s.PENDING_COMMANDS
    deadline = float(env.get("GATEWAY_DRAIN_DEADLINE_S", DEFAULT_DRAIN_DEADLINE_S))
    grace = s.pod_spec(worker())["terminationGracePeriodSeconds"]
    assert grace >= deadline + 30, "the grace period covers the drain deadline plus the goodbyes and BYEs"
    strategy = worker()["spec"]["strategy"]["rollingUpdate"]
    assert (strategy["maxSurge"], strategy["maxUnavailable"]) == (0, 1), "host ports: one worker per node"


def test_secrets_are_referenced_by_keys_of_the_template_and_the_template_is_fake() -> None:
    templates = s.secret_template()
    for name, data in templates.items():
        for key, value in data.items():
            assert value.startswith("REPLACE-ME"), f"{name}.{key} must be an obvious placeholder"
    for workload, spec in all_containers():
        for item in spec.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in templates[ref["name"]], (workload["metadata"]["name"], ref)
    for workload in workloads():
        for volume in s.pod_spec(workload).get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in templates
                assert volume["secret"]["optional"] is True, "SIP over TLS is optional"


# ---------------------------------------------------------------------------------------------------- Kamailio


def test_kamailio_runs_the_shipped_dispatcher_cfg_with_defines_it_declares() -> None:
    spec = s.container(kamailio(), "kamailio")
    argv = s.container_argv(spec)
    assert argv[:3] == ["kamailio", "-DD", "-E"], "in the foreground, logging to stderr"
    config_path = argv[argv.index("-f") + 1]
    mounts = {m["mountPath"]: m["name"] for m in spec["volumeMounts"]}
    mount_dir, _, filename = config_path.rpartition("/")
    volumes = {v["name"]: v for v in s.pod_spec(kamailio())["volumes"]}
    configmap = volumes[mounts[mount_dir]]["configMap"]["name"]
    generated = {g["name"]: g["files"] for g in s.kustomization()["configMapGenerator"]}
    sources = {entry.rpartition("/")[2]: s.DEPLOY / entry for entry in generated[configmap]}
    assert sources[filename] == s.DEPLOY / "kamailio" / "dispatcher.cfg"

    declared = set(re.findall(r"^#!trydef\s+(\w+)", sources[filename].read_text(), re.MULTILINE))
    defines = dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "-A")
    assert set(defines) <= declared, f"{set(defines) - declared} are not defines of dispatcher.cfg"
    assert defines["LISTEN"] == f"udp:{s.FIELD_VALUES['status.hostIP']}:5060"
    run_mount = next(m["mountPath"] for m in spec["volumeMounts"] if m["name"] == "run")
    assert defines["DS_LIST"] == f'"{run_mount}/dispatcher.list"'
    assert defines["CTL_SOCKET"] == f'"unix:{run_mount}/kamailio_ctl"'
    assert "emptyDir" in volumes["run"], "the list and the ctl socket live in a volume all containers share"
    for probe in ("livenessProbe", "readinessProbe"):
        assert spec[probe]["exec"]["command"] == ["kamcmd", "-s", f"unix:{run_mount}/kamailio_ctl", "core.uptime"]


def test_kamailio_dispatches_to_the_worker_service_on_the_workers_sip_port(monkeypatch: pytest.MonkeyPatch) -> None:
    _, settings = worker_settings(monkeypatch)
    kamailio_spec = s.container(kamailio(), "kamailio")
    defines = dict(a.split("=", 1) for a in s.container_argv(kamailio_spec) if "=" in a)
    for name in ("dispatcher-list", "dispatcher-sync"):
        spec = s.container(kamailio(), name)
        env = s.container_env(spec)
        assert spec["command"][:2] == ["sh", "/etc/kamailio/dispatcher-sync.sh"]
        assert int(env["WORKER_SIP_PORT"]) == settings.sip.sip_port
        assert f'"{env["DS_LIST_FILE"]}"' == defines["DS_LIST"]
        service = s.find("Service", env["WORKER_SERVICE"])
        assert service["spec"]["clusterIP"] == "None", "headless: its name resolves to every worker's address"
        assert "publishNotReadyAddresses" not in service["spec"], "only ready workers get calls"
        assert s.selects(service["spec"]["selector"], worker()["spec"]["template"]["metadata"]["labels"])
    assert s.container(kamailio(), "dispatcher-sync")["command"][2] == "watch"
    assert s.container(kamailio(), "dispatcher-list")["command"][2] == "once"
    assert (
        f'"unix:{s.container_env(s.container(kamailio(), "dispatcher-sync"))["CTL_SOCKET"][5:]}"'
        == (defines["CTL_SOCKET"])
    )
    pod = s.pod_spec(kamailio())
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert kamailio()["spec"]["strategy"]["type"] == "Recreate", "node port 5060 is held until the old pod is gone"


def test_the_routes_and_redis_manifests_hold_together() -> None:
    routes = tomllib.loads((s.K8S / "gateway.toml").read_text())
    assert routes["profiles"]["echo"]["provider"] == "echo"
    redis = s.container(s.find("Deployment", "gateway-redis"), "redis")
    assert redis["args"][:3] == ["redis-server", "--port", "6379"]
    assert {p["containerPort"] for p in redis["ports"]} == {6379}
    policy = s.find("NetworkPolicy", "gateway-redis")["spec"]
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]
    assert s.selects(peer["podSelector"]["matchLabels"], control()["spec"]["template"]["metadata"]["labels"])


# --------------------------------------------------------------------------------------- as kubectl renders it


def test_kubectl_renders_the_kustomization_with_the_shipped_files() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        unavailable("kubectl is not installed (it renders deploy/kustomization.yaml: kubectl kustomize deploy)")
    assert kubectl is not None
    result = subprocess.run([kubectl, "kustomize", str(s.DEPLOY)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    configmaps = {doc["metadata"]["name"].rsplit("-", 1)[0]: doc for doc in rendered if doc["kind"] == "ConfigMap"}
    kamailio_files = configmaps["gateway-kamailio"]["data"]
    assert kamailio_files["dispatcher.cfg"] == (s.DEPLOY / "kamailio" / "dispatcher.cfg").read_text()
    assert kamailio_files["dispatcher-sync.sh"] == (s.K8S / "dispatcher-sync.sh").read_text()
    assert configmaps["gateway-routes"]["data"]["gateway.toml"] == (s.K8S / "gateway.toml").read_text()

    image = s.kustomization()["images"][0]
    generated = {doc["metadata"]["name"] for doc in configmaps.values()}
    for doc in rendered:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "voice-gateway"
        if doc["kind"] != "Deployment":
            continue
        for spec in s.containers(doc):
            assert spec["image"] in {f"{image['newName']}:{image['newTag']}", KAMAILIO_IMAGE, REDIS_IMAGE}
        for volume in s.pod_spec(doc).get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in generated, "references follow the generated names"
