"""Checks manifests rendered from deploy/helm/moat (called by scripts/helm-check).

usage: helm_manifests.py MOAT_BINARY DEFAULT.yaml FULL.yaml
DEFAULT.yaml: `helm template` with the chart's values; FULL.yaml: with autoscaling,
serviceMonitor and tls on and a fixed adminToken.
"""
import base64
import os
import subprocess
import sys
import tempfile

import yaml


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def by_kind(docs):
    out = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def fail(msg):
    print(f"helm_manifests: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def check_common(moat, docs, name):
    k = by_kind(docs)
    for kind in ["Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"]:
        check(len(k.get(kind, [])) == 1, f"{name}: expected one {kind}, got {len(k.get(kind, []))}")
    dep = k["Deployment"][0]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}, f"{name}: liveness probe")
    check(c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}, f"{name}: readiness probe")
    sc = c["securityContext"]
    check(sc.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem")
    check(sc.get("runAsNonRoot") is True, f"{name}: container runAsNonRoot")
    check(sc.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation")
    check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: capabilities")
    psc = pod["securityContext"]
    check(psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0, f"{name}: pod non-root")
    check(c["args"][:3] == ["serve", "--config", "/etc/moat/moat.yaml"], f"{name}: args {c['args']}")
    env = {e["name"]: e for e in c["env"]}
    check(env["MOAT_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "admin-token", f"{name}: token env")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    check("/var/lib/moat" in mounts, f"{name}: writable data volume")
    vols = {v["name"]: v for v in pod["volumes"]}
    check("emptyDir" in vols["data"], f"{name}: data is an emptyDir")
    items = {i["path"]: i["key"] for i in vols["config"]["configMap"]["items"]}
    check("moat.yaml" in items, f"{name}: moat.yaml mounted")
    # The config: admin listener port agrees with the probes' named port.
    cm = k["ConfigMap"][0]["data"]
    cfg = yaml.safe_load(cm["moat.yaml"])
    admin_port = int(cfg["admin"]["address"].rsplit(":", 1)[1])
    check(admin_port == ports["admin"], f"{name}: admin port {admin_port} != containerPort {ports['admin']}")
    listen_port = int(cfg["listeners"][0]["address"].rsplit(":", 1)[1])
    check(listen_port == ports["http"], f"{name}: listener port {listen_port} != containerPort {ports['http']}")
    # The token is a reference, not a value.
    secret = k["Secret"][0]
    token = base64.b64decode(secret["data"]["admin-token"]).decode()
    check(len(token) >= 16, f"{name}: admin token too short")
    for key, text in cm.items():
        check(token not in text, f"{name}: the admin token is in ConfigMap key {key}")
    check(cfg["admin"]["token"] == "${MOAT_ADMIN_TOKEN}", f"{name}: admin.token {cfg['admin']['token']!r}")
    svc = k["Service"][0]
    check({p["targetPort"] for p in svc["spec"]["ports"]} == {"http", "admin"}, f"{name}: service ports")
    pdb = k["PodDisruptionBudget"][0]
    check(pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"], f"{name}: PDB selector")
    # The rendered config as moat loads it: ConfigMap files laid out as kubelet mounts them.
    with tempfile.TemporaryDirectory() as d:
        for path, key in items.items():
            os.makedirs(os.path.dirname(os.path.join(d, path)), exist_ok=True)
            with open(os.path.join(d, path), "w") as f:
                f.write(cm[key])
        envs = dict(os.environ, MOAT_ADMIN_TOKEN=token, MOAT_DATA_DIR=d)
        r = subprocess.run([moat, "check-config", os.path.join(d, "moat.yaml")], env=envs,
                           capture_output=True, text=True)
        check(r.returncode == 0, f"{name}: moat check-config: {r.stderr.strip()}")
    return k


def main():
    moat, default_path, full_path = sys.argv[1:4]
    d = check_common(moat, load(default_path), "default")
    check("HorizontalPodAutoscaler" not in d and "ServiceMonitor" not in d, "default: HPA/ServiceMonitor off")
    check(d["Deployment"][0]["spec"]["replicas"] == 2, "default: 2 replicas")
    f = check_common(moat, load(full_path), "full")
    check(len(f.get("HorizontalPodAutoscaler", [])) == 1, "full: HPA")
    check("replicas" not in f["Deployment"][0]["spec"], "full: replicas left to the HPA")
    hpa = f["HorizontalPodAutoscaler"][0]
    check(hpa["spec"]["scaleTargetRef"]["name"] == f["Deployment"][0]["metadata"]["name"], "full: HPA target")
    sm = f["ServiceMonitor"][0]
    ep = sm["spec"]["endpoints"][0]
    check(ep["port"] == "admin" and ep["path"] == "/metrics", "full: ServiceMonitor endpoint")
    check(ep["authorization"]["credentials"]["key"] == "admin-token", "full: ServiceMonitor token")
    data = f["Secret"][0]["data"]
    check(base64.b64decode(data["admin-token"]).decode() == "fixed-token-for-the-check", "full: adminToken")
    for key in ["tls.crt", "tls.key", "ca.crt"]:
        check(key in data, f"full: Secret {key}")
    print("helm_manifests: default and full renderings ok")


if __name__ == "__main__":
    main()
