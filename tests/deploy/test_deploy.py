"""Deployment files (Dockerfile, KServe manifests, Helm chart) checked as far as this machine allows: no Docker engine
and no helm here (docs/deploy.md says what that leaves unchecked). The Helm templates are rendered by a plain value
substitution (they use nothing but {{ .Values.x }} and {{ .Release.Name }}), the Kubernetes objects are validated
against the Kubernetes schemas (kubernetes-validate), every osprey-server flag they pass must exist, and the runtime
image's packages must provide every shared library the server binary links."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S_VERSION = "1.30.0"


def server_help():
    binary = Path(os.environ.get("OSPREY_BIN", REPO / "build" / "bin" / "osprey")).parent / "osprey-server"
    if not binary.is_file():
        pytest.fail(f"{binary} missing: `make build` (or `make server`) first", pytrace=False)
    return subprocess.run([str(binary), "--help"], capture_output=True, text=True, check=True).stdout, binary


def check_flags(args, where):
    text, _ = server_help()
    known = set(re.findall(r"(--[a-z][a-z-]+)", text))
    for arg in args:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            assert flag in known, f"{where}: {flag} is not an osprey-server flag"


def render(template: str, values: dict, release="test") -> str:
    def lookup(match):
        path = match.group(1).split(".")
        if path[0] == "Release" and path[1] == "Name":
            return release
        assert path[0] == "Values", match.group(0)
        v = values
        for key in path[1:]:
            assert key in v, f"{match.group(0)}: no such value in values.yaml"
            v = v[key]
        return str(v)

    out = re.sub(r"\{\{\s*\.([A-Za-z0-9_.]+)\s*\}\}", lookup, template)
    assert "{{" not in out, "a template uses more than value substitution; render it with helm"
    return out


def validate(obj):
    import kubernetes_validate

    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_helm_chart_renders_valid_objects():
    chart = DEPLOY / "helm" / "osprey"
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["name"] == "osprey"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    kinds = []
    for template in sorted((chart / "templates").glob("*.yaml")):
        obj = yaml.safe_load(render(template.read_text(), values))
        validate(obj)
        kinds.append(obj["kind"])
        if obj["kind"] == "Deployment":
            container = obj["spec"]["template"]["spec"]["containers"][0]
            check_flags(container["args"], template.name)
            assert "--memory-budget=2G" in container["args"]
    assert sorted(kinds) == ["Deployment", "Service"]


def test_kserve_manifests():
    runtime = yaml.safe_load((DEPLOY / "kserve" / "servingruntime.yaml").read_text())
    service = yaml.safe_load((DEPLOY / "kserve" / "inferenceservice.yaml").read_text())
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1" and runtime["kind"] == "ServingRuntime"
    assert service["apiVersion"] == "serving.kserve.io/v1beta1" and service["kind"] == "InferenceService"
    assert service["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert service["spec"]["predictor"]["model"]["modelFormat"]["name"] in formats
    container = runtime["spec"]["containers"][0]
    assert container["name"] == "kserve-container"  # the name KServe looks for
    check_flags(container["args"], "servingruntime.yaml")
    assert "--port=8080" in container["args"] and "--host=0.0.0.0" in container["args"]
    # The container part is a Kubernetes Container: validate it inside a Pod.
    validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": {"containers": [container]}})


def test_dockerfile_runtime_has_every_shared_library():
    text = (REPO / "Dockerfile").read_text()
    stages = text.split("FROM ")
    runtime = next(s for s in stages if s.startswith("debian:12 AS runtime"))
    packages = set(re.findall(r"\b(lib[a-z0-9+.-]+|ocl-icd-libopencl1|zlib1g|curl)\b", runtime.split("rm -rf")[0]))
    _, binary = server_help()
    if not shutil.which("dpkg"):
        pytest.skip("dpkg not available to map libraries to packages")
    needed, copied = set(), set()
    for line in subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout.splitlines():
        m = re.search(r"(\S+) => (\S+)", line)
        if not m:
            continue
        for path in (os.path.realpath(m.group(2)), m.group(2)):  # dpkg knows one of them (merged /usr)
            owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
            if owner.returncode == 0:
                needed.add(owner.stdout.split(":")[0])
                break
        else:
            if not re.match(r"/(usr/)?lib", os.path.realpath(m.group(2))):
                copied.add(m.group(1))  # not from a Debian package (oneDNN 3 from PyPI): the runtime stage copies it
    assert "libdnnl.so.3" in copied
    copies = re.findall(r"^COPY --from=build (\S+) (\S+)", runtime, re.M)
    for soname in copied:
        assert any(Path(dst).name == soname for _, dst in copies), f"runtime stage does not copy {soname}"
    needed -= {"libc6", "libstdc++6", "libgcc-s1"}  # in every Debian image
    assert needed <= packages, f"runtime stage lacks {sorted(needed - packages)}"
    cmd = re.search(r'CMD \[(.*?)\]', text, re.S).group(1)
    check_flags([a.strip().strip('"') for a in cmd.replace("\\\n", "").split(",")], "Dockerfile CMD")
    assert '"--host", "0.0.0.0"' in text and "USER 10001" in text and "HEALTHCHECK" in text
