"""The Helm chart lints, renders, and agrees with the service: probes on its endpoints and port, a drain grace
shorter than Kubernetes' kill timer, a locked-down pod, real setting names, and secrets only by reference.

Needs helm (`deploy/helm/install-helm.sh` builds it into .cache/bin); no cluster.
"""

from __future__ import annotations

import base64
import math
import re
import subprocess
from typing import Any

import pytest
import yaml

from message_history.settings import Settings
from tests.unit.deploy_support import (
    CHART,
    KUBERNETES_ENV,
    SERVICE_ENV_PREFIXES,
    VALUES_ALL_ON,
    Doc,
    config_map,
    env_names,
    load_yaml,
    of_kind,
    pod_docs,
    pod_spec,
    render,
    render_text,
    require_helm,
    require_tool,
    run_helm,
    setting_default,
    settings_env_names,
)

ALL_ON = ("-f", str(VALUES_ALL_ON))
# Value sets rendered by most tests: the defaults, every option on, and the shapes the options switch between.
CASES: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "all-on": ALL_ON,
    "statefulset": ("--set", "workload.kind=StatefulSet"),
    "split": ("--set", "paths=split"),
    "hpa-on-lag": ("--set", "autoscaling.enabled=true,autoscaling.lag.enabled=true"),
    "custom-port-and-grace": ("--set", "config.httpPort=9100,config.shutdownGraceSeconds=61.5"),
}
CASE_PARAMS = [pytest.param(args, id=name) for name, args in CASES.items()]
LIVENESS_PATH = "/livez"
# Objects of CRDs (Prometheus Operator, KEDA): kubecheck has no Go type for them.
CUSTOM_RESOURCES = frozenset({"ServiceMonitor", "ScaledObject", "PrometheusRule"})
READINESS_PATH = "/readyz"
# Settings the chart fills from other values than `config` (endpoints, security, downward API).
SET_OUTSIDE_CONFIG = {
    "kafka_bootstrap_servers",
    "mongodb_uri",
    "mongodb_database",
    "kafka_security_protocol",
    "kafka_sasl_mechanism",
    "kafka_sasl_username",
    "kafka_sasl_password",
    "kafka_ssl_cafile",
    "message_id_key",
    "message_id_previous_keys",
    "group_instance_id",
}


@pytest.fixture(scope="module")
def helm() -> str:
    return require_helm()


def _workloads(docs: tuple[Doc, ...]) -> list[Doc]:
    return of_kind(docs, "Deployment", "StatefulSet")


def _service_container(workload: Doc) -> Doc:
    (container,) = pod_spec(workload)["containers"]
    return dict(container)


def _http_port(docs: tuple[Doc, ...]) -> int:
    """The port the service listens on, as the ConfigMap tells it (the service's default if unset)."""
    configured = config_map(docs).get("MESSAGE_HISTORY_HTTP_PORT")
    return int(configured) if configured is not None else int(setting_default("http_port"))


def _drain_grace(docs: tuple[Doc, ...]) -> float:
    configured = config_map(docs).get("MESSAGE_HISTORY_SHUTDOWN_GRACE_S")
    return float(configured) if configured is not None else float(setting_default("shutdown_grace_s"))


# --- lint and render ------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [pytest.param((), id="defaults"), pytest.param(ALL_ON, id="all-on")])
def test_helm_lint_passes_strict(helm: str, args: tuple[str, ...]) -> None:
    """`helm lint --strict` finds no error or warning, with the defaults and with every option on."""
    result = run_helm(helm, "lint", "--strict", str(CHART), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("args", CASE_PARAMS)
def test_helm_template_renders_a_workload_per_path(helm: str, args: tuple[str, ...]) -> None:
    """Rendering gives one workload per path (`run`, or `run --only recall|persist` when split)."""
    docs = render(helm, *args)
    split = "paths=split" in args or (args == ALL_ON and load_yaml(VALUES_ALL_ON)["paths"] == "split")
    expected = [["run", "--only", "recall"], ["run", "--only", "persist"]] if split else [["run"]]
    assert sorted(_service_container(w)["args"] for w in _workloads(docs)) == sorted(expected)


@pytest.mark.parametrize("args", CASE_PARAMS)
def test_rendered_objects_decode_strictly_into_kubernetes_types(helm: str, args: tuple[str, ...]) -> None:
    """Every built-in object decodes into its k8s.io/api type with no unknown field and no wrong type
    (deploy/helm/kubecheck), which helm lint does not check."""
    kubecheck = require_tool("kubecheck")
    done = subprocess.run(
        [kubecheck], input=render_text(helm, *args), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    docs = render(helm, *args)
    custom = [d for d in docs if d["kind"] in CUSTOM_RESOURCES]
    assert len([line for line in lines if line.startswith("OK ")]) == len(docs) - len(custom)
    assert len([line for line in lines if line.startswith("SKIP ")]) == len(custom)


# --- probes and ports -----------------------------------------------------------------------------


@pytest.mark.parametrize("args", CASE_PARAMS)
def test_probes_hit_the_service_endpoints_on_its_port(helm: str, args: tuple[str, ...]) -> None:
    """Startup and liveness probe /livez, readiness /readyz, on the container port the service listens on."""
    docs = render(helm, *args)
    port = _http_port(docs)
    for workload in _workloads(docs):
        container = _service_container(workload)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"http": port}
        for probe, path in (
            ("startupProbe", LIVENESS_PATH),
            ("livenessProbe", LIVENESS_PATH),
            ("readinessProbe", READINESS_PATH),
        ):
            http_get = container[probe]["httpGet"]
            assert http_get["path"] == path, probe
            assert ports.get(http_get["port"], http_get["port"]) == port, probe


def test_default_port_is_the_service_default(helm: str) -> None:
    """With the chart's defaults the container port is the service's own default HTTP port."""
    docs = render(helm)
    assert _http_port(docs) == setting_default("http_port")
    (workload,) = _workloads(docs)
    assert _service_container(workload)["ports"][0]["containerPort"] == setting_default("http_port")


@pytest.mark.parametrize("args", CASE_PARAMS)
def test_metrics_service_and_monitor_target_the_http_port(helm: str, args: tuple[str, ...]) -> None:
    """The Service forwards to the named http port and a ServiceMonitor, when on, scrapes /metrics on it."""
    docs = render(helm, *args)
    for service in of_kind(docs, "Service"):
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    for monitor in of_kind(docs, "ServiceMonitor"):
        assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("http", "/metrics")]


# --- graceful shutdown ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        *CASE_PARAMS,
        pytest.param(("--set", "config.shutdownGraceSeconds=0.5"), id="grace-0.5s"),
        pytest.param(("--set", "config.shutdownGraceSeconds=300"), id="grace-300s"),
        pytest.param(
            ("--set", "config.shutdownGraceSeconds=30.2,workload.terminationGraceMarginSeconds=0"),
            id="grace-30.2s-margin-0",
        ),
    ],
)
def test_termination_grace_exceeds_the_drain_grace(helm: str, args: tuple[str, ...]) -> None:
    """Every pod's terminationGracePeriodSeconds is above MESSAGE_HISTORY_SHUTDOWN_GRACE_S, for any grace."""
    docs = render(helm, *args)
    drain = _drain_grace(docs)
    long_running = [doc for doc in pod_docs(docs) if doc["kind"] != "Pod"]
    graces = [pod_spec(doc).get("terminationGracePeriodSeconds") for doc in long_running]
    assert graces
    for grace in graces:
        assert isinstance(grace, int)
        assert grace > drain
        assert grace >= math.ceil(drain) + 1


# --- security -------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", CASE_PARAMS)
def test_every_pod_runs_locked_down(helm: str, args: tuple[str, ...]) -> None:
    """Pods run as a non-root numeric user, read-only root, no privilege escalation, no capabilities,
    RuntimeDefault seccomp, a writable /tmp from an emptyDir, and no Kubernetes API token."""
    docs = render(helm, *args)
    pods = list(pod_docs(docs))
    assert {doc["kind"] for doc in pods} >= {"Pod"}  # the helm test pod is checked too
    for doc in pods:
        spec = pod_spec(doc)
        pod_ctx = spec["securityContext"]
        assert spec["automountServiceAccountToken"] is False
        assert pod_ctx["runAsNonRoot"] is True
        assert isinstance(pod_ctx["runAsUser"], int)
        assert pod_ctx["runAsUser"] > 0
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            ctx = container["securityContext"]
            where = f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}"
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx.get("privileged", False) is False, where
            assert ctx["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in ctx["capabilities"], where
            assert ctx.get("runAsNonRoot", pod_ctx["runAsNonRoot"]) is True, where
            assert ctx.get("runAsUser", pod_ctx["runAsUser"]) > 0, where
            seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile"))
            assert seccomp == {"type": "RuntimeDefault"}, where
            tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert len(tmp) == 1, where
            assert "emptyDir" in volumes[tmp[0]["name"]], where


@pytest.mark.parametrize("args", CASE_PARAMS)
def test_secrets_come_from_secret_references(helm: str, args: tuple[str, ...]) -> None:
    """MONGODB_URI, the Kafka SASL password and the message id keys reach the pods only through secretKeyRef,
    never as a value or in the ConfigMap."""
    docs = render(helm, *args)
    secret_names = {
        "MONGODB_URI",
        "MESSAGE_HISTORY_KAFKA_SASL_PASSWORD",
        "MESSAGE_HISTORY_MESSAGE_ID_KEY",
        "MESSAGE_HISTORY_MESSAGE_ID_PREVIOUS_KEYS",
    }
    assert not secret_names & set(config_map(docs))
    for doc in pod_docs(docs):
        for container in pod_spec(doc)["containers"]:
            env = {entry["name"]: entry for entry in container.get("env", [])}
            assert "MONGODB_URI" in env
            for name in secret_names & set(env):
                assert "value" not in env[name], name
                assert "secretKeyRef" in env[name]["valueFrom"], name


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param((), {}, id="defaults-unset"),
        pytest.param(
            ("--set", "messageIdKeys.keySecret.name=mh-ids,messageIdKeys.previousKeysSecret.name=mh-old-ids"),
            {
                "MESSAGE_HISTORY_MESSAGE_ID_KEY": {"name": "mh-ids", "key": "key"},
                "MESSAGE_HISTORY_MESSAGE_ID_PREVIOUS_KEYS": {"name": "mh-old-ids", "key": "previous-keys"},
            },
            id="existing-secrets",
        ),
        pytest.param(
            ("--set", "secrets.create=true,secrets.mongodbUri=mongodb://x,secrets.messageIdKey=k"),
            {"MESSAGE_HISTORY_MESSAGE_ID_KEY": {"name": "mh-message-history", "key": "message-id-key"}},
            id="created-secret-key-only",
        ),
    ],
)
def test_message_id_keys_come_from_the_secret_they_name(
    helm: str, args: tuple[str, ...], expected: dict[str, dict[str, str]]
) -> None:
    """The message id keys are set only when a Secret holds them (else the service's own key in MongoDB),
    from the existing Secret named, or from the chart's Secret when it was given the value."""
    for doc in pod_docs(render(helm, *args)):
        for container in pod_spec(doc)["containers"]:
            env = {entry["name"]: entry for entry in container.get("env", [])}
            found = {
                name: env[name]["valueFrom"]["secretKeyRef"]
                for name in ("MESSAGE_HISTORY_MESSAGE_ID_KEY", "MESSAGE_HISTORY_MESSAGE_ID_PREVIOUS_KEYS")
                if name in env
            }
            assert found == expected


def test_no_secret_is_created_by_default(helm: str) -> None:
    """The default values create no Secret: credentials live outside the chart and its release history."""
    assert of_kind(render(helm), "Secret") == []


def test_created_secret_holds_the_values_and_nothing_else_shows_them(helm: str) -> None:
    """With secrets.create on, the values are only in the Secret (base64) and nowhere in clear text."""
    values = load_yaml(VALUES_ALL_ON)["secrets"]
    docs = render(helm, *ALL_ON)
    (secret,) = of_kind(docs, "Secret")
    decoded = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    expected = {
        "mongodb-uri": values["mongodbUri"],
        "kafka-sasl-password": values["kafkaSaslPassword"],
        "message-id-key": values["messageIdKey"],
        "message-id-previous-keys": values["messageIdPreviousKeys"],
    }
    assert decoded == expected
    clear_text = yaml.safe_dump_all([doc for doc in docs if doc["kind"] != "Secret"])
    for value in expected.values():
        assert value not in clear_text


def test_no_hash_of_a_secret_reaches_a_pod_template(helm: str) -> None:
    """Pod annotations are readable by many: no digest of a created Secret appears anywhere but in the Secret
    (an unsalted sha256 of a short password can be guessed offline). Rotation rolls the pods through
    secrets.revision, a value the operator bumps, rendered as it is."""
    docs = render(helm, *ALL_ON)
    for doc in pod_docs(docs):
        annotations = doc["spec"].get("template", doc)["metadata"].get("annotations", {})
        assert [k for k in annotations if "secret" in k] in ([], ["message-history/secrets-revision"])
        digests = [k for k, v in annotations.items() if re.fullmatch(r"[0-9a-f]{64}", str(v))]
        assert digests in ([], ["checksum/config"])  # the ConfigMap holds no secret
    revision = load_yaml(VALUES_ALL_ON)["secrets"]["revision"]
    for workload in _workloads(docs):
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["message-history/secrets-revision"] == revision


# --- network --------------------------------------------------------------------------------------


def test_network_policy_is_on_by_default_and_admits_only_the_http_port_from_metrics_from(helm: str) -> None:
    """By default a NetworkPolicy selects the release's pods and lets in only TCP to the HTTP port, only from
    `networkPolicy.metricsFrom` (kubelet probes come from the node, which NetworkPolicy does not block);
    egress is left open unless restrictEgress asks for it."""
    docs = render(helm)
    (policy,) = of_kind(docs, "NetworkPolicy")
    metrics_from = load_yaml(CHART / "values.yaml")["networkPolicy"]["metricsFrom"]
    assert metrics_from  # someone is named: an empty `from` would admit everyone
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": _http_port(docs), "protocol": "TCP"}], "from": metrics_from}
    ]
    assert "egress" not in policy["spec"]
    (workload,) = _workloads(docs)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()

    (restricted,) = of_kind(render(helm, "--set", "networkPolicy.restrictEgress=true"), "NetworkPolicy")
    assert restricted["spec"]["policyTypes"] == ["Ingress", "Egress"]
    ports = {p["port"] for rule in restricted["spec"]["egress"] for p in rule["ports"]}
    assert ports == {53, 9092, 27017}
    assert of_kind(render(helm, "--set", "networkPolicy.enabled=false"), "NetworkPolicy") == []


# --- settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", CASE_PARAMS)
def test_every_environment_name_is_a_setting_of_the_service(helm: str, args: tuple[str, ...]) -> None:
    """Every variable in the ConfigMap, and every MESSAGE_HISTORY_/KAFKA_/MONGODB_ variable in a container,
    is one the Settings model reads (a misspelt name would be silently ignored by the service)."""
    docs = render(helm, *args)
    known = settings_env_names()
    unknown = set(config_map(docs)) - set(known)
    assert not unknown
    for doc in pod_docs(docs):
        for container in pod_spec(doc)["containers"]:
            for name in env_names(container):
                if name.startswith(SERVICE_ENV_PREFIXES):
                    assert name in known, name
                else:
                    assert name in KUBERNETES_ENV or args == ALL_ON, name  # all-on adds an extraEnv example


@pytest.mark.parametrize("args", [pytest.param((), id="defaults"), pytest.param(ALL_ON, id="all-on")])
def test_config_map_is_accepted_by_settings(
    helm: str, args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Settings model reads the rendered ConfigMap without a validation error, and with the defaults it
    yields exactly the service's own defaults (the chart documents no default the service does not have)."""
    for name in settings_env_names():
        monkeypatch.delenv(name, raising=False)
    service_defaults = Settings().model_dump()
    data = config_map(render(helm, *args))
    for name, value in data.items():
        monkeypatch.setenv(name, value)
    from_chart = Settings().model_dump()
    if args == ():
        differing = {k for k in service_defaults if service_defaults[k] != from_chart[k]}
        # The chart points at a `kafka` Service instead of the service's loopback default.
        assert differing == {"kafka_bootstrap_servers"}
    else:
        assert from_chart["http_port"] == int(data["MESSAGE_HISTORY_HTTP_PORT"])
        assert from_chart["shutdown_grace_s"] == float(data["MESSAGE_HISTORY_SHUTDOWN_GRACE_S"])


def test_every_setting_is_reachable_from_the_chart(helm: str) -> None:
    """With every option on, the chart sets every Settings field (a new setting without a value fails)."""
    docs = render(helm, *ALL_ON)
    (workload, *_) = _workloads(docs)
    set_names = set(config_map(docs)) | set(env_names(_service_container(workload)))
    fields = settings_env_names()
    reached = {fields[name] for name in set_names if name in fields}
    assert set(Settings.model_fields) - reached == set()
    config_keys = set(load_yaml(CHART / "values.yaml")["config"])
    assert len(config_keys) == len(set(Settings.model_fields) - SET_OUTSIDE_CONFIG)


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("Deployment", ("--set", "staticMembership.enabled=true")), ("StatefulSet", ())],
)
def test_static_membership_uses_the_pod_name(helm: str, kind: str, extra: tuple[str, ...]) -> None:
    """MESSAGE_HISTORY_GROUP_INSTANCE_ID comes from the pod name, defined first so Kubernetes expands it."""
    docs = render(helm, "--set", f"workload.kind={kind}", *extra)
    (workload,) = _workloads(docs)
    assert workload["kind"] == kind
    env = _service_container(workload)["env"]
    names = [entry["name"] for entry in env]
    instance = env[names.index("MESSAGE_HISTORY_GROUP_INSTANCE_ID")]["value"]
    assert "$(POD_NAME)" in instance
    assert names.index("POD_NAME") < names.index("MESSAGE_HISTORY_GROUP_INSTANCE_ID")
    pod_name = env[names.index("POD_NAME")]
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert re.fullmatch(r"[A-Za-z0-9._$()-]+", instance)  # Kafka accepts [a-zA-Z0-9._-] once expanded


@pytest.mark.parametrize(("kind", "static"), [("Deployment", False), ("StatefulSet", True)])
def test_static_membership_by_default_only_where_pod_names_are_stable(
    helm: str, kind: str, static: bool
) -> None:
    """A Deployment's replaced pods get new names: a static member (no LeaveGroup) would hold its partitions
    for a session timeout on every rollout, so by default only a StatefulSet's pods are static members."""
    (workload,) = _workloads(render(helm, "--set", f"workload.kind={kind}"))
    assert ("MESSAGE_HISTORY_GROUP_INSTANCE_ID" in env_names(_service_container(workload))) is static


def test_static_membership_can_be_turned_off(helm: str) -> None:
    """With staticMembership.enabled=false no instance id is set, so each pod is a dynamic member."""
    docs = render(helm, "--set", "workload.kind=StatefulSet", "--set", "staticMembership.enabled=false")
    (workload,) = _workloads(docs)
    assert "MESSAGE_HISTORY_GROUP_INSTANCE_ID" not in env_names(_service_container(workload))


def test_statefulset_has_its_governing_headless_service(helm: str) -> None:
    """A StatefulSet names a headless Service the chart renders, so its pods get stable names."""
    docs = render(helm, "--set", "workload.kind=StatefulSet")
    (workload,) = _workloads(docs)
    services = of_kind(docs, "Service")
    headless = {s["metadata"]["name"] for s in services if s["spec"].get("clusterIP") == "None"}
    assert workload["spec"]["serviceName"] in headless


# --- scaling and disruption -----------------------------------------------------------------------


@pytest.mark.parametrize("args", CASE_PARAMS)
def test_each_workload_has_a_budget_and_at_most_one_autoscaler(helm: str, args: tuple[str, ...]) -> None:
    """Every workload is selected by exactly one PodDisruptionBudget and scaled by at most one HPA or
    ScaledObject, and a scaled workload leaves `replicas` to its autoscaler."""
    docs = render(helm, *args)
    for workload in _workloads(docs):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        budgets = [
            pdb
            for pdb in of_kind(docs, "PodDisruptionBudget")
            if pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(budgets) == 1
        scalers = [
            s
            for s in of_kind(docs, "HorizontalPodAutoscaler", "ScaledObject")
            if s["spec"]["scaleTargetRef"]["name"] == workload["metadata"]["name"]
            and s["spec"]["scaleTargetRef"]["kind"] == workload["kind"]
        ]
        assert len(scalers) <= 1
        assert ("replicas" in workload["spec"]) == (not scalers)


def test_keda_scales_each_path_on_the_lag_of_its_own_input_topics(helm: str) -> None:
    """With split paths, KEDA scales recall on the requests topic's lag and persist on the responses topic's,
    for the service's consumer group, never beyond the partition count."""
    docs = render(helm, *ALL_ON)
    values = load_yaml(VALUES_ALL_ON)
    topics = {
        scaled["spec"]["scaleTargetRef"]["name"]: [t["metadata"]["topic"] for t in scaled["spec"]["triggers"]]
        for scaled in of_kind(docs, "ScaledObject")
    }
    assert topics == {"mh-recall": ["agent.requests"], "mh-persist": ["agent.responses"]}
    for scaled in of_kind(docs, "ScaledObject"):
        assert scaled["spec"]["maxReplicaCount"] <= values["kafka"]["topicPartitions"]
        for trigger in scaled["spec"]["triggers"]:
            assert trigger["type"] == "kafka"
            assert trigger["metadata"]["consumerGroup"] == values["config"]["groupId"]
            assert trigger["metadata"]["allowIdleConsumers"] == "false"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ("--set", "autoscaling.enabled=true,keda.enabled=true"), "enable one", id="hpa-and-keda"
        ),
        pytest.param(
            ("--set", "kafka.topicPartitions=1"), "extra pods would be idle", id="replicas>partitions"
        ),
        pytest.param(
            ("--set", "kafka.topicPartitions=4,keda.enabled=true,keda.maxReplicaCount=5"),
            "keda.maxReplicaCount",
            id="keda-max>partitions",
        ),
        pytest.param(("--set", "config.lastMesages=10"), "not a setting of the service", id="config-typo"),
        pytest.param(("--set", "workload.kind=DaemonSet"), "workload.kind", id="bad-kind"),
        pytest.param(("--set", "paths=recall"), "paths must be", id="bad-paths"),
        pytest.param(
            ("--set", "kafka.sasl.mechanism=PLAIN"), "securityProtocol", id="sasl-without-sasl-protocol"
        ),
        pytest.param(("--set", "secrets.create=true"), "secrets.mongodbUri", id="create-secret-without-uri"),
        pytest.param(
            ("--set", "topics.create=true"), "topics.create needs kafka.topicPartitions", id="topics-no-count"
        ),
        pytest.param(
            (
                "--set",
                "topics.create=true,kafka.topicPartitions=6,secrets.create=true,secrets.mongodbUri=mongodb://x,"
                "secrets.kafkaSaslPassword=p,kafka.sasl.mechanism=PLAIN,kafka.sasl.username=u,"
                "kafka.securityProtocol=SASL_SSL",
            ),
            "existing Secret",
            id="topics-password-in-own-secret",
        ),
    ],
)
def test_impossible_values_are_refused_with_a_reason(helm: str, args: tuple[str, ...], message: str) -> None:
    """Values that cannot work make `helm template` fail with a message naming what to change."""
    result = run_helm(helm, "template", "mh", str(CHART), *args)
    assert result.returncode != 0
    assert message in result.stderr


# --- replay Job -----------------------------------------------------------------------------------


def test_replay_job_is_off_by_default(helm: str) -> None:
    """No Job is rendered unless replay.enabled is set."""
    assert of_kind(render(helm), "Job") == []


def test_replay_job_passes_its_args_and_the_service_settings(helm: str) -> None:
    """replay.enabled renders a Job running `message-history replay <args>` with the service's ConfigMap and
    secret references, no static membership, and a name that changes with replay.runId."""
    docs = render(
        helm,
        "--set",
        "replay.enabled=true,replay.runId=r7",
        "--set-json",
        'replay.args=["--dry-run","--rate","10"]',
    )
    (job,) = of_kind(docs, "Job")
    spec = pod_spec(job)
    (container,) = spec["containers"]
    assert container["args"] == ["replay", "--dry-run", "--rate", "10"]
    assert job["metadata"]["name"].endswith("-replay-r7")
    assert spec["restartPolicy"] == "Never"
    assert container["envFrom"][0]["configMapRef"]["name"] == config_map_name(docs)
    assert "MONGODB_URI" in env_names(container)
    assert "MESSAGE_HISTORY_GROUP_INSTANCE_ID" not in env_names(container)


def config_map_name(docs: tuple[Doc, ...]) -> str:
    (found,) = of_kind(docs, "ConfigMap")
    name: str = found["metadata"]["name"]
    return name


# --- documentation --------------------------------------------------------------------------------


def _documented_keys(text: str) -> set[str]:
    """Dotted paths of values.yaml keys that carry a `# --` comment directly above them."""
    documented: set[str] = set()
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        match = re.match(r"^(\s*)([A-Za-z0-9_]+):", line)
        if match and not stripped.startswith("-"):
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = ".".join([key for _, key in stack] + [match.group(2)])
            if any(c.startswith("# --") for c in comment):
                documented.add(path)
            stack.append((indent, match.group(2)))
        comment = []
    return documented


def _value_leaves(values: Any, documented: set[str], prefix: str = "") -> list[str]:
    """Keys to document: a key with its own `# --` comment, else every key below a non-empty mapping."""
    leaves: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if path not in documented and isinstance(value, dict) and value:
            leaves.extend(_value_leaves(value, documented, f"{path}."))
        else:
            leaves.append(path)
    return leaves


def test_every_value_is_documented_in_values_and_readme() -> None:
    """Every leaf key of values.yaml has a `# --` comment there and a row in the chart README's table."""
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    documented = _documented_keys(text)
    leaves = _value_leaves(yaml.safe_load(text), documented)
    assert len(leaves) > 50  # the walk found the values, not an empty file
    assert [leaf for leaf in leaves if leaf not in documented] == []
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    assert [leaf for leaf in leaves if f"| `{leaf}` |" not in readme] == []


def _unknown_keys(defaults: dict[str, Any], overrides: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys of `overrides` absent from `defaults`, looking inside mappings whose default is non-empty."""
    unknown: list[str] = []
    for key, value in overrides.items():
        path = f"{prefix}{key}"
        if key not in defaults:
            unknown.append(path)
        elif isinstance(defaults[key], dict) and defaults[key] and isinstance(value, dict):
            unknown.extend(_unknown_keys(defaults[key], value, f"{path}."))
    return unknown


def test_values_all_on_only_uses_keys_the_chart_has() -> None:
    """values-all-on.yaml sets no key that values.yaml lacks (a misspelt option would be silently ignored)."""
    assert _unknown_keys(load_yaml(CHART / "values.yaml"), load_yaml(VALUES_ALL_ON)) == []


# --- topics Job ----------------------------------------------------------------------------------------


def test_topics_job_is_off_by_default(helm: str) -> None:
    """No topics Job unless topics.create is set."""
    assert [j for j in of_kind(render(helm), "Job") if j["metadata"]["name"].endswith("-topics")] == []


def test_topics_job_creates_every_topic_with_one_partition_count_before_the_pods(helm: str) -> None:
    """topics.create renders a pre-install/pre-upgrade hook running `message-history topics --partitions N`
    with kafka.topicPartitions, the service's settings inline (no ConfigMap yet) and no MongoDB secret."""
    docs = render(helm, "--set", "topics.create=true,kafka.topicPartitions=12,config.responsesTopic=resp")
    (job,) = [j for j in of_kind(docs, "Job") if j["metadata"]["name"].endswith("-topics")]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = pod_spec(job)["containers"]
    assert container["args"][:3] == ["topics", "--partitions", "12"]
    env = {entry["name"]: entry.get("value") for entry in container["env"]}
    assert env["MESSAGE_HISTORY_RESPONSES_TOPIC"] == "resp"
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == config_map(docs)["KAFKA_BOOTSTRAP_SERVERS"]
    assert "MONGODB_URI" not in env
    assert "envFrom" not in container
