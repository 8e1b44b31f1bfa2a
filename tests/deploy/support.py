"""Reading the deployment files (deploy/k8s, deploy/kustomization.yaml, docker-compose.yml) for the deploy tests.

The checks compare these files with the code they deploy, so a renamed setting, flag, port or endpoint breaks a
test instead of a cluster: :func:`gateway_env_names` lists every environment variable the gateway reads (from its
pydantic settings classes), :func:`control_app` and :func:`worker_paths` the HTTP paths its apps serve.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
KUSTOMIZATION = DEPLOY / "kustomization.yaml"
COMPOSE = REPO / "docker-compose.yml"
SECRET_TEMPLATE = K8S / "secret.example.yaml"

# Settings being added beside this work (graceful drain, SIP over TLS, SRTP, trunk registration): the manifests
# and docs may name them before the code reads them. Once the code has them this set may be emptied; a name here
# that the code already reads does no harm.
PENDING_SETTINGS = frozenset(
    {
        "GATEWAY_SIP_TLS_CERT",
        "GATEWAY_SIP_TLS_KEY",
        "GATEWAY_SRTP",
        "GATEWAY_TRUNK_REGISTER",
    }
)
# Subcommands being added the same way (none at the moment).
PENDING_COMMANDS: frozenset[str] = frozenset()

# Modules whose import defines every settings class of the gateway (pydantic BaseSettings subclasses).
SETTINGS_MODULES = (
    "gateway.control.settings",
    "gateway.control.webrtc_api",
    "gateway.worker.settings",
    "gateway.worker.webrtc",
    "gateway.providers.registry",
    "gateway.commands.worker",
    "gateway.commands.control",
    "gateway.commands.run",
)

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def kustomization() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(KUSTOMIZATION.read_text())
    return loaded


def manifest_files() -> list[Path]:
    """The resources the kustomization applies, in its order."""
    return [DEPLOY / name for name in kustomization()["resources"]]


@dataclass(frozen=True, kw_only=True)
class Resource:
    path: Path
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])


def resources() -> list[Resource]:
    return [Resource(path=path, doc=doc) for path in manifest_files() for doc in load_yaml_documents(path)]


def find(kind: str, name: str) -> dict[str, Any]:
    matches = [r.doc for r in resources() if r.kind == kind and r.name == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def pod_spec(workload: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: Mapping[str, Any], *, init: bool = True) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return [*(spec.get("initContainers", []) if init else []), *spec["containers"]]


def container(workload: Mapping[str, Any], name: str) -> dict[str, Any]:
    matches = [c for c in containers(workload) if c["name"] == name]
    assert len(matches) == 1, f"expected one container {name}"
    return matches[0]


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def secret_template() -> dict[str, dict[str, str]]:
    """Secret name -> its placeholder stringData."""
    return {doc["metadata"]["name"]: doc["stringData"] for doc in load_yaml_documents(SECRET_TEMPLATE)}


def expand(text: str, values: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in env values, command and args (an unknown name stays as written)."""
    return _VAR.sub(lambda m: values.get(m.group(1), m.group(0)), text)


FIELD_VALUES = {
    "status.hostIP": "192.0.2.10",
    "status.podIP": "192.0.2.10",
    "metadata.name": "gateway-worker-5d8f7c9b6-x2x9z",
}


def container_env(spec: Mapping[str, Any]) -> dict[str, str]:
    """The environment a container gets, as the kubelet builds it: literal values, downward-API fields (with
    example values), keys of the Secret template, and $(VAR) expanded from the variables defined before."""
    secrets = secret_template()
    env: dict[str, str] = {}
    for item in spec.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[item["name"]] = FIELD_VALUES[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            if ref.get("optional") and ref["key"] not in secrets[ref["name"]]:
                continue  # an optional key the Secret does not hold: the kubelet leaves the variable unset
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
        else:
            raise AssertionError(f"unexpected env source {source}")
    return env


def container_argv(spec: Mapping[str, Any], *, entrypoint: tuple[str, ...] = ()) -> list[str]:
    """command + args with $(VAR) expanded; ``entrypoint`` stands in for the image's when command is unset."""
    env = container_env(spec)
    argv = [*spec.get("command", entrypoint), *spec.get("args", [])]
    return [expand(str(arg), env) for arg in argv]


def _settings_classes() -> Iterator[type]:
    from pydantic_settings import BaseSettings

    for module in SETTINGS_MODULES:
        importlib.import_module(module)
    pending: list[type] = [BaseSettings]
    seen: set[type] = set()
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                pending.append(sub)
                if sub.__module__.startswith("gateway."):
                    yield sub


def gateway_env_names() -> frozenset[str]:
    """Every environment variable a gateway process reads: the fields of its settings classes (prefix + name, or
    their aliases) and GATEWAY_COMPILED, which `import gateway` reads itself."""
    from pydantic import AliasChoices

    from gateway.compiled import ENV as COMPILED_ENV

    names = {COMPILED_ENV}
    for cls in _settings_classes():
        prefix = str(cls.model_config.get("env_prefix", ""))  # type: ignore[attr-defined]
        for field_name, field in cls.model_fields.items():  # type: ignore[attr-defined]
            alias = field.validation_alias
            if isinstance(alias, AliasChoices):
                names.update(str(choice).upper() for choice in alias.choices if isinstance(choice, str))
            elif isinstance(alias, str):
                names.add(alias.upper())
            else:
                names.add(f"{prefix}{field_name}".upper())
    return frozenset(names)


def control_app() -> Any:
    """The control-plane app as `gateway control` builds it (create_app), with the built-in routes."""
    from gateway.control.app import create_app
    from gateway.control.settings import ControlSettings

    return create_app(ControlSettings(api_token="x" * 24), sweeper=False)


def worker_paths() -> frozenset[str]:
    """Paths the worker's API serves: its command router, its open health paths, and /metrics, which `gateway
    worker` adds beside them."""
    from gateway.fleet.worker_api import worker_api, worker_health

    router = worker_api(commands=object(), token="x" * 24)  # type: ignore[arg-type]
    health = worker_health(lambda: {"ready": True})
    return frozenset({*(getattr(route, "path", "") for route in [*router.routes, *health.routes]), "/metrics"})
