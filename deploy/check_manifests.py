#!/usr/bin/env python3
"""Offline checks of deploy/k8s beyond YAML syntax: the fields Kubernetes
requires of each kind used, selectors that select their own pods, and what
fusor needs (resources on every container, health probes on the
scheduler: gRPC, or `fusor ... health` where TLS is on; one nvidia.com/gpu
per GPU worker; every file a flag names under a mounted volume, every
mounted volume declared; images with a version tag, a numeric user behind runAsNonRoot; the Dockerfiles'
numeric USER and HEALTHCHECK). Exits 1 listing every problem."""
import pathlib
import sys

import yaml

problems = []


def need(cond, where, what):
    if not cond:
        problems.append(f"{where}: {what}")


def check_pod(where, spec, labels, claims):
    containers = spec.get("containers") or []
    need(containers, where, "no containers")
    pod_security = spec.get("securityContext") or {}
    for c in containers:
        cw = f"{where} container {c.get('name', '?')}"
        need(c.get("name"), cw, "no name")
        need(c.get("image"), cw, "no image")
        image = str(c.get("image", ""))
        tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
        need(tag and tag != "latest", cw, f"image {image} has no version tag")
        security = {**pod_security, **(c.get("securityContext") or {})}
        # The kubelet verifies runAsNonRoot only against a numeric user (the image's USER name is refused).
        need(not security.get("runAsNonRoot") or isinstance(security.get("runAsUser"), int), cw,
             "runAsNonRoot without a numeric runAsUser")
        res = c.get("resources") or {}
        need(res.get("requests") or res.get("limits"), cw, "no resource requests or limits")
        mounts = {m.get("name"): m.get("mountPath", "") for m in c.get("volumeMounts") or []}
        declared = {v.get("name") for v in spec.get("volumes") or []} | claims
        for name in mounts:
            need(name in declared, cw, f"mounts volume {name}, which is not declared")
        args = [str(a) for a in c.get("args") or []]
        for flag, value in zip(args, args[1:]):
            if flag in FILE_FLAGS:
                need(any(value.startswith(p.rstrip("/") + "/") for p in mounts.values()), cw,
                     f"{flag} {value} is not under a mounted volume")
    return containers


FILE_FLAGS = {"--tls-cert", "--tls-key", "--tls-client-ca", "--tls-ca", "--db"}


def health_probe(probe):
    if "grpc" in probe:
        return True
    command = (probe.get("exec") or {}).get("command") or []
    return bool(command) and command[0] == "fusor" and command[-1] == "health"


for path in sorted(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "deploy/k8s").glob("*.yaml")):
    for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
        if doc is None:
            continue
        kind = doc.get("kind")
        where = f"{path}[{i}] {kind} {doc.get('metadata', {}).get('name', '?')}"
        need(doc.get("apiVersion"), where, "no apiVersion")
        need(kind, where, "no kind")
        need(doc.get("metadata", {}).get("name"), where, "no metadata.name")
        spec = doc.get("spec") or {}
        if kind in ("Deployment", "StatefulSet"):
            need(doc.get("apiVersion") == "apps/v1", where, "apiVersion is not apps/v1")
            selector = (spec.get("selector") or {}).get("matchLabels") or {}
            template = spec.get("template") or {}
            labels = (template.get("metadata") or {}).get("labels") or {}
            need(selector, where, "no selector.matchLabels")
            need(all(labels.get(k) == v for k, v in selector.items()), where, "the selector does not match the pod labels")
            claims = {(t.get("metadata") or {}).get("name") for t in spec.get("volumeClaimTemplates") or []}
            containers = check_pod(where, template.get("spec") or {}, labels, claims)
            if kind == "StatefulSet":
                need(spec.get("serviceName"), where, "no serviceName")
                need(spec.get("replicas", 1) == 1, where, "the scheduler owns its database: one replica")
                for c in containers:
                    for probe in ("readinessProbe", "livenessProbe"):
                        need(health_probe(c.get(probe) or {}), where, f"no health {probe} (gRPC or fusor health)")
            if "worker" in doc["metadata"]["name"]:
                for c in containers:
                    gpus = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
                    need(gpus == 1, where, "a GPU worker must request exactly one nvidia.com/gpu")
                need((template.get("spec") or {}).get("nodeSelector"), where, "no nodeSelector for the GPU model")
        elif kind == "Service":
            need(spec.get("selector"), where, "no selector")
            for p in spec.get("ports") or []:
                need(isinstance(p.get("port"), int), where, f"port {p.get('name')} has no number")
        else:
            problems.append(f"{where}: kind {kind} is not checked; add it to deploy/check_manifests.py")

# The images the manifests run: a numeric USER (runAsNonRoot), and a health check where a port is served.
for dockerfile in sorted(pathlib.Path(__file__).resolve().parent.joinpath("container").glob("*.Dockerfile")):
    lines = [line.strip() for line in dockerfile.read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    need(users and users[-1].split(":")[0].isdigit(), dockerfile.name, "the last USER is not numeric")
    if any(line.startswith("EXPOSE ") for line in lines):
        need(any(line.startswith("HEALTHCHECK ") for line in lines), dockerfile.name, "serves a port, no HEALTHCHECK")

for p in problems:
    print(p)
sys.exit(1 if problems else 0)
