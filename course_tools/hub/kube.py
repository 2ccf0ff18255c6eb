"""KubeSpawner, the spawner Zero to JupyterHub runs, configured from deploy/z2jh/values.yaml.

The Helm chart turns `singleuser:` of values.yaml into KubeSpawner's settings; this module does
the same translation for the settings the course uses, so the course can (1) run a hub with
KubeSpawner outside the chart (`jupyterhub -f` a config that calls `configure(c)`), and (2) build
offline the pod manifest KubeSpawner would submit for a learner (`pod_manifest`), which
tests/test_hub.py validates against Kubernetes' own schema and compares with the one-machine
hub's limits and hidden folders (`course_tools/hub/spawner.py`). What it reads:

    singleuser.image.name/tag             the learners' image (deploy/Dockerfile)
    singleuser.memory.limit/guarantee     mem_limit / mem_guarantee
    singleuser.cpu.limit/guarantee        cpu_limit / cpu_guarantee
    singleuser.extraEnv                   environment (the hand-in service's address)
    singleuser.defaultUrl, lifecycleHooks, uid, fsGid
    singleuser.storage                    the learner's home volume (dynamic: one claim each)
    singleuser.extraVolumes/Mounts        what learners must not see: the course's solutions/,
                                          tests/ and .git covered by an empty read-only volume
    singleuser.extraPodConfig             no Kubernetes API token in the learner's pod
    cull.timeout/every                    the idle culler's arguments
"""

from __future__ import annotations

from pathlib import Path

from course_tools.hub import COURSE_ROOT

VALUES = COURSE_ROOT / "deploy" / "z2jh" / "values.yaml"
IMAGE_COURSE_ROOT = "/srv/course"   # where deploy/Dockerfile puts the course in the image


def load_values(path: Path = VALUES) -> dict:
    import yaml

    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def spawner_settings(values: dict) -> dict:
    """KubeSpawner trait -> value, as the chart would set them from `values`."""
    user = values["singleuser"]
    image = user["image"]
    settings = {
        "image": f"{image['name']}:{image['tag']}",
        "mem_limit": user["memory"]["limit"],
        "mem_guarantee": user["memory"].get("guarantee"),
        "cpu_limit": float(user["cpu"]["limit"]),
        "cpu_guarantee": float(user["cpu"].get("guarantee") or 0) or None,
        "environment": dict(user.get("extraEnv") or {}),
        "default_url": user.get("defaultUrl", ""),
        "uid": user.get("uid", 1000),
        "fs_gid": user.get("fsGid", 100),
        "lifecycle_hooks": user.get("lifecycleHooks") or {},
        "extra_pod_config": user.get("extraPodConfig") or {},
        "cmd": user.get("cmd", ["jupyterhub-singleuser"]),
        "start_timeout": user.get("startTimeout", 300),
    }
    volumes = list(user.get("extraVolumes") or [])
    mounts = list(user.get("extraVolumeMounts") or [])
    storage = user.get("storage") or {}
    if storage.get("type") == "dynamic":   # the chart's defaults for a home per learner
        settings.update(storage_pvc_ensure=True, storage_capacity=storage["capacity"],
                        pvc_name_template="claim-{user_server}",
                        storage_access_modes=["ReadWriteOnce"])
        volumes.insert(0, {"name": "volume-{user_server}",
                           "persistentVolumeClaim": {"claimName": "{pvc_name}"}})
        mounts.insert(0, {"name": "volume-{user_server}",
                          "mountPath": storage.get("homeMountPath", "/home/jovyan")})
    settings.update(volumes=volumes, volume_mounts=mounts)
    return {k: v for k, v in settings.items() if v is not None}


def configure(c, values: dict | None = None) -> None:
    """Set a JupyterHub config `c` to spawn learners with KubeSpawner as values.yaml says."""
    values = load_values() if values is None else values
    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
    for name, value in spawner_settings(values).items():
        setattr(c.KubeSpawner, name, value)


def hidden_paths(values: dict) -> list[str]:
    """Course folders (relative to the course in the image) covered in the learner's pod."""
    user = values["singleuser"]
    covering = {v["name"] for v in user.get("extraVolumes") or [] if "emptyDir" in v}
    prefix = IMAGE_COURSE_ROOT.rstrip("/") + "/"
    return sorted(m["mountPath"].removeprefix(prefix) for m in user.get("extraVolumeMounts") or []
                  if m["name"] in covering and m["mountPath"].startswith(prefix))


# KubeSpawner loads a cluster's client settings when it is made: an offline one, never contacted
OFFLINE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: offline, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: offline, user: {token: offline}}]
contexts: [{name: offline, context: {cluster: offline, user: offline}}]
current-context: offline
"""


async def _manifest(values: dict, learner: str) -> dict:
    from kubernetes_asyncio.client import ApiClient
    from kubespawner import KubeSpawner
    from traitlets.config import Config

    c = Config()
    for name, value in spawner_settings(values).items():
        setattr(c.KubeSpawner, name, value)

    class User:   # what KubeSpawner reads of the hub's user object
        name = learner
        id = 1
        url = f"/user/{learner}/"
        escaped_name = learner

    class Hub:
        public_host = ""
        url = "http://hub:8081/hub/"
        base_url = "/hub/"
        api_url = "http://hub:8081/hub/api"

    spawner = KubeSpawner(_mock=True, config=c, user=User(), hub=Hub())
    spawner.api_token = "offline-manifest-token"
    pod = await spawner.get_pod_manifest()
    async with ApiClient() as api:
        return api.sanitize_for_serialization(pod)


def pod_manifest(learner: str = "ana", values: dict | None = None) -> dict:
    """The pod KubeSpawner would submit for `learner`, as plain data; no cluster needed (nothing
    is sent: KubeSpawner only reads an offline cluster's settings from a temporary file)."""
    import asyncio
    import tempfile

    from kubernetes_asyncio.config import kube_config

    values = load_values() if values is None else values
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "kubeconfig"
        config.write_text(OFFLINE_KUBECONFIG)
        before = kube_config.KUBE_CONFIG_DEFAULT_LOCATION   # read when KubeSpawner loads it
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(config)
        try:
            return asyncio.run(_manifest(values, learner))
        finally:
            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = before
