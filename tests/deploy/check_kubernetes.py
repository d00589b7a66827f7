#!/usr/bin/env python3
"""The Kubernetes examples (scripts/deploy/kubernetes), without a cluster (kubectl needs one).

    check_kubernetes.py --manifests DIR --sidecar tensorlane-sidecar --cli tensorlane

Parses every YAML document (python3-yaml; exits 77, skipped, without it), rejects fields the
Kubernetes API does not have in the objects used here (what `kubectl apply` would refuse), and
checks what the deployment depends on:
  - the DaemonSet: hostNetwork, /dev/infiniband from the host, privileged or IPC_LOCK, the
    host-path socket directory, the key Secret mounted 0600, a memory limit (the workers' host
    buffers are the sidecar's memfds), and each node's config chosen by $(NODE_NAME);
  - every config in the ConfigMap passes the built `tensorlane-sidecar --check-config` with a key
    made by the built `tensorlane keygen`, is named after its [node] name, puts the socket in the
    mounted directory, and the nodes list each other;
  - the worker pod mounts only the socket directory: no /dev/infiniband, no privilege, no added
    capability, its runAsGroup in every config's allowed_gids, TENSORLANE_SOCKET = the socket.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("skipped: python3-yaml is not installed (apt-get install python3-yaml)")
    sys.exit(77)

from checks import check, failures


# Fields of the Kubernetes API (core/v1, apps/v1) for the objects these examples use. A field
# outside these is a typo that the API server would reject (kubectl's strict validation).
FIELDS = {
    "object": {"apiVersion", "kind", "metadata", "spec", "data", "stringData", "type"},
    "metadata": {"name", "namespace", "labels", "annotations"},
    "daemonset.spec": {"selector", "template", "updateStrategy", "minReadySeconds",
                       "revisionHistoryLimit"},
    "template": {"metadata", "spec"},
    "pod.spec": {"containers", "initContainers", "volumes", "nodeSelector", "hostNetwork",
                 "hostPID", "hostIPC", "dnsPolicy", "securityContext", "tolerations", "affinity",
                 "serviceAccountName", "priorityClassName", "terminationGracePeriodSeconds",
                 "restartPolicy", "nodeName", "runtimeClassName"},
    "container": {"name", "image", "command", "args", "env", "envFrom", "ports", "resources",
                  "securityContext", "volumeMounts", "volumeDevices", "readinessProbe",
                  "livenessProbe", "startupProbe", "imagePullPolicy", "workingDir", "lifecycle"},
    "securityContext": {"privileged", "runAsUser", "runAsGroup", "runAsNonRoot", "capabilities",
                        "allowPrivilegeEscalation", "readOnlyRootFilesystem", "seccompProfile",
                        "seLinuxOptions", "procMount"},
    "podSecurityContext": {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup",
                           "supplementalGroups", "seccompProfile", "seLinuxOptions", "sysctls",
                           "fsGroupChangePolicy"},
    "capabilities": {"add", "drop"},
    "volumeMount": {"name", "mountPath", "readOnly", "subPath", "mountPropagation"},
    "volume": {"name", "hostPath", "configMap", "secret", "emptyDir", "persistentVolumeClaim"},
    "hostPath": {"path", "type"},
    "secret": {"secretName", "defaultMode", "items", "optional"},
    "configMap": {"name", "defaultMode", "items", "optional"},
    "emptyDir": {"medium", "sizeLimit"},
    "env": {"name", "value", "valueFrom"},
    "probe": {"exec", "httpGet", "tcpSocket", "initialDelaySeconds", "periodSeconds",
              "timeoutSeconds", "failureThreshold", "successThreshold"},
}
HOSTPATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket",
                  "CharDevice", "BlockDevice"}


def fields(obj, kind, where):
    unknown = set(obj) - FIELDS[kind]
    check(not unknown, f"{where}: only {kind} fields" + (f" (unknown: {sorted(unknown)})" if unknown else ""))


def check_pod_spec(spec, where):
    fields(spec, "pod.spec", where)
    if "securityContext" in spec:
        fields(spec["securityContext"], "podSecurityContext", where + ".securityContext")
    names = set()
    for v in spec.get("volumes", []):
        fields(v, "volume", f"{where} volume {v.get('name')}")
        names.add(v["name"])
        for k in ("hostPath", "secret", "configMap", "emptyDir"):
            if k in v:
                fields(v[k], k, f"{where} volume {v['name']}.{k}")
        if "hostPath" in v:
            check(v["hostPath"].get("type", "") in HOSTPATH_TYPES,
                  f"{where} volume {v['name']}: hostPath type {v['hostPath'].get('type')!r}")
    mounted = set()
    for c in spec["containers"]:
        cw = f"{where} container {c.get('name')}"
        fields(c, "container", cw)
        if "securityContext" in c:
            fields(c["securityContext"], "securityContext", cw + ".securityContext")
            if "capabilities" in c["securityContext"]:
                fields(c["securityContext"]["capabilities"], "capabilities", cw + ".capabilities")
        for e in c.get("env", []):
            fields(e, "env", f"{cw} env {e.get('name')}")
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in c:
                fields(c[probe], "probe", f"{cw}.{probe}")
        for m in c.get("volumeMounts", []):
            fields(m, "volumeMount", f"{cw} mount {m.get('mountPath')}")
            check(m["name"] in names, f"{cw}: mount {m['mountPath']} names a volume of the pod")
            mounted.add(m["name"])
    check(mounted == names, f"{where}: every volume is mounted ({sorted(names - mounted)} unused)"
          if mounted != names else f"{where}: every volume is mounted")


def mounts(container, volumes):
    """mountPath -> volume, for one container."""
    by_name = {v["name"]: v for v in volumes}
    return {m["mountPath"]: (m, by_name.get(m["name"], {})) for m in container.get("volumeMounts", [])}


def check_configs(configmap, sidecar, cli, key_mount, sock_dir):
    """Runs --check-config on each node's file; returns {node name: resolved config}."""
    resolved = {}
    with tempfile.TemporaryDirectory(prefix="tl-k8s-") as tmp:
        key = os.path.join(tmp, "peer.key")
        r = subprocess.run([cli, "keygen", key], capture_output=True, text=True)
        check(r.returncode == 0, "tensorlane keygen makes the Secret's key" + ("" if r.returncode == 0 else ": " + r.stderr))
        for file_name, text in configmap["data"].items():
            check(file_name.endswith(".toml"), f"ConfigMap key {file_name} is a .toml file")
            path = os.path.join(tmp, file_name)
            key_in_file = os.path.join(key_mount, "peer.key")
            check(f'peer_key_file = "{key_in_file}"' in text, f"{file_name}: peer_key_file is the mounted Secret ({key_in_file})")
            with open(path, "w") as f:
                f.write(text.replace(f'"{key_in_file}"', json.dumps(key)))
            r = subprocess.run([sidecar, "--check-config", path, "--json"], capture_output=True, text=True)
            if not check(r.returncode == 0, f"{file_name} passes tensorlane-sidecar --check-config"
                         + ("" if r.returncode == 0 else ":\n" + r.stderr)):
                continue
            cfg = json.loads(r.stdout)
            name = cfg["node"]["name"]
            check(file_name == name + ".toml", f"{file_name} is named after its [node] name {name!r} (= the Kubernetes node)")
            check(os.path.dirname(cfg["node"]["socket"]) == sock_dir,
                  f"{file_name}: the socket {cfg['node']['socket']} is in the host-path directory {sock_dir}")
            check(not cfg["node"]["listen"].startswith("127."), f"{file_name}: listens on the host's address {cfg['node']['listen']}")
            resolved[name] = cfg
    for name, cfg in resolved.items():
        for peer in cfg["peers"]:
            other = resolved.get(peer["name"])
            check(other is not None and other["node"]["listen"] == peer["address"],
                  f"{name} lists {peer['name']} at {peer['address']}, where {peer['name']} listens")
    # Nodes of an etcd directory find each other only when they share its endpoints and cluster.
    directories = {(tuple(c["directory"].get("endpoints", [])), c["directory"].get("cluster"))
                   for c in resolved.values() if c.get("directory", {}).get("kind") == "etcd"}
    check(len(directories) <= 1, f"the nodes' etcd directories are one (endpoints, cluster): {sorted(directories)}")
    return resolved


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifests", required=True)
    ap.add_argument("--sidecar", required=True)
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()

    docs = []
    for path in sorted(glob.glob(os.path.join(args.manifests, "*.yaml"))):
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if d is not None:
                    docs.append((os.path.basename(path), d))
    check(len(docs) >= 4, f"{len(docs)} YAML documents parse")
    for file_name, d in docs:
        where = f"{file_name}: {d.get('kind')}/{d.get('metadata', {}).get('name')}"
        fields(d, "object", where)
        fields(d.get("metadata", {}), "metadata", where + " metadata")
        check(bool(d.get("apiVersion")) and bool(d.get("kind")) and bool(d["metadata"].get("name")),
              f"{where}: apiVersion, kind and metadata.name are set")

    by_kind = {}
    for _f, d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    ds = by_kind["DaemonSet"][0]
    cm = by_kind["ConfigMap"][0]
    pod = by_kind["Pod"][0]

    # --- the sidecar's DaemonSet
    fields(ds["spec"], "daemonset.spec", "DaemonSet spec")
    fields(ds["spec"]["template"], "template", "DaemonSet template")
    check(ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items(),
          "DaemonSet: the selector matches the template's labels")
    spec = ds["spec"]["template"]["spec"]
    check_pod_spec(spec, "DaemonSet")
    check(spec.get("hostNetwork") is True, "DaemonSet: hostNetwork (RoCE GIDs and the bootstrap address are the host's)")
    check(spec.get("dnsPolicy") == "ClusterFirstWithHostNet", "DaemonSet: dnsPolicy ClusterFirstWithHostNet with hostNetwork")
    c = spec["containers"][0]
    sc = c.get("securityContext", {})
    caps = set(sc.get("capabilities", {}).get("add", []))
    check(sc.get("privileged") is True or "IPC_LOCK" in caps, "DaemonSet: privileged or IPC_LOCK (memlock for RDMA registration)")
    check("IPC_LOCK" in caps and "CHOWN" in caps, "DaemonSet: IPC_LOCK and CHOWN named (what remains without privileged)")
    m = mounts(c, spec["volumes"])
    ib = m.get("/dev/infiniband", ({}, {}))[1]
    check(ib.get("hostPath", {}).get("path") == "/dev/infiniband", "DaemonSet: /dev/infiniband from the host")
    sock = m.get("/run/tensorlane", ({}, {}))
    check(sock[1].get("hostPath", {}).get("path") == "/run/tensorlane" and not sock[0].get("readOnly"),
          "DaemonSet: /run/tensorlane is the host's directory, writable (the socket is made there)")
    key_mount = [p for p, (_mm, v) in m.items() if "secret" in v]
    check(len(key_mount) == 1, "DaemonSet: the key Secret is mounted once")
    secret = m[key_mount[0]][1]["secret"] if key_mount else {}
    check(secret.get("defaultMode") == 0o600, f"DaemonSet: the key is mounted mode 0600 (defaultMode {secret.get('defaultMode')})")
    check("fsGroup" not in spec.get("securityContext", {}), "DaemonSet: no fsGroup (it would make the key group-readable)")
    check(bool(c.get("resources", {}).get("limits", {}).get("memory")),
          "DaemonSet: a memory limit (sized for the workers' host buffers)")
    cfg_mount = [p for p, (_mm, v) in m.items() if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
    check(len(cfg_mount) == 1, "DaemonSet: the ConfigMap is mounted")
    env = {e["name"]: e for e in c.get("env", [])}
    check(env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
          "DaemonSet: NODE_NAME is the pod's node")
    check(cfg_mount and c.get("args") == ["--config", f"{cfg_mount[0]}/$(NODE_NAME).toml"],
          "DaemonSet: runs --config <ConfigMap>/$(NODE_NAME).toml")
    check(c.get("command") == ["tensorlane-sidecar"], "DaemonSet: runs tensorlane-sidecar in the foreground")

    # --- the configs
    resolved = check_configs(cm, args.sidecar, args.cli, key_mount[0] if key_mount else "", "/run/tensorlane")
    check(len(resolved) >= 2, f"the ConfigMap holds a config per node ({sorted(resolved)})")

    # --- the worker pod
    spec = pod["spec"]
    check_pod_spec(spec, "Pod")
    vols = spec.get("volumes", [])
    check(len(vols) == 1 and vols[0].get("hostPath", {}).get("path") == "/run/tensorlane",
          "worker: its only volume is the host's /run/tensorlane")
    check(not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"),
          "worker: no host network, PID or IPC namespace")
    c = spec["containers"][0]
    sc = c.get("securityContext", {})
    check(not sc.get("privileged"), "worker: not privileged")
    check(not sc.get("capabilities", {}).get("add"), "worker: no capability added (no IPC_LOCK)")
    check(sc.get("capabilities", {}).get("drop") == ["ALL"], "worker: drops all capabilities")
    check(sc.get("allowPrivilegeEscalation") is False, "worker: no privilege escalation")
    check(all(not p.startswith("/dev/infiniband") for p in mounts(c, vols)), "worker: no /dev/infiniband")
    check(not c.get("volumeDevices"), "worker: no devices")
    psc = spec.get("securityContext", {})
    gids = {psc["runAsGroup"]} if "runAsGroup" in psc else set()
    gids |= set(psc.get("supplementalGroups", []))
    check(all(gids & set(cfg["security"]["allowed_gids"]) for cfg in resolved.values()) and gids,
          f"worker: one of its gids {sorted(gids)} is in every node's allowed_gids")
    check(spec.get("securityContext", {}).get("runAsNonRoot") is True, "worker: runs as non-root")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    sockets = {cfg["node"]["socket"] for cfg in resolved.values()}
    check(sockets == {env.get("TENSORLANE_SOCKET")}, f"worker: TENSORLANE_SOCKET {env.get('TENSORLANE_SOCKET')} is the sidecars' socket")
    m = mounts(c, vols)
    check(list(m) == ["/run/tensorlane"] and m["/run/tensorlane"][0].get("readOnly") is True,
          "worker: mounts the socket directory read-only (connecting needs no write access)")

    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
